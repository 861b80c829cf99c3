"""Every measured number on the book's pages in ``book/`` comes from the recorded data.

Two checks, CPU only, a second or two:

1. **Typed numbers.** The prose of every page in ``book/`` and ``book/appendix/`` (Markdown pages,
   and the Markdown cells of notebook pages) may hold a number only where an entry of ``ALLOWED``
   covers it and says why
   it is not a measurement: a hardware limit, a software version, a chapter number, a tile shape
   that names a configuration. Code (fenced blocks, inline code, whose digits are masked), glue
   roles, cross-references, citations and link targets are not prose. A measured quantity
   (registers, bytes, percentages from a profile, SASS counts, TFLOPS, times) has no entry: it
   must be glued from the data, so a page cannot go stale by hand. Some entries also check the
   number they allow (a tile shape must be one the data hold, a chapter must exist, the driver a
   page names must be the recording's). The lab record in the appendix names where each number
   was measured: a length, batch, head dimension, split count, varlen mix or tile row is allowed
   only if the recorded data (``results/h200`` and every run in ``experiments/data``) hold it, a
   target only if the code that checks it holds it, and a prediction's numbers only inside its
   **Prediction.** paragraph.
2. **Glued numbers.** Notebook pages glue their values with ``flashbook.chapter.glue`` and quote
   them with ``{glue:text}`` roles. Every glued value must equal what ``results/h200`` gives now
   (the committed outputs are what the book renders: ``execute_notebooks`` is off), every role
   must name a glued key, and every key must have a known source. Keys name their datum:

   - ``p__STEP__METRIC``: the Nsight Compute metric of the step's kernel
     (``results/h200/profiles/summary.json``);
   - ``c__ARCH__STEP__FIELD``: a field of the step's compile report (``results/h200/compile/``);
   - ``pm__KEY[__KEY...]``: the profile summary's meta; ``cm__ARCH__KEY``: a compile report's meta;
   - anything else is arithmetic on those and must be in ``DERIVED``.

``python -m pytest tests/test_book_pages.py -o addopts=""``. To check a page's old text, pass its
path: ``BOOK_PAGES=/tmp/old/nsight_compute.md pytest tests/test_book_pages.py -o addopts=""``
scans those files instead of ``book/``.
"""
from __future__ import annotations

import ast
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
GPU = "h200"
GLUE_MIME = "application/papermill.record/text/plain"


# ---------------------------------------------------------------------------------------------
# The data
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data():
    from flashbook.data import results
    return results.load(GPU, root=ROOT / "results")


def _tile_shapes(r) -> set[str]:
    """Every M×N tile shape that the recorded data name (compile reports, tile grid, profiles)."""
    shapes = set()
    configs = list(r.compile.get("config", [])) + list(r.tile_grid.get("config", []))
    configs += [v.get("config", "") for v in r.profile_meta.get("per_step", {}).values()]
    for c in configs:
        m = re.match(r"(\d+)x(\d+)", str(c))
        if m:
            shapes.add(f"{m[1]}×{m[2]}")
    return shapes


_COORDS: dict = {}


def _coords(r) -> dict[str, set]:
    """The coordinates the recorded data hold: sequence lengths, batch sizes, head dims, split
    counts, varlen mixes (sequences, length), tile rows, tileiras versions, over the recorded
    dataset and every experiment run (``results.experiment``)."""
    if id(r) in _COORDS:
        return _COORDS[id(r)]
    frames = [r.bench] + [r.experiment(n) for n in r.experiments]
    c = {k: set() for k in ("N", "B", "D", "splits", "mix", "rows", "tileiras")}
    for df in frames:
        for col, key in (("Nq", "N"), ("Nk", "N"), ("B", "B"), ("D", "D"), ("num_splits", "splits")):
            if col in df:
                c[key] |= {int(v) for v in df[col].dropna().unique()}
        if "mix" in df:
            for m in df["mix"].dropna().unique():
                if (x := re.fullmatch(r"equal_(\d+)x(\d+)", str(m))):
                    c["mix"].add((int(x[1]), int(x[2])))
    c["rows"] = {int(s.split("×")[0]) for s in _tile_shapes(r)}
    runs = [json.loads(p.read_text()) for p in (ROOT / "experiments" / "data").glob("*/*.json")]
    metas = [r.meta] + [d.get("meta", {}) for d in runs if isinstance(d, dict)]
    c["tileiras"] = {str(m.get("tileiras")) for m in metas if m.get("tileiras")}
    _COORDS[id(r)] = c
    return c


