"""Pictures of the ideas: schematic diagrams drawn by code, for the chapters (issue 13).

Each function draws one idea and returns a matplotlib ``Figure``; none reads measured data, so a
diagram holds no measurement, only the structure of the algorithm or the hardware (capacities such
as the 256 KB register file are hardware limits). The book shows them as SVG files written by

    python -m flashbook.chapter.diagrams            # -> book/_static/diagrams/*.svg

and ``tests/test_diagrams.py`` checks that each renders and that the committed files are current.

==========================  ========  =========================================================
function                    chapter   idea
==========================  ========  =========================================================
``naive_vs_fused``          1         the N × N intermediate through HBM, or kept on chip
``online_rescale``          2         the running sum is rescaled when the running max grows
``dataflow``                3         Q, K, V tiles from HBM through shared memory to registers
``accumulator_home``        5         the accumulator in registers (Hopper) or TMEM (Blackwell)
``waves_tail``              8         programs of unequal work on SMs: the tail, and remap
``warp_specialised``        10        a TMA producer and two consumer warp groups, in time
==========================  ========  =========================================================

The output is deterministic: fixed data, SVG text kept as text (``svg.fonttype = "none"``), a
fixed hash salt for element ids and no date in the metadata.
"""
from __future__ import annotations

import argparse
import heapq
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle  # noqa: E402

OUT_DIR = Path(__file__).resolve().parents[2] / "book" / "_static" / "diagrams"

# Memory levels and roles, one colour each in every diagram.
HBM = "#dbe9f6"        # off-chip: HBM / global memory
SMEM = "#fde9c9"       # shared memory
REG = "#d9f0d3"        # registers
TMEM = "#e8dff5"       # Blackwell tensor memory
TC = "#f4cccc"         # tensor cores / MMA
EDGE = "#444444"
Q_C, K_C, V_C, O_C = "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"
ACCENT = "#d62728"

STYLE = {
    "svg.fonttype": "none",          # text stays text: small files, readable diffs
    "svg.hashsalt": "flashattn",     # stable element ids
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
}


# --- Drawing helpers ---------------------------------------------------------------------------

def _canvas(w: float, h: float, xmax: float = 100, ymax: float = 60) -> tuple[Figure, plt.Axes]:
    """A figure with one axes in data units [0, xmax] x [0, ymax], no ticks."""
    with plt.rc_context(STYLE):
        fig = plt.figure(figsize=(w, h))
        ax = fig.add_axes([0, 0, 1, 1])
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, ymax)
    ax.set_axis_off()
    return fig, ax


def _box(ax, x, y, w, h, label="", fc="white", ec=EDGE, fs=8.5, lw=1.0, color="black",
         weight="normal", round_=0.6, va="center", **kw):
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle=f"round,pad=0,rounding_size={round_}",
                                fc=fc, ec=ec, lw=lw, **kw))
    if label:
        ty = y + h / 2 if va == "center" else y + h - 1.2
        ax.text(x + w / 2, ty, label, ha="center", va=va, fontsize=fs, color=color,
                weight=weight)


def _arrow(ax, p0, p1, label="", color=EDGE, lw=1.4, fs=7.5, style="-|>", rad=0.0,
           loff=(0, 0), ha="center", ls="-"):
    ax.add_patch(FancyArrowPatch(p0, p1, arrowstyle=style, mutation_scale=11, color=color,
                                 lw=lw, ls=ls, connectionstyle=f"arc3,rad={rad}",
                                 shrinkA=1, shrinkB=1))
    if label:
        mx, my = (p0[0] + p1[0]) / 2 + loff[0], (p0[1] + p1[1]) / 2 + loff[1]
        ax.text(mx, my, label, fontsize=fs, ha=ha, va="center", color=color)


def _band(ax, y, h, label, fc, note=""):
    ax.add_patch(Rectangle((0.5, y), 99, h, fc=fc, ec="none", alpha=0.55))
    ax.text(1.5, y + h - 1.4, label, fontsize=9, weight="bold", va="top", color="#222222")
    if note:
        ax.text(1.5, y + h - 4.4, note, fontsize=7.5, va="top", color="#555555")


