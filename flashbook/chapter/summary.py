"""Chapter 15 (the summary): the journey in one table, the Hopper ladder beside the seed's B200 steps, the
other workloads, and the two power regimes of the H200.

    from flashbook.chapter import summary
    summary.journey_table(r, (1024, 16384))          # chapter, step: TFLOPS, x cuDNN [95 % CI]
    summary.ladder_vs_seed(r, results.seed_b200())   # each change over the one before, both GPUs
    summary.other_workloads(r, 8192)                 # best (and the steps before it) per workload
    doc = results.load_experiment_file(*summary.PROBE)
    summary.power_regimes(doc)                       # ours over cuDNN: idle start vs back to back
    summary.readme_numbers(r, doc)                   # the numbers README.md quotes
    summary.journey_figure(r)                        # the first page: each step at two N
    summary.intro_numbers(r)                         # the numbers the first page quotes

Ratios are speeds over cuDNN's (or over the previous step's), paired by round with a bootstrap
95 % interval (``flashbook.chapter.ladder.paired``). Everything here reads recorded data and runs
on a CPU.
"""
from __future__ import annotations

import statistics

from ..impls import RATIO_REF
from .ladder import fmt_ci, paired

WORKLOAD = "fp16-causal-d128"
FULL = "fp16-full-d128"
# The chapter in which each step of the book appears (chapter 2 builds the online softmax in
# NumPy, chapter 4 adds causal masking and GQA to the baseline's kernel).
CHAPTER_OF = {"naive": 1, "baseline": 3, "large_tiles": 5, "fast_math": 6, "loop_split": 7,
              "remap": 8, "autotune": 9, "arch_tuned": 10, "warp_groups": 10}
# Workloads as the book names them.
WORKLOAD_LABELS = {"fp16-causal-d128": "fp16 causal D=128", "fp16-full-d128": "fp16 non-causal D=128",
                   "bf16-causal-d128": "bf16 causal D=128",
                   "fp16-causal-d128-gqa32x8": "fp16 causal GQA 32:8",
                   "fp16-causal-d64": "fp16 causal D=64", "fp16-causal-d256": "fp16 causal D=256"}
# The seed's steps on the B200 and the same changes on the H200's ladder at 64x128 (chapters
# 6-8; flashbook.steps.HOPPER_LADDER): (change, seed step, its predecessor, rung, predecessor).
LADDER_PAIRS = (
    ("larger tiles", "large_tiles", "baseline", "baseline@64x128", "baseline"),
    ("+ fast math", "fast_math", "large_tiles", "fast_math@64x128", "baseline@64x128"),
    ("+ loop split", "loop_split", "fast_math", "loop_split@64x128", "fast_math@64x128"),
    ("+ remap", "remap", "loop_split", "remap@64x128", "loop_split@64x128"),
    ("+ occupancy=2", None, None, "remap@64x128:occ=2", "remap@64x128"),
)
# The noise probe of E11 (experiments/LOG.md): arch_tuned's 64x128 kernel twice ("A", "A#2")
# and cuDNN, three ways of timing (experiments/noise_probe.py).
PROBE = ("15-noise-probe", "noise_probe.json")
PROBE_MODES = {"gap": "one launch after idle (the book's method)",
               "single": "one launch, back to back",
               "batch": "a batch of launches, back to back"}


