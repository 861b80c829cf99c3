"""The tiles each backward program visits, and their figure."""
from __future__ import annotations

import numpy as np

from .. import plots

# --- the tiles each backward program visits ---------------------------------------------------------
def visit_kinds(N, *, causal=True, dkdv=(64, 128), dq=(128, 64), input_pos=0):
    """Two arrays [query tiles, key tiles] of 0 (skipped) / 1 (full) / 2 (masked), on one grid
    of 64 × 64 cells: what bwd_dkdv's programs (one per key tile) visit and what bwd_dq's (one
    per query tile) visit, from ``reference.backward``'s schedules, at their own tile shapes."""
    from flashattn.reference.backward import dkdv_schedule, dq_schedule
    from flashattn.config import Config
    cell = 64
    n = -(-N // cell)
    a = np.zeros((n, n), dtype=int)
    tm, tn = dkdv
    for prog in dkdv_schedule(N, N, causal=causal, input_pos=input_pos, config=Config(tm, tn)):
        for i, kind in prog.query_tiles:
            a[i * tm // cell:(i + 1) * tm // cell,
              prog.key_tile * tn // cell:(prog.key_tile + 1) * tn // cell] = 1 + (kind == "masked")
    b = np.zeros((n, n), dtype=int)
    tm, tn = dq
    for i, visits in dq_schedule(N, N, causal=causal, input_pos=input_pos, config=Config(tm, tn)):
        for j, kind in visits:
            b[i * tm // cell:(i + 1) * tm // cell, j * tn // cell:(j + 1) * tn // cell] = \
                1 + (kind == "masked")
    return a, b


def visits_figure(N=1024, *, dkdv=(64, 128), dq=(128, 64)):
    """The two causal schedules side by side, with each kernel's tile outlined."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    a, b = visit_kinds(N, causal=True, dkdv=dkdv, dq=dq)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.9))
    for ax, k, (tm, tn), name in ((axes[0], a, dkdv, "bwd_dkdv: one program per key tile"),
                                   (axes[1], b, dq, "bwd_dq: one program per query tile")):
        plots.causal_tiles(k, 64, 64, ax=ax, title=f"{name}\n{tm}×{tn} tiles, N={N}")
        n = k.shape[0]
        if tm != tn:     # outline the kernel's own tiles: columns for bwd_dkdv, rows for bwd_dq
            for t in range(n * 64 // (tn if name.startswith("bwd_dkdv") else tm)):
                if name.startswith("bwd_dkdv"):
                    ax.add_patch(Rectangle((t * tn / 64 - 0.5, -0.5), tn / 64, n, fill=False,
                                           lw=1.0, ec="#333333"))
                else:
                    ax.add_patch(Rectangle((-0.5, t * tm / 64 - 0.5), n, tm / 64, fill=False,
                                           lw=1.0, ec="#333333"))
        ax.set_xlabel("key position / 64")
        ax.set_ylabel("query position / 64")
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig
