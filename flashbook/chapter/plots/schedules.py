"""Schedules: which tiles a causal mask skips, the work per program (chapters 4 and 8)."""
from __future__ import annotations

import numpy as np

from ...hardware import SM_COUNT
from .style import KIND_COLORS, KIND_NAMES, _plt, _title

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


def work_per_program(work, order=None, sm_count=SM_COUNT, occupancy=1, ax=None, title=None,
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