def _length(text: str) -> int:
    return int(text[:-1]) * 1024 if text.endswith("K") else int(text)


def _check_coord(key, parse=int):
    """Every number in the match must be a ``key`` coordinate of the data (see ``_coords``)."""
    def check(m, r):
        have = _coords(r)[key]
        bad = [x for x in re.findall(r"\d+K?", m[0]) if parse(x) not in have]
        return f"{key} {bad} not in the recorded data" if bad else None
    return check


def _check_mix(m, r):
    n, length = int(m["n"]), _length(m["l"])
    return None if (n, length) in _coords(r)["mix"] else f"no varlen mix of {n} × {length} recorded"


def _check_sms(m, r):
    n = int(m["v"] or m["w"])
    have = int(r.meta.get("sm_count", -1))
    return None if n == have else f"{n} SMs, the recording's GPU has {have}"


def _check_tileiras(m, r):
    have = _coords(r)["tileiras"]
    bad = [v for v in re.findall(r"\d+\.\d+(?:\.\d+)?", m[0])
           if not any(v.startswith(h) or h.startswith(v) for h in have)]
    return f"tileiras {bad} never recorded (recordings ran {sorted(have)})" if bad else None


def _target_values() -> set[float]:
    """The thresholds of the project's targets, as the code that checks them holds them."""
    import inspect
    from flashbook.chapter import decode, gap
    vals = {float(t[3]) for t in gap.TARGETS}
    for v in re.findall(r"threshold=([\d.]+)", inspect.getsource(decode.targets)):
        vals |= {float(v), round(float(v) * 100, 6)}      # 0.8 is written "80 %"
    return vals


def _check_target(m, r):
    bad = [x for x in re.findall(r"\d+(?:\.\d+)?", m[0]) if float(x) not in _target_values()]
    return f"{bad} is no target of gap.TARGETS or decode.targets" if bad else None


def _check_peak(m, r):
    from flashbook.chapter import gap
    return None if float(m["v"]) == gap.PEAK_TFLOPS else f"peak {m['v']} != {gap.PEAK_TFLOPS}"


def _chapters() -> int:
    """The number of chapters in _toc.yml (the numbered part: notebooks/NN_*)."""
    return len(re.findall(r"file:\s*notebooks/\d+_", (ROOT / "_toc.yml").read_text()))


# ---------------------------------------------------------------------------------------------
# 1. Typed numbers
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Allow:
    """Numbers inside a match of ``pattern`` are not measurements, because of ``reason``.

    A space in ``pattern`` matches any whitespace (prose wraps). ``check(match, r)`` returns an
    error message when the number it allows is wrong, or None.
    """
    pattern: str
    reason: str
    check: Callable | None = None

    @property
    def regex(self) -> re.Pattern:
        return re.compile(self.pattern.replace(" ", r"\s+"))


def _check_shape(m, r):
    shape = re.sub(r"\s", "", m[0])
    return None if shape in _tile_shapes(r) else f"tile shape {shape} is not in the data"


def _check_chapter(m, r):
    n = _chapters()
    bad = [int(x) for x in re.findall(r"\d+", m[0]) if not 1 <= int(x) <= n]
    return f"no chapter {bad} (the toc has {n})" if bad else None


def _check_meta(key):
    def check(m, r):
        have = str(r.meta.get(key) or "")
        return None if have.startswith(m["v"]) else f"{key} {m['v']!r}, the data say {have!r}"
    return check


# Each entry: a phrase in which a number is not a measurement, and why. Keep it small and
# specific: a number that is measured must be glued from the data, not allowed here.
ALLOWED = (
    # Hardware facts (NVIDIA's specifications), not measurements of ours.
    Allow(r"(?:at most|limit is) 255", "the ISA's limit of registers per thread"),
    Allow(r"(?:at most 64 warps|percentage of 64|64-warp limit|maximum \(64 on Hopper\))",
          "Hopper's limit of 64 resident warps per SM"),
    Allow(r"65,536 registers", "the register file of one SM (64 K 32-bit registers)"),
    Allow(r"\(32 threads\)", "the warp size"),
    Allow(r"Four consecutive warps \(128 threads\)", "the definition of a warpgroup"),
    Allow(r"16 results per SM per clock", "MUFU throughput from the CUDA programming guide"),
    Allow(r"about 989 TFLOPS|about 3\.9 tera-operations|some 250 times|"
          r"At head dimension 128 each score costs \$4D = 512\$",
          "the preface's roofline: H100/H200 spec sheet peak and arithmetic on the specs"),
    Allow(r"95 % (?:confidence )?interval", "the confidence level of the book's intervals, a convention"),
    # Formulas and notation.
    Allow(r"\$4 \\cdot B \\cdot H \\cdot N\^2 \\cdot D / t\$|\$2 N\^2 D\$",
          "the FLOP count of attention (the throughput convention)"),
    Allow(r"\$2\^x\$|\$1/x\$", "the functions MUFU.EX2 and MUFU.RCP compute"),
    # Names, identifiers and configurations.
    Allow(r"FlashAttention-\d", "names of the FlashAttention papers"),
    Allow(r"x86-64", "a name of the CPU architecture"),
    Allow(r"\b\d{4}\.\d{5}\b", "arXiv identifiers"),
    Allow(r"\d+×\d+", "a tile shape naming a configuration (it must be one the data hold)",
          _check_shape),
    Allow(r"[Cc]hapters? \d+(?:(?:–|, | and )\d+)*", "chapter numbers (they must exist)",
          _check_chapter),
    Allow(r"stages 1–3", "refers to the numbered list of stages above it"),
    Allow(r"B = 4, H = 32, D = 128", "the seed's workload, a configuration"),
    Allow(r"with 32 query heads and 8 K/V heads, query heads 0–3 read K/V head 0|group size 1",
          "the glossary's example of grouped-query attention"),
    # Software versions and requirements (not measurements); the recording's own are checked.
    Allow(r"(?:CUDA|Python\*?\*?|cuda-tile(?:\[tileiras\])?|tileiras`?) (?:>= )?\d+(?:\.\d+)*"
          r"(?:\.x)?(?: or newer)?|13\.3 or newer|accepts 13\.2 to 13\.4|toolkit \(13\.0\)",
          "software versions that the book requires"),
    Allow(r"ran driver (?P<v>\d+(?:\.\d+)*)", "the recording's driver", _check_meta("driver")),
    Allow(r"torch (?P<v>\d+(?:\.\d+)*) built", "the recording's torch", _check_meta("torch")),
    Allow(r"built for CUDA (?P<v>\d+(?:\.\d+)*)", "the recording's CUDA", _check_meta("cuda")),
    Allow(r"Return code 5", "an error message quoted verbatim"),
    # The lab record (book/appendix/): where a measurement was taken and how, checked against the
    # data; the measurements themselves are glued like everywhere else.
    Allow(r"\b\d+K\b", "a sequence length (it must be one the data hold)",
          _check_coord("N", _length)),
    Allow(r"(?:\bN[kq]?|\$N\$)\s*=\s*\d+K?\b", "a sequence length (it must be one the data hold)",
          _check_coord("N", _length)),
    Allow(r"\bB\s*(?:=|≥)\s*\d+\b", "a batch size (it must be one the data hold)", _check_coord("B")),
    Allow(r"\bD\s*=\s*\d+\b", "a head dimension (it must be one the data hold)", _check_coord("D")),
    Allow(r"(?P<n>\d+) (?:×|sequences of|of) (?P<l>\d+K?)\b(?! heads)",
          "a varlen mix: sequences × length (it must be one the data hold)", _check_mix),
    Allow(r"\b\d+ splits\b|splits instead of \d+", "a split count (it must be one the data hold)",
          _check_coord("splits")),
    Allow(r"\b\d+-row (?:tiles?|one)\b|\b\d+ rows\b",
          "the rows of a tile shape (they must be a tile the data hold)", _check_coord("rows")),
    Allow(r"split counts of 1, 2, 4 and 8 waves|for 1 to 16 tiles per program|"
          r"with 1, 4 and 8 tiles per program",
          "the settings a sweep ran at (its design, not its result)"),
    Allow(r"\d+ (?:idle-start )?rounds|batches of about \d+ ms|a \d+ ms batch|\d+ ms of idle",
          "settings of a timing method (rounds, batch length, idle gap)"),
    Allow(r"\b[Ss]weep \d\b", "the name of an experiment run"),
    Allow(r"tileiras 13\.\d+(?:\.\d+)? against 13\.\d+(?:\.\d+)?|(?:[Ww]ith|writes) 13\.\d+\b(?!\.\d| or)",
          "the tileiras versions compared (they must be ones the data were compiled with)",
          _check_tileiras),
    Allow(r"\b(?P<v>\d+) SMs\b|\((?P<w>\d+) × occupancy \d+\)", "the SM count of the recording's GPU", _check_sms),
    Allow(r"the (?P<v>\d+) MB L2|(?P<w>\d+) W power limit",
          "the H200's datasheet: its L2 size and power limit"),
    Allow(r"dense fp16 peak \((?P<v>\d+) TFLOPS\)", "the datasheet peak the roofline uses",
          _check_peak),
    Allow(r"issues 16 operations per clock per SM and the FMA pipe 128",
          "MUFU and FMA throughput from the CUDA programming guide"),
    Allow(r"occupancy=#: 128 registers",
          "the register cap of two 256-thread programs per SM (65,536 / 512)"),
    Allow(r"(?:above|below|from|outside|reach|minus) 1\b(?![.,]\d)|\(1\.00: as fast",
          "parity: a ratio of 1 means as fast (a definition)"),
    Allow(r"\(5th to 95th percentile", "the percentiles a range is given between"),
    Allow(r"\*\*Prediction\.\*\*(?:(?!\s\s)[^*])*",
          "a prediction, written down before the measurement that tests it"),
    Allow(r"at least (?:\d+\.\d+×|\d+ % of the HBM peak)|≥ \d+(?:\.\d+)?(?:×| % of the HBM peak| targets)|"
          r"within \d+ % of the padded|headline target, \d+\.\d+×",
          "a project target (it must be one the code checks)", _check_target),
    Allow(r"here 2⁸; p ≤ 256|adding 1\.5·2²³", "the arithmetic of fp16's range and fp32 rounding"),
    Allow(r"\*i\*\+1|\*n\*−1−\*i\*", "the indices of causal pairing"),
)