def _matrix(ax, x, y, w, h, rows, fc, hi=(), hi_fc=None, label="", edge=EDGE):
    """A tall matrix cut into ``rows`` row tiles; tiles in ``hi`` are filled with ``hi_fc``."""
    th = h / rows
    for r in range(rows):
        ax.add_patch(Rectangle((x, y + h - (r + 1) * th), w, th, lw=0.6, ec=edge,
                               fc=hi_fc if r in hi else fc))
    if label:
        ax.text(x + w / 2, y + h + 1.0, label, ha="center", va="bottom", fontsize=9,
                weight="bold")


# --- Chapter 1: standard attention against fused ----------------------------------------------

def naive_vs_fused() -> Figure:
    """Where the N × N intermediate goes: standard attention against a fused kernel.

    Top: the book's ``naive`` step, three kernels that each make a round trip through HBM: S is
    written in fp32 and read back twice by the softmax, P is written in fp16 and read by the last
    product. Bottom: one fused kernel keeps S and P on chip, and only Q, K, V and O cross HBM.
    """
    fig, ax = _canvas(7.4, 3.9, 100, 54)
    ax.text(1, 52.5, "Standard attention: three kernels (the naive step)", fontsize=9,
            weight="bold", va="top")
    ax.text(1, 22.5, "Fused attention: one kernel", fontsize=9, weight="bold", va="top")
    for y0, h in ((28, 20), (1, 18)):
        ax.add_patch(Rectangle((0.5, y0), 99, 5.5, fc=HBM, ec="none"))
        ax.text(98.5, y0 + 2.75, "HBM", ha="right", va="center", fontsize=8, weight="bold",
                color="#335")

    def tensor(x, y, w, label, c, big=False):
        _box(ax, x, y, w, 4.3, label, fc="white", ec=c, lw=1.8 if big else 1.3, fs=8,
             round_=0.3)

    # Standard: Q, K | S | P, V | O along the HBM strip, kernels above it.
    y = 28.6
    tensor(2, y, 8, "Q, K", K_C)
    tensor(27, y, 16, "S  (N × N, fp32)", ACCENT, big=True)
    tensor(52, y, 16, "P  (N × N, fp16)", ACCENT, big=True)
    tensor(73, y, 6, "V", V_C)
    tensor(84, y, 6, "O", O_C)
    ky = 39
    for x, w, name in ((8, 15, "scores_kernel"), (37, 15, "softmax_kernel"),
                       (67, 15, "pv_kernel")):
        _box(ax, x, ky, w, 6, name, fc=TC, fs=7.5)
    _arrow(ax, (6, 33), (10, 39), "read", fs=6.8, loff=(-3, 0))
    _arrow(ax, (19, 39), (33, 33), "write", fs=6.8, loff=(1, 2), color=ACCENT)
    _arrow(ax, (37, 33), (41, 39), "read ×2", fs=6.8, loff=(-4.5, 0), color=ACCENT)
    _arrow(ax, (49, 39), (58, 33), "write", fs=6.8, loff=(2, 2), color=ACCENT)
    _arrow(ax, (64, 33), (70, 39), "read", fs=6.8, loff=(-3, 0), color=ACCENT)
    _arrow(ax, (76, 33), (75, 39), "", fs=6.8)
    _arrow(ax, (79, 39), (86, 33), "write", fs=6.8, loff=(3, 1))

    # Fused: Q, K, V in, O out; S and P never leave the chip.
    y = 1.6
    tensor(2, y, 14, "Q, K, V", K_C)
    tensor(84, y, 6, "O", O_C)
    _box(ax, 25, 9.5, 50, 9, "", fc=TC)
    ax.text(50, 17, "fmha_kernel", ha="center", va="top", fontsize=7.5)
    for x, label in ((31, "S tile"), (44, "P tile"), (57, "acc")):
        _box(ax, x, 10.5, 11, 4, label, fc=REG, fs=7.2, round_=0.3)
    ax.text(50, 7.9, "S and P stay in registers, one tile at a time", ha="center",
            fontsize=7.2, color="#555555")
    _arrow(ax, (12, 6.1), (25, 12), "read once", fs=6.8, loff=(-3, 2))
    _arrow(ax, (75, 12), (86, 6.1), "write once", fs=6.8, loff=(3, 2))
    return fig


