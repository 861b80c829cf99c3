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


def make_flex_bwd_kernels_t(score_fn=None, grad_fn=None, mask_fn=None, n_score: int = 0,
                            n_mask: int = 0):
    """(flex_dq_kernel, flex_dkdv_kernel) in the dense backward's shape (``fmha_bwd.py``), with
    the arguments of ``make_flex_bwd_kernels``' pair, so the host swaps one pair for the other.

    What differs (chapter 13, the flex backward against the dense one):

    - dK/dV works on transposed tiles, S^T = K Q^T ([TILE_N keys, TILE_M queries]), so P^T and
      dS^T come out of the MMA already in the orientation dV += P^T dO and dK += dS^T Q take:
      each warp group keeps its own keys' rows, no transposition through shared memory. The mods
      see kv_idx as a [TILE_N, 1] column and q_idx as a [1, TILE_M] row (they broadcast).
    - The BlockMask's partial and full blocks are two loops, the mask compiled only into the
      first: no per-tile branch on ``partial`` in the loop that does most of the work.
    - A bounds branch around the loads only where a listed block can hold a sub-tile wholly past
      the end (more than one tile per block and a sequence that is not a whole number of blocks:
      EVEN_K/EVEN_M, which the plan sets against the block size, ``flex.flex_bwd_plan``).
    - Without a score function, scale and log2(e) fold into one multiply (exp2 of s * c - LSE2,
      with denormals flushed as in the dense kernels); LSE2 is computed once per query tile.
    - dQ reads V^T straight from memory, as ``bwd_dq_kernel`` does.
    """
    call_score = _score_caller(score_fn if score_fn is not None else identity_score,
                               n_score if score_fn is not None else 0)
    call_grad = _score_caller(grad_fn if grad_fn is not None else one_grad,
                              n_score if grad_fn is not None else 0)
    call_mask = _mask_caller(mask_fn if mask_fn is not None else no_mask,
                             n_mask if mask_fn is not None else 0)

    def logits2(s_raw, batch_idx, head_idx, offs_q, offs_k, k_seqlen, q_seqlen, sm_scale,
                MASKED: ConstBool, S0, S1, S2, M0, M1, M2, HAS_SCORE: ConstBool,
                HAS_MASK: ConstBool, EVEN_K: ConstBool, EVEN_M: ConstBool):
        """The scores in log2 units, masked: what exp2(. - LSE2) turns into P (any orientation:
        offs_q and offs_k broadcast to s_raw's shape)."""
        if HAS_SCORE:
            t = call_score(s_raw * sm_scale, batch_idx, head_idx, offs_q, offs_k, S0, S1, S2)
            t = t * INV_LOG_2
        else:
            t = s_raw * (sm_scale * INV_LOG_2)                       # one multiply per score
        if HAS_MASK:
            if MASKED:
                t = ct.where(call_mask(batch_idx, head_idx, offs_q, offs_k, M0, M1, M2), t,
                             -math.inf)
        if not EVEN_K:
            t = ct.where(offs_k < k_seqlen, t, -math.inf)            # keys past Nk
        if not EVEN_M:
            t = ct.where(offs_q < q_seqlen, t, -math.inf)            # queries past Nq
        return t

    def ds_of(p, dp, delta, s_raw, batch_idx, head_idx, offs_q, offs_k, sm_scale, S0, S1, S2,
              HAS_GRAD: ConstBool):
        ds = p * (dp - delta)
        if HAS_GRAD:
            ds = ds * call_grad(s_raw * sm_scale, batch_idx, head_idx, offs_q, offs_k, S0, S1, S2)
        return ds

    def dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head, offs_m,
                offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool,
                S0, S1, S2, M0, M1, M2, TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                HAS_SCORE: ConstBool, HAS_GRAD: ConstBool, HAS_MASK: ConstBool,
                EVEN_K: ConstBool):
        zero = ct.PaddingMode.ZERO
        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=zero).reshape((TILE_N, TILE_D))
        vt = ct.load(V, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                     order=(0, 1, 3, 2), padding_mode=zero).reshape((TILE_D, TILE_N))
        offs_n = j * TILE_N + offs_n_tile
        s = ct.mma(q, ct.transpose(k), ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        t = logits2(s, batch_idx, head_idx, offs_m, offs_n, k_seqlen, q_seqlen, sm_scale,
                    MASKED, S0, S1, S2, M0, M1, M2, HAS_SCORE, HAS_MASK, EVEN_K, True)
        p = ct.exp2(t - lse2, flush_to_zero=True)                    # [TILE_M, TILE_N]
        dp = ct.mma(do, vt, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        ds = ds_of(p, dp, delta, s, batch_idx, head_idx, offs_m, offs_n, sm_scale, S0, S1, S2,
                   HAS_GRAD)
        return ct.mma(ds.astype(q.dtype), k, dq)                     # dQ += dS0 K

    def dq_block(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head, offs_m,
                 offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool,
                 S0, S1, S2, M0, M1, M2, TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                 HAS_SCORE: ConstBool, HAS_GRAD: ConstBool, HAS_MASK: ConstBool,
                 EVEN_K: ConstBool, TPB: ConstInt):
        """dq_step, skipped for a sub-tile wholly past Nk (only where one can be listed)."""
        if EVEN_K or TPB == 1:
            dq = dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head, offs_m,
                         offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED, S0, S1, S2, M0, M1,
                         M2, TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K)
        else:
            if j * TILE_N < k_seqlen:
                dq = dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head,
                             offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale, MASKED, S0, S1,
                             S2, M0, M1, M2, TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD,
                             HAS_MASK, EVEN_K)
        return dq

    @ct.kernel
    def flex_dq_kernel(Q, K, V, dO, Lse, Delta, dQ, KvNum, KvIdx, FullNum, FullIdx,
                       S0, S1, S2, M0, M1, M2,
                       sm_scale: float, num_heads: int, group_size: int, mask_bmul: int,
                       mask_hmul: int,
                       TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                       EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                       HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                       HAS_FULL: ConstBool, QPB: ConstInt, TPB: ConstInt):
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
        lse2 = ct.where(lse == -math.inf, 0.0, lse) * INV_LOG_2      # once per query tile
        dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
        k_seqlen = K.shape[2]
        q_seqlen = Q.shape[2]
        if HAS_BLOCKS:
            qb = bid_x // QPB
            mb = batch_idx * mask_bmul
            mh = head_idx * mask_hmul
            n_part = ct.gather(KvNum, (mb, mh, qb)).item()
            for u in range(0, n_part * TPB):
                j = ct.gather(KvIdx, (mb, mh, qb, u // TPB)).item() * TPB + u % TPB
                dq = dq_block(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head,
                              offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale, True,
                              S0, S1, S2, M0, M1, M2, TILE_M, TILE_N, TILE_D, HAS_SCORE,
                              HAS_GRAD, HAS_MASK, EVEN_K, TPB)
            if HAS_FULL:
                n_full = ct.gather(FullNum, (mb, mh, qb)).item()
                for u in range(0, n_full * TPB):
                    j = ct.gather(FullIdx, (mb, mh, qb, u // TPB)).item() * TPB + u % TPB
                    dq = dq_block(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx,
                                  kv_head, offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale,
                                  False, S0, S1, S2, M0, M1, M2, TILE_M, TILE_N, TILE_D,
                                  HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, TPB)
        else:
            for j in range(0, ct.cdiv(k_seqlen, TILE_N)):
                dq = dq_step(q, do, lse2, delta, dq, K, V, j, batch_idx, head_idx, kv_head,
                             offs_m, offs_n_tile, k_seqlen, q_seqlen, sm_scale, False,
                             S0, S1, S2, M0, M1, M2, TILE_M, TILE_N, TILE_D, HAS_SCORE,
                             HAS_GRAD, HAS_MASK, EVEN_K)
        dq = (dq * sm_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
        ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)

    def dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx, offs_m_tile,
                  offs_n, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool,
                  S0, S1, S2, M0, M1, M2, TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                  HAS_SCORE: ConstBool, HAS_GRAD: ConstBool, HAS_MASK: ConstBool,
                  EVEN_K: ConstBool, EVEN_M: ConstBool):
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
        lse2 = ct.where(lse == -math.inf, 0.0, lse) * INV_LOG_2      # [1, TILE_M]
        offs_m = it * TILE_M + offs_m_tile                           # [1, TILE_M]
        st = ct.mma(k, ct.transpose(q), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        t = logits2(st, batch_idx, head_idx, offs_m, offs_n, k_seqlen, q_seqlen, sm_scale,
                    MASKED, S0, S1, S2, M0, M1, M2, HAS_SCORE, HAS_MASK, EVEN_K, EVEN_M)
        pt = ct.exp2(t - lse2, flush_to_zero=True)                   # P^T, [TILE_N, TILE_M]
        dv = ct.mma(pt.astype(Q.dtype), do, dv)                      # dV += P^T dO
        dpt = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        dst = ds_of(pt, dpt, delta, st, batch_idx, head_idx, offs_m, offs_n, sm_scale,
                    S0, S1, S2, HAS_GRAD)
        dk = ct.mma(dst.astype(Q.dtype), q, dk)                      # dK += dS0^T Q
        return dk, dv

    def dkdv_block(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx, offs_m_tile,
                   offs_n, k_seqlen, q_seqlen, sm_scale, MASKED: ConstBool,
                   S0, S1, S2, M0, M1, M2, TILE_M: ConstInt, TILE_N: ConstInt,
                   TILE_D: ConstInt, HAS_SCORE: ConstBool, HAS_GRAD: ConstBool,
                   HAS_MASK: ConstBool, EVEN_K: ConstBool, EVEN_M: ConstBool, QPB: ConstInt):
        """dkdv_step, skipped for a sub-tile wholly past Nq (only where one can be listed)."""
        if EVEN_M or QPB == 1:
            dk, dv = dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx,
                               offs_m_tile, offs_n, k_seqlen, q_seqlen, sm_scale, MASKED, S0,
                               S1, S2, M0, M1, M2, TILE_M, TILE_N, TILE_D, HAS_SCORE, HAS_GRAD,
                               HAS_MASK, EVEN_K, EVEN_M)
        else:
            if it * TILE_M < q_seqlen:
                dk, dv = dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx, head_idx,
                                   offs_m_tile, offs_n, k_seqlen, q_seqlen, sm_scale, MASKED,
                                   S0, S1, S2, M0, M1, M2, TILE_M, TILE_N, TILE_D, HAS_SCORE,
                                   HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M)
        return dk, dv

    @ct.kernel
    def flex_dkdv_kernel(Q, K, V, dO, Lse, Delta, dK, dV, QNum, QIdx, FullQNum, FullQIdx,
                         S0, S1, S2, M0, M1, M2,
                         sm_scale: float, num_kv_heads: int, group_size: int, mask_bmul: int,
                         mask_hmul: int,
                         TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                         EVEN_K: ConstBool, EVEN_M: ConstBool, HAS_SCORE: ConstBool,
                         HAS_GRAD: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                         HAS_FULL: ConstBool, QPB: ConstInt, TPB: ConstInt):
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
        kb = bid_n // TPB
        for g in range(0, group_size):
            head_idx = kv_head * group_size + g
            if HAS_BLOCKS:
                mb = batch_idx * mask_bmul
                mh = head_idx * mask_hmul
                n_part = ct.gather(QNum, (mb, mh, kb)).item()
                for u in range(0, n_part * QPB):
                    it = ct.gather(QIdx, (mb, mh, kb, u // QPB)).item() * QPB + u % QPB
                    dk, dv = dkdv_block(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx,
                                        head_idx, offs_m_tile, offs_n, k_seqlen, q_seqlen,
                                        sm_scale, True, S0, S1, S2, M0, M1, M2, TILE_M, TILE_N,
                                        TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M,
                                        QPB)
                if HAS_FULL:
                    n_full = ct.gather(FullQNum, (mb, mh, kb)).item()
                    for u in range(0, n_full * QPB):
                        it = ct.gather(FullQIdx, (mb, mh, kb, u // QPB)).item() * QPB + u % QPB
                        dk, dv = dkdv_block(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx,
                                            head_idx, offs_m_tile, offs_n, k_seqlen, q_seqlen,
                                            sm_scale, False, S0, S1, S2, M0, M1, M2, TILE_M,
                                            TILE_N, TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK,
                                            EVEN_K, EVEN_M, QPB)
            else:
                for it in range(0, ct.cdiv(q_seqlen, TILE_M)):
                    dk, dv = dkdv_step(k, v, dk, dv, Q, dO, Lse, Delta, it, batch_idx,
                                       head_idx, offs_m_tile, offs_n, k_seqlen, q_seqlen,
                                       sm_scale, False, S0, S1, S2, M0, M1, M2, TILE_M, TILE_N,
                                       TILE_D, HAS_SCORE, HAS_GRAD, HAS_MASK, EVEN_K, EVEN_M)
        dk = (dk * sm_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype)
        dv = dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype)
        ct.store(dK, index=(batch_idx, kv_head, bid_n, 0), tile=dk)
        ct.store(dV, index=(batch_idx, kv_head, bid_n, 0), tile=dv)

    return flex_dq_kernel, flex_dkdv_kernel
