"""Nsight Compute tables and figures: one row per step, the chapter card, metric bars."""
from __future__ import annotations

import math
import re

import numpy as np

from .style import _book_rank, _plt, _title, color_of

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