# --- Chapter 2: the online-softmax rescale -----------------------------------------------------

def online_rescale() -> Figure:
    """A row of scores read in three blocks; the running sum rescaled as the running max grows.

    Left: the scores by block and the running max $m_j$. Right: the running sum $d_j$ as a stack of
    each block's contribution *relative to the current max*: when block 2 raises the max, the
    earlier contributions shrink by $e^{m_{j-1} - m_j}$; when block 3 does not, they stay.
    """
    x = np.array([1.0, 2.2, 1.4, 0.6, 2.0, 3.4, 2.8, 1.2, 2.6, 1.8, 3.0, 0.8])   # one row
    blocks = [x[0:4], x[4:8], x[8:12]]
    colors = ["#9ecae1", "#4292c6", "#08519c"]
    with plt.rc_context(STYLE):
        fig, (a0, a1) = plt.subplots(1, 2, figsize=(7.2, 3.0),
                                     gridspec_kw={"width_ratios": [1.35, 1]})
    # Left: scores and the running max.
    m_prev, ms = -np.inf, []
    for b, (xb, c) in enumerate(zip(blocks, colors)):
        idx = np.arange(4 * b, 4 * b + 4)
        a0.bar(idx, xb, color=c, width=0.75, label=f"block {b + 1}")
        m = max(m_prev, xb.max())
        ms.append(m)
        a0.hlines(m, 4 * b - 0.45, 4 * b + 3.45, color=ACCENT, lw=2)
        if b > 0 and m > m_prev:
            a0.annotate("", xy=(4 * b - 0.45, m), xytext=(4 * b - 0.45, m_prev),
                        arrowprops=dict(arrowstyle="-|>", color=ACCENT, lw=1.2))
            a0.text(4 * b - 0.6, (m + m_prev) / 2, "max grows", fontsize=7.5, color=ACCENT,
                    va="center", ha="right")
        m_prev = m
    a0.plot([], [], color=ACCENT, lw=2, label="running max $m_j$")
    a0.set_xticks([1.5, 5.5, 9.5], ["block 1", "block 2", "block 3"])
    a0.set_yticks([])
    a0.set_ylabel("score $x_i$")
    a0.set_ylim(0, 5.2)
    a0.set_title("A row read one block at a time", fontsize=9.5)
    a0.legend(frameon=False, fontsize=7.5, loc="upper left", ncol=2)
    # Right: the running sum, as each block's share relative to the current max.
    for j in range(3):
        bottom = 0.0
        for b in range(j + 1):
            share = np.exp(blocks[b] - ms[j]).sum()
            a1.bar(j, share, bottom=bottom, color=colors[b], width=0.6, ec="white", lw=0.8)
            bottom += share
    a1.annotate(r"$\times\, e^{m_1 - m_2}$", xy=(0.78, np.exp(blocks[0] - ms[1]).sum() * 0.6),
                xytext=(0.22, np.exp(blocks[0] - ms[0]).sum() * 0.55), fontsize=8.5,
                color=ACCENT, arrowprops=dict(arrowstyle="-|>", color=ACCENT, lw=1.1))
    top = sum(np.exp(bl - ms[2]).sum() for bl in blocks)
    a1.text(2, top * 1.03, "max unchanged:\nno rescale", ha="center", va="bottom", fontsize=7.5,
            color="#555555")
    a1.set_xticks([0, 1, 2], ["$d_1$", "$d_2$", "$d_3$"])
    a1.set_yticks([])
    a1.set_ylabel(r"running sum $d_j = \sum e^{x_i - m_j}$")
    a1.set_ylim(0, top * 1.35)
    a1.set_title("The sum, relative to the current max", fontsize=9.5)
    fig.tight_layout()
    return fig


# --- Chapter 3: dataflow through the memory hierarchy ------------------------------------------

