"""An experiment-only variant of ``flashattn/kernels/fmha_bwd.py``'s dK/dV and dQ kernels: the
tiles that need a mask get their own loop, so the loop over every other tile has no branch in
its body (the library's kernels test "is this tile on the diagonal" inside the one loop).

Why: compiled for sm_90 at 64x64 (``experiments/tilegym_bwd_sass.py``), TileGym's dK/dV kernel,
which masks every tile with a select and no branch, issues the dP^T = V dO^T products between
the exponentials of P^T; ours waits for dP^T before the first exponential. Splitting the loop is
the forward's SPLIT_LOOP applied to the backward. Same signatures, arguments, grids, results
(to rounding) as the library kernels; launched by ``experiments/tilegym_bwd_bench.py``.
"""
import math

import cuda.tile as ct

from flashattn.kernels.common import INV_LOG_2, key_tile_range, mask_scores

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def _dkdv_step(Q, dO, LSE, Delta, k, v, dk, dv, batch_idx, head_idx, i, offs_n, offs_m_tile,
               input_pos, k_seqlen, qk_scale_log2,
               TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
               CAUSAL: ConstBool, EVEN_K: ConstBool, MASKED: ConstBool):
    """dK, dV += one query tile's share (the library's loop body; masked only if MASKED)."""
    q = ct.load(Q, index=(batch_idx, head_idx, i, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    do = ct.load(dO, index=(batch_idx, head_idx, i, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    lse = ct.load(LSE, index=(batch_idx, head_idx, i), shape=(1, 1, TILE_M),
                  padding_mode=ct.PaddingMode.POS_INF).reshape((1, TILE_M))
    delta = ct.load(Delta, index=(batch_idx, head_idx, i), shape=(1, 1, TILE_M),
                    padding_mode=ct.PaddingMode.ZERO).reshape((1, TILE_M))
    lse = ct.where(lse == -math.inf, math.inf, lse)                  # a row that sees no key
    delta = ct.where(lse == math.inf, 0.0, delta)
    st = ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32)
    st = ct.mma(k, ct.transpose(q), st)                              # S^T = K Q^T
    if MASKED:
        offs_m = input_pos + i * TILE_M + offs_m_tile
        st = mask_scores(st, offs_m, offs_n, k_seqlen, CAUSAL, EVEN_K)
    pt = ct.exp2(st * qk_scale_log2 - lse * INV_LOG_2, flush_to_zero=True)
    dv = ct.mma(pt.astype(Q.dtype), do, dv)                          # dV += P^T dO
    dpt = ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32)
    dpt = ct.mma(v, ct.transpose(do), dpt)                           # dP^T = V dO^T
    dst = (pt * (dpt - delta)).astype(Q.dtype)                       # dS^T
    dk = ct.mma(dst, q, dk)                                          # dK += dS^T Q
    return dk, dv


@ct.kernel
def bwd_dkdv_kernel(Q, K, V, dO, LSE, Delta, dK, dV,
                    qk_scale: float, input_pos: int, num_kv_heads: int, group_size: int,
                    TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                    CAUSAL: ConstBool, EVEN_K: ConstBool):
    """The library's bwd_dkdv_kernel with the masked query tiles (the diagonal ones; all of
    them on a ragged last key tile) in a loop of their own before the unmasked ones."""
    bid_n = ct.bid(0)
    batch_idx = ct.bid(1) // num_kv_heads
    kv_head = ct.bid(1) % num_kv_heads
    qk_scale_log2 = qk_scale * INV_LOG_2
    q_seqlen = Q.shape[2]
    k_seqlen = K.shape[2]
    k = ct.load(K, index=(batch_idx, kv_head, bid_n, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
    v = ct.load(V, index=(batch_idx, kv_head, bid_n, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
    dk = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    offs_n = bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[:, None]
    offs_m_tile = ct.arange(TILE_M, dtype=ct.int32)[None, :]
    num_m_blocks = ct.cdiv(q_seqlen, TILE_M)
    if CAUSAL:
        m_start = max(bid_n * TILE_N - input_pos, 0) // TILE_M
        mask_end = ct.cdiv(max((bid_n + 1) * TILE_N - input_pos, 0), TILE_M)
    else:
        m_start = 0
        mask_end = 0
    # query tiles m_start .. split - 1 are masked, split .. num_m_blocks - 1 are not
    split = min(max(mask_end, m_start), num_m_blocks)
    if not EVEN_K:
        if bid_n >= k_seqlen // TILE_N:                              # the ragged last key tile
            split = num_m_blocks
    for h in range(group_size):
        head_idx = kv_head * group_size + h
        for i in range(m_start, split):
            dk, dv = _dkdv_step(Q, dO, LSE, Delta, k, v, dk, dv, batch_idx, head_idx, i,
                                offs_n, offs_m_tile, input_pos, k_seqlen, qk_scale_log2,
                                TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, True)
        for i in range(split, num_m_blocks):
            dk, dv = _dkdv_step(Q, dO, LSE, Delta, k, v, dk, dv, batch_idx, head_idx, i,
                                offs_n, offs_m_tile, input_pos, k_seqlen, qk_scale_log2,
                                TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, False)
    dk = (dk * qk_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype)
    dv = dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype)
    ct.store(dK, index=(batch_idx, kv_head, bid_n, 0), tile=dk)
    ct.store(dV, index=(batch_idx, kv_head, bid_n, 0), tile=dv)


def _dq_step(K, V, q, do, lse2, delta, dq, batch_idx, kv_head, j, offs_m, offs_n_tile,
             k_seqlen, qk_scale_log2, TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
             CAUSAL: ConstBool, EVEN_K: ConstBool, MASKED: ConstBool, VROW: ConstBool):
    """dQ += one key tile's share (the library's loop body; masked only if MASKED). VROW: read
    V as its (TILE_N, TILE_D) rows and transpose the tile, with TileGym's load latency hints
    (K 2, V 4), not V^T by order= without hints."""
    if VROW:
        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO, latency=2).reshape((TILE_N, TILE_D))
        vt = ct.transpose(ct.load(V, index=(batch_idx, kv_head, j, 0),
                                  shape=(1, 1, TILE_N, TILE_D), latency=4,
                                  padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D)))
    else:
        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
        vt = ct.load(V, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                     order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_D, TILE_N))
    s = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    s = ct.mma(q, ct.transpose(k), s)
    if MASKED:
        s = mask_scores(s, offs_m, j * TILE_N + offs_n_tile, k_seqlen, CAUSAL, EVEN_K)
    p = ct.exp2(s * qk_scale_log2 - lse2, flush_to_zero=True)
    dp = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    dp = ct.mma(do, vt, dp)
    ds = p * (dp - delta)
    return ct.mma(ds.astype(q.dtype), k, dq)


@ct.kernel
def bwd_dq_kernel(Q, K, V, dO, LSE, Delta, dQ,
                  qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                  TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                  CAUSAL: ConstBool, EVEN_K: ConstBool):
    """The library's bwd_dq_kernel with the unmasked key tiles in one loop and the masked ones
    (the diagonal, the ragged end) in a second."""
    dq_program(Q, K, V, dO, LSE, Delta, dQ, qk_scale, input_pos, num_heads, group_size,
               TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, False)


@ct.kernel
def bwd_dq_vrow_kernel(Q, K, V, dO, LSE, Delta, dQ,
                       qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                       TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                       CAUSAL: ConstBool, EVEN_K: ConstBool):
    """bwd_dq_kernel above, V read by rows and transposed as a tile, TileGym's latency hints."""
    dq_program(Q, K, V, dO, LSE, Delta, dQ, qk_scale, input_pos, num_heads, group_size,
               TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, True)


def dq_program(Q, K, V, dO, LSE, Delta, dQ, qk_scale, input_pos, num_heads, group_size,
               TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
               CAUSAL: ConstBool, EVEN_K: ConstBool, VROW: ConstBool):
    bid_x = ct.bid(0)
    batch_idx = ct.bid(1) // num_heads
    head_idx = ct.bid(1) % num_heads
    kv_head = head_idx // group_size
    qk_scale_log2 = qk_scale * INV_LOG_2
    k_seqlen = K.shape[2]
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    do = ct.load(dO, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    lse = ct.load(LSE, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                  padding_mode=ct.PaddingMode.POS_INF).reshape((TILE_M, 1))
    delta = ct.load(Delta, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
    lse = ct.where(lse == -math.inf, math.inf, lse)
    delta = ct.where(lse == math.inf, 0.0, delta)
    lse2 = lse * INV_LOG_2
    dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    offs_m = input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    Tc, mask_start = key_tile_range(input_pos + bid_x * TILE_M, input_pos + (bid_x + 1) * TILE_M,
                                    k_seqlen, TILE_N, CAUSAL)
    split = min(mask_start, Tc)
    for j in range(0, split):
        dq = _dq_step(K, V, q, do, lse2, delta, dq, batch_idx, kv_head, j, offs_m, offs_n_tile,
                      k_seqlen, qk_scale_log2, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, False, VROW)
    for j in range(split, Tc):
        dq = _dq_step(K, V, q, do, lse2, delta, dq, batch_idx, kv_head, j, offs_m, offs_n_tile,
                      k_seqlen, qk_scale_log2, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, True, VROW)
    dq = (dq * qk_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
    ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)


@ct.kernel
def bwd_dq_maskall_kernel(Q, K, V, dO, LSE, Delta, dQ,
                          qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                          TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                          CAUSAL: ConstBool, EVEN_K: ConstBool):
    """The library's bwd_dq_kernel with TileGym's masking: one loop, no branch, and on every
    tile P is zeroed by a select after the exponential where the key is in the future (causal)
    or past Nk (ragged). On sm_90 the library's unmasked loop waits for dP before the first
    exponential while its masked loop overlaps them: this masks every tile to get the overlap
    everywhere, at the price of one compare and select per element."""
    bid_x = ct.bid(0)
    batch_idx = ct.bid(1) // num_heads
    head_idx = ct.bid(1) % num_heads
    kv_head = head_idx // group_size
    qk_scale_log2 = qk_scale * INV_LOG_2
    k_seqlen = K.shape[2]
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    do = ct.load(dO, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    lse = ct.load(LSE, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                  padding_mode=ct.PaddingMode.POS_INF).reshape((TILE_M, 1))
    delta = ct.load(Delta, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))
    lse = ct.where(lse == -math.inf, math.inf, lse)
    delta = ct.where(lse == math.inf, 0.0, delta)
    lse2 = lse * INV_LOG_2
    dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    offs_m = input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    Tc, _ = key_tile_range(input_pos + bid_x * TILE_M, input_pos + (bid_x + 1) * TILE_M,
                           k_seqlen, TILE_N, CAUSAL)
    for j in range(0, Tc):
        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
        vt = ct.load(V, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                     order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_D, TILE_N))
        s = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        s = ct.mma(q, ct.transpose(k), s)
        p = ct.exp2(s * qk_scale_log2 - lse2, flush_to_zero=True)
        if CAUSAL or not EVEN_K:
            offs_n = j * TILE_N + offs_n_tile
            keep = ct.full((TILE_M, TILE_N), True, dtype=ct.bool_)
            if not EVEN_K:
                keep = keep & (offs_n < k_seqlen)
            if CAUSAL:
                keep = keep & (offs_m >= offs_n)
            p = ct.where(keep, p, 0.0)
        dp = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        dp = ct.mma(do, vt, dp)
        ds = p * (dp - delta)
        dq = ct.mma(ds.astype(Q.dtype), k, dq)
    dq = (dq * qk_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
    ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)