NUMBER = re.compile(r"(?<![A-Za-z_\d.#])\d+(?:[.,]\d+)*")
FENCE = re.compile(r"^\s*(`{3,}|~{3,}|:{3,})\s*(\{[^}]*\})?\s*(.*)$")
CODE_DIRECTIVES = {"{code-cell}", "{code-block}", "{code}", "{sourcecode}", "{literalinclude}",
                   "{glue:figure}", "{math}", "{raw}", "{eval-rst}", "{bibliography}"}
ROLE_WITH_TITLE = re.compile(r"\{(?:doc|ref|numref|term|download)\}`([^`<]*?)\s*<[^`>]*>`")
ROLE = re.compile(r"\{[\w:+.-]+\}`[^`]*`")
INLINE_CODE = re.compile(r"(`+)((?:(?!\n\s*\n).)+?)\1", re.S)   # may wrap, not span paragraphs
LINK = re.compile(r"(!?)\[([^\]]*)\]\([^)\s]*(?:\s+\"[^\"]*\")?\)")
URL = re.compile(r"<https?://[^>]*>|https?://[^\s)>\]]+")


def prose(text: str) -> str:
    """``text`` (MyST Markdown) with everything that is not prose blanked; lines are kept, so line
    numbers stay right. Inline code keeps its letters (patterns may need them) with digits masked
    as ``#``; directive arguments (an admonition's title) and bodies stay: they are prose."""
    lines = text.split("\n")
    if lines and lines[0].strip() == "---":                       # front matter
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), 0)
        lines[:end + 1] = [""] * (end + 1)
    out, stack = [], []          # stack of open fences: (marker, is_code)
    for line in lines:
        m = FENCE.match(line)
        in_code = any(code for _, code in stack)
        if m and stack and m[1][0] == stack[-1][0][0] and len(m[1]) >= len(stack[-1][0]) \
                and not m[2] and not m[3]:
            stack.pop()                                             # a closing fence
            out.append("")
            continue
        if m and not in_code:
            marker, directive, arg = m[1], m[2], m[3]
            is_code = marker[0] != ":" and (directive is None or directive in CODE_DIRECTIVES)
            stack.append((marker, is_code))
            out.append("" if is_code else arg)
            continue
        if in_code:
            out.append("")
        elif stack and re.match(r"^\s*:[\w-]+:", line):             # a directive's option
            out.append("")
        else:
            out.append(line)
    text = "\n".join(out)
    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m[0].count("\n"), text, flags=re.S)
    text = re.sub(r"(?m)^\(.+\)=\s*$", "", text)                    # MyST targets
    text = re.sub(r"(?m)^%.*$", "", text)                           # MyST comments
    text = re.sub(r"(?m)^(\s*)\d+[.)](?=\s)", r"\1", text)          # numbered-list markers
    text = re.sub(r"\[\^[^\]]+\]", "", text)                        # footnote references
    text = re.sub(r"\{glue(?::\w+)?\}`[^`]*`", "GLUE", text)
    text = ROLE_WITH_TITLE.sub(lambda m: m[1], text)
    text = ROLE.sub("REF", text)
    text = INLINE_CODE.sub(lambda m: re.sub(r"\d", "#", m[2]), text)
    text = LINK.sub(lambda m: m[2], text)
    return URL.sub("URL", text)