def dataflow() -> Figure:
    """One program of the fused kernel: where each tile lives and how often it moves.

    HBM holds Q, K, V and O of one (batch, head). The program loads its query tile Q_i into shared
    memory once, streams the key and value tiles K_j, V_j through shared memory (TMA, two buffers),
    keeps the scores, the running max m_i, the running sum l_i and the accumulator in registers,
    and writes its output tile O_i once.
    """
    fig, ax = _canvas(7.4, 4.4, 100, 62)
    _band(ax, 41, 20.5, "HBM (global memory)", HBM, "one (batch, head): N rows × D")
    _band(ax, 22, 18, "Shared memory", SMEM, "per program (CTA)")
    _band(ax, 0.5, 20.5, "Registers", REG, "the consumer warp group")

    # HBM: Q, K, V, O as tall matrices cut into tiles.
    n = 8
    mx = {"Q": 26, "K": 42, "V": 58, "O": 80}
    _matrix(ax, mx["Q"], 43, 5, 15.5, n, "white", hi=(3,), hi_fc=Q_C, label="Q")
    _matrix(ax, mx["K"], 43, 5, 15.5, n, "white", hi=(0, 1, 2), hi_fc="#ffd8b0", label="K")
    _matrix(ax, mx["V"], 43, 5, 15.5, n, "white", hi=(0, 1, 2), hi_fc="#c7e9c0", label="V")
    for m_, c in (("K", K_C), ("V", V_C)):
        ax.add_patch(Rectangle((mx[m_], 43 + 15.5 - 4 * 15.5 / n), 5, 15.5 / n, fc=c, ec=EDGE,
                               lw=0.6))
    _matrix(ax, mx["O"], 43, 5, 15.5, n, "white", hi=(3,), hi_fc=O_C, label="O")
    ax.text(mx["Q"] - 1, 43 + 15.5 - 3.5 * 15.5 / n, "$Q_i$", ha="right", va="center",
            fontsize=8.5, color=Q_C)
    ax.text(mx["K"] + 6, 43 + 15.5 - 3.5 * 15.5 / n, "$K_j$", va="center", fontsize=8.5,
            color=K_C)
    ax.text(mx["V"] + 6, 43 + 15.5 - 3.5 * 15.5 / n, "$V_j$", va="center", fontsize=8.5,
            color=V_C)
    ax.text(mx["O"] - 1, 43 + 15.5 - 3.5 * 15.5 / n, "$O_i$", ha="right", va="center",
            fontsize=8.5, color=O_C)

    # Shared memory: Q_i once, K_j and V_j double-buffered.
    _box(ax, 22, 26, 12, 7, "$Q_i$", fc="white", ec=Q_C, lw=1.6)
    _box(ax, 39, 26, 9, 7, "$K_j$", fc="white", ec=K_C, lw=1.6)
    _box(ax, 49, 26, 9, 7, "$K_{j+1}$", fc="white", ec=K_C, lw=0.9, ls="--")
    _box(ax, 60, 26, 9, 7, "$V_j$", fc="white", ec=V_C, lw=1.6)
    _box(ax, 70, 26, 9, 7, "$V_{j+1}$", fc="white", ec=V_C, lw=0.9, ls="--")
    ax.text(1.5, 30, "K, V: two buffers, the\nnext tile loads while\nthis one is used",
            va="top", fontsize=7.2, color="#555555")

    # HBM -> SMEM
    _arrow(ax, (mx["Q"] + 2.5, 43), (28, 33.2), "once", color=Q_C, loff=(-3.5, 0))
    _arrow(ax, (mx["K"] + 2.5, 43), (44, 33.2), "stream\nj = 0, 1, 2, …", color=K_C, loff=(-6, 0))
    _arrow(ax, (mx["V"] + 2.5, 43), (65, 33.2), "stream", color=V_C, loff=(4, 0))

    # Registers: S, P, statistics, accumulator.
    _box(ax, 22, 9, 15, 8, "$S = Q_i K_j^T$\nfp32", fc="white", ec=ACCENT, lw=1.2)
    _box(ax, 41, 9, 15, 8, "$P = 2^{S - m_i}$\n(fp16)", fc="white")
    _box(ax, 60, 9, 17, 8, "acc ← acc·α + $P V_j$\nfp32", fc="white", ec=O_C, lw=1.6)
    _box(ax, 41, 2, 15, 5, "$m_i$, $l_i$ (per row)", fc="white", fs=8)
    _arrow(ax, (28, 26), (29, 17.2), "MMA", loff=(-3, 0))
    _arrow(ax, (43.5, 26), (33, 17.2), "", color=K_C)
    _arrow(ax, (37, 13), (41, 13))
    _arrow(ax, (56, 13), (60, 13))
    _arrow(ax, (64.5, 26), (67, 17.2), "MMA", color=V_C, loff=(3.2, 0))
    _arrow(ax, (48.5, 9), (48.5, 7.2), style="<|-|>")
    ax.text(82, 14.5, "loop over j:\nonline softmax\n(chapter 2)", fontsize=7.5, color="#555555",
            va="center")

    # acc -> O once.
    _arrow(ax, (76, 17), (mx["O"] + 2.5, 43), "",
           color=O_C, rad=-0.15)
    ax.text(84, 30, "once, at the end:\n$O_i$ = acc / $l_i$", fontsize=7.5, color=O_C,
            va="center")
    ax.text(99, 46, "nothing of size\nN × N is stored", ha="right", fontsize=8, color=ACCENT)
    return fig


