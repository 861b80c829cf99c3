"""Benchmark figures: TFLOPS against sequence length, the waterfall of a ladder, the roofline."""
from __future__ import annotations

import numpy as np

from flashbook.steps import STEP_NAMES
from .profiles import per_step
from .style import (_book_rank, _is_library, _linestyle, _pick_workload, _plt, _title, color_of,
                    fmt_n)

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

    from ...hardware import HBM_TBS, PEAK_TFLOPS
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
