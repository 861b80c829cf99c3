"""Issue 35: the library's shape in numbers: lines per module, comment density per module
(comment and docstring lines per code line), and ``duplicates`` on ``flashattn/``.
python experiments/library_report.py [ROOT]   (ROOT: a checkout, default this one)"""
import io
import pathlib
import subprocess
import sys
import tokenize

_LAYOUT = (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)


def counts(path):
    """(comment lines, docstring lines, code lines, total lines) of one file. A comment line holds
    only a comment; a docstring line is part of a string standing as a statement; a code line
    holds any other token (a line with code and a trailing comment is code)."""
    src = pathlib.Path(path).read_text()
    lines = src.splitlines()
    comment, doc, code = set(), set(), set()
    prev = None
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        if t.type == tokenize.COMMENT:
            if lines[t.start[0] - 1].strip().startswith("#"):
                comment.add(t.start[0])
        elif t.type == tokenize.STRING and (prev is None or prev.type in _LAYOUT):
            doc.update(range(t.start[0], t.end[0] + 1))
        elif t.type not in _LAYOUT:
            code.update(range(t.start[0], t.end[0] + 1))
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            prev = t
    return len(comment), len(doc), len(code - doc), len(lines)


def main(root="."):
    root = pathlib.Path(root).resolve()
    pkg = root / "flashattn"
    rows = [(str(p.relative_to(root)), *counts(p)) for p in sorted(pkg.rglob("*.py"))]
    print(f"{'module':44}{'lines':>6}{'code':>6}{'comm':>6}{'doc':>6}{'density':>8}")
    for name, c, d, k, n in rows:
        print(f"{name:44}{n:>6}{k:>6}{c:>6}{d:>6}{(c + d) / max(k, 1):>8.2f}")
    for label, sel in (("all of flashattn/", rows),
                       ("without interpret/", [r for r in rows if "/interpret/" not in r[0]])):
        c, d, k, n = (sum(r[i] for r in sel) for i in (1, 2, 3, 4))
        print(f"{label:44}{n:>6}{k:>6}{c:>6}{d:>6}{(c + d) / k:>8.2f}  ({len(sel)} modules)")
    over = [r for r in rows if r[4] > 500]
    print("modules over 500 lines:", ", ".join(f"{r[0]} ({r[4]})" for r in over) or "none")
    print("\n$ duplicates --repo flashattn --most 40")
    dup = subprocess.run(["duplicates", "--repo", str(pkg), "--most", "40", "--seconds", "120"],
                         capture_output=True, text=True)
    print(dup.stdout + dup.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:2])
