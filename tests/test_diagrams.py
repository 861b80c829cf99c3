"""The book's diagrams (``flashbook.chapter.diagrams``) render, and the committed SVGs are current.

CPU only, a few seconds: ``python -m pytest tests/test_diagrams.py -o addopts=""``. After changing
a diagram, rewrite the files with ``python -m flashbook.chapter.diagrams``.
"""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

import matplotlib  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from flashbook.chapter import diagrams  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "book" / "_static" / "diagrams"
NAMES = sorted(diagrams.DIAGRAMS)
MAX_BYTES = 100_000


def _svg(name: str) -> str:
    """Draw diagram ``name`` and return its SVG, closing the figure."""
    fig = diagrams.DIAGRAMS[name]()
    try:
        return diagrams.svg_text(fig)
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name", NAMES)
def test_renders(name):
    fig = diagrams.DIAGRAMS[name]()
    assert isinstance(fig, Figure)
    plt.close(fig)
    svg = _svg(name)
    ET.fromstring(svg.encode("utf-8"))                         # well-formed
    assert len(svg.encode("utf-8")) < MAX_BYTES
    assert svg == _svg(name), "not deterministic"


@pytest.mark.parametrize("name", NAMES)
def test_committed_svg(name):
    path = OUT / f"{name}.svg"
    assert path.exists(), f"{path} missing: run python -m flashbook.chapter.diagrams"
    text = path.read_text(encoding="utf-8")
    assert path.stat().st_size < MAX_BYTES, f"{path} is {path.stat().st_size} B"
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag.endswith("svg")
    # Byte-identical only with the matplotlib that wrote it (another version draws other paths).
    made_by = re.search(r"Matplotlib v([0-9][^,\s<]*)", text)
    if made_by and made_by.group(1) != matplotlib.__version__:
        pytest.skip(f"{path.name} written by matplotlib {made_by.group(1)}, "
                    f"this is {matplotlib.__version__}")
    assert text == _svg(name), (
        f"{path} is stale: run python -m flashbook.chapter.diagrams")


def test_save(tmp_path):
    path = diagrams.save("dataflow", tmp_path)
    assert path == tmp_path / "dataflow.svg" and path.stat().st_size > 1000


def _figure_targets() -> list[tuple[Path, str]]:
    """(notebook, image path) for every ``{figure}`` directive of a chapter notebook."""
    out = []
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(nb_path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if cell["cell_type"] == "markdown":
                src = "".join(cell["source"])
                out += [(nb_path, m) for m in re.findall(r"```\{figure\}\s+(\S+)", src)]
    return out


def test_every_diagram_is_in_a_chapter():
    used = {Path(t).stem for _, t in _figure_targets() if "/diagrams/" in t}
    assert used == set(NAMES), f"diagrams not shown in any chapter: {set(NAMES) - used}"


@pytest.mark.parametrize("nb_path,target", _figure_targets(),
                         ids=lambda v: v.stem if isinstance(v, Path) else v)
def test_figure_paths_resolve(nb_path, target):
    """The path in the figure directive resolves from the notebook's folder, as Sphinx reads it."""
    assert (nb_path.parent / target).resolve().is_file(), target