# --- Chapter 5: where the accumulator lives ----------------------------------------------------

def accumulator_home() -> Figure:
    """Hopper accumulates in registers, Blackwell in tensor memory.

    On Hopper (``sm_90``) the warpgroup MMA (``HGMMA``) reads its operands from shared memory and
    accumulates S and acc in the register file of the 128 consumer threads, beside everything else
    those threads hold; what does not fit spills to local memory. On Blackwell (``sm_100``) the
    tcgen05 MMA (``UTCHMMA``) accumulates in tensor memory (TMEM), and the threads load only the
    rows of S they are exponentiating.
    """
    fig, ax = _canvas(7.4, 3.7, 100, 50)
    for x0, title in ((1, "Hopper (sm_90): warpgroup MMA, HGMMA"),
                      (51, "Blackwell (sm_100): tcgen05 MMA, UTCHMMA")):
        _box(ax, x0, 1, 48, 46, "", fc="#fafafa", ec="#999999")
        ax.text(x0 + 24, 45, title, ha="center", va="top", fontsize=9, weight="bold")
        _box(ax, x0 + 2, 32, 44, 7.5, "shared memory: Q, K, V tiles (TMA)", fc=SMEM, fs=8)
        _box(ax, x0 + 2, 20, 14, 8, "tensor cores", fc=TC, fs=8)

    # Hopper: register file holds S and acc.
    _box(ax, 19, 4, 29, 24, "", fc=REG)
    ax.text(33.5, 26.5, "register file (256 KB per SM)", ha="center", va="top", fontsize=8)
    _box(ax, 21, 14.5, 12, 8, "S\nfp32", fc="white", ec=ACCENT, lw=1.3, fs=8)
    _box(ax, 34, 14.5, 12, 8, "acc\nfp32", fc="white", ec=O_C, lw=1.6, fs=8)
    _box(ax, 21, 6, 25, 7, "P, $m_i$, $l_i$, addresses,\nloop counters, masks", fc="white",
         fs=7.5)
    _arrow(ax, (10, 32), (10, 28.2), "operands", loff=(-5, 0), fs=7)
    _arrow(ax, (16.2, 24), (20.8, 20), "accumulate", loff=(0, 7.5), fs=7)
    _box(ax, 3, 4, 13, 9, "local memory\n(DRAM, via\nL1 / L2)", fc=HBM, fs=7, ls="--")
    _arrow(ax, (19, 8.5), (16.2, 8.5), "", color=ACCENT)
    ax.text(17.5, 14.5, "spill", fontsize=7, color=ACCENT, ha="center")

    # Blackwell: TMEM holds S and acc; registers hold the softmax working set.
    _box(ax, 69, 14, 29, 14, "", fc=TMEM)
    ax.text(83.5, 26.5, "tensor memory (256 KB per SM)", ha="center", va="top", fontsize=8)
    _box(ax, 71, 15.5, 12, 8, "S\nfp32", fc="white", ec=ACCENT, lw=1.3, fs=8)
    _box(ax, 84, 15.5, 12, 8, "acc\nfp32", fc="white", ec=O_C, lw=1.6, fs=8)
    _box(ax, 69, 3, 29, 9, "", fc=REG)
    ax.text(83.5, 11.2, "registers", ha="center", va="top", fontsize=8)
    _box(ax, 71, 4, 25, 5.5, "rows of S → P, $m_i$, $l_i$", fc="white", fs=7.5)
    _arrow(ax, (60, 32), (60, 28.2), "operands", loff=(-5, 0), fs=7)
    _arrow(ax, (66.2, 24), (70.8, 21.5), "accumulate", loff=(0, 8), fs=7)
    _arrow(ax, (77, 15.5), (77, 9.7), "load", fs=7, loff=(-3, 0), style="<|-|>")
    ax.text(53, 8, "the register file\nkeeps only the\nsoftmax's rows", fontsize=7.5,
            color="#555555", va="center")
    return fig


