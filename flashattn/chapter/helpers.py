"""Small helpers that more than one chapter calls, so each lives once and is tested.

    from flashattn import chapter
    chapter.below(err, "1e-15")                      # chapters 2, 3: an error shown as a bound
    chapter.tile_kinds("loop_split", 16384, cfg)     # chapters 4, 7: the tile grid of a launch
    chapter.time_steps(["fast_math", "loop_split"], cfg, N=8192)   # chapters 5, 7, 8 (GPU)

Everything here but ``time_steps`` runs on a CPU.
"""
from __future__ import annotations

import numpy as np

# Tile kinds, as ``plots.causal_tiles`` draws them.
SKIPPED, FULL, MASKED = 0, 1, 2


def below(err: float, tol: str) -> str:
    """``tol`` if ``err < float(tol)``, else AssertionError: a small error shown as a bound.

    The last bits of a tiny floating-point error depend on the machine's ``exp`` or BLAS; the
    bound does not, so a notebook that prints ``below(err, "1e-15")`` reads the same on every
    machine. ``tol`` is the text to print ("1e-15").
    """
    if not float(err) < float(tol):         # NaN fails too
        raise AssertionError(f"error {err!r} is not below {tol}")
    return tol


def tile_kinds(step, N: int, config, input_pos: int = 0) -> np.ndarray:
    """The tiles a causal launch of ``step`` visits, as a grid for ``plots.causal_tiles``.

    ``N`` queries at positions ``input_pos .. input_pos + N - 1`` against ``N + input_pos`` keys
    (``input_pos`` keys already in a cache), tiled by ``config`` (its ``TILE_M`` x ``TILE_N``).
    Returns an int array [query tiles, key tiles]: 0 skipped (never loaded), 1 full (computed
    without a mask), 2 masked (the diagonal, or a ragged end), read from
    ``flashattn.reference.schedule`` — the same loop bounds as the kernel.
    """
    from ..reference import schedule
    Nk = N + input_pos
    kinds = np.full((-(-N // config.TILE_M), -(-Nk // config.TILE_N)), SKIPPED, dtype=int)
    for prog in schedule(step, N, Nk, causal=True, config=config, input_pos=input_pos):
        for qt, keys in zip(prog.query_tiles, prog.key_tiles):
            for j, kind in keys:
                kinds[qt, j] = FULL if kind == "full" else MASKED
    return kinds


def time_steps(names, config, N: int, B: int = 4, H: int = 32, D: int = 128, reps: int = 10,
               *, causal: bool = True, device: str = "cuda"):
    """Time steps at one pinned ``config`` on this GPU; a DataFrame with one row per step.

    Every step runs on the same fresh fp16 inputs (B, H, N, D, seed 0), through
    ``flashattn.launch.launch`` with ``config`` as given (no autotuning), timed by
    ``measure.timing.time_cuda`` (3 warm-up calls, then ``reps``). Columns: step, config
    (``config.label()``), N, median_ms, tflops (``timing.attention_flops``: causal counts
    half), rounded to 3 decimals. Sequential timing: compare steps of one call only.
    """
    import pandas as pd
    import torch

    from ..launch import launch
    from ..measure import timing
    from ..steps import get_step
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    flops = timing.attention_flops(B, H, N, N, D, causal)
    rows = []
    for name in names:
        step = get_step(name)

        def fn(step=step):
            return launch(q, k, v, out, step, config, causal=causal, scale=D ** -0.5)
        t = timing.time_cuda(fn, warmup=3, reps=reps)
        rows.append(dict(step=name, config=config.label(), N=N, median_ms=t.median_ms,
                         tflops=timing.tflops(flops, t.median_ms)))
    return pd.DataFrame(rows).round(3)


__all__ = ["below", "tile_kinds", "time_steps", "SKIPPED", "FULL", "MASKED"]


def tile_registers(tm: int, tn: int, consumers: int = 128, tile_d: int = 128):
    """32-bit registers per consumer thread for S (fp32), P (fp16) and acc (fp32) of a
    ``tm x tn`` tile with head dimension ``tile_d``, if they sat in the registers of
    ``consumers`` threads (Hopper: one warp group, 128 threads). Chapter 5's estimate.

    Returns (s, p, acc), floats.
    """
    if tm < 1 or tn < 1 or consumers < 1 or tile_d < 1:
        raise ValueError(f"tile sizes and consumers must be >= 1, got {tm}, {tn}, "
                         f"{consumers}, {tile_d}")
    s = tm * tn * 4 / 4 / consumers            # S, fp32
    p = tm * tn * 2 / 4 / consumers            # P, fp16 (two per register)
    acc = tm * tile_d * 4 / 4 / consumers      # O accumulator, fp32
    return s, p, acc
