"""The book builds without warnings, and its pages render in a real browser.

Slow (a full Sphinx build, then headless Chromium): run with ``pytest -m slow tests/test_book.py``.
The build uses the committed notebook outputs (``execute_notebooks: "off"``), so no GPU is needed.
The browser tests need ``chromium`` (Debian: ``apt-get install -y chromium``) and skip without it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"
SHOTS = ROOT / "_build" / "screenshots"

# The chapter page the browser test opens, and the title it must show.
CHAPTER = "notebooks/05_large_tile_trap"
CHAPTER_TITLE = "The large-tile trap"
BOOK_TITLE = "FlashAttention in cuTile"


def _jupyter_book_cmd() -> list[str]:
    """The jupyter-book of this interpreter's environment (jupyter_book has no __main__)."""
    exe = Path(sys.executable).with_name("jupyter-book")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("jupyter-book")
    if found:
        return [found]
    return [sys.executable, "-c", "from jupyter_book.cli.main import main; main()"]


@pytest.fixture(scope="module")
def build() -> subprocess.CompletedProcess:
    """Build the book once into the repository's _build/ with warnings as errors."""
    pytest.importorskip("jupyter_book")
    proc = subprocess.run(
        [*_jupyter_book_cmd(), "build", ".", "-W", "-n", "--keep-going"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )
    return proc


def test_book_builds_without_warnings(build):
    out = build.stdout + build.stderr
    assert build.returncode == 0, f"jupyter-book build failed:\n{out[-6000:]}"
    warnings = [ln for ln in out.splitlines() if "WARNING" in ln]
    assert not warnings, "build warnings:\n" + "\n".join(warnings[:50])
    assert (HTML / "index.html").exists()
    assert (HTML / f"{CHAPTER}.html").exists()


# --- Headless browser -------------------------------------------------------------------------

def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium_args(profile: str) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", f"--user-data-dir={profile}"]


def _resolve_redirect(page: Path) -> Path:
    """Follow a meta-refresh page (Jupyter Book writes index.html as one) to its target."""
    m = re.search(r'http-equiv="Refresh"\s+content="\d+;\s*url=([^"]+)"',
                  page.read_text(encoding="utf-8"), re.IGNORECASE)
    return (page.parent / m.group(1)).resolve() if m else page


def _run_chromium(*args: str) -> subprocess.CompletedProcess:
    exe = _chromium()
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run([exe, *_chromium_args(profile), *args],
                              capture_output=True, text=True, timeout=180)


# Headless Chromium captures the window, not the page: the full-page shot sizes the window to the
# page's height (measured first), at half scale so a long chapter stays under the compositor's
# 16384-pixel limit. MathJax runs inside the virtual-time budget, so the shot shows rendered math.
WIDTH, MAX_PX, BUDGET_MS = 1280, 16000, "8000"


def _page_height(page: Path) -> int:
    """The rendered page's height in CSS pixels, read back through its title by a copy of the
    page (same folder, so its scripts and styles load) with a one-line script added."""
    probe = page.with_name(f".height-probe-{page.name}")
    script = ("<script>window.addEventListener('load', () => setTimeout(() => {"
              "document.title = 'H=' + document.documentElement.scrollHeight; }, 1500));"
              "</script>")
    html = page.read_text(encoding="utf-8")
    probe.write_text(html.replace("</body>", script + "</body>", 1), encoding="utf-8")
    try:
        proc = _run_chromium(f"--virtual-time-budget={BUDGET_MS}", f"--window-size={WIDTH},1600",
                             "--dump-dom", probe.as_uri())
    finally:
        probe.unlink(missing_ok=True)
    m = re.search(r"<title>H=(\d+)</title>", proc.stdout)
    return int(m.group(1)) if m else 1600


def _screenshot(page: Path, name: str) -> Path:
    """Two captures: ``name.png``, the top 1600 px at full scale (what a reader sees first), and
    ``name.full.png``, the whole page at half scale (math, figures and diagrams included)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    png = SHOTS / f"{name}.png"
    full = SHOTS / f"{name}.full.png"
    for p in (png, full):
        p.unlink(missing_ok=True)
    proc = _run_chromium(f"--screenshot={png}", f"--window-size={WIDTH},1600",
                         f"--virtual-time-budget={BUDGET_MS}", "--hide-scrollbars", page.as_uri())
    assert png.exists(), f"no screenshot written for {page}:\n{proc.stderr[-3000:]}"
    height = _page_height(page)
    scale = min(0.5, MAX_PX / max(height, 1))
    proc = _run_chromium(f"--screenshot={full}", f"--window-size={WIDTH},{height}",
                         f"--force-device-scale-factor={scale:.3f}",
                         f"--virtual-time-budget={BUDGET_MS}", "--hide-scrollbars", page.as_uri())
    assert full.exists(), f"no full-page screenshot written for {page}:\n{proc.stderr[-3000:]}"
    return png


def _dump_dom(page: Path) -> str:
    proc = _run_chromium("--virtual-time-budget=5000", "--dump-dom", page.as_uri())
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _has_image_output(notebook: Path) -> bool:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data or "image/svg+xml" in data:
                return True
    return False


needs_chromium = pytest.mark.skipif(
    _chromium() is None,
    reason="chromium not installed (apt-get install -y chromium); headless page checks skipped",
)


@needs_chromium
def test_front_page_renders(build):
    assert build.returncode == 0, "book build failed; see test_book_builds_without_warnings"
    page = _resolve_redirect(HTML / "index.html")
    assert page.exists(), page
    png = _screenshot(page, "index")
    assert png.stat().st_size > 10_000, f"{png} is suspiciously small ({png.stat().st_size} B)"
    dom = _dump_dom(page)
    assert BOOK_TITLE in dom
    assert "How we measure" in dom


@needs_chromium
def test_chapter_page_renders(build):
    assert build.returncode == 0, "book build failed; see test_book_builds_without_warnings"
    page = HTML / f"{CHAPTER}.html"
    assert page.exists(), page
    png = _screenshot(page, Path(CHAPTER).name)
    assert png.stat().st_size > 10_000, f"{png} is suspiciously small ({png.stat().st_size} B)"
    dom = _dump_dom(page)
    assert CHAPTER_TITLE in dom, f"chapter title {CHAPTER_TITLE!r} not on the page"
    # Figures are required only once the notebook carries image outputs (placeholders have none).
    if _has_image_output(ROOT / f"{CHAPTER}.ipynb"):
        assert "<img" in dom, "the notebook has image outputs but the page shows no <img>"


def _toc_pages() -> list[str]:
    """Every document of _toc.yml (root first), as paths without suffix."""
    import yaml
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    pages = [toc["root"]]
    for part in toc.get("parts", []):
        pages += [c["file"] for c in part.get("chapters", [])]
    return pages


@needs_chromium
def test_render_probe_reads_listings_groups_and_intervals(tmp_path):
    """The probe on a page made for it, with the book's own book.css and wrap-code.js in a narrow
    column: an indented comment-only line and a deep continuation line that wrap keep their
    source columns; a multi-index group gets its rule and an interval cell at most two lines.
    The same table without book.css reports the group and the tower. (No book build needed.)"""
    static = ROOT / "book" / "_static"
    comment = "# Every row sees key 0, " + "and the comment goes on " * 4
    listing = ("<span class='k'>for</span> j <span class='ow'>in</span> range(n):\n"
               f"    x = 1            <span class='c1'># [TILE_M, TILE_N] {'shape ' * 8}</span>\n"
               f"    <span class='c1'>{comment}</span>\n"
               f"    y = f(a,\n{' ' * 20}b_long_argument_name_that_does_not_fit)\n")
    table = ("<table><tbody><tr><th rowspan='2'>decode</th><td>no</td><td style='width:3em'>"
             "0.84 [0.84, 0.84]</td></tr><tr><td>yes</td><td>1</td></tr>"
             "<tr><th rowspan='2'>decode_paged64</th><td>no</td><td>2</td></tr>"
             "<tr><td>yes</td><td>3</td></tr></tbody></table>")

    def page(name, styled):
        head = (f"<link rel='stylesheet' href='{(static / 'book.css').as_uri()}'>"
                f"<script src='{(static / 'wrap-code.js').as_uri()}'></script>") if styled else ""
        p = tmp_path / name
        p.write_text(f"<html><head>{head}</head><body><main><article class='bd-article' "
                     f"style='width:330px;font-family:monospace'>"
                     f"<div class=\"highlight\"><pre>{listing}</pre></div>"
                     f"<div style='width:160px'>{table}</div></article></main></body></html>",
                     encoding="utf-8")
        return p
    styled = page("styled.html", True)
    rep = render_report(styled)
    assert listing_problems(styled, rep) == [], rep["listings"]
    assert rep["groups"] == [] and rep["towers"] == [], rep
    bare = render_report(page("bare.html", False))
    assert len(bare["groups"]) == 1 and len(bare["towers"]) == 1, bare


@needs_chromium
@pytest.mark.parametrize("doc", _toc_pages())
def test_math_renders_offline(build, doc):
    """MathJax is served from the built book (sphinx-mathjax-offline), so the math renders on a
    machine with no network: no page keeps an unrendered TeX delimiter, and a page whose source
    has math shows MathJax output. Each page is also screenshotted into _build/screenshots/."""
    assert build.returncode == 0, "book build failed; see test_book_builds_without_warnings"
    page = HTML / f"{doc}.html"
    assert page.exists(), page
    html = page.read_text(encoding="utf-8")
    assert "cdn.jsdelivr.net/npm/mathjax" not in html, "MathJax still comes from a CDN"
    dom = _dump_dom(page)
    body = dom.split("<body", 1)[-1]
    text = re.sub(r"<(script|style)\b.*?</\1>", "", body, flags=re.S)
    assert "\\(" not in text and "\\[" not in text, f"{doc}: unrendered TeX delimiters"
    has_math = 'class="math' in html
    if has_math:
        assert "<mjx-container" in dom, f"{doc}: the page has math but MathJax rendered none"
    _screenshot(page, doc.replace("/", "__"))


# --- Everything fits the column (issue 22, item 3) --------------------------------------------

PROBE_JS = Path(__file__).with_name("render_probe.js")
# What the probe reports, and what each kind of problem means to a reader.
RENDER_PROBLEMS = {
    "merror": "MathJax errors (the TeX source shown instead of the formula)",
    "math": "equations wider than the column (clipped or scrolling)",
    "rawtex": "raw TeX on the page",
    "code": "code blocks wider than the column (the ends of lines hidden)",
    "tables": "tables wider than the page",
    "towers": "interval cells wrapped into towers (more than two lines)",
    "groups": "multi-index groups with no rule above them",
    "broken_images": "images that did not load",
}


def source_listings(page: Path) -> list[list[int | None]]:
    """The indentation (leading spaces; None for a blank line) of every line of every highlighted
    code block of a built page, read from its HTML as written (before book/_static's scripts),
    in the order ``document.querySelectorAll("div.highlight pre")`` finds them."""
    import html as _html
    out = []
    for body in re.findall(r'<div class="highlight"><pre>(.*?)</pre>', page.read_text(encoding="utf-8"),
                           re.S):
        lines = _html.unescape(re.sub(r"<[^>]+>", "", body)).split("\n")
        if lines and not lines[-1]:
            lines.pop()
        out.append([len(ln) - len(ln.lstrip(" ")) if ln.strip() else None for ln in lines])
    return out


def listing_problems(page: Path, report: dict) -> list[str]:
    """Lines of the page's code blocks shown at another column than the source's indentation
    (the render probe's ``listings``, measured on the screen, against ``source_listings``)."""
    src, shown = source_listings(page), report.get("listings", [])
    if len(src) != len(shown):
        return [f"{len(src)} code blocks in the HTML, {len(shown)} on the screen"]
    bad = []
    for b, (want, got) in enumerate(zip(src, shown)):
        if len(want) != len(got):
            bad.append(f"block {b}: {len(want)} lines in the source, {len(got)} shown")
            continue
        bad += [f"block {b} line {i + 1}: indented {w}, shown at column {g}"
                for i, (w, g) in enumerate(zip(want, got))
                if w is not None and g is not None and w != g]     # None: not laid out (hidden)
    return bad


def page_notebook(doc: str) -> Path | None:
    """The notebook a toc page is built from (None for a Markdown page)."""
    nb = ROOT / f"{doc}.ipynb"
    return nb if nb.exists() else None


def render_report(page: Path, width: int = WIDTH) -> dict:
    """Open a copy of ``page`` (same folder, so its scripts and styles load) with
    ``tests/render_probe.js`` added, in a ``width``-pixel window, and return the probe's report
    (a dict: a list per key of RENDER_PROBLEMS, and page_height in CSS pixels)."""
    probe = page.with_name(f".render-probe-{page.name}")
    script = f"<script>{PROBE_JS.read_text(encoding='utf-8')}</script>"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", script + "</body>", 1),
                     encoding="utf-8")
    try:
        proc = _run_chromium("--virtual-time-budget=15000", f"--window-size={width},1600",
                             "--dump-dom", probe.as_uri())
    finally:
        probe.unlink(missing_ok=True)
    body = proc.stdout.rsplit("</script>", 1)[-1]            # after the probe's own source
    m = re.search(r'<pre id="render-report"[^>]*>(.*?)</pre>', body, re.S)
    assert m, f"{page.name}: the render probe wrote no report:\n{proc.stderr[-3000:]}"
    import html as _html
    return json.loads(_html.unescape(m.group(1)))


def render_problems(report: dict) -> list[str]:
    """One line per problem found, grouped by kind ('' when the page is clean)."""
    lines = []
    for key, what in RENDER_PROBLEMS.items():
        found = report.get(key, [])
        if found:
            lines.append(f"{len(found)} {what}:")
            lines += [f"    {item}" for item in found[:12]]
    return lines


@needs_chromium
def test_render_probe_finds_overflow(tmp_path):
    """The probe itself: a page with a wide code line, a wide table and raw TeX in the text is
    reported on each count; a page whose code and table fit is clean. (No book build needed.)"""
    wide = "x = 1  # " + "shape comment " * 30
    cells = "".join(f"<td>column_number_{i}</td>" for i in range(40))
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<html><body><main><article class='bd-article' style='width:600px'>"
        f"<div class='highlight'><pre>{wide}</pre></div>"
        f"<div><table><tr>{cells}</tr></table></div>"
        r"<p>the tile width \text{TILE\_N} as typed</p>"
        "</article></main></body></html>", encoding="utf-8")
    rep = render_report(bad)
    assert len(rep["code"]) == 1 and len(rep["tables"]) == 1 and len(rep["rawtex"]) == 1, rep
    good = tmp_path / "good.html"
    good.write_text(
        "<html><body><main><article class='bd-article' style='width:600px'>"
        "<div class='highlight'><pre>x = 1  # [TILE_M, D]</pre></div>"
        "<div><table><tr><td>1</td><td>2</td></tr></table></div><p>plain text</p>"
        "</article></main></body></html>", encoding="utf-8")
    assert render_problems(render_report(good)) == []


@needs_chromium
@pytest.mark.parametrize("doc", _toc_pages())
def test_page_fits_the_column(build, doc):
    """Every page of the book, in a 1280-pixel window (the book's layout with both sidebars):
    no MathJax error, no equation, code block or table wider than the column, no raw TeX. The
    DOM shows it after MathJax and book/_static's scripts have run (render_probe.js)."""
    assert build.returncode == 0, "book build failed; see test_book_builds_without_warnings"
    page = HTML / f"{doc}.html"
    assert page.exists(), page
    rep = render_report(page)
    problems = render_problems(rep)
    problems += [f"listing {p}" for p in listing_problems(page, rep)[:12]]
    nb = page_notebook(doc)
    if nb is not None:
        from test_figures import stored_images
        want = stored_images(json.loads(nb.read_text(encoding="utf-8")))
        if rep["images"] != want:
            problems.append(f"{rep['images']} images on the page, the notebook stores {want}")
    assert not problems, f"{doc} does not fit the page:\n" + "\n".join(problems)


# Chapters whose kernel listings the narrow-window check reads (issue 34, item 2).
LISTING_PAGES = ["notebooks/03_first_kernel", "notebooks/11_backward", "notebooks/12_decoding",
                 "book/final_kernel"]


@needs_chromium
@pytest.mark.parametrize("width", [1280, 900])
@pytest.mark.parametrize("doc", LISTING_PAGES)
def test_listings_keep_their_indentation(build, doc, width):
    """Every line of a kernel listing starts at its source column on the screen, also where the
    window is narrow and lines wrap (a wrapped line continues on a hanging indent)."""
    page = HTML / f"{doc}.html"
    assert page.exists(), page
    bad = listing_problems(page, render_report(page, width))
    assert not bad, f"{doc} at {width} px: lines off their indentation:\n  " + "\n  ".join(bad[:30])
