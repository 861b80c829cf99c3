"""The Hopper ladder of chapters 6-8: the seed's steps replayed at a tile that does not spill.

On Hopper the seed's 256x128 tiles spill (chapter 5), so the effect of its later steps cannot be
read there. The recorded dataset replays them at 64x128 (``flashbook.steps.HOPPER_LADDER``), each
rung one change over the previous one, timed in the same rounds as cuDNN and as the control
``best``/``best#2`` (one kernel timed as two rows), causal and non-causal::

    from flashbook.chapter import ladder
    t = ladder.effect_table(r, "fast_math@64x128")     # rung over its predecessor, per N
    ladder.display_table(t)                            # formatted, with the call per cell
    ladder.glue_effects("ch6_lad", t)                  # numbers for the prose
    ladder.figure(r, "fast_math@64x128",               # TFLOPS of the rungs so far, the chapter's bold
                  rungs=ladder.rungs_to("fast_math@64x128"))
    ladder.profile_rows(r.profile, ["baseline@64x128", "fast_math@64x128"], METRICS)

A rung's effect is its speed over its predecessor's, paired by round (``stats.ratio_ci`` of the
two rows' ``samples_ms``) with a bootstrap 95 % interval. ``call_effect`` names it "faster" or
"slower" only where the interval clears the control's and the change is larger than the
measured resolution: the control's gap, and the largest gap between any two rows of the run
that ran the same kernel (``resolution``: ``arch_tuned``, ``remap@64x128:occ=2``, ``best``,
``best#2`` and ``warp_groups`` where it chose 64x128). Otherwise "no effect detected".
"""
from __future__ import annotations

import math

from flashattn import stats
from flashbook.steps import HOPPER_LADDER

RUNGS: tuple[str, ...] = tuple(name for name, _ in HOPPER_LADDER)
LABELS: dict[str, str] = dict(HOPPER_LADDER)
# (label in the book, recorded workload)
WORKLOADS: tuple[tuple[str, str], ...] = (("causal", "fp16-causal-d128"),
                                          ("non-causal", "fp16-full-d128"))
CONTROL = ("best", "best#2")        # the same kernel timed as two rows: the resolution
# Rows that run arch_tuned's kernel (the same flags at 64x128 occupancy=2) where their recorded
# configuration says so: every pair of them is a control too.
COPIES = ("arch_tuned", "remap@64x128:occ=2", "best", "best#2", "warp_groups")
COPY_CONFIG = "64x128 occ=2"
NO_EFFECT = "no effect detected"


def predecessor(rung: str) -> str:
    """The rung below ``rung`` on the ladder. Raises KeyError for the first rung or a name that
    is not a rung."""
    if rung not in RUNGS:
        raise KeyError(f"{rung!r} is not a rung of the Hopper ladder ({', '.join(RUNGS)})")
    i = RUNGS.index(rung)
    if i == 0:
        raise KeyError(f"{rung!r} is the first rung: it has no predecessor")
    return RUNGS[i - 1]


def rungs_to(rung: str) -> tuple[str, ...]:
    """The rungs of the ladder up to and including ``rung``: what a chapter that ends at ``rung``
    may draw (a later rung is a look ahead). Raises KeyError for a name that is not a rung."""
    if rung not in RUNGS:
        raise KeyError(f"{rung!r} is not a rung of the Hopper ladder ({', '.join(RUNGS)})")
    return RUNGS[:RUNGS.index(rung) + 1]


def samples(r, impl: str, N: int, workload: str) -> list:
    """The per-round times (ms) of one recorded row. Raises KeyError if the row is absent or
    has no samples."""
    row = r.row(impl, N, workload)
    s = None if row is None else row.get("samples_ms")
    if s is None or (isinstance(s, float) and math.isnan(s)) or len(s) == 0:
        raise KeyError(f"no samples for {impl} at N={N} in {workload}")
    return list(s)


def paired(r, impl: str, ref: str, N: int, workload: str) -> tuple[float, float, float]:
    """Speed of ``impl`` over ``ref`` (ref time / impl time), paired by round: (ratio, lo, hi)."""
    return stats.ratio_ci(samples(r, ref, N, workload), samples(r, impl, N, workload))


def copies(r, N: int, workload: str, names=COPIES, config: str = COPY_CONFIG) -> list[str]:
    """The rows at N that ran the same kernel (``names`` recorded with configuration
    ``config``; ``best`` is recorded as "warp_groups: 64x128 occ=2")."""
    out = []
    for name in names:
        row = r.row(name, N, workload)
        if row is not None and str(row.get("config", "")).split(": ")[-1] == config:
            out.append(name)
    return out


