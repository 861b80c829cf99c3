"""The FlashAttention backward pass: three kernels, no atomics, deterministic.

(The book's ladder file: the library's ``flashattn/kernels/fmha_bwd.py`` with its off
switches kept, see ``flashbook/ladder/variants.py``; the library folds them away.)

The forward (``fmha.py``) keeps only O and, per query row, the log-sum-exp of its scaled scores
(``LSE``, natural log, fp32). The backward recomputes P from Q, K and the LSE instead of
storing the (Nq, Nk) matrix, and computes the five matrix products::

    S = Q K^T          P = exp(scale * S - LSE)          (recomputed)
    dV = P^T dO        dP = dO V^T
    dS = P o (dP - delta),  delta = rowsum(dO o O)       (o: elementwise)
    dQ = scale * dS K        dK = scale * dS^T Q         (the scale folds in once, at the end)

Layout is the forward's::

    Q, Out, dO, dQ: (B, Hq, Nq, D)    K, V, dK, dV: (B, Hkv, Nk, D)    LSE, Delta: (B, Hq, Nq) fp32

Kernels, in launch order (the deterministic default):

    bwd_preprocess_kernel   Delta = rowsum(dO o O)             grid (cdiv(Nq, TILE_M), B * Hq, 1)
    bwd_dkdv_kernel         dK, dV of one K/V tile             grid (cdiv(Nk, TILE_N), B * Hkv, 1)
                            (loops over the query heads of its GQA group and the query tiles
                            that can see it: dK, dV are summed in registers, in fp32)
    bwd_dq_kernel           dQ of one query tile               grid (cdiv(Nq, TILE_M), B * Hq, 1)
                            (loops over the key tiles it sees, as the forward)

The opt-in variant ``bwd_dkdv_dq_atomic_kernel`` (``attention_backward(...,
deterministic=False)``) replaces the last two: one dK/dV pass that also adds each pair's share
of dQ to an fp32 buffer with atomic adds. Both are measured (``bench --backward``).

A query row that sees no key has LSE = -inf (the forward's log 0; +inf, FlashAttention-2's
convention for it, means the same here): its P and dS are 0, so its dQ is 0 and it adds nothing
to dK and dV. flashattn's contract never makes such a row (every row sees key 0), but an LSE
from elsewhere may hold one.

Every (query tile, key tile) pair is visited by the dK/dV pass and by the dQ pass exactly when
the forward visits it, and masked exactly when the forward (with ``SPLIT_LOOP``) masks it:
tiles that straddle the causal diagonal and the ragged last key tile.
``flashattn.reference.backward`` emulates these loops in NumPy.
"""
import math

import cuda.tile as ct

from flashattn.kernels.common import (INV_LOG_2, ConstBool, ConstInt, dscores, guard_lse,
                                      key_tile_range, mask_scores, recompute_p)