def typed_numbers(text: str, r) -> list[tuple[int, str, str]]:
    """(line, number, why) for each number in the prose of ``text`` that no ALLOWED entry
    covers, or that an entry's check rejects."""
    clean = prose(text)
    flat = clean.replace("\n", " ")            # same length: offsets stay valid
    covered, problems = [], []
    for a in ALLOWED:
        for m in a.regex.finditer(flat):
            covered.append((m.start(), m.end()))
            if a.check is not None and (err := a.check(m, r)):
                problems.append((clean.count("\n", 0, m.start()) + 1, m[0], err))
    for m in NUMBER.finditer(flat):
        if not any(s <= m.start() and m.end() <= e for s, e in covered):
            line = clean.count("\n", 0, m.start()) + 1
            ctx = flat[max(0, m.start() - 40):m.end() + 40].strip()
            problems.append((line, m[0], f"typed by hand in “…{ctx}…”"))
    return sorted(problems)


def _book_files() -> list[Path]:
    return [p for folder in (BOOK, BOOK / "appendix") for ext in ("*.md", "*.ipynb")
            for p in sorted(folder.glob(ext))]


def book_pages() -> list[Path]:
    """The pages to scan: ``book/*.md``, ``book/*.ipynb`` and the lab record in
    ``book/appendix/``, or ``$BOOK_PAGES`` (paths separated by ``os.pathsep``) to check other
    text, e.g. a page's old version."""
    env = os.environ.get("BOOK_PAGES")
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return _book_files()