def resolution(r, workload: str, names=COPIES, config: str = COPY_CONFIG):
    """The measured resolution of a workload: the largest gap |ratio - 1| between any two rows
    that ran the same kernel (``copies``), over every recorded N. Returns (gap, detail) with
    detail a DataFrame: N, the two rows, ratio/lo/hi, gap."""
    import itertools

    import pandas as pd
    rows = []
    ns = sorted(int(n) for n in r.bench[r.bench["workload"] == workload]["Nq"].unique())
    for N in ns:
        for a, b in itertools.combinations(copies(r, N, workload, names, config), 2):
            x = paired(r, b, a, N, workload)
            rows.append({"N": N, "a": a, "b": b, "ratio": x[0], "lo": x[1], "hi": x[2],
                         "gap": abs(x[0] - 1)})
    d = pd.DataFrame(rows, columns=["N", "a", "b", "ratio", "lo", "hi", "gap"])
    return (float(d["gap"].max()) if len(d) else 0.0), d


def call_effect(effect, control, resolution: float = 0.0) -> str:
    """"faster" / "slower" only where the effect's interval clears the control's and the change
    is larger than both the control's gap and ``resolution`` (the largest gap between copies of
    one kernel, ``resolution``); otherwise ``NO_EFFECT``. ``effect`` and ``control`` are
    (ratio, lo, hi)."""
    (x, lo, hi), (c, clo, chi) = effect, control
    if any(v != v for v in (x, lo, hi, c, clo, chi)):
        return NO_EFFECT
    larger = abs(x - 1) > max(abs(c - 1), resolution)
    if larger and lo > chi:
        return "faster"
    if larger and hi < clo:
        return "slower"
    return NO_EFFECT


def fmt_ci(t, spec: str = ".3f") -> str:
    """(ratio, lo, hi) -> "1.140 [1.139, 1.142]"."""
    x, lo, hi = t
    return f"{x:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def effect_table(r, step: str, prev: str | None = None, workloads=WORKLOADS,
                 control=CONTROL):
    """The measured effect of ``step`` over ``prev`` (default: its predecessor on the ladder)
    at every recorded N of each workload.

    Columns: workload (book label), N, ``prev`` and ``step`` TFLOPS, ratio/lo/hi (speed of
    ``step`` over ``prev`` paired by round, 95 % interval), ctl/ctl_lo/ctl_hi (the control
    ``control[1]`` over ``control[0]``, same rounds), res (the workload's ``resolution``), call
    (``call_effect``). Works for any two rows timed in the same run (e.g. ``pair`` over
    ``arch_tuned``).
    """
    import pandas as pd
    prev = prev or predecessor(step)
    rows = []
    for label, workload in workloads:
        res = resolution(r, workload)[0]
        b = r.bench[(r.bench["workload"] == workload) & (r.bench["impl"] == step)]
        for N in sorted(int(n) for n in b["Nq"].unique()):
            eff = paired(r, step, prev, N, workload)
            ctl = paired(r, control[1], control[0], N, workload)
            rows.append({"workload": label, "N": N,
                         "tflops_prev": float(r.row(prev, N, workload)["tflops"]),
                         "tflops": float(r.row(step, N, workload)["tflops"]),
                         "ratio": eff[0], "lo": eff[1], "hi": eff[2],
                         "ctl": ctl[0], "ctl_lo": ctl[1], "ctl_hi": ctl[2], "res": res,
                         "call": call_effect(eff, ctl, res)})
    t = pd.DataFrame(rows)
    t.attrs.update(step=step, prev=prev)
    return t


def display_table(t, spec: str = ".3f"):
    """``effect_table`` for the page: index (workload, N), TFLOPS of both steps, the effect and
    the control as "ratio [lo, hi]", and the call."""
    step, prev = t.attrs.get("step", "step"), t.attrs.get("prev", "prev")
    out = t[["workload", "N"]].copy()
    out["N"] = [f"{n // 1024}K" if n % 1024 == 0 else str(n) for n in t["N"]]
    out[f"{prev} TFLOPS"] = t["tflops_prev"].round(1)
    out[f"{step} TFLOPS"] = t["tflops"].round(1)
    out["speed ratio [95 % CI]"] = [fmt_ci(x, spec) for x in zip(t["ratio"], t["lo"], t["hi"])]
    out["control best#2 / best"] = [fmt_ci(x, spec) for x in zip(t["ctl"], t["ctl_lo"],
                                                                   t["ctl_hi"])]
    out["call"] = t["call"]
    return out.set_index(["workload", "N"])


