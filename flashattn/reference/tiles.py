"""The fused forward's launch schedule, and the float32 pieces its NumPy emulations share.

    Program, schedule(Nq, Nk, causal=..., config=...)   the programs of kernels/fmha.py's grid
    key_tiles(bid_x, Nk, ...)                           the key tiles one query tile visits
    INV_LOG_2, exp2, as_f32                             the kernels' base-2 softmax, in float32
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..config import Config

INV_LOG_2 = 1.0 / math.log(2)  # as flashattn.kernels.common (not imported: it needs cuda.tile)


@dataclass(frozen=True)
class Program:
    """One program of the grid's first axis (the same for every batch and head).

    bid: ct.bid(0); query_tiles: the query tiles (bid_x) it computes, in order;
    key_tiles[t]: ((j, kind), ...) the key tiles visited for query_tiles[t], kind "masked"
    (mask_scores applied) or "full".
    """
    bid: int
    query_tiles: tuple[int, ...]
    key_tiles: tuple[tuple[tuple[int, str], ...], ...]

    @property
    def work(self) -> int:
        """Key tiles visited, the unit of a program's run time."""
        return sum(len(t) for t in self.key_tiles)


def key_tiles(bid_x: int, Nk: int, *, tile_m: int, tile_n: int, causal: bool,
              input_pos: int = 0) -> tuple[tuple[int, str], ...]:
    """The key tiles query tile ``bid_x`` visits, as (j, kind) pairs: ``key_tile_range``'s
    bounds, the mask only from ``mask_start`` on (the diagonal, or the ragged end of K)."""
    if causal:
        Tc = -(-min(input_pos + (bid_x + 1) * tile_m, Nk) // tile_n)
        mask_start = min((input_pos + bid_x * tile_m) // tile_n, Nk // tile_n)
    else:
        Tc = -(-Nk // tile_n)
        mask_start = Nk // tile_n
    return tuple((j, "masked" if j >= mask_start else "full") for j in range(Tc))


def schedule(Nq: int, Nk: int, *, causal: bool, config: Config,
             input_pos: int = 0) -> list[Program]:
    """The programs of fmha_kernel's first grid axis, in launch order (bid 0, 1, ...): one
    query tile each, the longest first when causal (bid_x = num_m_blocks - 1 - bid)."""
    n = -(-Nq // config.TILE_M)
    order = range(n - 1, -1, -1) if causal else range(n)
    return [Program(bid, (t,), (key_tiles(t, Nk, tile_m=config.TILE_M, tile_n=config.TILE_N,
                                          causal=causal, input_pos=input_pos),))
            for bid, t in enumerate(order)]


def exp2(x, ftz: bool):
    """np.exp2; with ``ftz`` a denormal result is 0, as ``ct.exp2(..., flush_to_zero=True)``."""
    p = np.exp2(x)
    if ftz:
        p = np.where(p < np.finfo(np.float32).tiny, np.float32(0), p)
    return p


def as_f32(t) -> np.ndarray:
    """A float32 NumPy array of a torch tensor (any device) or an array-like."""
    if isinstance(t, torch.Tensor):
        t = t.detach().to("cpu", torch.float32).numpy()
    return np.asarray(t, dtype=np.float32)