def fmt_n(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def ratio(r, impl: str, N: int, workload: str = WORKLOAD, ref: str = RATIO_REF):
    """Speed of ``impl`` over ``ref`` (cuDNN) at ``N``, paired by round: (ratio, lo, hi)."""
    return paired(r, impl, ref, N, workload)


def control_gap(r, workloads=None) -> float:
    """The largest |best#2 / best - 1| over every N of ``workloads`` (default: all recorded),
    paired by round: the resolution of the dataset, as a fraction."""
    gaps = []
    for wl in workloads or r.workloads:
        ns = r.bench[(r.bench["workload"] == wl) & (r.bench["impl"] == "best#2")]["Nq"]
        gaps += [abs(paired(r, "best#2", "best", int(N), wl)[0] - 1) for N in ns.unique()]
    if not gaps:
        raise KeyError("no control (best, best#2) recorded")
    return max(gaps)


def journey_table(r, seqlens=(1024, 16384), workload: str = WORKLOAD, steps=None):
    """One row per step of the book (chapter, step): at each N its TFLOPS and its speed over
    cuDNN's with the 95 % interval ("0.965 [0.964, 0.965]"). Steps without a measurement at an N
    (``naive`` at 8K and 16K) read "–"."""
    import pandas as pd
    steps = list(steps or CHAPTER_OF)
    cols, rows = [], []
    for N in seqlens:
        cols += [(fmt_n(N), "TFLOPS"), (fmt_n(N), "× cuDNN [95 % CI]")]
    for s in steps:
        cells = []
        for N in seqlens:
            row = r.row(s, N, workload)
            if row is None or row.get("tflops") != row.get("tflops"):
                cells += ["–", "–"]
                continue
            cells += [f"{row['tflops']:.0f}", fmt_ci(ratio(r, s, N, workload))]
        rows.append(cells)
    idx = pd.MultiIndex.from_tuples([(CHAPTER_OF[s], s) for s in steps],
                                    names=["chapter", "step"])
    return pd.DataFrame(rows, index=idx, columns=pd.MultiIndex.from_tuples(cols))


def ladder_vs_seed(r, seed, workload: str = WORKLOAD):
    """Each change over the step before it: the seed's steps on the B200 (quoted TFLOPS) and the
    Hopper ladder at 64x128 on the H200 (paired by round). Rows: the change; columns (N, GPU).
    The B200 has no occupancy step (NaN)."""
    import pandas as pd
    data = {}
    for N in seed.columns:
        b200, h200 = [], []
        for _, s, sp, rung, rp in LADDER_PAIRS:
            b200.append(seed.loc[s, N] / seed.loc[sp, N] if s else float("nan"))
            h200.append(paired(r, rung, rp, int(N), workload)[0])
        data[(fmt_n(int(N)), "B200 (seed's)")] = b200
        data[(fmt_n(int(N)), "H200 (ours)")] = h200
    t = pd.DataFrame(data, index=[c for c, *_ in LADDER_PAIRS])
    t.index.name = "change"
    return t


def other_workloads(r, N: int = 8192, impls=("baseline", "autotune", "arch_tuned", "best",
                                             "sdpa_flash")):
    """Every workload recorded at ``N``: the speed over cuDNN of ``impls``, the 95 % interval of
    ``best`` and the configuration ``best`` chose. One row per workload (book labels)."""
    import pandas as pd
    rows = {}
    for wl, label in WORKLOAD_LABELS.items():
        if r.row("best", N, wl) is None:
            continue
        t = r.ratio_table(wl)
        row = {impl: float(t.loc[impl, N]) if impl in t.index else float("nan")
               for impl in impls}
        row["best [95 % CI]"] = fmt_ci(ratio(r, "best", N, wl))
        row["best runs"] = str(r.row("best", N, wl)["config"]).split(": ")[-1]
        rows[label] = row
    out = pd.DataFrame.from_dict(rows, orient="index")
    out[list(impls)] = out[list(impls)].astype(float)
    out.index.name = f"workload (N={fmt_n(N)})"
    return out


def power_regimes(doc):
    """The noise probe (E11) as one row per (N, mode): the speed of our kernel over cuDNN's
    (median of cuDNN's times over median of ours), the sample spread of ours (sd, % of its
    mean), and the SM clock range (MHz) and median board power (W) read after our samples."""
    import pandas as pd
    out = []
    for row in doc["rows"]:
        a, c = row["samples"]["A"], row["samples"]["cudnn"]
        clocks, powers = row["clocks"]["A"], row["powers"]["A"]
        out.append({"N": int(row["N"]), "mode": row["mode"],
                    "ours / cuDNN": statistics.median(c) / statistics.median(a),
                    "sd of ours %": 100 * statistics.stdev(a) / statistics.mean(a),
                    "SM clock MHz": f"{min(clocks)}–{max(clocks)}",
                    "median power W": statistics.median(powers)})
    return pd.DataFrame(out).set_index(["N", "mode"])


# The whole default workload recorded in the sustained regime (every sample a batch after an
# untimed run of itself), beside the idle-start dataset: experiments/data/17-sustained/.
SUSTAINED = "17-sustained"


def regime_numbers(r, doc) -> dict:
    """What the two power-regime measurements show, as the book states it: the noise probe
    (``doc``: arch_tuned's 64x128 kernel against cuDNN, N = 4K-16K) after idle and back to back,
    with whether the two modes' intervals are apart at every N; and the sustained recording of
    the whole default workload (``best`` against cuDNN at every N, ``experiments/data/17-sustained``)
    beside the idle-start dataset: its range, whether every point is below 1, where its
    interval reaches 1, and where the two recordings' intervals separate."""
    from .method import probe_summary, regime_table
    ps = probe_summary(doc)
    gap, batch = ps.xs("gap", level="mode"), ps.xs("batch", level="mode")
    reg = regime_table(r.bench, r.experiment(SUSTAINED))
    return {"probe_idle": f"{gap['ratio'].min():.2f}–{gap['ratio'].max():.2f}",
            "probe_busy": f"{batch['ratio'].min():.2f}–{batch['ratio'].max():.2f}",
            "probe_apart": bool((batch["ratio_lo"] > gap["ratio_hi"]).all()),
            "probe_ns": ", ".join(fmt_n(int(n)) for n in gap.index),
            "whole_sustained": f"{reg['sustained'].min():.3f}–{reg['sustained'].max():.3f}",
            "whole_idle": f"{reg['idle'].min():.3f}–{reg['idle'].max():.3f}",
            "whole_below_one": bool((reg["sustained"] < 1).all()),
            "whole_reaches_one": ", ".join(fmt_n(int(n)) for n in reg.index[reg["sustained_hi"] >= 1])
            or "none",
            "whole_separated": ", ".join(fmt_n(int(n)) for n in reg.index[reg["separated"]]) or "none"}


def readme_numbers(r, doc=None) -> dict[str, str]:
    """The numbers README.md quotes, formatted as it quotes them: the range of ``best`` over
    cuDNN causal and non-causal, over FlashAttention-2, at D=256, the largest control gap, the
    recording's date and driver, and (with the probe ``doc``) the back-to-back range."""
    causal = [ratio(r, "best", N, WORKLOAD)[0] for N in _ns(r, WORKLOAD)]
    full = [ratio(r, "best", N, FULL)[0] for N in _ns(r, FULL)]
    fa2 = [ratio(r, "best", N, WORKLOAD, ref="sdpa_flash")[0] for N in _ns(r, WORKLOAD)]
    out = {"causal": f"{min(causal):.2f}–{max(causal):.2f}",
           "full": f"{min(full):.2f}–{max(full):.2f}",
           "fa2": f"{min(fa2):.2f}–{max(fa2):.2f}",
           "d256": f"{ratio(r, 'best', 8192, 'fp16-causal-d256')[0]:.2f}",
           "control": f"{100 * control_gap(r):.2f}",
           "date": str(r.meta["date"])[:10], "driver": str(r.meta["driver"])}
    if doc is not None:
        p = power_regimes(doc).xs("batch", level="mode")["ours / cuDNN"]
        out["sustained"] = f"{p.min():.2f}–{p.max():.2f}"
        reg = regime_numbers(r, doc)
        out["probe_idle"] = reg["probe_idle"]
        out["whole_sustained"] = reg["whole_sustained"]
    return out


# ---------------------------------------------------------------------------------------------
# The first page (book/intro.ipynb): the journey at a glance
# ---------------------------------------------------------------------------------------------
# The libraries drawn as reference lines beside the steps.
JOURNEY_LIBRARIES = ("sdpa_cudnn", "sdpa_flash", "flex")


def journey_seqlens(r, workload: str = WORKLOAD) -> tuple[int, int]:
    """The shortest and the longest sequence length recorded for ``workload``."""
    ns = r.bench.loc[r.bench["workload"] == workload, "Nq"]
    if ns.empty:
        raise KeyError(f"no benchmark rows for {workload!r}")
    return int(ns.min()), int(ns.max())


def journey_points(r, seqlens=None, workload: str = WORKLOAD, steps=None):
    """One row per (step, N) in book order: chapter, step, N, TFLOPS and the speed over cuDNN's
    paired by round with its 95 % interval (ratio, lo, hi). A step not run at an N (``naive``
    at the longest lengths) has NaN."""
    import pandas as pd
    seqlens = tuple(seqlens or journey_seqlens(r, workload))
    nan = float("nan")
    rows = []
    for s in list(steps or CHAPTER_OF):
        for N in seqlens:
            row = r.row(s, N, workload)
            tf = nan if row is None else float(row.get("tflops", nan))
            x, lo, hi = (nan, nan, nan) if tf != tf else ratio(r, s, N, workload)
            rows.append({"chapter": CHAPTER_OF.get(s), "step": s, "N": int(N), "tflops": tf,
                         "ratio": x, "lo": lo, "hi": hi})
    return pd.DataFrame(rows)


def journey_figure(r, seqlens=None, workload: str = WORKLOAD, steps=None,
                   libraries=JOURNEY_LIBRARIES):
    """The book's journey in one figure: a panel per sequence length (default: the shortest and
    the longest recorded), one above the other on a shared TFLOPS axis; in each, one bar per step
    in book order with its TFLOPS, and beside each bar the step's TFLOPS and speed over cuDNN's
    with its 95 % interval. The ``libraries`` timed in the same rounds are vertical reference
    lines (colours and dashes from ``flashbook.impls``). Returns the Figure."""
    import matplotlib.pyplot as plt

    from ..impls import get
    from .plots import color_of
    seqlens = tuple(seqlens or journey_seqlens(r, workload))
    pts = journey_points(r, seqlens, workload, steps)
    order = list(dict.fromkeys(pts["step"]))
    ys = {s: len(order) - 1 - i for i, s in enumerate(order)}       # first step on top
    xmax = max([pts["tflops"].max()] + [(r.row(lib, N, workload) or {}).get("tflops", 0)
                                        for lib in libraries for N in seqlens]) * 1.04
    style = {"axes.spines.top": False, "axes.spines.right": False, "font.size": 8.5}
    col = dict(va="center", fontsize=8, family="monospace")          # the column of numbers
    with plt.rc_context(style):
        size = (8.0, 0.25 * len(order) * len(seqlens) + 1.5)
        fig, axes = plt.subplots(len(seqlens), 1, figsize=size, sharex=True, dpi=90,
                                 squeeze=False)
        axes = axes[:, 0]
        handles = {}
        for ax, N in zip(axes, seqlens):
            d = pts[pts["N"] == N].set_index("step")
            tr = ax.get_yaxis_transform()
            for s in order:
                y, p = ys[s], d.loc[s]
                if p["tflops"] != p["tflops"]:
                    ax.text(xmax * 0.01, y, "not run at this length", va="center", fontsize=7.5,
                            color="#777777", style="italic")
                    ax.text(1.02, y, f"{'–':>6}", transform=tr, color="#777777", **col)
                    continue
                ax.barh(y, p["tflops"], height=0.7, color=color_of(s))
                ax.text(1.02, y, f"{p['tflops']:>6.0f} {fmt_ci((p['ratio'], p['lo'], p['hi']))}",
                        transform=tr, **col)
            for lib in libraries:
                row = r.row(lib, N, workload)
                if row is None:
                    continue
                impl = get(lib)
                h = ax.axvline(row["tflops"], color=impl.color, ls=impl.linestyle, lw=1.4,
                               zorder=3)
                handles.setdefault(impl.label, h)
            ax.text(1.02, len(order) - 0.45, "TFLOPS × cuDNN [95 % CI]", transform=tr,
                    va="bottom", fontsize=8, family="monospace", color="#444444")
            ax.set_xlim(0, xmax)
            ax.set_ylim(-0.6, len(order) - 0.4)
            ax.set_yticks([ys[s] for s in order],
                          [f"ch. {CHAPTER_OF.get(s, '?')}  {s}" for s in order])
            ax.tick_params(axis="y", length=0)
            ax.set_title(f"N = {fmt_n(N)}", fontsize=9, loc="left", fontweight="bold")
            ax.grid(True, axis="x", alpha=0.3)
        axes[-1].set_xlabel("TFLOPS")
        fig.legend(list(handles.values()), list(handles), loc="lower center",
                   ncol=len(handles), frameon=False, fontsize=8,
                   title="libraries, timed in the same rounds", title_fontsize=8)
        gpu = str(r.meta.get("gpu") or "").removeprefix("NVIDIA ")
        shape = pts.dropna(subset=["tflops"]).iloc[0]
        shape = r.row(shape["step"], int(shape["N"]), workload)
        fig.suptitle(f"Each chapter's step: {WORKLOAD_LABELS.get(workload, workload)}, "
                     f"B={shape['B']}, H={shape['Hq']} — {gpu}".rstrip(" —"), fontsize=10,
                     x=0.02, ha="left")
        fig.tight_layout(rect=(0, 0.075, 1, 1), h_pad=1.2)
    return fig


def intro_numbers(r, workload: str = WORKLOAD) -> dict:
    """The numbers the first page quotes beside the journey figure: the two lengths, and at the
    longest the TFLOPS of the first fused kernel (``baseline``), of the large tiles, and of the
    last step (``warp_groups``) with its speed over cuDNN's [95 % interval] and over the
    baseline; where the data come from and how many rounds."""
    from ..data.results import source_line
    short, long = journey_seqlens(r, workload)
    tf = {s: float(r.row(s, long, workload)["tflops"])
          for s in ("baseline", "large_tiles", "warp_groups")}
    x, lo, hi = ratio(r, "warp_groups", long, workload)
    return {"n_short": fmt_n(short), "n_long": fmt_n(long),
            "base_tflops": tf["baseline"], "trap_tflops": tf["large_tiles"],
            "final_tflops": tf["warp_groups"], "final_gain": tf["warp_groups"] / tf["baseline"],
            "final_ratio": float(x), "final_lo": float(lo), "final_hi": float(hi),
            "source": source_line(r.meta),
            "rounds": int(r.bench_meta[workload]["method"]["rounds"])}


def _ns(r, workload):
    d = r.bench[(r.bench["workload"] == workload) & (r.bench["impl"] == "best")]
    return sorted(int(n) for n in d["Nq"].unique())


__all__ = ["CHAPTER_OF", "WORKLOAD_LABELS", "LADDER_PAIRS", "PROBE", "PROBE_MODES", "ratio",
           "control_gap", "journey_table", "ladder_vs_seed", "other_workloads", "power_regimes",
           "readme_numbers", "fmt_n", "JOURNEY_LIBRARIES", "journey_seqlens",
           "journey_points", "journey_figure", "intro_numbers"]