def pct(ratio: float, spec: str = "+.1f") -> str:
    """A speed ratio as a signed change in %: 1.0361 -> "+3.6"; never "-0.0"."""
    s = format(100 * (ratio - 1), spec)
    return s.replace("-", "+", 1) if s.lstrip("+-").strip("0.") == "" else s


def _tag(label: str) -> str:
    return "c" if label == "causal" else "f" if label == "non-causal" else label


def glue_effects(prefix: str, t, glue=None) -> dict:
    """Glue an ``effect_table`` for the prose; returns {name: text}.

    Per cell (tag ``c`` causal, ``f`` non-causal; ``N`` as ``1k`` .. ``16k``):
    ``{prefix}_{tag}{N}`` "1.140 [1.139, 1.142]", ``..._pct`` the change in % ("+14.0"),
    ``..._call``. Per workload: ``{prefix}_{tag}_faster`` / ``_slower`` / ``_none`` / ``_n``
    (counts), ``_min_pct`` / ``_max_pct`` (the range of the changes).
    """
    if glue is None:
        from .page import glue
    out = {}

    def g(name, value):
        out[name] = value
        glue(name, value)

    for label in dict.fromkeys(t["workload"]):
        tag, sub = _tag(label), t[t["workload"] == label]
        for _, x in sub.iterrows():
            n = f"{x['N'] // 1024}k" if x["N"] % 1024 == 0 else str(x["N"])
            g(f"{prefix}_{tag}{n}", fmt_ci((x["ratio"], x["lo"], x["hi"])))
            g(f"{prefix}_{tag}{n}_pct", pct(x["ratio"]))
            g(f"{prefix}_{tag}{n}_call", x["call"])
        g(f"{prefix}_{tag}_faster", str(int((sub["call"] == "faster").sum())))
        g(f"{prefix}_{tag}_slower", str(int((sub["call"] == "slower").sum())))
        g(f"{prefix}_{tag}_none", str(int((sub["call"] == NO_EFFECT).sum())))
        g(f"{prefix}_{tag}_n", str(len(sub)))
        g(f"{prefix}_{tag}_min_pct", pct(sub["ratio"].min()))
        g(f"{prefix}_{tag}_max_pct", pct(sub["ratio"].max()))
    return out


