"""The chapter's three figures: bandwidth against cache length, the roofline, the crossover.
Labels and colours are the registry's (``flashbook.impls``)."""
from __future__ import annotations

import numpy as np

from ...hardware import PEAK_TFLOPS
from ...impls import color_of, label_of
from .arith import _fmt_n, ridge
from .data import OURS, TORCH, DecodeData

LABELS = {n: label_of(n, "decode") for n in (*OURS, "square_best", *TORCH)}
COLORS = {n: color_of(n) for n in (*OURS, "square_best", "sdpa_flash", "sdpa_cudnn", "sdpa_math",
                                   "flex")}


def _plt():
    import matplotlib.pyplot as plt
    return plt


def bandwidth_figure(d: DecodeData, impls=("decode", "decode_paged64", "square_best",
                                           "sdpa_flash", "sdpa_cudnn"), Nqs=(1, 4)):
    """GB/s against cache length, one panel per (Nq, B), with the HBM peak as a line."""
    plt = _plt()
    Bs = sorted(int(b) for b in d.ok["B"].unique())
    fig, axes = plt.subplots(len(Nqs), len(Bs), figsize=(3.3 * len(Bs), 2.7 * len(Nqs)),
                             sharey=True, squeeze=False)
    peak = d.peak_tbps * 1e3
    for i, nq in enumerate(Nqs):
        for j, B in enumerate(Bs):
            ax = axes[i][j]
            sub = d.ok[(d.ok["B"] == B) & (d.ok["Nq"] == nq)]
            for impl in impls:
                s = sub[sub["impl"] == impl].sort_values("Nk")
                if s.empty:
                    continue
                ax.plot(s["Nk"], s["gbps"], marker="o", ms=3, lw=1.4,
                        ls="-" if impl in OURS else "--", color=COLORS.get(impl, "#999999"),
                        label=LABELS.get(impl, impl))
            ax.axhline(peak, color="#d62728", lw=1, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(sub["Nk"].unique()))
            ax.set_xticklabels([_fmt_n(n) for n in sorted(sub["Nk"].unique())], fontsize=7)
            ax.set_ylim(0, peak * 1.08)
            ax.set_title(f"B={B}, Nq={nq}", fontsize=9)
            if j == 0:
                ax.set_ylabel("GB/s of K/V")
            if i == len(Nqs) - 1:
                ax.set_xlabel("cache length Nk")
    axes[0][0].annotate(f"HBM peak {d.peak_tbps:g} TB/s", (0.02, peak * 1.01),
                        xycoords=("axes fraction", "data"), fontsize=7, color="#d62728",
                        va="bottom")
    h, lab = axes[0][-1].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"Decode bandwidth, GQA 32:8, D=128, fp16 — recorded on {d.gpu}", fontsize=10)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


def roofline_figure(d: DecodeData, impls=("decode", "square_best", "sdpa_flash", "sdpa_cudnn"),
                    B: int = 8):
    """The roofline of one decode step: measured TFLOPS at each implementation's arithmetic
    intensity (FLOPs over the bytes of K/V it must read), all cache lengths of one batch size,
    against the HBM slope and the tensor-core roof."""
    from flashattn.timing import attention_flops
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    peak_tb = d.peak_tbps
    ii = np.logspace(-0.5, 3.5, 200)
    ax.plot(ii, np.minimum(PEAK_TFLOPS, peak_tb * ii), color="#444444", lw=1.5)
    r = ridge(PEAK_TFLOPS, peak_tb)
    ax.axvline(r, color="#bbbbbb", ls=":", lw=1)
    ax.annotate(f"ridge ≈ {r:.0f} FLOP/byte", (r * 1.1, 2.0), fontsize=8)
    ax.annotate(f"{peak_tb:g} TB/s", (0.5, peak_tb * 0.5 * 1.25), fontsize=8)
    ax.annotate(f"{PEAK_TFLOPS:.0f} TFLOPS", (1500, PEAK_TFLOPS * 1.1), fontsize=8, ha="center")
    ok = d.ok[(d.ok["B"] == B) & d.ok["impl"].isin(impls)]
    marks = {1: "o", 4: "^"}
    for impl in impls:
        for nq in (1, 4):
            s = ok[(ok["impl"] == impl) & (ok["Nq"] == nq)]
            if s.empty:
                continue
            fl = np.array([attention_flops(int(x.B), int(x.Hq), int(x.Nq), int(x.Nk), int(x.D),
                                           True, input_pos=int(x.Nk) - int(x.Nq))
                           for x in s.itertuples()])
            tf = fl / (s["median_ms"].to_numpy() * 1e-3) / 1e12
            x = fl / s["kv_bytes"].to_numpy()
            ax.scatter(x, tf, marker=marks[nq], s=28, color=COLORS.get(impl, "#999"),
                       alpha=0.85, label=f"{LABELS.get(impl, impl)}, Nq={nq}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.3, 3000)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of K/V)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(f"Roofline of a decode step, B={B}, Nk 1K–128K — recorded on {d.gpu}",
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7)
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


def crossover_figure(d: DecodeData):
    """Square kernel time over decode time against Nk, one line per Nq (B=8)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.3))
    c = d.crossover
    t = c.pivot_table(index=["Nq", "Nk"], columns="impl", values="median_ms", aggfunc="first")
    for nq, col in zip((1, 4, 16), ("#1f77b4", "#2ca02c", "#9467bd")):
        if nq not in t.index.get_level_values(0):
            continue
        s = t.loc[nq]
        ax.plot(s.index, s["square_best"] / s["decode"], marker="o", ms=3, color=col,
                label=f"Nq={nq}")
    from flashattn.api import DECODE_PATH_MIN_NK
    ax.axhline(1.0, color="#444", lw=1)
    ax.axvline(DECODE_PATH_MIN_NK, color="#d62728", ls=":", lw=1)
    ax.annotate("DECODE_PATH_MIN_NK", (DECODE_PATH_MIN_NK * 1.05, 0.62), fontsize=7,
                color="#d62728")
    ks = sorted(c["Nk"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([_fmt_n(k) for k in ks], fontsize=8)
    ax.set_xlabel("cache length Nk")
    ax.set_ylabel("square time / decode time")
    ax.set_title(f"Decode path against the square kernel, B=8 — recorded on {d.gpu}", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig
