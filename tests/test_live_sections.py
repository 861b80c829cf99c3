"""Every "Live" section does what it says (issue 34, item 3).

A chapter's live cell (``if chapter.mode() == "live":``) is the code a reader runs on a GPU. On
the page it must be visible (not ``remove-cell``/``remove-input``), and without a GPU it must say
so plainly (an ``else`` branch that prints or shows the recorded run) and store that output,
without error. A heading must not run straight into the next one with nothing shown between
(the Live sections did: their only cell was removed from the page). CPU only, a second.
"""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "book").rglob("*.ipynb"))
REMOVED = {"remove-cell"}
NO_CODE = {"remove-cell", "remove-input"}
HEADING = re.compile(r"^(#{1,6})\s+(.*\S)\s*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})")


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else (v or "")


def _tags(cell) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def _is_live_test(node) -> bool:
    """``chapter.mode() == "live"`` (or ``mode() == "live"``)."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)):
        return False
    left, right = node.left, node.comparators[0]
    call = left if isinstance(left, ast.Call) else right
    const = right if isinstance(left, ast.Call) else left
    if not (isinstance(call, ast.Call) and isinstance(const, ast.Constant) and const.value == "live"):
        return False
    f = call.func
    return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")) == "mode"


def live_ifs(src: str) -> list[ast.If]:
    src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.split("\n"))
    try:
        tree = ast.parse(src)
    except SyntaxError:
        return []
    return [n for n in ast.walk(tree) if isinstance(n, ast.If) and _is_live_test(n.test)]


def live_cell_problems(nb: dict) -> list[str]:
    """What is wrong with each live cell of ``nb`` (a line each)."""
    bad = []
    n = 0
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        n += 1
        ifs = live_ifs(_text(cell["source"]))
        if not ifs:
            continue
        hidden = NO_CODE & _tags(cell)
        if hidden:
            bad.append(f"code cell {n}: the live code is hidden from the reader ({sorted(hidden)})")
        if not all(i.orelse for i in ifs):
            bad.append(f"code cell {n}: no else branch saying, without a GPU, that it needs one")
        outs = cell.get("outputs", [])
        if any(o.get("output_type") == "error" for o in outs):
            bad.append(f"code cell {n}: stores an error")
        elif not outs:
            bad.append(f"code cell {n}: stores no output (without a GPU it must say it needs one)")
    return bad


def _visible_lines(md: str) -> list[tuple[int | None, str]]:
    """(heading level or None, text) for every non-blank line outside comments; a fenced block
    counts as content."""
    out, fence = [], None
    for ln in md.split("\n"):
        if fence:
            if ln.strip().startswith(fence):
                fence = None
            continue
        m = FENCE.match(ln)
        if m:
            fence = m.group(1)
            out.append((None, ln))
            continue
        if not ln.strip() or ln.strip().startswith("<!--") or ln.strip().startswith("(") and \
                ln.strip().endswith(")="):                 # blank, comment, MyST target
            continue
        h = HEADING.match(ln)
        out.append((len(h.group(1)), h.group(2)) if h else (None, ln))
    return out


def empty_headings(nb: dict) -> list[str]:
    """Headings followed by a heading of the same or a higher level (or the end of the page)
    with nothing a reader sees between them."""
    items: list[tuple[int | None, str]] = []
    for cell in nb["cells"]:
        if REMOVED & _tags(cell):
            continue
        if cell["cell_type"] == "markdown":
            items += _visible_lines(_text(cell["source"]))
        elif cell["cell_type"] == "code":
            shown = "remove-input" not in _tags(cell) or (
                "remove-output" not in _tags(cell) and cell.get("outputs"))
            if shown:
                items.append((None, "<code cell>"))
    bad = []
    for i, (level, text) in enumerate(items):
        if level is None:
            continue
        nxt = items[i + 1] if i + 1 < len(items) else (0, "the end of the page")
        if nxt[0] is not None and nxt[0] <= level:
            bad.append(f"{'#' * level} {text} (runs into: {nxt[1]})")
    return bad


def _id(p: Path) -> str:
    return p.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_live_cells_are_shown_and_say_when_they_need_a_gpu(path):
    bad = live_cell_problems(json.loads(path.read_text(encoding="utf-8")))
    assert not bad, f"{_id(path)}:\n  " + "\n  ".join(bad)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_id)
def test_no_heading_without_content(path):
    bad = empty_headings(json.loads(path.read_text(encoding="utf-8")))
    assert not bad, f"{_id(path)}: headings with nothing under them:\n  " + "\n  ".join(bad)


def test_the_checks_catch_an_empty_live_section():
    """On notebooks made for them: the issue's case (a Live heading, its only cell removed,
    then the Summary) fails both checks; the cell shown with an else branch and its output
    passes both."""
    live = 'if chapter.mode() == "live":\n    run()\n'
    ok_src = live + 'else:\n    print("needs a GPU")\n'

    def nb(src, tags, outputs):
        return {"cells": [
            {"cell_type": "markdown", "source": "## Live: on your GPU", "metadata": {}},
            {"cell_type": "code", "source": src, "metadata": {"tags": tags}, "outputs": outputs},
            {"cell_type": "markdown", "source": "## Summary\n\n- text", "metadata": {}}]}
    bad = nb(live, ["remove-cell"], [])
    assert len(live_cell_problems(bad)) == 3
    assert empty_headings(bad) == ["## Live: on your GPU (runs into: Summary)"]
    good = nb(ok_src, [], [{"output_type": "stream", "name": "stdout", "text": "needs a GPU\n"}])
    assert live_cell_problems(good) == [] and empty_headings(good) == []
    assert empty_headings({"cells": [{"cell_type": "markdown", "metadata": {},
                                      "source": "# Title\n\n## A\n\ntext\n\n## B\n"}]}) \
        == ["## B (runs into: the end of the page)"]
