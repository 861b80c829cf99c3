"""The book's structure, checked on its sources (CPU, no build): every ``{cite}`` key has an
entry in ``references.bib``; the prose says nothing about how the book was made; and no code a
reader sees names a step before the chapter that introduces it.

Pages: the chapters (``notebooks/*.ipynb``) and the pages under ``book/`` (``.ipynb``, ``.md``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
PAGES = NOTEBOOKS + sorted((ROOT / "book").glob("*.ipynb")) + sorted((ROOT / "book").glob("*.md"))

CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]+)`")
BIB_KEY = re.compile(r"^@\w+\{([^,\s]+),", re.M)

# Words about how the book was made, not about attention. Matched case-insensitively in prose.
BANNED = (
    r"\bfield notes\b",
    r"\bthe issue that\b",
    r"\bthis issue\b",
    r"\bissue #?\d+\b",
    r"\bthe lead\b",
    r"\bhelper session\b",
    r"\bin this session\b",
    r"\bthe brief\b",
    r"\bTODO\b",
    r"\bFIXME\b",
    r"\bXXX\b",
    r"\bNOTES\.md\b",
)

# The chapter that introduces each step of the book (chapter 1 measures `baseline` beside
# `naive`; chapter 3 walks through it): code a reader sees in an earlier chapter
# must not name it (prose may, saying "chapter N's `step`").
INTRODUCED = {"naive": 1, "baseline": 1, "large_tiles": 5, "fast_math": 6, "loop_split": 7,
              "remap": 8, "autotune": 9, "arch_tuned": 10, "warp_groups": 10,
              "lazy_rescale": 10, "pair": 10, "exp_poly": 10, "persistent": 10,
              "unchecked_kv": 10}
HIDDEN = {"remove-cell", "remove-input", "hide-input"}


def _cells(path: Path):
    """(cell_type, source, tags) of a notebook, or one markdown 'cell' for a .md page."""
    if path.suffix == ".md":
        return [("markdown", path.read_text(encoding="utf-8"), [])]
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"]), c.get("metadata", {}).get("tags", []))
            for c in nb["cells"]]


def _prose(path: Path) -> str:
    """The Markdown of a page, without code blocks and inline code."""
    text = "\n".join(src for kind, src, _ in _cells(path) if kind == "markdown")
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def bib_keys() -> set[str]:
    return set(BIB_KEY.findall((ROOT / "references.bib").read_text(encoding="utf-8")))


def cited_keys(text: str) -> set[str]:
    return {k.strip() for group in CITE.findall(text) for k in group.split(",")}


def banned_phrases(text: str) -> list[str]:
    return [m.group(0) for pat in BANNED for m in re.finditer(pat, text, re.I)]


def forward_steps(chapter: int, code: str) -> list[str]:
    """Steps named (as string literals) in ``code`` that a later chapter introduces."""
    return [s for s, ch in INTRODUCED.items()
            if ch > chapter and re.search(rf"[\"']{s}[\"']", code)]


def test_the_checks_catch_what_they_should():
    assert cited_keys("see {cite:p}`a2020x, b2021y` and {cite}`c`") == {"a2020x", "b2021y", "c"}
    assert banned_phrases("The issue that started this; our field notes. TODO") == [
        "field notes", "The issue that", "TODO"]
    assert banned_phrases("the warp could not issue; issue slots") == []
    assert forward_steps(5, 'step=Dropdown(options=["baseline", "fast_math"])') == ["fast_math"]
    assert forward_steps(6, 'source.step_diff("fast_math")') == []


def test_references_bib_has_entries():
    keys = bib_keys()
    assert {"dao2022flashattention", "zadouri2026flashattention4"} <= keys


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_every_citation_is_in_references_bib(path):
    text = "\n".join(src for kind, src, _ in _cells(path) if kind == "markdown")
    missing = cited_keys(text) - bib_keys()
    assert not missing, f"{path.name} cites keys missing from references.bib: {sorted(missing)}"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_no_words_about_how_the_book_was_made(path):
    found = banned_phrases(_prose(path))
    assert not found, f"{path.name}: {found}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_visible_code_names_no_later_step(path):
    chapter = int(path.name[:2])
    found = []
    for kind, src, tags in _cells(path):
        if kind == "code" and not HIDDEN & set(tags):
            found += forward_steps(chapter, src)
    assert not found, (f"{path.name} shows code with steps of later chapters: {found}; "
                       "say \"chapter N's `step`\" in the prose instead")


def later_steps_unannounced(chapter: int, markdown: str) -> list[str]:
    """Steps of later chapters named in a paragraph (as `step`) that does not say which
    chapter introduces them ("chapter 10's `arch_tuned`")."""
    out = []
    for para in re.split(r"\n\s*\n", markdown):
        for s, ch in INTRODUCED.items():
            if ch > chapter and re.search(rf"`{s}[`@']", para) and not re.search(
                    rf"[Cc]hapters?\s+(?:\d+(?:,\s*|\s+and\s+|\s*[–-]\s*))*{ch}\b", para):
                out.append(s)
    return out


def test_the_prose_check_catches_an_unannounced_step():
    assert later_steps_unannounced(3, "timed `arch_tuned`'s kernel") == ["arch_tuned"]
    assert later_steps_unannounced(3, "timed chapter 10's `arch_tuned`") == []
    assert later_steps_unannounced(5, "the `warp_groups` step (chapters 9 and 10)") == []
    assert later_steps_unannounced(10, "timed `arch_tuned`") == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_names_a_later_step_with_its_chapter(path):
    chapter = int(path.name[:2])
    text = "\n\n".join(src for kind, src, _ in _cells(path) if kind == "markdown")
    found = later_steps_unannounced(chapter, text)
    assert not found, f"{path.name}: later steps named without their chapter: {found}"


def _ends_with_an_expression(src: str) -> bool:
    """The cell's last statement is an expression (its value is displayed), not an assignment
    or a call whose value is dropped with ``_ =``."""
    import ast
    try:
        body = ast.parse(src).body
    except SyntaxError:
        return True                   # IPython magics: not this test's business
    return bool(body) and isinstance(body[-1], ast.Expr)


@pytest.mark.parametrize("path", [p for p in PAGES if p.suffix == ".ipynb"], ids=lambda p: p.name)
def test_figures_are_displayed_explicitly(path):
    """CI runs the notebooks with MPLBACKEND=Agg, where pyplot shows nothing by itself: a cell
    whose recorded output holds a figure must end with the figure (``fig``), or nbval finds the
    output missing there although it passes under Jupyter's inline backend."""
    nb = json.loads(path.read_text())
    bad = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
           and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))
           and not _ends_with_an_expression("".join(c["source"]))]
    assert not bad, f"{path.name}: cells {bad} show a figure without ending with it"