def markdown_parts(page: Path) -> list[tuple[str, str]]:
    """(where, Markdown text) of a page: the file, or each Markdown cell of a notebook."""
    if page.suffix == ".ipynb":
        nb = json.loads(page.read_text(encoding="utf-8"))
        return [(f"{page.name} cell {i}", "".join(c["source"]))
                for i, c in enumerate(nb["cells"]) if c["cell_type"] == "markdown"]
    return [(page.name, page.read_text(encoding="utf-8"))]


def _page_id(p: Path) -> str:
    return f"appendix/{p.name}" if p.parent.name == "appendix" else p.name


@pytest.mark.parametrize("page", book_pages(), ids=_page_id)
def test_no_typed_measurements(page, data):
    problems = [f"{where}, line {line}: {num!r}: {why}"
                for where, text in markdown_parts(page)
                for line, num, why in typed_numbers(text, data)]
    assert not problems, (
        f"{page.name} quotes numbers that do not come from the data. Glue measured values "
        f"from results/{GPU} (flashbook.chapter.glue + {{glue:text}}); add a non-measurement to "
        f"ALLOWED in {Path(__file__).name} with its reason.\n  " + "\n  ".join(problems))


def test_prose_extraction():
    """What the scan sees and what it skips."""
    text = "\n".join([
        "(label)=",
        "# Title 7",
        "1. item with 3 things, `--launch-count 1` and {glue:text}`p__baseline__x:.1f` %",
        "See [chapter 5](../notebooks/05_x.ipynb) and {doc}`the trap <../notebooks/05_x>`.",
        "```bash",
        "ncu --launch-count 1",
        "```",
        ":::{admonition} Return code 9",
        ":class: warning",
        "body 42",
        ":::",
        "<!-- 17 -->",
        "% a comment, 18",
    ])
    lines = prose(text).split("\n")
    assert len(lines) == 13
    assert [NUMBER.findall(x) for x in lines] == [[], ["7"], ["3"], ["5"], [], [], [], ["9"], [],
                                                  ["42"], [], [], []]


def test_allowed_entries_are_used():
    """No dead entries: every ALLOWED phrase occurs on some page (of book/, not $BOOK_PAGES)."""
    texts = [prose(t).replace("\n", " ") for p in _book_files() for _, t in markdown_parts(p)]
    unused = [a.pattern for a in ALLOWED if not any(a.regex.search(t) for t in texts)]
    assert not unused, f"ALLOWED entries that no page uses (remove them): {unused}"


# ---------------------------------------------------------------------------------------------
# 2. Glued numbers
# ---------------------------------------------------------------------------------------------
def _profile_row(r, step):
    rows = r.profile[r.profile["step"] == step]
    assert len(rows) == 1, f"{len(rows)} profiled kernels for step {step!r} (want one)"
    return rows.iloc[0]


def _compile_row(r, arch, step):
    rows = r.compile[(r.compile["arch"] == arch) & (r.compile["step"] == step)]
    assert len(rows) == 1, f"{len(rows)} compiled kernels for {arch} {step!r} (want one)"
    return rows.iloc[0]


def _metric(r, step, metric):
    return _profile_row(r, step)[metric]


JOURNEY_WORKLOAD = "fp16-causal-d128"       # the first page's workload: B=4 H=32 D=128 causal


def _journey_ns(r) -> list[int]:
    return sorted(int(n) for n in r.bench.loc[r.bench["workload"] == JOURNEY_WORKLOAD, "Nq"])


def _journey_row(r, step):
    """The recorded row of ``step`` at the longest N of the first page's workload."""
    row = r.row(step, max(_journey_ns(r)), JOURNEY_WORKLOAD)
    assert row is not None, f"no row for {step!r} at the longest N of {JOURNEY_WORKLOAD}"
    return row


