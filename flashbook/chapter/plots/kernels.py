"""Compile reports, the online-softmax state (chapter 2) and the tile explorer (chapter 5)."""
from __future__ import annotations

import math

import numpy as np

from .style import _book_rank, _plt

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
    from ..helpers import tile_registers
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
