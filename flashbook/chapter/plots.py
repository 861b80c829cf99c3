"""The book's figures and tables, from plain DataFrames (matplotlib only).

Every function takes the DataFrames of ``flashbook.data.results.load(gpu)`` (``.bench``,
``.profile``, ``.compile``) or arrays, and returns a matplotlib Figure (tables: a DataFrame or
pandas Styler). Pass ``meta`` (the results' metadata dict: ``gpu``, ...) to put the GPU in titles.

Colours are fixed per implementation (``PALETTE``) so a step has the same colour in every chapter.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ..impls import IMPLS
from ..impls import color_of as _color_of
from flashattn.steps import STEP_NAMES

# Colours come from the implementation registry (``flashbook.impls``): one per step, per
# experiment and per library, the same in every chapter.
PALETTE = {name: impl.color for name, impl in IMPLS.items()}
KIND_COLORS = {0: "#eeeeee", 1: "#1f77b4", 2: "#ff7f0e"}   # skipped / full / masked tiles
KIND_NAMES = {0: "skipped", 1: "full", 2: "masked"}


def color_of(impl: str) -> str:
    """The colour of an implementation in every figure (``flashbook.impls.color_of``)."""
    return _color_of(impl)


def _plt():
    import matplotlib.pyplot as plt
    return plt


def _title(text: str, meta: dict | None = None) -> str:
    gpu = (meta or {}).get("gpu") or (meta or {}).get("gpu_name")
    return f"{text} — {gpu}" if gpu else text


def _book_rank(name: str) -> int:
    return STEP_NAMES.index(name) if name in STEP_NAMES else len(STEP_NAMES)


def fmt_n(n: int) -> str:
    """1024 -> "1K", 16384 -> "16K", 1000 -> "1000": sequence lengths on axes and in tables."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _pick_workload(df, workload):
    """Rows of one workload: the given one, else the most common one."""
    if "workload" not in df.columns or df.empty:
        return df, workload
    if workload is None:
        workload = df["workload"].value_counts().index[0]
    return df[df["workload"] == workload], workload


def _linestyle(impl: str) -> str:
    """A library's line style from the registry (each library its own), dashed if unknown."""
    from ..impls import get
    try:
        return get(impl).linestyle
    except KeyError:
        return "--"


def _is_library(df_rows) -> bool:
    return "kind" in df_rows.columns and (df_rows["kind"] == "library").all()