def figure(r, step: str, workloads=WORKLOADS, rungs=RUNGS, reference: str = "sdpa_cudnn",
           effect: bool = True):
    """TFLOPS against N of every rung, one panel per workload; ``step`` and its predecessor
    drawn bold, the other rungs faint, the reference library dashed. With ``effect`` (and a
    predecessor), a second row shows the change of ``step`` over it in % with the 95 % interval
    of each N, and the run's resolution (``resolution``) shaded. The legend sits under the panels
    (two columns), so the panels keep the page's width. Returns the Figure."""
    import matplotlib.pyplot as plt

    from .plots import color_of, fmt_n
    prev = predecessor(step) if step in RUNGS[1:] else None
    rows = 2 if effect and prev is not None else 1
    fig, axes = plt.subplots(rows, len(workloads), figsize=(3.9 * len(workloads) + 0.6,
                                                            4.4 + 2.2 * (rows - 1)),
                             sharey="row", squeeze=False,
                             gridspec_kw={"height_ratios": [3, 2][:rows]})
    markers = "osD^v"
    for col, (label, workload) in enumerate(workloads):
        ax = axes[0, col]
        t = r.tflops_table(workload)
        for i, rung in enumerate(rungs):
            if rung not in t.index:
                continue
            bold = rung in (step, prev)
            ax.plot(t.columns, t.loc[rung], marker=markers[i % len(markers)], ms=4,
                    lw=2.2 if bold else 1.0, alpha=1.0 if bold else 0.35, color=color_of(rung),
                    label=f"{rung} ({LABELS.get(rung, '')})")
        if reference in t.index:
            ax.plot(t.columns, t.loc[reference], "k--", lw=1.2, label=f"{reference} (library)")
        ax.set_title(f"{label} ({workload})", fontsize=9)
        ax.set_ylim(bottom=0)
        if rows == 2:
            e = effect_table(r, step, prev, workloads=((label, workload),))
            res = 100 * float(e["res"].iloc[0]) if len(e) else 0.0
            bx = axes[1, col]
            y = 100 * (e["ratio"] - 1)
            bx.axhspan(-res, res, color="#cccccc", alpha=0.5, lw=0,
                       label="resolution (shaded; value above each panel)")
            bx.set_title(f"resolution ±{res:.2f} %", fontsize=8)
            bx.axhline(0, color="#888888", lw=0.8)
            err = [100 * (e["ratio"] - e["lo"]), 100 * (e["hi"] - e["ratio"])]
            bx.errorbar(e["N"], y, yerr=err, fmt="o", ms=4, capsize=3, color=color_of(step),
                        label=f"{step} over {prev}, 95 % CI")
            bx.set_xlabel("sequence length N")
        else:
            ax.set_xlabel("sequence length N")
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ns = sorted(int(n) for n in r.bench[r.bench["workload"] == workloads[0][1]]["Nq"].unique())
        ax.set_xticks(ns, [fmt_n(n) for n in ns])
        ax.minorticks_off()
    axes[0, 0].set_ylabel("TFLOPS")
    handles, labels = axes[0, -1].get_legend_handles_labels()
    if rows == 2:
        axes[1, 0].set_ylabel("change, %")
        h2, l2 = axes[1, -1].get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    fig.suptitle(f"The Hopper ladder at 64×128: {step}" + (f" over {prev}" if prev else ""),
                 fontsize=10)
    nrows_legend = -(-len(labels) // 2)
    fig.tight_layout(rect=(0, 0.026 * nrows_legend + 0.015, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False, fontsize=7.5,
               bbox_to_anchor=(0.5, 0.0))
    return fig


def profile_rows(profile_df, steps, metrics: dict):
    """Selected Nsight Compute metrics of ``steps`` (one profile row per step: the longest
    kernel's), as a DataFrame: rows the labels of ``metrics`` ({metric: label}), columns the
    steps, and ``ratio`` (last step over first) when there are two. Raises KeyError for a step
    or metric that was not recorded."""
    import pandas as pd
    p = profile_df
    have = set(p["step"])
    missing = [s for s in steps if s not in have]
    if missing:
        raise KeyError(f"no recorded profile for {', '.join(missing)}")
    absent = [m for m in metrics if m not in p.columns]
    if absent:
        raise KeyError(f"metrics not recorded: {', '.join(absent)}")
    cols = {}
    for s in steps:
        g = p[p["step"] == s]
        if "gpu__time_duration.sum" in g and g["gpu__time_duration.sum"].notna().any():
            g = g.loc[[g["gpu__time_duration.sum"].astype(float).idxmax()]]
        cols[s] = [float(g[m].iloc[0]) for m in metrics]
    t = pd.DataFrame(cols, index=list(metrics.values()))
    t.index.name = "metric"
    if len(steps) == 2:
        t["ratio"] = t[steps[1]] / t[steps[0]]
    return t


# The counters that show a launch's tail: how long each SM was busy, against the launch's length.
SM_ACTIVITY = ("sm__cycles_active.avg", "sm__cycles_active.min", "sm__cycles_active.max",
               "sm__cycles_elapsed.avg", "sm__cycles_elapsed.max", "gpu__time_duration.sum")


def sm_activity(report, steps=None):
    """How busy the SMs were in each profiled launch, read from a recorded Nsight Compute report
    (``.ncu-rep``, or ``.ncu-rep.xz`` as the dataset stores them) with the ``ncu_report`` module.

    The recorded summaries keep achieved occupancy, which is averaged over the cycles an SM is
    active and so cannot see SMs that idle at the end of a launch; ``sm__cycles_active`` over
    ``sm__cycles_elapsed`` can. Returns a DataFrame indexed by step (the NVTX range of each
    profiled kernel; ``steps`` selects and orders): the counters of ``SM_ACTIVITY`` and
    ``busy_avg_pct`` / ``busy_min_pct`` / ``busy_max_pct`` (active cycles over the launch's
    elapsed cycles, ``sm__cycles_elapsed.max``: the mean SM, the least and the most busy one;
    the last can read slightly above 100). Raises RuntimeError without ``ncu_report``, KeyError
    for a step not in the report.
    """
    import pandas as pd

    from ..measure.ncu import report_metrics
    rows = report_metrics(report, SM_ACTIVITY)
    d = pd.DataFrame.from_dict(rows, orient="index")
    d.index.name = "step"
    if steps is not None:
        missing = [s for s in steps if s not in d.index]
        if missing:
            raise KeyError(f"not in the report: {', '.join(missing)}; it has "
                           f"{', '.join(d.index)}")
        d = d.loc[list(steps)]
    el = d["sm__cycles_elapsed.max"]
    for k in ("avg", "min", "max"):
        d[f"busy_{k}_pct"] = 100 * d[f"sm__cycles_active.{k}"] / el
    return d


__all__ = ["RUNGS", "LABELS", "WORKLOADS", "CONTROL", "COPIES", "NO_EFFECT", "SM_ACTIVITY",
           "predecessor", "rungs_to", "samples", "paired", "copies", "resolution", "call_effect",
           "fmt_ci", "pct", "effect_table", "display_table", "glue_effects", "figure", "profile_rows",
           "sm_activity"]