# --- Chapter 8: waves and the tail --------------------------------------------------------------

def _greedy(work: list[float], slots: int) -> list[tuple[int, float, float]]:
    """(slot, start, end) per program when each takes the first free slot, in launch order."""
    free = [(0.0, s) for s in range(slots)]
    heapq.heapify(free)
    out = []
    for w in work:
        t, s = heapq.heappop(free)
        out.append((s, t, t + w))
        heapq.heappush(free, (t + w, s))
    return out


def waves_tail(slots: int = 4, heads: int = 3, tiles: int = 6) -> Figure:
    """A causal grid on a few SMs: the same programs in two launch orders.

    Each head has ``tiles`` query tiles; query tile ``t`` visits ``t + 1`` key tiles (the causal
    triangle), plus one unit of prologue and epilogue. Programs start in launch order on the first
    free slot (chapter 8's greedy model). Without remap each head's programs grow, so the launch
    ends on the longest ones; remap reverses the order within a head and the launch ends on short
    ones, which fill the gaps: a smaller tail.
    """
    cmap = ["#6baed6", "#fd8d3c", "#74c476", "#9e9ac8"]
    orders = {"launch order without remap": list(range(tiles)),
              "with remap: each head's tiles in reverse": list(range(tiles))[::-1]}
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(2, 1, figsize=(7.2, 3.9), sharex=True)
    total = heads * sum(t + 2 for t in range(tiles))
    spans = []
    for ax, (title, order) in zip(axes, orders.items()):
        progs = [(h, t) for h in range(heads) for t in order]
        work = [t + 2 for _, t in progs]
        sched = _greedy(work, slots)
        end = max(e for _, _, e in sched)
        spans.append(end)
        for (h, t), (s, a, e) in zip(progs, sched):
            ax.broken_barh([(a, e - a)], (s - 0.4, 0.8), facecolors=cmap[h % len(cmap)],
                           edgecolors="white", lw=1.0)
            ax.text((a + e) / 2, s, f"{t + 1}", ha="center", va="center", fontsize=7)
        ideal = total / slots
        ax.axvline(ideal, color="#555555", ls="--", lw=1)
        ax.axvline(end, color=ACCENT, lw=1.5)
        ax.axvspan(ideal, end, color=ACCENT, alpha=0.08)
        ax.set_yticks(range(slots), [f"SM {s}" for s in range(slots)])
        ax.invert_yaxis()
        ax.set_title(title, fontsize=9.5, loc="left")
        ax.tick_params(axis="x", labelbottom=False, length=0)
        ax.spines["left"].set_visible(False)
    top = axes[0]
    top.text(total / slots, -0.75, "perfect balance ", ha="right", va="bottom", fontsize=7.5,
             color="#555555")
    top.text(spans[0], -0.75, " last program ends", ha="left", va="bottom", fontsize=7.5,
             color=ACCENT)
    axes[1].set_xlabel("time →   (numbers: key tiles a program visits; colour: its head; "
                       "shaded: the tail)")
    axes[1].set_xlim(0, max(spans) * 1.12)
    fig.tight_layout()
    return fig


# --- Chapter 10: a warp-specialised timeline ----------------------------------------------------

