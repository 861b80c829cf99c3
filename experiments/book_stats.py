"""Per chapter: words (before the Summary, and in all), tables and figures, as a reader sees them.
python experiments/book_stats.py [--markdown]

Words are the Markdown cells' prose (code blocks, directives' options, HTML comments and glue
roles' keys not counted; a glued value counts as one word). Tables are table outputs of shown
cells plus the Markdown pipe tables; figures are the image outputs of shown cells plus the
Markdown images and figure directives. Cells tagged ``remove-cell`` are not seen, so not counted.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = {"remove-cell"}
NO_OUTPUT = {"remove-cell", "remove-output"}
IMAGES = ("image/png", "image/svg+xml", "image/jpeg")
SUMMARY = re.compile(r"^#{2,3}\s+Summary\s*$", re.M)


def _text(v) -> str:
    return "".join(v) if isinstance(v, list) else (v or "")


def prose_words(md: str) -> int:
    md = re.sub(r"<!--.*?-->", " ", md, flags=re.S)
    md = re.sub(r"^(```|~~~).*?^\1\s*$", " ", md, flags=re.S | re.M)      # fenced code
    md = re.sub(r"^\s*:[\w-]+:.*$", " ", md, flags=re.M)                  # directive options
    md = re.sub(r"\{glue(?::\w+)?\}`[^`]*`", " X ", md)                    # a glued value: a word
    md = re.sub(r"\{\w+\}`([^`<]*)(?:<[^`]*>)?`", r" \1 ", md)            # roles: their text
    md = re.sub(r"\]\([^)]*\)", "]", md)                                   # link targets
    return len(re.findall(r"[\w$\\][\w'’.,:;%×$\\^{}()+/=-]*", md))


def markdown_tables(md: str) -> int:
    return len(re.findall(r"^\s*\|?[\s:-]*-{3,}[\s:|-]*\|[\s:|-]*$", md, re.M))


def markdown_figures(md: str) -> int:
    return len(re.findall(r"!\[[^\]]*\]\(|^:{3,}\s*\{(?:figure|image)\}", md, re.M))


def stats(path: Path) -> dict:
    nb = json.loads(path.read_text(encoding="utf-8"))
    words_before = words = tables = figures = 0
    seen_summary = False
    title = ""
    for cell in nb["cells"]:
        tags = set(cell.get("metadata", {}).get("tags", []))
        if tags & HIDDEN:
            continue
        if cell["cell_type"] == "markdown":
            md = _text(cell["source"])
            if not title and (m := re.search(r"^#\s+(.+)$", md, re.M)):
                title = m.group(1).strip()
            m = SUMMARY.search(md)
            if m and not seen_summary:
                words_before += prose_words(md[:m.start()])
                seen_summary = True
            elif not seen_summary:
                words_before += prose_words(md)
            words += prose_words(md)
            tables += markdown_tables(md)
            figures += markdown_figures(md)
        elif cell["cell_type"] == "code" and not tags & NO_OUTPUT:
            for o in cell.get("outputs", []):
                data = o.get("data", {})
                if any(k in data for k in IMAGES):
                    figures += 1
                elif "<table" in _text(data.get("text/html")):
                    tables += 1
    return {"chapter": path.stem, "title": title, "words before summary": words_before,
            "words": words, "tables": tables, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rows = [stats(p) for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))]
    cols = ["chapter", "words before summary", "words", "tables", "figures"]
    if "--markdown" in argv:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    else:
        print(f"{'chapter':28s} {'words<summary':>13s} {'words':>6s} {'tables':>6s} {'figures':>7s}")
        for r in rows:
            print(f"{r['chapter']:28s} {r['words before summary']:13d} {r['words']:6d} "
                  f"{r['tables']:6d} {r['figures']:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