# ---------------------------------------------------------------------------------------------
# Benchmarks
# ---------------------------------------------------------------------------------------------
def tflops_vs_seqlen(bench_df, impls=None, workload=None, ax=None, meta=None):
    """TFLOPS against sequence length, one line per implementation.

    Steps are solid, libraries dashed; the shading spans the TFLOPS of the first and third
    quartile times. The x axis is log2 (1K .. 16K). Returns the Figure.
    """
    plt = _plt()
    df, workload = _pick_workload(bench_df, workload)
    df = df[df["error"].fillna("") == ""] if "error" in df.columns else df
    df = df.dropna(subset=["tflops"])
    if impls is not None:
        df = df[df["impl"].isin(impls)]
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(8, 4.5))
    order = sorted(df["impl"].unique(), key=lambda s: (_is_library(df[df["impl"] == s]),
                                                       _book_rank(s), s))
    for impl in order:
        d = df[df["impl"] == impl].sort_values("Nk")
        lib = _is_library(d)
        c = color_of(impl)
        ax.plot(d["Nk"], d["tflops"], ls=_linestyle(impl) if lib else "-", marker="o", ms=3.5,
                lw=1.8, color=c, label=impl + (" (library)" if lib else ""))
        if {"q1_ms", "q3_ms", "median_ms"} <= set(d.columns):
            lo = d["tflops"] * d["median_ms"] / d["q3_ms"]
            hi = d["tflops"] * d["median_ms"] / d["q1_ms"]
            ax.fill_between(d["Nk"], lo, hi, color=c, alpha=0.15, lw=0)
    ax.set_xscale("log", base=2)
    ns = sorted(df["Nk"].unique()) if not df.empty else [1024, 16384]
    ticks = [n for n in (1024, 2048, 4096, 8192, 16384) if ns[0] <= n <= ns[-1]] or ns
    ax.set_xticks(ticks)
    ax.set_xticklabels([fmt_n(int(n)) for n in ticks])
    ax.minorticks_off()
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("TFLOPS")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.set_title(_title(f"Forward attention throughput{f' ({workload})' if workload else ''}",
                        meta))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def waterfall(bench_df, seqlen=16384, steps=None, workload=None, meta=None,
              reference="cudnn"):
    """Speed-up of each step over the previous one (bars, top) and over ``baseline`` (line,
    bottom), on two axes that share the steps.

    Steps go in book order from ``baseline``; each bar is that step's TFLOPS over its
    predecessor's, labelled at its end; the line below is the running total, labelled at each
    point, with the reference library (cuDNN) over ``baseline`` dashed and named at its end.
    Both y axes are logarithmic, so a slow-down (the large-tile trap) reads as clearly as a
    speed-up; bars and the running line never share an axis, and no legend covers the data.
    Returns the Figure (``fig.axes[0]`` the bars, ``fig.axes[1]`` the line).
    """
    plt = _plt()
    df, workload = _pick_workload(bench_df, workload)
    df = df[df["Nk"] == seqlen]
    tf = df.groupby("impl")["tflops"].max()
    if steps is None:
        steps = [s for s in STEP_NAMES if s in tf.index and s != "naive"]
    steps = [s for s in steps if s in tf.index and tf[s] == tf[s]]
    if not steps:
        raise ValueError(f"no step has a measurement at N={seqlen}")
    base = tf[steps[0]]
    per = [1.0] + [tf[b] / tf[a] for a, b in zip(steps, steps[1:])]
    total = [tf[s] / base for s in steps]
    width = min(7.5, max(5.5, 0.75 * len(steps) + 1.5))
    fig, (ax0, ax1) = plt.subplots(2, 1, sharex=True, figsize=(width, 5.6),
                                   gridspec_kw={"height_ratios": [1, 1], "hspace": 0.12})
    x = np.arange(len(steps))

    # Top: each step over its predecessor. Bars start at x1, so a slow-down hangs below the line.
    ax0.bar(x, np.array(per) - 1.0, bottom=1.0, color=[color_of(s) for s in steps], alpha=0.85,
            width=0.6, label="over the previous step")
    ax0.axhline(1.0, color="#888888", lw=0.8)
    ax0.set_yscale("log")
    lo, hi = min(per), max(per)
    ax0.set_ylim(min(0.8, lo / 2.2), max(1.25, hi * 2.2))
    for xi, p in zip(x[1:], per[1:]):
        up = p >= 1.0
        ax0.annotate(f"×{p:.2f}", (xi, p), textcoords="offset points", xytext=(0, 3 if up else -3),
                     ha="center", va="bottom" if up else "top", fontsize=7.5)
    ax0.set_ylabel("over the previous\nstep (×, log)")
    ax0.grid(True, axis="y", alpha=0.3, which="major")

    # Bottom: the running total over baseline, and the reference library.
    ax1.plot(x, total, "k-o", ms=4, lw=1.5, label=f"over {steps[0]} (running total)")
    ax1.axhline(1.0, color="#888888", lw=0.8)
    ref = [i for i in tf.index if reference in i.lower()]
    r = tf[ref[0]] / base if ref else None
    for i, (xi, t) in enumerate(zip(x, total)):
        drop = i > 0 and t < total[i - 1] * 0.999
        near_ref = r is not None and t <= r and r / t < 1.4     # keep the dashed line clear
        below = drop or near_ref
        ax1.annotate(f"×{t:.2f}", (xi, t), textcoords="offset points",
                     xytext=(0, -7 if below else 6), ha="center",
                     va="top" if below else "bottom", fontsize=7.5, fontweight="bold")
    ymax = max(total)
    if ref:
        ymax = max(ymax, r)
        ax1.axhline(r, color=color_of(ref[0]), ls="--", lw=1.2,
                    label=f"{ref[0]} over {steps[0]} (×{r:.2f})")
        ax1.annotate(f"{ref[0]} ×{r:.2f}", (x[-1], r), textcoords="offset points",
                     xytext=(0, 4), ha="right", va="bottom", fontsize=7.5, color=color_of(ref[0]))
    ax1.set_yscale("log")
    ax1.set_ylim(min(total) / 2.0, ymax * 2.0)
    ax1.set_ylabel(f"over {steps[0]}\n(×, log)")
    ax1.grid(True, axis="y", alpha=0.3, which="major")
    ax1.set_xticks(x)
    ax1.set_xticklabels(steps, rotation=30, ha="right")
    ax1.set_xlabel("step (book order)")
    ax0.set_title(_title(f"Speed-up step by step at N={fmt_n(seqlen)}"
                         f"{f' ({workload})' if workload else ''}", meta), fontsize=10)
    fig.subplots_adjust(left=0.14, right=0.98, top=0.93, bottom=0.2)
    return fig