def warp_specialised(iters: int = 3) -> Figure:
    """One producer and two consumer warp groups of a program, over a few loop iterations.

    The producer warp group only issues TMA loads of K_j and V_j into shared memory, one tile
    ahead of use. Each consumer warp group owns half of the query tile's rows (64 of 128) and runs
    S = QKᵀ (MMA), the softmax, and acc += PV (MMA). Offset by half an iteration, one group's
    softmax runs while the other's MMAs use the tensor cores, so the tensor cores do not wait for
    the exponentials: the schedule FlashAttention-3 arranges by hand. An idealised picture: the
    softmax is drawn as long as two MMAs, and no duration is measured.
    """
    mma, soft = 1.0, 2.0
    period = 2 * mma + soft                     # one iteration of one consumer
    t0 = 2.0                                    # the first K tile arrives
    wg_colors = ("#e06666", "#f4a6a6")
    with plt.rc_context(STYLE):
        fig, ax = plt.subplots(figsize=(7.4, 2.9))
    labels = ["tensor cores", "consumer 2\n(rows 64–127)", "consumer 1\n(rows 0–63)",
              "producer\n(TMA loads)"]
    for j in range(iters + 1):                  # producer: K_j, then V_j, back to back
        for k, (name, c) in enumerate(((f"K{j}", K_C), (f"V{j}", V_C))):
            a = t0 + period * j - 2.0 + 2.0 * k
            ax.broken_barh([(a, 1.94)], (2.65, 0.7), facecolors=c, alpha=0.85)
            ax.text(a + 0.97, 3, name, ha="center", va="center", fontsize=7.5, color="white")
    busy = {0: [], 1: []}
    for g, y in ((0, 2), (1, 1)):
        for j in range(iters):
            t = t0 + g * period / 2 + j * period
            for name, d, c in (("QKᵀ", mma, wg_colors[g]), ("softmax", soft, REG),
                               ("PV", mma, wg_colors[g])):
                ax.broken_barh([(t, d - 0.04)], (y - 0.35, 0.7), facecolors=c,
                               edgecolors=EDGE, lw=0.6)
                ax.text(t + d / 2, y, f"softmax {j}" if name == "softmax" else name,
                        ha="center", va="center", fontsize=6.8)
                if c != REG:
                    busy[g].append((t, d - 0.04))
                t += d
    for g in (0, 1):
        ax.broken_barh(busy[g], (-0.3, 0.6), facecolors=wg_colors[g], edgecolors=EDGE, lw=0.4)
    ax.text(t0 + period * iters + period / 2 + 0.2, 0, "no gap once\nboth consumers run",
            fontsize=7.5, va="center", color="#555555")
    ax.set_yticks([0, 1, 2, 3], labels)
    ax.set_xlim(-0.1, t0 + period * iters + period / 2 + 3.5)
    ax.set_ylim(-0.6, 3.6)
    ax.set_xticks([])
    ax.set_xlabel("time →  (phase lengths idealised, not measured; colour: the consumer "
                  "that issued the MMA)")
    for side in ("left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="y", length=0)
    fig.tight_layout()
    return fig


# --- Writing the SVGs ----------------------------------------------------------------------------

DIAGRAMS = {
    "naive_vs_fused": naive_vs_fused,
    "online_rescale": online_rescale,
    "dataflow": dataflow,
    "accumulator_home": accumulator_home,
    "waves_tail": waves_tail,
    "warp_specialised": warp_specialised,
}


def svg_text(fig: Figure) -> str:
    """The figure as deterministic SVG text."""
    import io
    buf = io.StringIO()
    with plt.rc_context(STYLE):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def save(name: str, out_dir: Path = OUT_DIR) -> Path:
    """Draw diagram ``name`` and write ``out_dir/name.svg``; returns the path."""
    fig = DIAGRAMS[name]()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.svg"
    path.write_text(svg_text(fig), encoding="utf-8")
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Write the book's diagrams as SVG.")
    p.add_argument("--out", type=Path, default=OUT_DIR)
    p.add_argument("names", nargs="*", choices=[[], *DIAGRAMS], default=[])
    args = p.parse_args(argv)
    for name in args.names or DIAGRAMS:
        path = save(name, args.out)
        print(f"{path} ({path.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
