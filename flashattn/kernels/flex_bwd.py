"""The flex backward: dQ and dK/dV with a score function and a mask compiled in.

``make_flex_bwd_kernels(score_fn, grad_fn, mask_fn)`` builds the pair per mods, as
``make_flex_kernel`` does the forward (``flex.mod_callers``; the mods' tensors as the tuples
``ST``, ``MT``), in the dense backward's shape (``fmha_bwd.py``), with its recompute and guard
(``common.guard_lse``, ``recompute_p``, ``dscores``):

    flex_dq_kernel     grid (cdiv(Nq, TILE_M), B * Hq): a query tile visits the key blocks its
                       BlockMask row lists (as the forward) and accumulates dQ; V^T is read
                       straight from memory, as ``bwd_dq_kernel`` does
    flex_dkdv_kernel   grid (cdiv(Nk, TILE_N), B * Hkv): a key tile visits, for each query head
                       of its GQA group, the query blocks the BlockMask's column lists
                       (q_num_blocks / q_indices, full_q_*) and accumulates dK, dV (summed over
                       the group), on transposed tiles S^T = K Q^T ([TILE_N, TILE_M]): P^T and
                       dS^T come out of the MMA in the orientation dV += P^T dO and dK += dS^T Q
                       take; the mods see kv_idx as a [TILE_N, 1] column, q_idx as a [1, TILE_M]
                       row (they broadcast)

Per tile: s0 = q . k * scale, s = score_fn(s0) (or s0), the mask on partial blocks, P = exp(s -
LSE) (0 where LSE = -inf: a row with no key), dP = dO V^T, dS = P (dP - Delta) with Delta =
rowsum(dO * O), and through the score function dS0 = dS * grad_fn(s0) (``grad_fn``: d score_fn
/ d s0; None: 1, an additive bias). dQ = scale dS0 K, dK = scale dS0^T Q, dV = P^T dO.
LSE (natural log) and Delta: fp32 (B, Hq, Nq).

The partial and full blocks are two loops, the mask compiled only into the first. A bounds
branch guards a sub-tile only where a listed block can hold one wholly past the end (EVEN_K /
EVEN_M are set per block by the plan, ``flex_spec.flex_bwd_plan``). Without a score function,
scale and log2(e) fold into one multiply.
"""
import math

import cuda.tile as ct

from .common import INV_LOG_2, ConstBool, ConstInt, dscores, guard_lse, recompute_p
from .flex import block_count, listed_tile, mask_row, mod_callers