# ---------------------------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------------------------
# (label, metric or callable on a per-step row, format)
PROFILE_FIELDS = [
    ("registers / thread", "launch__registers_per_thread", "{:.0f}"),
    ("local memory (spill) bytes", "local_bytes", "bytes"),        # shown as B, MB, GB
    ("shared memory / block (KB)", "smem_kb", "{:.1f}"),
    ("grid (programs)", "launch__grid_size", "{:,.0f}"),
    ("waves per SM", "launch__waves_per_multiprocessor", "{:.2f}"),
    ("theoretical occupancy %", "sm__maximum_warps_per_active_cycle_pct", "{:.1f}"),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", "{:.1f}"),
    ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
    ("tensor pipe %", "tensor_pct", "{:.1f}"),
    ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
    ("DRAM bytes (MB)", "dram_mb", "{:,.1f}"),
    ("duration (ms)", "duration_ms", "{:.3f}"),
]
_SUMMED = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
           "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
           "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum")


def _wide(profile_df):
    """Accept the long summary rows (step, kernel, metric, value) or the wide table."""
    import pandas as pd
    if "metric" in profile_df.columns and "value" in profile_df.columns:
        w = profile_df.pivot_table(index=["step", "kernel"], columns="metric", values="value",
                                   aggfunc="first").reset_index()
        w.columns.name = None
        return w
    return pd.DataFrame(profile_df)


def per_step(profile_df, steps=None):
    """One row per step: times and bytes summed over its kernels, the rest from its longest
    kernel; derived columns local_bytes, smem_kb, dram_mb, duration_ms, tensor_pct."""
    import pandas as pd
    w = _wide(profile_df)
    if steps is not None:
        w = w[w["step"].isin(steps)]
    out = []
    for step, g in w.groupby("step", sort=False):
        dur = g["gpu__time_duration.sum"] if "gpu__time_duration.sum" in g else None
        main = g.loc[dur.idxmax()] if dur is not None and dur.notna().any() else g.iloc[0]
        row = main.copy()
        for c in _SUMMED:
            if c in g:
                row[c] = g[c].sum(min_count=1)
        row["kernel"] = ", ".join(g["kernel"].astype(str)) if len(g) > 1 else main["kernel"]
        out.append(row)
    d = pd.DataFrame(out).reset_index(drop=True)
    if d.empty:
        return d

    def col(name):
        return d[name] if name in d else pd.Series(np.nan, index=d.index)
    loc = col("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum").fillna(0) + \
        col("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum").fillna(0)
    has_loc = col("l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum").notna() | \
        col("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum").notna()
    d["local_bytes"] = loc.where(has_loc, col("stack_bytes") if "stack_bytes" in d else np.nan)
    d["smem_kb"] = (col("launch__shared_mem_per_block_static").fillna(0)
                    + col("launch__shared_mem_per_block_dynamic").fillna(0)) / 1024
    d["dram_mb"] = (col("dram__bytes_read.sum") + col("dram__bytes_write.sum")) / 1e6
    d["duration_ms"] = col("gpu__time_duration.sum") / 1e6
    tensor = [c for c in d.columns if str(c).startswith("sm__pipe_tensor")
              and str(c).endswith("cycles_active.avg.pct_of_peak_sustained_active")]
    d["tensor_pct"] = d[tensor].max(axis=1) if tensor else np.nan
    d["_o"] = d["step"].map(_book_rank)
    return d.sort_values("_o", kind="stable").drop(columns="_o").reset_index(drop=True)


def profile_table(profile_df, steps=None, styled=True):
    """Key Nsight Compute metrics side by side: one column per step, one row per metric.

    Returns a pandas Styler (numbers formatted, each row shaded from low to high) or, with
    ``styled=False`` or without jinja2, the DataFrame.
    """
    import pandas as pd
    d = per_step(profile_df, steps)
    table = pd.DataFrame({r["step"]: [r.get(m, np.nan) for _, m, _ in PROFILE_FIELDS]
                          for _, r in d.iterrows()},
                         index=[label for label, _, _ in PROFILE_FIELDS])
    table = table.dropna(how="all")
    table.index.name = "metric"
    if not styled:
        return table
    try:
        fmt = {label: f for label, _, f in PROFILE_FIELDS}
        sty = table.style
        for label in table.index:
            sty = sty.format(lambda v, f=fmt[label]: _card_fmt(f, v),
                             subset=pd.IndexSlice[[label], :])
        return sty.background_gradient(axis=1, cmap="Blues", low=0.1, high=0.1)
    except ImportError:
        return table