def test_intro_outline_names_every_page():
    """The intro's "How the book is organized" lists every page of _toc.yml: the numbered
    chapters as a numbered list of as many items, every other page as a link."""
    root = Path(__file__).resolve().parents[1]
    nb = json.loads((root / "book" / "intro.ipynb").read_text())
    md = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    outline = md[md.index("## How the book is organized"):]
    toc = (root / "_toc.yml").read_text()
    numbered = toc[toc.index("numbered: true"):].split("- caption:")[0]
    chapters = re.findall(r"file:\s*(\S+)", numbered)
    items = re.findall(r"^(\d+)\. ", outline, re.M)
    assert [int(i) for i in items[:len(chapters)]] == list(range(1, len(chapters) + 1))
    others = [f for f in re.findall(r"file:\s*(\S+)", toc) if f not in chapters]
    missing = [f for f in others if f.split("/")[-1] + "." not in outline]
    assert not missing, f"pages of _toc.yml not linked from the intro's outline: {missing}"


def later_steps_in_output(chapter: int, text: str) -> list[str]:
    """Steps of later chapters that an output shows by name: an identifier with an underscore
    anywhere (``arch_tuned``), a one-word name (``pair``) only as a whole label (a table cell or
    header, ``pair@...``, ``pair /``, ``pair:``), so that English ("a persistent grid") passes."""
    found = []
    for s, ch in INTRODUCED.items():
        if ch <= chapter:
            continue
        if "_" in s:
            pat = rf"(?<![\w-]){s}(?![\w-])"
        else:
            pat = rf">\s*{s}\s*<|(?<![\w-]){s}(?=@| /|:)|/ {s}(?![\w-])"
        if re.search(pat, text):
            found.append(s)
    return found


def test_the_output_check_catches_a_later_step():
    assert later_steps_in_output(9, "<th>arch_tuned / cuDNN</th>") == ["arch_tuned"]
    assert later_steps_in_output(8, "<td>pair</td>") == ["pair"]
    assert later_steps_in_output(8, "<th>persistent grid: call</th> a pair of tiles") == []
    assert later_steps_in_output(10, "<th>arch_tuned</th>") == []


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if 3 <= int(p.name[:2]) <= 9],
                         ids=lambda p: p.name)
def test_visible_outputs_name_no_later_step(path):
    """Chapters 3-9 speak only of what came before: the tables and printouts a reader sees (every
    output not removed from the page) name no step of a later chapter; a margin note may point
    ahead. Figures are checked through their code (legend labels come from the cell)."""
    chapter = int(path.name[:2])
    nb = json.loads(path.read_text(encoding="utf-8"))
    found = []
    for i, cell in enumerate(nb["cells"]):
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] != "code" or tags & {"remove-cell", "remove-output"}:
            continue
        for o in cell.get("outputs", []):
            if (o.get("metadata", {}).get("scrapbook") or {}).get("name"):
                continue                                  # a glued value: the prose quotes it
            data = {k: v for k, v in o.get("data", {}).items() if not k.startswith("image/")}
            text = json.dumps(data) + json.dumps(o.get("text", ""))
            found += [f"cell {i}: {s}" for s in later_steps_in_output(chapter, text)]
    assert not found, (f"{path.name} shows steps of later chapters in its outputs: {found}; "
                       "label them by what this chapter calls them (a margin note may link ahead)")
