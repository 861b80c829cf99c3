"""The flex backward's first kernel pair ("mn": score tiles [queries, keys] in both kernels, the
partial and full blocks in one loop with a per-tile branch) and the A/B variants chapter 13
measured against the shipped pair (``flashattn/kernels/flex_bwd.py``: the dense backward's
shape, transposed dK/dV). The library ships only its pair; this module keeps the others so the
experiments can re-measure them (``flashbook.ladder.flex_variants``: the tables and the launch).
"""
from __future__ import annotations

import math

import cuda.tile as ct

from flashattn.kernels.common import INV_LOG_2, ConstBool, ConstInt, mask_scores
from flashattn.kernels.flex import block_count, listed_block, mask_row, mod_callers


def make_flex_bwd_kernels_mn(score_fn=None, grad_fn=None, mask_fn=None):
    """(flex_dq_kernel, flex_dkdv_kernel) of the first pair for one (score, its derivative,
    mask) triple."""
    call_score, call_grad, call_mask = mod_callers(score_fn, mask_fn, grad_fn)

    def grad_tile(q, k, v, do, lse, delta, offs_m, offs_n, batch_idx, head_idx, k_seqlen,
                  q_seqlen, sm_scale, partial, ST, MT,
                  TILE_M: ConstInt, TILE_N: ConstInt, HAS_SCORE: ConstBool,
                  HAS_GRAD: ConstBool, HAS_MASK: ConstBool, EVEN_K: ConstBool,
                  EVEN_M: ConstBool):
        """P and dS0 (through the score function) of one [TILE_M, TILE_N] tile."""
        s0 = ct.mma(q, ct.transpose(k), ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        s0 = s0 * sm_scale                                           # FlexAttention's score
        if HAS_SCORE:
            s = call_score(s0, batch_idx, head_idx, offs_m, offs_n, ST)
        else:
            s = s0
        if HAS_MASK:
            if partial:
                s = ct.where(call_mask(batch_idx, head_idx, offs_m, offs_n, MT), s,
                             -math.inf)
        if not EVEN_K:
            s = mask_scores(s, offs_m, offs_n, k_seqlen, False, False)  # keys past Nk
        if not EVEN_M:
            s = ct.where(offs_m < q_seqlen, s, -math.inf)            # queries past Nq
        lse_use = ct.where(lse == -math.inf, 0.0, lse)               # [TILE_M, 1]
        p = ct.exp2((s - lse_use) * INV_LOG_2)                       # [TILE_M, TILE_N]
        dp = ct.mma(do, ct.transpose(v), ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        ds = p * (dp - delta)                                        # [TILE_M, TILE_N]
        if HAS_GRAD:
            ds = ds * call_grad(s0, batch_idx, head_idx, offs_m, offs_n, ST)
        return p, ds

    @ct.kernel
    def flex_dq_kernel(Q, K, V, dO, Lse, Delta, dQ, KvNum, KvIdx, FullNum, FullIdx,
                       ST, MT,
                       sm_scale: float, num_heads: int, group_size: int, mask_bmul: int,
                       mask_hmul: int,
                       TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                       EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                       HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                       HAS_FULL: ConstBool, Q_TILES_PER_BLOCK: ConstInt,
                       KV_TILES_PER_BLOCK: ConstInt):
        """dQ of one query tile: the forward's schedule. See the module docstring."""
        bid_x = ct.bid(0)
        bid_y = ct.bid(1)
        batch_idx = bid_y // num_heads
        head_idx = bid_y % num_heads
        kv_head = head_idx // group_size
        offs_m = (bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[:, None]
        offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
        zero = ct.PaddingMode.ZERO
        q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                    padding_mode=zero).reshape((TILE_M, TILE_D))
        do = ct.load(dO, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                     padding_mode=zero).reshape((TILE_M, TILE_D))
        lse = ct.load(Lse, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                      padding_mode=zero).reshape((TILE_M, 1))
        delta = ct.load(Delta, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                        padding_mode=zero).reshape((TILE_M, 1))
        dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
        k_seqlen = K.shape[2]
        q_seqlen = Q.shape[2]
        if HAS_BLOCKS:
            qb = bid_x // Q_TILES_PER_BLOCK
            mb, mh, n_part = mask_row(KvNum, batch_idx, head_idx, qb, mask_bmul, mask_hmul)
            if HAS_FULL:
                n_full = block_count(FullNum, mb, mh, qb)
            else:
                n_full = 0 * n_part
            n_iter = (n_part + n_full) * KV_TILES_PER_BLOCK
        else:
            n_part = 0
            n_iter = ct.cdiv(k_seqlen, TILE_N)
        for u in range(0, n_iter):
            if HAS_BLOCKS:
                i = u // KV_TILES_PER_BLOCK
                partial = i < n_part
                if HAS_FULL:
                    if partial:
                        blk = listed_block(KvIdx, mb, mh, qb, i)
                    else:
                        blk = listed_block(FullIdx, mb, mh, qb, i - n_part)
                else:
                    blk = listed_block(KvIdx, mb, mh, qb, i)
                j = blk * KV_TILES_PER_BLOCK + u % KV_TILES_PER_BLOCK
            else:
                partial = u < 0
                j = u
            if j * TILE_N < k_seqlen:
                k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                            padding_mode=zero).reshape((TILE_N, TILE_D))
                v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                            padding_mode=zero).reshape((TILE_N, TILE_D))
                p, ds = grad_tile(q, k, v, do, lse, delta, offs_m, j * TILE_N + offs_n_tile,
                                  batch_idx, head_idx, k_seqlen, q_seqlen, sm_scale, partial,
                                  ST, MT, TILE_M, TILE_N, HAS_SCORE, HAS_GRAD,
                                  HAS_MASK, EVEN_K, True)
                dq = ct.mma(ds.astype(Q.dtype), k, dq)               # dQ += dS0 K
        dq = (dq * sm_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
        ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)

    @ct.kernel
    def flex_dkdv_kernel(Q, K, V, dO, Lse, Delta, dK, dV, QNum, QIdx, FullQNum, FullQIdx,
                         ST, MT,
                         sm_scale: float, num_kv_heads: int, group_size: int, mask_bmul: int,
                         mask_hmul: int,
                         TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                         EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                         HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                         HAS_FULL: ConstBool, Q_TILES_PER_BLOCK: ConstInt,
                         KV_TILES_PER_BLOCK: ConstInt):
        """dK, dV of one key tile, summed over its GQA group. See the module docstring."""
        bid_n = ct.bid(0)
        bid_y = ct.bid(1)
        batch_idx = bid_y // num_kv_heads
        kv_head = bid_y % num_kv_heads
        offs_m_tile = ct.arange(TILE_M, dtype=ct.int32)[:, None]
        offs_n = (bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[None, :]
        zero = ct.PaddingMode.ZERO
        k = ct.load(K, index=(batch_idx, kv_head, bid_n, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=zero).reshape((TILE_N, TILE_D))
        v = ct.load(V, index=(batch_idx, kv_head, bid_n, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=zero).reshape((TILE_N, TILE_D))
        dk = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
        dv = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
        k_seqlen = K.shape[2]
        q_seqlen = Q.shape[2]
        kb = bid_n // KV_TILES_PER_BLOCK
        for g in range(0, group_size):
            head_idx = kv_head * group_size + g
            if HAS_BLOCKS:
                mb, mh, n_part = mask_row(QNum, batch_idx, head_idx, kb, mask_bmul, mask_hmul)
                if HAS_FULL:
                    n_full = block_count(FullQNum, mb, mh, kb)
                else:
                    n_full = 0 * n_part
                n_iter = (n_part + n_full) * Q_TILES_PER_BLOCK
            else:
                n_part = 0
                n_iter = ct.cdiv(q_seqlen, TILE_M)
            for u in range(0, n_iter):
                if HAS_BLOCKS:
                    i = u // Q_TILES_PER_BLOCK
                    partial = i < n_part
                    if HAS_FULL:
                        if partial:
                            blk = listed_block(QIdx, mb, mh, kb, i)
                        else:
                            blk = listed_block(FullQIdx, mb, mh, kb, i - n_part)
                    else:
                        blk = listed_block(QIdx, mb, mh, kb, i)
                    it = blk * Q_TILES_PER_BLOCK + u % Q_TILES_PER_BLOCK
                else:
                    partial = u < 0
                    it = u
                if it * TILE_M < q_seqlen:
                    q = ct.load(Q, index=(batch_idx, head_idx, it, 0),
                                shape=(1, 1, TILE_M, TILE_D),
                                padding_mode=zero).reshape((TILE_M, TILE_D))
                    do = ct.load(dO, index=(batch_idx, head_idx, it, 0),
                                 shape=(1, 1, TILE_M, TILE_D),
                                 padding_mode=zero).reshape((TILE_M, TILE_D))
                    lse = ct.load(Lse, index=(batch_idx, head_idx, it), shape=(1, 1, TILE_M),
                                  padding_mode=zero).reshape((TILE_M, 1))
                    delta = ct.load(Delta, index=(batch_idx, head_idx, it),
                                    shape=(1, 1, TILE_M), padding_mode=zero).reshape((TILE_M, 1))
                    p, ds = grad_tile(q, k, v, do, lse, delta, it * TILE_M + offs_m_tile, offs_n,
                                      batch_idx, head_idx, k_seqlen, q_seqlen, sm_scale,
                                      partial, ST, MT, TILE_M, TILE_N,
                                      HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M)
                    dv = ct.mma(ct.transpose(p.astype(Q.dtype)), do, dv)   # dV += P^T dO
                    dk = ct.mma(ct.transpose(ds.astype(Q.dtype)), q, dk)   # dK += dS0^T Q
        dk = (dk * sm_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype)
        dv = dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype)
        ct.store(dK, index=(batch_idx, kv_head, bid_n, 0), tile=dk)
        ct.store(dV, index=(batch_idx, kv_head, bid_n, 0), tile=dv)

    return flex_dq_kernel, flex_dkdv_kernel
