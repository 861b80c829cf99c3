"""Standard attention, written in cuTile so Nsight Compute can show its memory traffic.

Three kernels, each a round trip through global memory::

    S = scale * Q K^T (+ mask)     scores_kernel    writes  (BH, Nq, Nk) fp32
    P = softmax(S)                 softmax_kernel   reads S twice, writes P in the input dtype
    O = P V                        pv_kernel        reads P, V

``S`` and ``P`` hold one chunk of (batch, head) pairs; ``bh_offset`` says which, so a long
sequence can be run a few heads at a time when all of them would not fit in memory.
"""
import math

import cuda.tile as ct

from flashattn.kernels.common import ConstBool, ConstInt


@ct.kernel
def scores_kernel(Q, K, S, qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                  bh_offset: int,
                  TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, CAUSAL: ConstBool):
    """S[z] = qk_scale * Q[b, h] K[b, h // group_size]^T, -inf above the diagonal if causal.

    Grid: (cdiv(Nq, TILE_M), cdiv(Nk, TILE_N), chunk) with z + bh_offset = b * num_heads + h.
    """
    bid_m, bid_n, z = ct.bid(0), ct.bid(1), ct.bid(2)
    bh = bh_offset + z
    batch_idx = bh // num_heads
    head_idx = bh % num_heads
    q = ct.load(Q, index=(batch_idx, head_idx, bid_m, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    k = ct.load(K, index=(batch_idx, head_idx // group_size, 0, bid_n),
                shape=(1, 1, TILE_D, TILE_N), order=(0, 1, 3, 2),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_D, TILE_N))
    s = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)) * qk_scale
    if CAUSAL:
        offs_m = input_pos + bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
        offs_n = bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[None, :]
        s = ct.where(offs_m >= offs_n, s, -math.inf)                 # [TILE_M, TILE_N]
    ct.store(S, index=(z, bid_m, bid_n), tile=s.reshape((1, TILE_M, TILE_N)))


@ct.kernel
def softmax_kernel(S, P, TILE_R: ConstInt, TILE_N: ConstInt):
    """P[z, rows] = softmax(S[z, rows]) over the last axis; two passes over S.

    Grid: (cdiv(Nq, TILE_R), chunk).
    """
    bid_r, z = ct.bid(0), ct.bid(1)
    n_keys = S.shape[2]
    num_tiles = ct.cdiv(n_keys, TILE_N)
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    m = ct.full((TILE_R, 1), -math.inf, dtype=ct.float32)            # running max
    l = ct.full((TILE_R, 1), 0.0, dtype=ct.float32)                  # running sum
    # Pass 1: row max and sum, reading S once (online, so one pass suffices).
    for j in range(0, num_tiles):
        s = ct.load(S, index=(z, bid_r, j), shape=(1, TILE_R, TILE_N),
                    padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_R, TILE_N))
        m_new = max(m, ct.max(s, axis=-1, keepdims=True))
        # exp(-inf - -inf) is NaN: a row that is all -inf so far keeps l = 0.
        safe = ct.where(m_new == -math.inf, 0.0, m_new)
        l = l * ct.exp(m - safe) + ct.sum(ct.exp(s - safe), axis=-1, keepdims=True)
        m = m_new
    # Pass 2: read S again and write the probabilities.
    for j in range(0, num_tiles):
        s = ct.load(S, index=(z, bid_r, j), shape=(1, TILE_R, TILE_N),
                    padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_R, TILE_N))
        p = ct.exp(s - m) / l                                        # [TILE_R, TILE_N]
        p = ct.where(offs_n_tile + j * TILE_N < n_keys, p, 0.0)
        ct.store(P, index=(z, bid_r, j), tile=p.reshape((1, TILE_R, TILE_N)).astype(P.dtype))


@ct.kernel
def pv_kernel(P, V, Out, num_heads: int, group_size: int, bh_offset: int,
              TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt):
    """Out[b, h, rows] = P[z, rows] V[b, h // group_size]. Grid: (cdiv(Nq, TILE_M), chunk)."""
    bid_m, z = ct.bid(0), ct.bid(1)
    bh = bh_offset + z
    batch_idx = bh // num_heads
    head_idx = bh % num_heads
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)          # [TILE_M, TILE_D]
    for j in range(0, ct.cdiv(P.shape[2], TILE_N)):
        p = ct.load(P, index=(z, bid_m, j), shape=(1, TILE_M, TILE_N),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_N))
        v = ct.load(V, index=(batch_idx, head_idx // group_size, j, 0),
                    shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
        acc = ct.mma(p, v, acc)
    ct.store(Out, index=(batch_idx, head_idx, bid_m, 0),
             tile=acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