@ct.kernel
def bwd_preprocess_kernel(Out, dO, Delta,
                          num_heads: int,
                          TILE_M: ConstInt, TILE_D: ConstInt, PDL: ConstInt):
    """Delta[b, h, i] = sum_d dO[b, h, i, d] * Out[b, h, i, d], in fp32.

    One program per query tile per (batch, head): grid ``(cdiv(Nq, TILE_M), B * Hq, 1)``.
    """
    if PDL == 2:
        # E27 (off): the dK/dV pass, a programmatic dependent, may be scheduled at once.
        ct.grid_dependency_control_launch_dependents()
    bid_x = ct.bid(0)
    batch_idx = ct.bid(1) // num_heads
    head_idx = ct.bid(1) % num_heads
    # Zero padding: rows past Nq and head-dim columns past D add nothing.
    o = ct.load(Out, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))   # [TILE_M, TILE_D]
    do = ct.load(dO, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    delta = ct.sum(o.astype(ct.float32) * do.astype(ct.float32), axis=-1)    # [TILE_M]
    ct.store(Delta, index=(batch_idx, head_idx, bid_x),
             tile=delta.reshape((1, 1, TILE_M)))                             # rows past Nq dropped


@ct.kernel
def bwd_dkdv_kernel(Q, K, V, dO, LSE, Delta, dK, dV,
                    qk_scale: float, input_pos: int, num_kv_heads: int, group_size: int,
                    TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                    CAUSAL: ConstBool, EVEN_K: ConstBool, PDL: ConstInt):
    """dK, dV of key/value tile ``ct.bid(0)`` of one (batch, key/value head); dQ is left to
    ``bwd_dq_kernel``. Grid ``(cdiv(Nk, TILE_N), B * Hkv, 1)``. The loop is ``dkdv_program``'s.
    """
    if PDL == 1 or PDL == 2:
        # E27 (off): a programmatic dependent of the preprocess: wait for Delta.
        ct.grid_dependency_control_wait()
    if PDL == 2:
        # The dQ pass reads nothing this kernel writes: it may start beside this one's tail.
        ct.grid_dependency_control_launch_dependents()
    dkdv_program(Q, K, V, dO, LSE, Delta, dK, dV, dK, qk_scale, input_pos, num_kv_heads,
                 group_size, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, False)


@ct.kernel
def bwd_dkdv_dq_atomic_kernel(Q, K, V, dO, LSE, Delta, dK, dV, dQacc,
                              qk_scale: float, input_pos: int, num_kv_heads: int,
                              group_size: int,
                              TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                              CAUSAL: ConstBool, EVEN_K: ConstBool):
    """The opt-in, non-deterministic variant: dK, dV as ``bwd_dkdv_kernel``, and each query
    tile's share of dQ, scale * dS K, added to the fp32 ``dQacc`` (B, Hq, Nq, D; zeroed by the
    host) with atomic adds, so no separate dQ pass runs. The order of the adds varies from run
    to run: dQ's last bits do too."""
    dkdv_program(Q, K, V, dO, LSE, Delta, dK, dV, dQacc, qk_scale, input_pos, num_kv_heads,
                 group_size, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, True)


def dkdv_program(Q, K, V, dO, LSE, Delta, dK, dV, dQacc,
                 qk_scale, input_pos, num_kv_heads, group_size,
                 TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                 CAUSAL: ConstBool, EVEN_K: ConstBool, DQ_ATOMIC: ConstBool):
    """One program of the dK/dV pass: key/value tile ``ct.bid(0)`` of one (batch, kv head).

    Works on transposed score tiles, [TILE_N, TILE_M] (keys down, queries across), so that
    P^T and dS^T come out of the matrix products in the orientation dV += P^T dO and
    dK += dS^T Q take them. qk_scale: softmax scale; input_pos: position of query row 0
    (causal); group_size = Hq // Hkv. With ``DQ_ATOMIC`` each (query tile, key tile) pair
    also adds scale * dS K to ``dQacc`` (otherwise ``dQacc`` is not touched).
    """
    bid_n = ct.bid(0)                                                # key tile j
    batch_idx = ct.bid(1) // num_kv_heads
    kv_head = ct.bid(1) % num_kv_heads
    qk_scale_log2 = qk_scale * INV_LOG_2                             # P in base 2
    q_seqlen = Q.shape[2]
    k_seqlen = K.shape[2]

    # --- This program's K and V tile, read once; dK and dV accumulate in fp32 ---
    # Zero padding: keys past Nk and head-dim columns past D read as 0.
    k = ct.load(K, index=(batch_idx, kv_head, bid_n, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))  # [TILE_N, TILE_D]
    v = ct.load(V, index=(batch_idx, kv_head, bid_n, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))  # [TILE_N, TILE_D]
    dk = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)           # [TILE_N, TILE_D]
    dv = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)           # [TILE_N, TILE_D]
    offs_n = bid_n * TILE_N + ct.arange(TILE_N, dtype=ct.int32)[:, None]  # [TILE_N, 1]
    offs_m_tile = ct.arange(TILE_M, dtype=ct.int32)[None, :]        # [1, TILE_M]

    # --- Which query tiles see this key tile (the forward's schedule, transposed) ---
    num_m_blocks = ct.cdiv(q_seqlen, TILE_M)
    if CAUSAL:
        # Query tile i reaches key tile j iff j * TILE_N < input_pos + (i + 1) * TILE_M.
        m_start = max(bid_n * TILE_N - input_pos, 0) // TILE_M
        # The forward masks tile (i, j) iff j >= (input_pos + i * TILE_M) // TILE_N, that is
        # iff i < cdiv((j + 1) * TILE_N - input_pos, TILE_M): the tiles on the diagonal.
        mask_end = ct.cdiv(max((bid_n + 1) * TILE_N - input_pos, 0), TILE_M)
    else:
        m_start = 0
        mask_end = 0
    ragged = bid_n >= k_seqlen // TILE_N                             # the last, partial tile
    num_tiles = max(num_m_blocks - m_start, 0)

    # --- One loop over (query head of the group, query tile) ---
    for t in range(group_size * num_tiles):
        head_idx = kv_head * group_size + t // num_tiles
        i = m_start + t % num_tiles                                  # query tile
        # Zero padding: rows past Nq of Q and dO read as 0, and LSE as +inf, so P^T is 0
        # there and those rows add nothing to dK and dV.
        q = ct.load(Q, index=(batch_idx, head_idx, i, 0), shape=(1, 1, TILE_M, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
        do = ct.load(dO, index=(batch_idx, head_idx, i, 0), shape=(1, 1, TILE_M, TILE_D),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
        lse = ct.load(LSE, index=(batch_idx, head_idx, i), shape=(1, 1, TILE_M),
                      padding_mode=ct.PaddingMode.POS_INF).reshape((1, TILE_M))  # [1, TILE_M]
        delta = ct.load(Delta, index=(batch_idx, head_idx, i), shape=(1, 1, TILE_M),
                        padding_mode=ct.PaddingMode.ZERO).reshape((1, TILE_M))   # [1, TILE_M]
        # A row that sees no key (LSE -inf): P = 0 and dS = 0, as for the padding.
        lse = guard_lse(lse)
        delta = ct.where(lse == math.inf, 0.0, delta)

        st = ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32)
        st = ct.mma(k, ct.transpose(q), st)                          # S^T = K Q^T
        if (CAUSAL and i < mask_end) or (not EVEN_K and ragged):
            # Keys past Nk only reach rows of dK, dV the store drops; masked anyway, so the
            # masked tiles are the forward's and no inf is computed.
            offs_m = input_pos + i * TILE_M + offs_m_tile            # [1, TILE_M]
            st = mask_scores(st, offs_m, offs_n, k_seqlen, CAUSAL, EVEN_K)  # [TILE_N, TILE_M]
        # P^T, recomputed: exp(scale * S - LSE) = exp2(scale * log2(e) * S - LSE * log2(e)).
        pt = recompute_p(st * qk_scale_log2, lse * INV_LOG_2)         # [TILE_N, TILE_M]
        dv = ct.mma(pt.astype(Q.dtype), do, dv)                      # dV += P^T dO
        dpt = ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32)
        dpt = ct.mma(v, ct.transpose(do), dpt)                       # dP^T = V dO^T
        dst = dscores(pt, dpt, delta).astype(Q.dtype)               # dS^T, [TILE_N, TILE_M]
        dk = ct.mma(dst, q, dk)                                      # dK += dS^T Q (unscaled)
        if DQ_ATOMIC:
            # This pair's share of dQ for query tile i: scale * dS K, added element by element
            # (rows past Nq and columns past D fall outside dQacc: the bounds check drops them).
            dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
            dq = ct.mma(ct.transpose(dst), k, dq)                    # dS K, [TILE_M, TILE_D]
            rows = i * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]   # [TILE_M, 1]
            cols = ct.arange(TILE_D, dtype=ct.int32)[None, :]               # [1, TILE_D]
            ct.atomic_add(dQacc, (batch_idx, head_idx, rows, cols), dq * qk_scale,
                          memory_order=ct.MemoryOrder.RELAXED)

    # --- The scale, once; store (rows past Nk are dropped) ---
    dk = (dk * qk_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype)
    dv = dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype)
    ct.store(dK, index=(batch_idx, kv_head, bid_n, 0), tile=dk)
    ct.store(dV, index=(batch_idx, kv_head, bid_n, 0), tile=dv)