# The Nsight Compute card of a step chapter: the three sections the book is built around.
CARD_SECTIONS = {
    "LaunchStats": [
        ("registers / thread", "launch__registers_per_thread", "{:.0f}"),
        ("threads / program", "launch__block_size", "{:.0f}"),
        ("shared memory / program (KB)", "smem_kb", "{:.1f}"),
        ("grid (programs)", "launch__grid_size", "{:,.0f}"),
        ("waves per SM", "launch__waves_per_multiprocessor", "{:.2f}"),
        ("local memory (spill) bytes", "local_bytes", "bytes"),      # shown as B, MB, GB
    ],
    "Occupancy": [
        ("programs / SM: register limit", "launch__occupancy_limit_registers", "{:.0f}"),
        ("programs / SM: shared-memory limit", "launch__occupancy_limit_shared_mem", "{:.0f}"),
        ("theoretical occupancy %", "sm__maximum_warps_per_active_cycle_pct", "{:.1f}"),
        ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", "{:.1f}"),
    ],
    "SpeedOfLight": [
        ("duration (ms)", "duration_ms", "{:.3f}"),
        ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
        ("memory throughput %",
         "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
        ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
        ("tensor pipe %", "tensor_pct", "{:.1f}"),
    ],
    "WarpStateStats": [   # recorded since the stall reasons were added; absent before
        ("stall: waiting for memory (long scoreboard)",
         "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "{:.2f}"),
        ("stall: barrier", "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
         "{:.2f}"),
        ("stall: math pipe throttle",
         "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio", "{:.2f}"),
        ("issue slots busy %", "smsp__issue_active.avg.pct_of_peak_sustained_active", "{:.1f}"),
    ],
}


def fmt_bytes(v) -> str:
    """A byte count for people, in decimal units: 0 -> "0 B", 1.1e11 -> "111.0 GB"."""
    if v != v:
        return "–"
    a = abs(v)
    for div, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if a >= div:
            return f"{v / div:,.1f} {unit}"
    return f"{v:,.0f} B"


def _card_fmt(fmt: str, v, percent: bool = False) -> str:
    if v != v:
        return "–"
    if percent and float(v).is_integer():
        return f"{int(v)}"                 # a whole percentage as one: "25", not "25.0"
    return fmt_bytes(v) if fmt == "bytes" else fmt.format(v)


def ncu_card(profile_df, step, prev=None, *, highlight=(), styled=True):
    """The Nsight Compute card of a chapter: LaunchStats, Occupancy and SpeedOfLight (and the
    stall reasons when recorded) of ``step`` beside ``prev`` (its predecessor), from the recorded
    profile (``results.load(gpu).profile``).

    ``highlight``: labels of the rows that carry the chapter's argument (e.g.
    ``("local memory (spill) bytes", "SM throughput %")``); they are shaded and bold. Returns a
    pandas Styler (or the DataFrame with ``styled=False``): rows (section, metric), columns the
    two steps and their ratio. Raises KeyError if a step was not profiled.
    """
    import pandas as pd
    steps = [s for s in (prev, step) if s is not None]
    d = per_step(profile_df, steps)
    have = set(d["step"]) if not d.empty else set()
    missing = [s for s in steps if s not in have]
    if missing:
        raise KeyError(f"no recorded profile for {', '.join(missing)}; profiled: "
                       f"{', '.join(sorted(have)) or 'none'}")
    rows, index, fmts = [], [], {}
    by = {r["step"]: r for _, r in d.iterrows()}
    for section, fields in CARD_SECTIONS.items():
        for label, metric, fmt in fields:
            vals = [by[s].get(metric, np.nan) for s in steps]
            if all(v != v for v in vals):          # not recorded (e.g. WarpStateStats)
                continue
            rows.append(vals)
            index.append((section, label))
            fmts[label] = fmt
    table = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["section", "metric"]),
                         columns=steps, dtype=float)
    unknown = set(highlight) - set(fmts)
    if unknown:
        raise KeyError(f"highlight names no row of the card: {sorted(unknown)}")
    if prev is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            table["ratio"] = table[step] / table[prev]
    if not styled:
        return table
    try:
        sty = table.style
        for (section, label) in table.index:
            sty = sty.format(lambda v, f=fmts[label], pct="%" in label: _card_fmt(f, v, pct),
                             subset=pd.IndexSlice[[(section, label)], steps])
        if "ratio" in table:
            sty = sty.format(lambda v: "–" if v != v or not np.isfinite(v) else f"×{v:.2f}",
                             subset=["ratio"])
        marked = [i for i in table.index if i[1] in set(highlight)]
        if marked:
            sty = sty.set_properties(subset=pd.IndexSlice[marked, :],
                                     **{"background-color": "#fff3b0", "font-weight": "bold"})
        # A fixed table id (pandas draws a random one): the committed HTML output, which nbval
        # compares and git stores, stays the same from one execution to the next.
        uid = re.sub(r"[^A-Za-z0-9_-]", "-", "ncu-card-" + "-".join(steps[::-1]))
        return (sty.set_uuid(uid)
                .set_caption(f"Nsight Compute: {step}" + (f" beside {prev}" if prev else "")))
    except ImportError:
        return table


