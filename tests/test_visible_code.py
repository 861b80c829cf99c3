"""No page of the book shows more than a budget of visible code outside kernel listings.

Issue 13, part 1: plumbing (imports, data wrangling, plotting, ``glue``) stays in the notebooks for
those who run them, but the rendered book hides it with Jupyter Book's cell tags:

- ``remove-cell``: the cell vanishes from the page (it still runs, so its ``glue`` records are
  there for the prose);
- ``remove-input``: the output (a figure, a table, the provenance banner) stays, the code goes;
- ``hide-input``: the code sits behind a "Show code cell source" toggle.

A code cell is **visible** when it has none of these tags. A visible cell is a **kernel listing**
when it carries the tag ``kernel-listing`` or calls ``step_source``, ``step_diff``,
``config_diff`` or ``inspect.getsource`` (``flashbook.source``'s renderers of the real
kernel): listings are the lesson and are not counted.

**Budget: 40 visible non-blank code lines per page** (chapter notebooks ``notebooks/*.ipynb`` and
the executed book pages ``book/*.ipynb``), outside kernel listings. That leaves room for a few
small demos a reader should type (chapter 2's online softmax against the reference, a
correctness check) and the one-line calls that produce a measurement.

CPU only, well under a second: ``python -m pytest tests/test_visible_code.py -o addopts=""``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUDGET = 40
HIDDEN = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
LISTING_TAG = "kernel-listing"
LISTING_CALL = re.compile(r"\b(step_source|step_diff|config_diff|getsource)\(")
PAGES = sorted(ROOT.glob("notebooks/*.ipynb")) + sorted(ROOT.glob("book/*.ipynb"))


def _tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def is_listing(cell: dict) -> bool:
    """A kernel listing: tagged ``kernel-listing``, or a call of the source renderers."""
    return LISTING_TAG in _tags(cell) or bool(LISTING_CALL.search("".join(cell["source"])))


def is_visible(cell: dict) -> bool:
    return cell["cell_type"] == "code" and not (_tags(cell) & HIDDEN)


def visible_lines(nb: dict) -> dict[int, int]:
    """Cell index -> non-blank code lines, for the visible code cells that are not listings."""
    out = {}
    for i, cell in enumerate(nb["cells"]):
        if is_visible(cell) and not is_listing(cell):
            out[i] = sum(1 for ln in "".join(cell["source"]).splitlines() if ln.strip())
    return out


def test_pages_found():
    assert len([p for p in PAGES if p.parent.name == "notebooks"]) >= 11


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_visible_code_within_budget(page):
    nb = json.loads(page.read_text(encoding="utf-8"))
    lines = visible_lines(nb)
    total = sum(lines.values())
    assert total <= BUDGET, (
        f"{page.name} shows {total} visible code lines outside kernel listings (budget {BUDGET}); "
        f"cells (index: lines): {lines}. Tag plumbing remove-cell / remove-input / hide-input.")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_glue_cells_still_run(page):
    """Tags hide cells from the page, never from execution: no cell is tagged to be skipped."""
    nb = json.loads(page.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        tags = _tags(cell)
        assert not tags & {"skip-execution", "raises-exception"}, (page.name, i, tags)


@pytest.mark.parametrize("page", [p for p in PAGES if p.parent.name == "notebooks"],
                         ids=lambda p: p.stem)
def test_listings_stay_visible(page):
    """The kernel code and its diffs are the lesson: a listing is never hidden."""
    nb = json.loads(page.read_text(encoding="utf-8"))
    listings = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and is_listing(c)]
    hidden = [i for i in listings if not is_visible(nb["cells"][i])]
    assert not hidden, f"{page.name}: kernel listings hidden in cells {hidden}"


def test_counting():
    code = lambda src, tags=(): {"cell_type": "code", "source": src,  # noqa: E731
                                 "metadata": {"tags": list(tags)}}
    nb = {"cells": [code("import x\n\nx.y()\n"), code("a\nb", ["remove-cell"]),
                    code("chapter.show(source.step_diff('remap'), 'diff')"),
                    code("print(1)", ["kernel-listing"]), code("c", ["hide-input"]),
                    {"cell_type": "markdown", "source": "text", "metadata": {}}]}
    assert visible_lines(nb) == {0: 2}