@ct.kernel
def bwd_dq_kernel(Q, K, V, dO, LSE, Delta, dQ,
                  qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                  TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                  CAUSAL: ConstBool, EVEN_K: ConstBool, PDL: ConstInt):
    """dQ of query tile ``ct.bid(0)`` of one (batch, query head): the forward's loop over key
    tiles, with dQ += dS K in place of O += P V. Grid ``(cdiv(Nq, TILE_M), B * Hq, 1)``."""
    if PDL == 1:
        # E27 (off): a programmatic dependent of the dK/dV pass: wait for it first. With
        # PDL == 2 dK/dV lets this start once the preprocess is done (Delta complete), and
        # only the final store waits.
        ct.grid_dependency_control_wait()
    bid_x = ct.bid(0)
    batch_idx = ct.bid(1) // num_heads
    head_idx = ct.bid(1) % num_heads
    kv_head = head_idx // group_size                                 # GQA
    qk_scale_log2 = qk_scale * INV_LOG_2
    k_seqlen = K.shape[2]

    # --- This program's query rows: Q, dO, LSE, Delta, read once ---
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    do = ct.load(dO, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    lse = ct.load(LSE, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                  padding_mode=ct.PaddingMode.POS_INF).reshape((TILE_M, 1))   # [TILE_M, 1]
    delta = ct.load(Delta, index=(batch_idx, head_idx, bid_x), shape=(1, 1, TILE_M),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, 1))   # [TILE_M, 1]
    # A row that sees no key (LSE -inf): P = 0 and dS = 0, so its dQ is 0.
    lse = guard_lse(lse)
    delta = ct.where(lse == math.inf, 0.0, delta)
    lse2 = lse * INV_LOG_2                                           # log2 units, once per row
    dq = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)           # [TILE_M, TILE_D]
    offs_m = input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)[:, None]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]        # [1, TILE_N]

    # --- Which key tiles this query tile visits: the forward's rule ---
    Tc, mask_start = key_tile_range(input_pos + bid_x * TILE_M, input_pos + (bid_x + 1) * TILE_M,
                                    k_seqlen, TILE_N, CAUSAL)

    for j in range(0, Tc):
        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
        # V^T straight from (Nk, D) memory, as the forward reads K^T.
        vt = ct.load(V, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                     order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_D, TILE_N))
        s = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        s = ct.mma(q, ct.transpose(k), s)                            # S = Q K^T
        if (CAUSAL or not EVEN_K) and j >= mask_start:
            s = mask_scores(s, offs_m, j * TILE_N + offs_n_tile, k_seqlen, CAUSAL, EVEN_K)
        p = recompute_p(s * qk_scale_log2, lse2)                    # [TILE_M, TILE_N]
        dp = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        dp = ct.mma(do, vt, dp)                                      # dP = dO V^T
        ds = dscores(p, dp, delta)                                   # dS, [TILE_M, TILE_N]
        dq = ct.mma(ds.astype(Q.dtype), k, dq)                       # dQ += dS K (unscaled)

    dq = (dq * qk_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype)
    if PDL == 2:
        # Finish after the dK/dV pass, as a plain launch would: what follows in the stream
        # may read dK and dV once this grid is done.
        ct.grid_dependency_control_wait()
    ct.store(dQ, index=(batch_idx, head_idx, bid_x, 0), tile=dq)     # rows past Nq dropped