def _human_fmt(v, _pos=None) -> str:
    """Axis labels without matplotlib's offset text: 1.1e11 -> "110G", 0.5 -> "0.5"."""
    a = abs(v)
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def _human_formatter():
    from matplotlib.ticker import FuncFormatter
    return FuncFormatter(_human_fmt)


def profile_bars(profile_df, metrics=None, steps=None, meta=None, ncols=3):
    """Small multiples: one bar chart per metric, one bar per step. Returns the Figure."""
    plt = _plt()
    d = per_step(profile_df, steps)
    fields = {m: (label, f) for label, m, f in PROFILE_FIELDS}
    metrics = metrics or ["launch__registers_per_thread", "local_bytes",
                          "sm__warps_active.avg.pct_of_peak_sustained_active",
                          "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                          "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                          "duration_ms"]
    metrics = [m for m in metrics if m in d.columns]
    n = max(1, len(metrics))
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.4 * ncols, 2.6 * nrows), squeeze=False)
    for ax, m in zip(axes.flat, metrics):
        vals = d[m].astype(float)
        ax.bar(range(len(d)), vals.fillna(0), color=[color_of(s) for s in d["step"]])
        ax.set_title(fields.get(m, (m, ""))[0], fontsize=9)
        ax.set_xticks(range(len(d)))
        ax.set_xticklabels(d["step"], rotation=45, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
        ax.yaxis.set_major_formatter(_human_formatter())   # 1.1e11 -> "110G": no offset text
        ax.grid(True, axis="y", alpha=0.3)
        if m.endswith("pct") or m.endswith("_pct_of_peak_sustained_active") or "%" in \
                fields.get(m, ("", ""))[0]:
            ax.set_ylim(0, 100)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    fig.suptitle(_title("Nsight Compute, step by step", meta), fontsize=11)
    fig.tight_layout()
    return fig


def min_bytes(B, Hq, Hkv, Nq, Nk, D, elem_bytes=2) -> float:
    """The least DRAM traffic of attention: read Q, K, V once and write O once.

    ``elem_bytes · D · (2·B·Hq·Nq + 2·B·Hkv·Nk)`` — Q and O are (B, Hq, Nq, D), K and V are
    (B, Hkv, Nk, D). For MHA with Nq = Nk = N in fp16: ``2 · 4·B·H·N·D`` bytes.
    """
    return float(elem_bytes) * D * (2 * B * Hq * Nq + 2 * B * Hkv * Nk)


def roofline(bench_df, profile_df=None, peak_tflops=None, bandwidth_tbs=None, seqlen=4096,
             workload=None, meta=None, ax=None):
    """Log-log roofline with each implementation at (arithmetic intensity, achieved TFLOPS).

    FLOPs are ``flashattn.timing.attention_flops`` (4·B·H·Nq·Nk·D, halved when causal). Bytes are
    the DRAM bytes read + written that Nsight Compute measured for the step (summed over its
    kernels; the profile must be of the same workload), else ``min_bytes`` (Q, K, V read once,
    O written once) — libraries always use ``min_bytes``. Defaults: the H200's dense fp16 peak
    and HBM3e bandwidth (``flashbook.hardware``). Returns the Figure.
    """
    from flashattn.timing import attention_flops

    from ..hardware import HBM_TBS, PEAK_TFLOPS
    peak_tflops = PEAK_TFLOPS if peak_tflops is None else peak_tflops
    bandwidth_tbs = HBM_TBS if bandwidth_tbs is None else bandwidth_tbs
    plt = _plt()
    df, workload = _pick_workload(bench_df, workload)
    df = df[(df["Nk"] == seqlen)].dropna(subset=["tflops"])
    prof = per_step(profile_df) if profile_df is not None and len(profile_df) else None
    measured = {}
    if prof is not None and {"dram__bytes_read.sum", "dram__bytes_write.sum"} <= set(prof):
        measured = {r["step"]: r["dram__bytes_read.sum"] + r["dram__bytes_write.sum"]
                    for _, r in prof.iterrows()}
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(7, 4.8))
    pts = []
    for _, r in df.iterrows():
        causal = bool(r["causal"]) if not isinstance(r["causal"], str) else \
            r["causal"].lower() in ("true", "1", "yes")
        flops = attention_flops(int(r["B"]), int(r["Hq"]), int(r["Nq"]), int(r["Nk"]),
                                int(r["D"]), causal)
        eb = 4 if str(r.get("dtype", "float16")) in ("float32", "torch.float32") else 2
        mb = measured.get(r["impl"])
        by = mb if mb and mb == mb and r.get("kind") != "library" else \
            min_bytes(int(r["B"]), int(r["Hq"]), int(r["Hkv"]), int(r["Nq"]), int(r["Nk"]),
                      int(r["D"]), eb)
        pts.append((r["impl"], flops / by, r["tflops"], r.get("kind") == "library",
                    mb is not None and r.get("kind") != "library"))
    xs = [p[1] for p in pts] or [1.0]
    lo, hi = min(xs + [1.0]) / 4, max(xs + [peak_tflops / bandwidth_tbs * 10]) * 4
    ii = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.plot(ii, np.minimum(peak_tflops, bandwidth_tbs * ii), color="#444444", lw=1.5)
    ridge = peak_tflops / bandwidth_tbs
    ax.axvline(ridge, color="#bbbbbb", ls=":", lw=1)
    ax.annotate(f"{peak_tflops:.0f} TFLOPS peak", (hi / 1.2, peak_tflops), ha="right",
                va="bottom", fontsize=8)
    ax.annotate(f"{bandwidth_tbs} TB/s", (lo * 1.5, bandwidth_tbs * lo * 1.5), rotation=0,
                fontsize=8, va="bottom")
    # Steps as filled dots, libraries as larger open squares drawn on top: a library at the same
    # point as a step rings the step's dot instead of hiding under it. Each point is named beside
    # it; a point close to one already named takes the other side.
    placed = []
    for impl, x, y, lib, meas in sorted(pts, key=lambda p: (p[3], _book_rank(p[0]))):
        ax.scatter([x], [y], s=110 if lib else 40, marker="s" if lib else "o",
                   facecolors="none" if lib else color_of(impl), edgecolors=color_of(impl),
                   linewidths=1.6 if lib else 1.0,
                   label=impl + (" (library)" if lib else "" if meas else " (min. bytes)"),
                   zorder=4 if lib else 3)
        near = [q for q in placed if abs(np.log10(q[0] / x)) < 0.35 and abs(np.log10(q[1] / y)) < 0.12]
        side = -1 if any(q[2] == 1 for q in near) else 1
        if near and all(q[2] == -1 for q in near):
            side = 1
        dy = 0 if not near else (-7 if y < near[0][1] else 7)
        ax.annotate(impl, (x, y), textcoords="offset points", xytext=(9 * side, dy),
                    ha="left" if side > 0 else "right", va="center", fontsize=7.5,
                    color=color_of(impl))
        placed.append((x, y, side))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per DRAM byte)")
    ax.set_ylabel("achieved TFLOPS (log)")
    ax.grid(True, which="both", alpha=0.2)
    ax.set_title(_title(f"Roofline at N={fmt_n(seqlen)}{f' ({workload})' if workload else ''}",
                        meta), fontsize=10)
    ax.legend(loc="lower right", frameon=True, framealpha=0.9, fontsize=7.5)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Schedules
