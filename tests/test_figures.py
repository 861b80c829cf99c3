"""Every figure of the book is stored as an image in its notebook (issue 34, item 1).

nbval compares text outputs only, so a notebook re-executed without a PNG formatter for
matplotlib figures (``MPLBACKEND=Agg`` in a kernel, or a runner that formats results itself)
keeps passing while the page shows ``<Figure size 675x504 with 2 Axes>`` where the figure was.
Two checks over every notebook of the book (``notebooks/`` and ``book/``), CPU only:

1. no output stores a figure's text repr without an image beside it;
2. a shown cell that makes a figure (its last expression is a figure variable, it calls
   ``display(fig)``, ``plt.subplots``/``plt.figure`` or a ``*_figure`` function) has an image
   among its outputs.

``tests/test_book.py`` checks the built pages against the same count (``stored_images``).
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "book").rglob("*.ipynb"))
FIGURE_REPR = re.compile(r"^<(?:matplotlib\.figure\.)?Figure size ")
IMAGE_MIMES = ("image/png", "image/svg+xml", "image/jpeg")
HIDDEN = {"remove-cell", "remove-output"}


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else (v or "")


def _has_image(output: dict) -> bool:
    return any(m in output.get("data", {}) for m in IMAGE_MIMES)


def _code_cells(nb: dict):
    n = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            n += 1
            yield n, cell


def figure_reprs(nb: dict) -> list[str]:
    """'cell N: <Figure ...>' for every output that holds a figure's repr and no image."""
    bad = []
    for n, cell in _code_cells(nb):
        for o in cell.get("outputs", []):
            text = _text(o.get("data", {}).get("text/plain"))
            if FIGURE_REPR.match(text) and not _has_image(o):
                bad.append(f"code cell {n}: {text.strip()[:60]}")
    return bad


def _call_name(call: ast.Call) -> tuple[str, str]:
    f = call.func
    if isinstance(f, ast.Attribute):
        owner = f.value.id if isinstance(f.value, ast.Name) else ""
        return owner, f.attr
    return "", getattr(f, "id", "")


def makes_figure(src: str) -> str | None:
    """Why the cell's source shows a figure (a short phrase), or None."""
    src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.split("\n"))
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        v = tree.body[-1].value
        if isinstance(v, ast.Name) and "fig" in v.id.lower():
            return f"ends with {v.id}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        owner, name = _call_name(node)
        if owner == "plt" and name in ("subplots", "figure"):
            return f"calls plt.{name}"
        if name.endswith("_figure"):
            return f"calls {name}"
        if name == "display" and node.args and isinstance(node.args[0], ast.Name) \
                and "fig" in node.args[0].id.lower():
            return f"displays {node.args[0].id}"
    return None


def figures_without_image(nb: dict) -> list[str]:
    """'cell N (why)' for every shown cell that makes a figure but stores no image."""
    bad = []
    for n, cell in _code_cells(nb):
        if HIDDEN & set(cell.get("metadata", {}).get("tags", [])):
            continue
        why = makes_figure(_text(cell["source"]))
        if why and not any(_has_image(o) for o in cell.get("outputs", [])):
            bad.append(f"code cell {n} ({why})")
    return bad


def stored_images(nb: dict) -> int:
    """The images a reader sees on the built page: image outputs of cells not removed."""
    return sum(_has_image(o) for _, cell in _code_cells(nb)
               if not HIDDEN & set(cell.get("metadata", {}).get("tags", []))
               for o in cell.get("outputs", []))


def _id(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_no_figure_stored_as_text(path):
    bad = figure_reprs(json.loads(path.read_text(encoding="utf-8")))
    assert not bad, (f"{_id(path)} stores figures as text, no image (re-execute it with an "
                     f"inline backend: python -m flashbook nbrun IN OUT):\n  " + "\n  ".join(bad))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_figure_cells_store_an_image(path):
    bad = figures_without_image(json.loads(path.read_text(encoding="utf-8")))
    assert not bad, f"{_id(path)}: cells that make a figure but store no image:\n  " + \
        "\n  ".join(bad)


def test_the_checks_catch_a_lost_figure():
    """The two checks on a notebook made for them: a figure stored as text is caught by both;
    the same cell with its PNG passes; a table cell is no figure."""
    def nb(outputs, src="fig = plots.waterfall(r)\nfig", tags=()):
        return {"cells": [{"cell_type": "code", "source": src, "outputs": outputs,
                           "metadata": {"tags": list(tags)}}]}
    text = {"output_type": "execute_result", "data": {"text/plain": "<Figure size 675x504 with 2 Axes>"}}
    image = {"output_type": "execute_result",
             "data": {"text/plain": "<Figure size 675x504 with 2 Axes>", "image/png": "iVBOR"}}
    assert figure_reprs(nb([text])) and figures_without_image(nb([text]))
    assert not figure_reprs(nb([image])) and not figures_without_image(nb([image]))
    assert stored_images(nb([image])) == 1 and stored_images(nb([image], tags=["remove-cell"])) == 0
    assert makes_figure("display(fig)") and makes_figure("f, ax = plt.subplots()")
    assert makes_figure("x = flex.speedup_figure(D)") and not makes_figure("table.round(2)")