def make_flex_bwd_kernels(score_fn=None, grad_fn=None, mask_fn=None):
    """(flex_dq_kernel, flex_dkdv_kernel) for one (score, its derivative, mask) triple."""
    call_score, call_grad, call_mask = mod_callers(score_fn, mask_fn, grad_fn)

    def logits2(s_raw, batch_idx, head_idx, offs_q, offs_k, k_seqlen, q_seqlen, sm_scale,
                MASKED: ConstBool, ST, MT, HAS_SCORE: ConstBool, HAS_MASK: ConstBool,
                EVEN_K: ConstBool, EVEN_M: ConstBool):
        """The scores in log2 units, masked: what exp2(. - LSE2) turns into P (any orientation:
        offs_q and offs_k broadcast to s_raw's shape)."""
        if HAS_SCORE:
            t = call_score(s_raw * sm_scale, batch_idx, head_idx, offs_q, offs_k, ST)
            t = t * INV_LOG_2
        else:
            t = s_raw * (sm_scale * INV_LOG_2)
        if HAS_MASK:
            if MASKED:
                t = ct.where(call_mask(batch_idx, head_idx, offs_q, offs_k, MT), t, -math.inf)
        if not EVEN_K:
            t = ct.where(offs_k < k_seqlen, t, -math.inf)            # keys past Nk
        if not EVEN_M:
            t = ct.where(offs_q < q_seqlen, t, -math.inf)            # queries past Nq
        return t

    def ds_of(p, dp, delta, s_raw, batch_idx, head_idx, offs_q, offs_k, sm_scale, ST,
              HAS_GRAD: ConstBool):
        ds = dscores(p, dp, delta)
        if HAS_GRAD:
            ds = ds * call_grad(s_raw * sm_scale, batch_idx, head_idx, offs_q, offs_k, ST)
        return ds

    def dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head, offs_m,
                offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool, ST, MT,
                TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, HAS_SCORE: ConstBool,
                HAS_GRAD: ConstBool, HAS_MASK: ConstBool, EVEN_K: ConstBool):
        zero = ct.PaddingMode.ZERO
        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=zero).reshape((TILE_N, TILE_D))
        vt = ct.load(V, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                     order=(0, 1, 3, 2), padding_mode=zero).reshape((TILE_D, TILE_N))
        offs_n = j * TILE_N + offs_n_tile
        s = ct.mma(q, ct.transpose(k), ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        t = logits2(s, batch_idx, head_idx, offs_m, offs_n, k_seqlen, q_seqlen, sm_scale,
                    MASKED, ST, MT, HAS_SCORE, HAS_MASK, EVEN_K, True)
        p = recompute_p(t, lse2)                                     # [TILE_M, TILE_N]
        dp = ct.mma(do, vt, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        ds = ds_of(p, dp, delta, s, batch_idx, head_idx, offs_m, offs_n, sm_scale, ST,
                   HAS_GRAD)
        return ct.mma(ds.astype(q.dtype), k, dq)                     # dQ += dS0 K

    def dq_block(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head, offs_m,
                 offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool, ST, MT,
                 TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, HAS_SCORE: ConstBool,
                 HAS_GRAD: ConstBool, HAS_MASK: ConstBool, EVEN_K: ConstBool,
                 KV_TILES_PER_BLOCK: ConstInt):
        """dq_step, skipped for a sub-tile wholly past Nk (only where one can be listed)."""
        if EVEN_K or KV_TILES_PER_BLOCK == 1 or j * TILE_N < k_seqlen:
            dq = dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head, offs_m,
                         offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED, ST, MT, TILE_M,
                         TILE_N, TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K)
        return dq

    @ct.kernel
    def flex_dq_kernel(Q, K, V, dO, Lse, Delta, dQ, KvNum, KvIdx, FullNum, FullIdx, ST, MT,
                       sm_scale: float, num_heads: int, group_size: int, mask_bmul: int,
                       mask_hmul: int,
                       TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                       EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                       HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                       HAS_FULL: ConstBool, Q_TILES_PER_BLOCK: ConstInt,
                       KV_TILES_PER_BLOCK: ConstInt):
        """dQ of one query tile: the partial blocks (masked), then the full ones."""
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
        lse = guard_lse(lse)
        lse2 = lse * INV_LOG_2                                       # once per query tile
        dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
        k_seqlen = K.shape[2]
        q_seqlen = Q.shape[2]
        if HAS_BLOCKS:
            qb = bid_x // Q_TILES_PER_BLOCK
            mb, mh, n_part = mask_row(KvNum, batch_idx, head_idx, qb, mask_bmul, mask_hmul)
            for u in range(0, n_part * KV_TILES_PER_BLOCK):
                j = listed_tile(KvIdx, mb, mh, qb, u, KV_TILES_PER_BLOCK)
                dq = dq_block(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head,
                              offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale, True, ST, MT,
                              TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K,
                              KV_TILES_PER_BLOCK)
            if HAS_FULL:
                n_full = block_count(FullNum, mb, mh, qb)
                for u in range(0, n_full * KV_TILES_PER_BLOCK):
                    j = listed_tile(FullIdx, mb, mh, qb, u, KV_TILES_PER_BLOCK)
                    dq = dq_block(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx,
                                  kv_head, offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale,
                                  False, ST, MT, TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD,
                                  HAS_MASK, EVEN_K, KV_TILES_PER_BLOCK)
        else:
            for j in range(0, ct.cdiv(k_seqlen, TILE_N)):
                dq = dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head,
                             offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale, False, ST, MT,
                             TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K)
        dq = (dq * sm_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
        ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)

    def dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx, offs_m_tile,
                  offs_n, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool, ST, MT,
                  TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, HAS_SCORE: ConstBool,
                  HAS_GRAD: ConstBool, HAS_MASK: ConstBool, EVEN_K: ConstBool,
                  EVEN_M: ConstBool):
        """One query tile's share of dK, dV on transposed tiles ([TILE_N, TILE_M])."""
        zero = ct.PaddingMode.ZERO
        q = ct.load(Q, index=(batch_idx, head_idx, it, 0), shape=(1, 1, TILE_M, TILE_D),
                    padding_mode=zero).reshape((TILE_M, TILE_D))
        do = ct.load(dO, index=(batch_idx, head_idx, it, 0), shape=(1, 1, TILE_M, TILE_D),
                     padding_mode=zero).reshape((TILE_M, TILE_D))
        lse = ct.load(Lse, index=(batch_idx, head_idx, it), shape=(1, 1, TILE_M),
                      padding_mode=zero).reshape((1, TILE_M))
        delta = ct.load(Delta, index=(batch_idx, head_idx, it), shape=(1, 1, TILE_M),
                        padding_mode=zero).reshape((1, TILE_M))
        lse = guard_lse(lse)
        lse2 = lse * INV_LOG_2                                       # [1, TILE_M]
        offs_m = it * TILE_M + offs_m_tile                           # [1, TILE_M]
        st = ct.mma(k, ct.transpose(q), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        t = logits2(st, batch_idx, head_idx, offs_m, offs_n, k_seqlen, q_seqlen, sm_scale,
                    MASKED, ST, MT, HAS_SCORE, HAS_MASK, EVEN_K, EVEN_M)
        pt = recompute_p(t, lse2)                                    # P^T, [TILE_N, TILE_M]
        dv = ct.mma(pt.astype(Q.dtype), do, dv)                      # dV += P^T dO
        dpt = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        dst = ds_of(pt, dpt, delta, st, batch_idx, head_idx, offs_m, offs_n, sm_scale, ST,
                    HAS_GRAD)
        dk = ct.mma(dst.astype(Q.dtype), q, dk)                      # dK += dS0^T Q
        return dk, dv

    def dkdv_block(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx, offs_m_tile,
                   offs_n, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool, ST, MT,
                   TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, HAS_SCORE: ConstBool,
                   HAS_GRAD: ConstBool, HAS_MASK: ConstBool, EVEN_K: ConstBool,
                   EVEN_M: ConstBool, Q_TILES_PER_BLOCK: ConstInt):
        """dkdv_step, skipped for a sub-tile wholly past Nq (only where one can be listed)."""
        if EVEN_M or Q_TILES_PER_BLOCK == 1 or it * TILE_M < q_seqlen:
            dk, dv = dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx,
                               offs_m_tile, offs_n, k_seqlen, q_seqlen, sm_scale, MASKED, ST,
                               MT, TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK,
                               EVEN_K, EVEN_M)
        return dk, dv

    @ct.kernel
    def flex_dkdv_kernel(Q, K, V, dO, Lse, Delta, dK, dV, QNum, QIdx, FullQNum, FullQIdx,
                         ST, MT, sm_scale: float, num_kv_heads: int, group_size: int,
                         mask_bmul: int, mask_hmul: int,
                         TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                         EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                         HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                         HAS_FULL: ConstBool, Q_TILES_PER_BLOCK: ConstInt,
                         KV_TILES_PER_BLOCK: ConstInt):
        """dK, dV of one key tile on transposed tiles, summed over its GQA group."""
        bid_n = ct.bid(0)
        bid_y = ct.bid(1)
        batch_idx = bid_y // num_kv_heads
        kv_head = bid_y % num_kv_heads
        offs_m_tile = ct.arange(TILE_M, dtype=ct.int32)[None, :]     # queries across
        offs_n = (bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[:, None]  # keys down
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
                for u in range(0, n_part * Q_TILES_PER_BLOCK):
                    it = listed_tile(QIdx, mb, mh, kb, u, Q_TILES_PER_BLOCK)
                    dk, dv = dkdv_block(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx,
                                        head_idx, offs_m_tile, offs_n, k_seqlen, q_seqlen,
                                        sm_scale, True, ST, MT, TILE_M, TILE_N, TILE_D,
                                        HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M,
                                        Q_TILES_PER_BLOCK)
                if HAS_FULL:
                    n_full = block_count(FullQNum, mb, mh, kb)
                    for u in range(0, n_full * Q_TILES_PER_BLOCK):
                        it = listed_tile(FullQIdx, mb, mh, kb, u, Q_TILES_PER_BLOCK)
                        dk, dv = dkdv_block(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx,
                                            head_idx, offs_m_tile, offs_n, k_seqlen, q_seqlen,
                                            sm_scale, False, ST, MT, TILE_M, TILE_N, TILE_D,
                                            HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M,
                                        Q_TILES_PER_BLOCK)
            else:
                for it in range(0, ct.cdiv(q_seqlen, TILE_M)):
                    dk, dv = dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx,
                                       head_idx, offs_m_tile, offs_n, k_seqlen, q_seqlen,
                                       sm_scale, False, ST, MT, TILE_M, TILE_N, TILE_D,
                                       HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M)
        dk = (dk * sm_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype)
        dv = dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype)
        ct.store(dK, index=(batch_idx, kv_head, bid_n, 0), tile=dk)
        ct.store(dV, index=(batch_idx, kv_head, bid_n, 0), tile=dv)

    return flex_dq_kernel, flex_dkdv_kernel