# ---------------------------------------------------------------------------------------------
def causal_tiles(kinds, tile_m=64, tile_n=64, ax=None, title=None, meta=None):
    """The tile grid of a causal launch: each (query tile, key tile) coloured by its kind.

    ``kinds``: 2-D array [num query tiles, num key tiles] of 0 (skipped), 1 (full, no mask),
    2 (masked: on the diagonal or the ragged end). Returns the Figure.
    """
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    plt = _plt()
    k = np.asarray(kinds, dtype=int)
    if k.ndim != 2:
        raise ValueError(f"kinds must be 2-D (query tiles, key tiles), got shape {k.shape}")
    nq, nk = k.shape
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(
        figsize=(min(9, 1.5 + 0.35 * nk), min(9, 1.2 + 0.35 * nq)))
    cmap = ListedColormap([KIND_COLORS[i] for i in range(3)])
    ax.imshow(k, cmap=cmap, vmin=-0.5, vmax=2.5, interpolation="nearest", aspect="equal")
    if nq <= 64 and nk <= 64:
        ax.set_xticks(np.arange(-0.5, nk, 1), minor=True)
        ax.set_yticks(np.arange(-0.5, nq, 1), minor=True)
        ax.grid(which="minor", color="white", lw=0.8)
        ax.tick_params(which="minor", length=0)
    ax.set_xlabel(f"key tile j  (TILE_N = {tile_n})")
    ax.set_ylabel(f"query tile i  (TILE_M = {tile_m})")
    counts = {i: int((k == i).sum()) for i in range(3)}
    ax.legend(handles=[Patch(color=KIND_COLORS[i], label=f"{KIND_NAMES[i]}: {counts[i]}")
                       for i in (1, 2, 0)],
              loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=8)
    ax.set_title(_title(title or f"Causal tiles: {nq * tile_m} queries × {nk * tile_n} keys",
                        meta), fontsize=10)
    fig.tight_layout()
    return fig


