"""The flex backward (chapter 13): dQ and dK/dV for a score function and a mask compiled in.

``make_flex_bwd_kernels(score_fn, grad_fn, mask_fn, n_score, n_mask)`` builds two kernels per
pair of mods, as ``flex.py`` does for the forward:

    flex_dq_kernel     grid (cdiv(Nq, TILE_M), B * Hq): a query tile visits the key blocks its
                       BlockMask row lists (as the forward) and accumulates dQ
    flex_dkdv_kernel   grid (cdiv(Nk, TILE_N), B * Hkv): a key tile visits, for each query head
                       of its GQA group, the query blocks the BlockMask's column lists
                       (q_num_blocks / q_indices, full_q_*) and accumulates dK, dV (summed over
                       the group)

Per tile: s0 = q . k * scale, s = score_fn(s0) (or s0), the mask on partial blocks, P = exp(s -
LSE) (0 where LSE = -inf: a row with no key), dP = dO V^T, dS = P (dP - Delta) with Delta =
rowsum(dO * O), and through the score function dS0 = dS * grad_fn(s0) (``grad_fn``: d score_fn
/ d s0; None: 1, an additive bias). dQ = scale dS0 K, dK = scale dS0^T Q, dV = P^T dO.
LSE (natural log) and Delta: fp32 (B, Hq, Nq).
"""
import math

import cuda.tile as ct

from .common import INV_LOG_2, ConstBool, ConstInt, mask_scores
from .flex import _mask_caller, _score_caller, identity_score, no_mask


def one_grad(score, b, h, q_idx, kv_idx):
    """d score / d score of an additive score function (never called when HAS_GRAD=False)."""
    return score


def make_flex_bwd_kernels(score_fn=None, grad_fn=None, mask_fn=None, n_score: int = 0,
                          n_mask: int = 0):
    """(flex_dq_kernel, flex_dkdv_kernel) for one (score, its derivative, mask) triple."""
    call_score = _score_caller(score_fn if score_fn is not None else identity_score,
                               n_score if score_fn is not None else 0)
    call_grad = _score_caller(grad_fn if grad_fn is not None else one_grad,
                              n_score if grad_fn is not None else 0)
    call_mask = _mask_caller(mask_fn if mask_fn is not None else no_mask,
                             n_mask if mask_fn is not None else 0)

    def grad_tile(q, k, v, do, lse, delta, offs_m, offs_n, batch_idx, head_idx, k_seqlen,
                  q_seqlen, sm_scale, partial, S0, S1, S2, M0, M1, M2,
                  TILE_M: ConstInt, TILE_N: ConstInt, HAS_SCORE: ConstBool,
                  HAS_GRAD: ConstBool, HAS_MASK: ConstBool, EVEN_K: ConstBool,
                  EVEN_M: ConstBool):
        """P and dS0 (through the score function) of one [TILE_M, TILE_N] tile."""
        s0 = ct.mma(q, ct.transpose(k), ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        s0 = s0 * sm_scale                                           # FlexAttention's score
        if HAS_SCORE:
            s = call_score(s0, batch_idx, head_idx, offs_m, offs_n, S0, S1, S2)
        else:
            s = s0
        if HAS_MASK:
            if partial:
                s = ct.where(call_mask(batch_idx, head_idx, offs_m, offs_n, M0, M1, M2), s,
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
            ds = ds * call_grad(s0, batch_idx, head_idx, offs_m, offs_n, S0, S1, S2)
        return p, ds

    @ct.kernel
    def flex_dq_kernel(Q, K, V, dO, Lse, Delta, dQ, KvNum, KvIdx, FullNum, FullIdx,
                       S0, S1, S2, M0, M1, M2,
                       sm_scale: float, num_heads: int, group_size: int, mask_bmul: int,
                       mask_hmul: int,
                       TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                       EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                       HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                       HAS_FULL: ConstBool, QPB: ConstInt, TPB: ConstInt):
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
            qb = bid_x // QPB
            mb = batch_idx * mask_bmul
            mh = head_idx * mask_hmul
            n_part = ct.gather(KvNum, (mb, mh, qb)).item()
            if HAS_FULL:
                n_full = ct.gather(FullNum, (mb, mh, qb)).item()
            else:
                n_full = 0 * n_part
            n_iter = (n_part + n_full) * TPB
        else:
            n_part = 0
            n_iter = ct.cdiv(k_seqlen, TILE_N)
        for u in range(0, n_iter):
            if HAS_BLOCKS:
                i = u // TPB
                partial = i < n_part
                if HAS_FULL:
                    if partial:
                        blk = ct.gather(KvIdx, (mb, mh, qb, i)).item()
                    else:
                        blk = ct.gather(FullIdx, (mb, mh, qb, i - n_part)).item()
                else:
                    blk = ct.gather(KvIdx, (mb, mh, qb, i)).item()
                j = blk * TPB + u % TPB
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
                                  S0, S1, S2, M0, M1, M2, TILE_M, TILE_N, HAS_SCORE, HAS_GRAD,
                                  HAS_MASK, EVEN_K, True)
                dq = ct.mma(ds.astype(Q.dtype), k, dq)               # dQ += dS0 K
        dq = (dq * sm_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
        ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)

    @ct.kernel
    def flex_dkdv_kernel(Q, K, V, dO, Lse, Delta, dK, dV, QNum, QIdx, FullQNum, FullQIdx,
                         S0, S1, S2, M0, M1, M2,
                         sm_scale: float, num_kv_heads: int, group_size: int, mask_bmul: int,
                         mask_hmul: int,
                         TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                         EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                         HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                         HAS_FULL: ConstBool, QPB: ConstInt, TPB: ConstInt):
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
        kb = bid_n // TPB
        for g in range(0, group_size):
            head_idx = kv_head * group_size + g
            if HAS_BLOCKS:
                mb = batch_idx * mask_bmul
                mh = head_idx * mask_hmul
                n_part = ct.gather(QNum, (mb, mh, kb)).item()
                if HAS_FULL:
                    n_full = ct.gather(FullQNum, (mb, mh, kb)).item()
                else:
                    n_full = 0 * n_part
                n_iter = (n_part + n_full) * QPB
            else:
                n_part = 0
                n_iter = ct.cdiv(q_seqlen, TILE_M)
            for u in range(0, n_iter):
                if HAS_BLOCKS:
                    i = u // QPB
                    partial = i < n_part
                    if HAS_FULL:
                        if partial:
                            blk = ct.gather(QIdx, (mb, mh, kb, i)).item()
                        else:
                            blk = ct.gather(FullQIdx, (mb, mh, kb, i - n_part)).item()
                    else:
                        blk = ct.gather(QIdx, (mb, mh, kb, i)).item()
                    it = blk * QPB + u % QPB
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
                                      partial, S0, S1, S2, M0, M1, M2, TILE_M, TILE_N,
                                      HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M)
                    dv = ct.mma(ct.transpose(p.astype(Q.dtype)), do, dv)   # dV += P^T dO
                    dk = ct.mma(ct.transpose(ds.astype(Q.dtype)), q, dk)   # dK += dS0^T Q
        dk = (dk * sm_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype)
        dv = dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype)
        ct.store(dK, index=(batch_idx, kv_head, bid_n, 0), tile=dk)
        ct.store(dV, index=(batch_idx, kv_head, bid_n, 0), tile=dv)

    return flex_dq_kernel, flex_dkdv_kernel