def _fmt_n(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _source_line(r) -> str:
    from flashbook.data.results import source_line
    return source_line(r.meta)


# Glue keys whose value is arithmetic on the data: key -> value from the dataset. Each must be
# what the page's hidden cell computes.
DERIVED: dict[str, Callable] = {
    # one warp's registers: allocated registers per thread x the warp's 32 threads
    "nc_bl_warp_regs": lambda r: 32 * _metric(r, "baseline",
                                              "launch__registers_per_thread_allocated"),
    # warps that fit in the 65,536-register file of an SM
    "nc_bl_warps_fit": lambda r: 65536 // DERIVED["nc_bl_warp_regs"](r),
    "nc_bl_smem_kib": lambda r: _metric(r, "baseline",
                                        "launch__shared_mem_per_block_static") / 1024,
    "nc_lt_local_gb": lambda r: (_metric(r, "large_tiles",
                                         "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum")
                                 + _metric(r, "large_tiles",
                                           "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")) / 1e9,
    "nc_lt_dram_write_gb": lambda r: _metric(r, "large_tiles", "dram__bytes_write.sum") / 1e9,
    "nc_bl_dram_write_gb": lambda r: _metric(r, "baseline", "dram__bytes_write.sum") / 1e9,
    # The first page (intro.ipynb): the default workload's benchmark at its shortest and longest
    # N, read from the recorded rows (tflops, ratio_cudnn[_lo|_hi]) and the recording's meta.
    "intro_n_short": lambda r: _fmt_n(min(_journey_ns(r))),
    "intro_n_long": lambda r: _fmt_n(max(_journey_ns(r))),
    "intro_base_tflops": lambda r: _journey_row(r, "baseline")["tflops"],
    "intro_trap_tflops": lambda r: _journey_row(r, "large_tiles")["tflops"],
    "intro_final_tflops": lambda r: _journey_row(r, "warp_groups")["tflops"],
    "intro_final_gain": lambda r: (_journey_row(r, "warp_groups")["tflops"]
                                   / _journey_row(r, "baseline")["tflops"]),
    "intro_final_ratio": lambda r: _journey_row(r, "warp_groups")["ratio_cudnn"],
    "intro_final_lo": lambda r: _journey_row(r, "warp_groups")["ratio_cudnn_lo"],
    "intro_final_hi": lambda r: _journey_row(r, "warp_groups")["ratio_cudnn_hi"],
    "intro_source": lambda r: _source_line(r),
    "intro_rounds": lambda r: r.bench_meta[JOURNEY_WORKLOAD]["method"]["rounds"],
}


def expected_value(key: str, r):
    """What the data give for glue key ``key`` (see the module docstring for the names)."""
    parts = key.split("__")
    if parts[0] == "p" and len(parts) >= 3:
        return _metric(r, parts[1], "__".join(parts[2:]))
    if parts[0] == "c" and len(parts) == 4:
        return _compile_row(r, parts[1], parts[2])[parts[3]]
    if parts[0] in ("pm", "cm") and len(parts) >= 2:
        v = r.profile_meta if parts[0] == "pm" else r.compile_meta
        for p in parts[1:]:
            v = v[p]
        return v
    if key in DERIVED:
        return DERIVED[key](r)
    raise KeyError(f"glue key {key!r} has no known source: name it p__/c__/pm__/cm__ or add it "
                   f"to DERIVED")


def glued_values(nb: dict) -> dict[str, object]:
    """key -> value of every ``glue`` output in a notebook."""
    out = {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            name = (o.get("metadata", {}).get("scrapbook") or {}).get("name")
            if name is None:
                continue
            assert GLUE_MIME in o.get("data", {}), f"glue {name!r} has no text/plain value"
            text = o["data"][GLUE_MIME]
            text = "".join(text) if isinstance(text, list) else text
            out[name] = ast.literal_eval(text)
    return out


GLUE_ROLE = re.compile(r"\{glue(?::(\w+))?\}`([^`]+)`")


def glue_roles(nb: dict) -> list[tuple[str, str | None]]:
    """(key, format spec or None) of every glue role in the Markdown cells."""
    roles = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        for kind, content in GLUE_ROLE.findall("".join(cell["source"])):
            key, spec = content, None
            if kind == "text" and ":" in content:
                key, spec = content.rsplit(":", 1)
            roles.append((key, spec))
    return roles


def _same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b) or abs(float(a) - float(b)) <= 1e-12 * max(abs(float(b)), 1)
    return a == b


# The glue-source check covers the pages in book/ itself; the appendix glues its values under
# chapter-style keys, and nbval rebuilds them from the data (the notebooks test).
NOTEBOOK_PAGES = [p for p in book_pages() if p.suffix == ".ipynb" and p.parent.name != "appendix"]


@pytest.mark.skipif(not NOTEBOOK_PAGES, reason="no notebook pages in book/")
@pytest.mark.parametrize("page", NOTEBOOK_PAGES, ids=_page_id)
def test_glued_values_are_the_data(page, data):
    nb = json.loads(page.read_text(encoding="utf-8"))
    glued = glued_values(nb)
    assert glued, f"{page.name} glues nothing: execute it (jupyter execute --inplace)"
    wrong = []
    for key, value in glued.items():
        try:
            want = expected_value(key, data)
        except (KeyError, AssertionError) as e:
            wrong.append(f"{key}: {e}")
            continue
        if hasattr(want, "item"):
            want = want.item()
        if not _same(value, want):
            wrong.append(f"{key}: the page says {value!r}, the data give {want!r}")
    assert not wrong, (f"{page.name}: glued values that are not the data (re-execute the page, "
                       f"or fix its hidden cell):\n  " + "\n  ".join(wrong))


@pytest.mark.skipif(not NOTEBOOK_PAGES, reason="no notebook pages in book/")
@pytest.mark.parametrize("page", NOTEBOOK_PAGES, ids=_page_id)
def test_glue_roles_name_glued_keys(page):
    nb = json.loads(page.read_text(encoding="utf-8"))
    glued = glued_values(nb)
    roles = glue_roles(nb)
    missing = sorted({k for k, _ in roles if k not in glued})
    assert not missing, f"{page.name}: glue roles without a glued value: {missing}"
    for key, spec in roles:
        if spec:
            format(glued[key], spec)     # raises if the spec does not fit the value
    unused = sorted(set(glued) - {k for k, _ in roles})
    assert not unused, f"{page.name}: glued but never quoted: {unused}"


def test_book_pages_in_toc():
    """Every page in book/ is in _toc.yml (a page outside it is not built, and not checked)."""
    toc = (ROOT / "_toc.yml").read_text()
    pages = {p.relative_to(BOOK).with_suffix("").as_posix() for p in _book_files()}
    missing = sorted(p for p in pages
                     if not re.search(rf"(?:file|root):\s*book/{p}\s*$", toc, re.M))
    assert not missing, f"pages in book/ missing from _toc.yml: {missing}"


def test_lab_record_allowances_are_checked(data):
    """The appendix's allowances take coordinates the data hold and nothing else; a prediction's
    numbers are allowed up to the end of its paragraph, not beyond."""
    def flagged(text):
        return [num for _, num, _ in typed_numbers(text, data)]
    assert flagged("At B=8 and 32K, at N=4096 and D=256, 32 × 1K, 16 splits, 132 SMs.") == []
    assert sorted(flagged("At B=3 and 3K, N=3000, D=96, 5 × 1K, 7 splits, 100 SMs.")) == sorted(
        ["B=3", "3K", "N=3000", "D=96", "5 × 1K", "7 splits", "100 SMs"])
    assert flagged("the kernel ran 12 % faster at 4K") == ["12"]
    assert flagged("**Prediction.** A gain of +2–5 % at 1K.\n\nIt gained 7 %.") == ["7"]
    assert flagged("tileiras 13.5 against 13.4; at least 1.10× at 16K") == []
    assert flagged("tileiras 13.9 against 13.4; at least 1.25× at 16K") == [
        "at least 1.25×", "tileiras 13.9 against 13.4"]