def work_per_program(work, order=None, sm_count=132, occupancy=1, ax=None, title=None,
                     meta=None):
    """Key tiles each program visits, in launch order, with the wave boundaries marked.

    ``work[p]``: key tiles of program p; ``order``: program ids in launch order (default
    0, 1, 2, ...). A wave is ``sm_count × occupancy`` programs running at once; the last wave's
    longest program sets the tail. Returns the Figure.
    """
    plt = _plt()
    w = np.asarray(work, dtype=float).ravel()
    order = np.arange(len(w)) if order is None else np.asarray(order, dtype=int).ravel()
    seq = w[order]
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(9, 3.6))
    wave = max(1, int(sm_count * occupancy))
    colors = ["#1f77b4" if (i // wave) % 2 == 0 else "#6baed6" for i in range(len(seq))]
    ax.bar(np.arange(len(seq)), seq, width=1.0, color=colors, lw=0)
    for b in range(wave, len(seq), wave):
        ax.axvline(b - 0.5, color="#d62728", ls="--", lw=1)
    nwaves = len(seq) / wave
    ax.annotate(f"{nwaves:.2f} waves of {wave} programs ({sm_count} SMs × {occupancy})",
                (0.01, 0.97), xycoords="axes fraction", va="top", fontsize=8, color="#d62728")
    ax.set_xlim(-0.5, len(seq) - 0.5)
    ax.set_xlabel("program, in launch order")
    ax.set_ylabel("key tiles visited")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(_title(title or "Work per program", meta), fontsize=10)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------
COMPILE_FIELDS = {"registers": "REG", "stack_bytes": "STACK", "mma_ops": "MMA",
                  "sass_MUFU.EX2": "EX2", "sass_MUFU.RCP": "RCP", "sass_LDL": "LDL",
                  "sass_STL": "STL"}


def compile_table(compile_df, archs=("sm_90", "sm_100")):
    """Registers, stack, MMA, EX2, RCP, LDL, STL per step (rows, book order) and arch
    (column groups), from the compile reports. Returns a DataFrame with two column levels."""
    import pandas as pd
    df = compile_df[compile_df["arch"].isin(archs)].copy()
    if "error" in df.columns:
        df = df[df["error"].fillna("") == ""]
    fields = [c for c in COMPILE_FIELDS if c in df.columns]
    keys = ["step", "kernel"] if "kernel" in df.columns else ["step"]
    t = df.pivot_table(index=keys, columns="arch", values=fields, aggfunc="first")
    t = t.rename(columns=COMPILE_FIELDS, level=0).swaplevel(0, 1, axis=1)
    present = [a for a in archs if a in t.columns.get_level_values(0)]
    names = [COMPILE_FIELDS[f] for f in fields]
    t = t.reindex(columns=pd.MultiIndex.from_product([present, names]))
    t = t.iloc[sorted(range(len(t)), key=lambda i: (_book_rank(t.index[i][0] if len(keys) > 1
                                                                else t.index[i]), i))]
    return t.astype("Int64") if not t.empty else t


def online_softmax_state(xs, block: int, j: int, ax=None):
    """Chapter 2's online-softmax trace after block ``j`` (1-based) of ``block`` scores: the
    scores read so far, the block just read and the running maximum, with m, l and the
    rescale factor in the title. The interactive trace draws this for one ``j``; the static
    page shows a few (``online_softmax_states``). Returns the Figure."""
    from flashattn.reference import blockwise_trace
    plt = _plt()
    xs = np.asarray(xs, dtype=np.float64)
    m_tr, l_tr = blockwise_trace(xs, block)                           # (n_blocks,) each
    n_blocks = len(m_tr)
    if not 1 <= j <= n_blocks:
        raise ValueError(f"block j must be in 1..{n_blocks}, got {j}")
    alpha = float(np.exp(m_tr[j - 2] - m_tr[j - 1])) if j > 1 else 0.0
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(8, 3.4))
    n = min(j * block, len(xs))
    idx = np.arange(len(xs))
    ax.scatter(idx[n:], xs[n:], s=4, color="#cccccc", label="not read yet")
    ax.scatter(idx[:n], xs[:n], s=4, color="#1f77b4", label="read")
    ax.axvspan((j - 1) * block, n, color="#ff7f0e", alpha=0.15, label="block just read")
    ax.hlines(m_tr[j - 1], 0, n, color="#d62728", lw=2, label="running max m")
    ax.set_xlim(0, len(xs))
    ax.set_xlabel("key index")
    ax.set_ylabel("score")
    ax.set_title(f"after block {j} of {n_blocks}:  m = {m_tr[j - 1]:.3f},  l = {l_tr[j - 1]:.3f},"
                 f"  rescale = {alpha:.3f}", fontsize=9)
    ax.legend(loc="upper left", fontsize=7, frameon=False, ncol=4)
    fig.tight_layout()
    return fig


def online_softmax_states(xs, block: int, blocks=None):
    """The static face of chapter 2's interactive trace: ``online_softmax_state`` for a few
    blocks (default: the first, two in between and the last), one panel each, on shared
    axes. Returns the Figure."""
    plt = _plt()
    n_blocks = math.ceil(len(xs) / block)
    if blocks is None:
        blocks = sorted({1, max(1, n_blocks // 3), max(1, 2 * n_blocks // 3), n_blocks})
    fig, axes = plt.subplots(len(blocks), 1, figsize=(8, 2.3 * len(blocks)), sharex=True,
                             sharey=True, squeeze=False)
    for ax, j in zip(axes[:, 0], blocks):
        online_softmax_state(xs, block, j, ax=ax)
        ax.get_legend().remove()
        if ax is not axes[-1, 0]:
            ax.set_xlabel("")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=8, frameon=False,
               markerscale=2)
    return fig


def tile_explorer(grid, step: str = "baseline", shapes=None, selected=(256, 128),
                  max_registers: int = 255, consumers: int = 128, tile_d: int = 128):
    """The static face of chapter 5's tile explorer: for each tile shape, the registers the
    tiles would need per consumer thread (S, P, acc stacked: ``helpers.tile_registers``)
    against the 255-register limit, the registers the compiler gave (Hopper, Blackwell), and
    the spill stack it needed. ``grid``: rows of ``results.load(gpu).tile_grid`` (columns
    step, arch, TILE_M, TILE_N, registers, stack_bytes). ``selected``: the explorer's
    default shape, outlined. Returns the Figure."""
    from .helpers import tile_registers
    plt = _plt()
    g = grid[grid["step"] == step]
    if g.empty:
        raise ValueError(f"no rows for step {step!r} in the tile grid")
    if shapes is None:
        shapes = sorted({(int(a), int(b)) for a, b in zip(g["TILE_M"], g["TILE_N"])})
    labels = [f"{tm}×{tn}" for tm, tn in shapes]
    x = np.arange(len(shapes))
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(8.5, 3.4))
    bottom = np.zeros(len(shapes))
    for k, (name, color) in enumerate((("S (fp32)", "#9ecae1"), ("P (fp16)", "#c6dbef"),
                                       ("acc (fp32)", "#3182bd"))):
        vals = np.array([tile_registers(tm, tn, consumers, tile_d)[k] for tm, tn in shapes])
        ax0.bar(x, vals, 0.6, bottom=bottom, color=color, label=name)
        bottom += vals
    ax0.axhline(max_registers, color="#d62728", lw=1.2, ls="--")
    ax0.text(len(shapes) - 0.5, max_registers, f"limit {max_registers}", color="#d62728",
             fontsize=7, ha="right", va="bottom")

    def compiled(arch, col):
        h = g[g["arch"] == arch].set_index(["TILE_M", "TILE_N"])[col]
        return np.array([float(h.get(s, np.nan)) for s in shapes])

    markers = {"sm_90": ("o", "#000000", "Hopper (sm_90)"),
               "sm_100": ("s", "#ff7f0e", "Blackwell (sm_100)")}
    for arch, (mk, color, name) in markers.items():
        ax0.plot(x, compiled(arch, "registers"), mk, color=color, ms=5, ls="none",
                 label=f"compiled, {name}")
    ax0.set_ylim(0, 1.15 * max(bottom.max(), max_registers))
    ax0.set_ylabel("32-bit registers per thread", fontsize=8)
    ax0.set_title("tiles' register demand vs what the compiler gives", fontsize=9)
    ax0.legend(fontsize=6.5, frameon=False, loc="upper left", ncol=2)
    w = 0.38
    for k, (arch, (_, color, name)) in enumerate(markers.items()):
        ax1.bar(x + (k - 0.5) * w, compiled(arch, "stack_bytes"), w, color=color, label=name)
    ax1.set_ylabel("spill stack, bytes per thread", fontsize=8)
    ax1.set_title("spilling: the cliff", fontsize=9)
    ax1.legend(fontsize=7, frameon=False, loc="upper left")
    for ax in (ax0, ax1):
        ax.set_xticks(x, labels, fontsize=7, rotation=45)
        ax.set_xlabel("TILE_M × TILE_N", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        if tuple(selected) in shapes:
            i = shapes.index(tuple(selected))
            ax.axvspan(i - 0.45, i + 0.45, color="#ffd92f", alpha=0.35, zorder=0)
            ax.get_xticklabels()[i].set_fontweight("bold")
    fig.suptitle(f"{step} step, every tile shape (highlighted: the explorer's default "
                 f"{selected[0]}×{selected[1]})", fontsize=9)
    fig.tight_layout()
    return fig
