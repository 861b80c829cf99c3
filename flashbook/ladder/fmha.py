"""The fused attention kernel behind every FlashAttention step of the book.

One kernel body, specialised at compile time by upper-case ``ct.Constant`` flags. Each step of
the book (``flashattn.STEPS``) is a choice of flags, tile shape and launch hints, so the lines a
step changes are exactly the lines under its flag; ``flashattn.source.step_source(name)`` prints
the kernel as the compiler sees it for one step and ``flashattn.source.step_diff`` the change
from the step before.

Layout is that of ``torch.nn.functional.scaled_dot_product_attention``::

    Q, Out: (B, Hq, Nq, D)      K, V: (B, Hkv, Nk, D)      Hq % Hkv == 0

Grid: ``(cdiv(Nq, TILE_M), B * Hq, 1)``, one program per query tile per (batch, head). Two
chapter-10 experiments change it: with ``PAIR`` the first axis is halved and each program does
two query tiles; with ``PERSISTENT`` it is ``(SMs x occupancy, 1, 1)`` and each program loops
over work items.
"""
import math

import cuda.tile as ct
from cuda.tile import RoundingMode as RMd

from flashattn.kernels.common import (INV_LOG_2, ConstBool, ConstInt, key_tile_range, mask_scores,
                                      online_softmax_update)


# 2^f on [0, 1], degree 3, p(0) = 1, max relative error 8.6e-5 (below fp16's 4.9e-4 rounding of P).
EXP2_POLY = (0.69511679, 0.22764499, 0.07706704)
ROUND_MAGIC = 12582912.0          # 1.5 * 2^23: adding it rounds an fp32 in [-2^22, 2^22] to an integer


def exp2_fma(x):
    """2^x for x <= 0 on the FMA/ALU pipes instead of the exp unit (MUFU), chapter 10.

    2^x = 2^n * 2^f with n = floor(x) and f = x - n in [0, 1]: a cubic for 2^f, n added
    straight into the exponent bits. n comes from the rounding of an fp32 add: adding
    1.5 * 2^23 to x - 0.5 leaves round(x - 0.5) = floor(x) (or floor(x) - 1 at integers, where
    f = 1 and the cubic gives 2) in the low mantissa bits, so no float-to-int conversion (F2I,
    on the same pipe as MUFU) is needed. Below -126 the result is denormal or zero (the clamp at
    -126.5 keeps n >= -127: one less and the exponent would wrap into a NaN), which the fp16 P
    and flush-to-zero arithmetic treat as 0, like exp2(flush_to_zero=True).
    """
    x = ct.maximum(x, -126.5)
    t = (x - 0.5) + ROUND_MAGIC                                      # round(x - 0.5) in its bits
    n = t - ROUND_MAGIC                                              # floor(x), as a float
    f = x - n                                                        # [0, 1]
    p = ((EXP2_POLY[2] * f + EXP2_POLY[1]) * f + EXP2_POLY[0]) * f + 1.0
    # bits(t) = bits(1.5 * 2^23) + n, and bits(1.5 * 2^23) << 23 wraps to 0: n << 23 remains.
    bits = ct.bitcast(p, ct.int32) + (ct.bitcast(t, ct.int32) << 23)
    return ct.bitcast(bits, ct.float32)


def exp2_split(x, EXP_POLY: ConstInt):
    """exp2 of a [TILE_M, TILE_N] tile, 1/EXP_POLY of its columns on the FMA pipe."""
    if EXP_POLY == 2:
        half = (x.shape[0], x.shape[1] // 2)
        return ct.cat((ct.exp2(ct.extract(x, (0, 0), half), flush_to_zero=True),
                       exp2_fma(ct.extract(x, (0, 1), half))), axis=1)
    elif EXP_POLY == 4:
        quarter = (x.shape[0], x.shape[1] // 4)
        a = ct.cat((ct.exp2(ct.extract(x, (0, 0), quarter), flush_to_zero=True),
                    ct.exp2(ct.extract(x, (0, 1), quarter), flush_to_zero=True)), axis=1)
        b = ct.cat((ct.exp2(ct.extract(x, (0, 2), quarter), flush_to_zero=True),
                    exp2_fma(ct.extract(x, (0, 3), quarter))), axis=1)
        return ct.cat((a, b), axis=1)
    else:
        return ct.exp2(x, flush_to_zero=True)


def online_softmax_update_poly(qk, m_i, l_i, acc, qk_scale, EXP_POLY: ConstInt):
    """``common.online_softmax_update`` with 1/EXP_POLY of the exponentials of P on the FMA
    pipe (chapter 10); fast math (flush to zero) and no guard, as the steps that use it."""
    m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale)  # [TILE_M, 1]
    p = exp2_split(qk * qk_scale - m_ij, EXP_POLY)                   # [TILE_M, TILE_N]
    alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)                  # [TILE_M, 1]
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)            # [TILE_M, 1]
    acc = acc * alpha                                                # [TILE_M, TILE_D]
    return p, m_ij, l_i, acc


def attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, bid_x, batch_idx, head_idx, kv_head,
                      TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                      CAUSAL: ConstBool, EVEN_K: ConstBool, FAST_MATH: ConstBool,
                      SPLIT_LOOP: ConstBool, LAZY_RESCALE: ConstBool, EXP_POLY: ConstInt,
                      UNCHECKED_KV: ConstBool, K_LAT: ConstInt, V_LAT: ConstInt,
                      WRITE_LSE: ConstBool, PIPELINE: ConstBool):
    """Compute Out[batch_idx, head_idx, bid_x*TILE_M : (bid_x+1)*TILE_M, :]."""
    # --- Query tile and running state (fp32 for the softmax statistics and the output) ---
    offs_m = input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)  # [TILE_M]
    offs_m = offs_m[:, None]                                         # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]         # [1, TILE_N]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)          # running max (log2 units)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)               # running sum of exp2
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)          # unnormalised output
    # Zero padding: rows past Nq and columns past D (D=80 runs with TILE_D=128) read as 0.
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]

    # --- Which key tiles this query tile visits (causal: none past the diagonal) ---
    k_seqlen = K.shape[2]
    if SPLIT_LOOP:
        # Chapter 7: and from which one on the mask is needed.
        Tc, mask_start = key_tile_range(input_pos + bid_x * TILE_M,
                                        input_pos + (bid_x + 1) * TILE_M, k_seqlen, TILE_N, CAUSAL)
    else:
        Tc, _ = key_tile_range(input_pos + bid_x * TILE_M, input_pos + (bid_x + 1) * TILE_M,
                               k_seqlen, TILE_N, CAUSAL)

    if PIPELINE:
        # Chapter 10: S of key tile 0 before the loop; in the loop, S of tile j + 1 is issued
        # before the softmax of tile j (FlashAttention-3's intra-warpgroup overlap, in source).
        k = ct.load(K, index=(batch_idx, kv_head, 0, 0), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), latency=K_LAT, padding_mode=ct.PaddingMode.ZERO)
        qk_next = ct.mma(q, k.reshape((TILE_D, TILE_N)),
                         ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    # --- Main loop over key/value tiles ---
    for j in range(0, Tc):
        if PIPELINE:
            qk = qk_next                                             # S of tile j
            if j + 1 < Tc:
                k = ct.load(K, index=(batch_idx, kv_head, 0, j + 1),
                            shape=(1, 1, TILE_D, TILE_N), order=(0, 1, 3, 2), latency=K_LAT,
                            padding_mode=ct.PaddingMode.ZERO)
                qk_next = ct.mma(q, k.reshape((TILE_D, TILE_N)),
                                 ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        else:
            # K is read transposed straight from (Nk, D) memory: order swaps the last two axes.
            if UNCHECKED_KV:
                # Chapter 10: the host proved every K/V tile in bounds (Nk % TILE_N == 0, D == TILE_D).
                k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                            order=(0, 1, 3, 2), latency=K_LAT, check_bounds=False)
            else:
                k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                            order=(0, 1, 3, 2), latency=K_LAT, padding_mode=ct.PaddingMode.ZERO)
            k = k.reshape((TILE_D, TILE_N))                              # [TILE_D, TILE_N]
            qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)       # [TILE_M, TILE_N]
            qk = ct.mma(q, k, qk)                                        # S = Q K^T

        if SPLIT_LOOP:
            # Only tiles that straddle the diagonal (or the end of K) need the mask.
            if (CAUSAL or not EVEN_K) and j >= mask_start:
                qk = mask_scores(qk, offs_m, j * TILE_N + offs_n_tile, k_seqlen, CAUSAL, EVEN_K)
        else:
            if CAUSAL or not EVEN_K:
                qk = mask_scores(qk, offs_m, j * TILE_N + offs_n_tile, k_seqlen, CAUSAL, EVEN_K)

        if LAZY_RESCALE:
            # Chapter 10: keep the stale max unless some row's max grew by more than 2^8;
            # p <= 256 still fits fp16/bf16 and the final division by l_i cancels the offset.
            m_blk = ct.max(qk, axis=-1, keepdims=True) * qk_scale    # [TILE_M, 1]
            grow = ct.max(m_blk - m_i)                               # scalar over the tile
            if grow > 8.0:
                p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, GUARD=False,
                                                         FLUSH=FAST_MATH)
            else:
                p = ct.exp2(qk * qk_scale - m_i, flush_to_zero=FAST_MATH)  # [TILE_M, TILE_N]
                l_i = l_i + ct.sum(p, axis=-1, keepdims=True)        # [TILE_M, 1]
        elif EXP_POLY:
            p, m_i, l_i, acc = online_softmax_update_poly(qk, m_i, l_i, acc, qk_scale, EXP_POLY)
        else:
            # Every row sees key 0 (the contract): no guard. FLUSH: fast math, chapter 6.
            p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, GUARD=False,
                                                     FLUSH=FAST_MATH)

        if UNCHECKED_KV:
            v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                        latency=V_LAT, check_bounds=False)
        else:
            v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                        latency=V_LAT, padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((TILE_N, TILE_D))                              # [TILE_N, TILE_D]
        acc = ct.mma(p.astype(Q.dtype), v, acc)                      # O += P V, [TILE_M, TILE_D]

    # --- Normalise and store ---
    if FAST_MATH:
        acc = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=RMd.APPROX)
    else:
        acc = ct.truediv(acc, l_i)                                   # IEEE division
    acc = acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)
    ct.store(Out, index=(batch_idx, head_idx, bid_x, 0), tile=acc)   # rows past Nq are dropped
    if WRITE_LSE:
        # The backward's statistic (issue 11), only when asked: Lse is fp32 (B, Hq, Nq), else a
        # one-element stand-in never touched. lse_i = log sum_j exp(scale * S[i, j])
        # = (m_i + log2 l_i) ln 2, in natural-log units as the backward and PyTorch take it.
        # Every row sees key 0 (the contract), so l_i >= 1 and the LSE is finite.
        lse = (m_i + ct.log2(l_i)) / INV_LOG_2                       # [TILE_M, 1], natural log
        ct.store(Lse, index=(batch_idx, head_idx, bid_x), tile=lse.reshape((1, 1, TILE_M)))


@ct.kernel
def fmha_kernel(Q, K, V, Out, Lse,
                qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                num_m_blocks: int,
                TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                CAUSAL: ConstBool, EVEN_K: ConstBool,
                FAST_MATH: ConstBool, SPLIT_LOOP: ConstBool, REMAP: ConstBool,
                PAIR: ConstBool, LAZY_RESCALE: ConstBool, EXP_POLY: ConstInt,
                UNCHECKED_KV: ConstBool, K_LAT: ConstInt, V_LAT: ConstInt,
                PERSISTENT: ConstBool, WRITE_LSE: ConstBool, PIPELINE: ConstBool):
    """FlashAttention forward. See the module docstring for shapes and grid.

    qk_scale: softmax scale (1/sqrt(D) by default); input_pos: absolute position of query row 0
    (causal only); group_size = Hq // Hkv; num_m_blocks = cdiv(Nq, TILE_M).
    """
    qk_scale = qk_scale * INV_LOG_2                                  # softmax in base 2
    if PERSISTENT:
        # Chapter 10: a grid of one program per SM slot; each loops over work items in the
        # order the hardware would launch them (query tiles of one head together, so K/V
        # stay in L2), longest causal tiles first, dealt round-robin.
        for t in range(ct.bid(0), num_m_blocks * Q.shape[0] * num_heads, ct.num_blocks(0)):
            bh = t // num_m_blocks
            tile = t % num_m_blocks
            if CAUSAL:
                tile = num_m_blocks - 1 - tile
            attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, tile, bh // num_heads,
                              bh % num_heads, (bh % num_heads) // group_size, TILE_M, TILE_N,
                              TILE_D, CAUSAL, EVEN_K, FAST_MATH, SPLIT_LOOP, LAZY_RESCALE,
                              EXP_POLY, UNCHECKED_KV, K_LAT, V_LAT, WRITE_LSE, PIPELINE)
    else:
        # --- Program id -> (query tile, batch, head); GQA maps Hq heads onto Hkv ---
        bid_y = ct.bid(1)
        batch_idx = bid_y // num_heads
        head_idx = bid_y % num_heads
        kv_head = head_idx // group_size                             # chapter 4
        if PAIR:
            # Chapter 10: program i does query tiles i and n-1-i, so every program of a causal
            # launch does the same number of key tiles (seed 003, section 6). One loop, not
            # two inlined calls: half the code, and Blackwell's compiler accepts it.
            first = ct.bid(0)
            second = num_m_blocks - 1 - first                        # >= first
            for t in range(1 + min(second - first, 1)):              # 1 pass if they coincide
                bid_x = first + t * (second - first)
                attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, bid_x, batch_idx,
                                  head_idx, kv_head, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K,
                                  FAST_MATH, SPLIT_LOOP, LAZY_RESCALE, EXP_POLY, UNCHECKED_KV,
                                  K_LAT, V_LAT, WRITE_LSE, PIPELINE)
        else:
            if REMAP and CAUSAL:
                # Chapter 8: launch the longest query tiles (bottom rows) first.
                bid_x = num_m_blocks - 1 - ct.bid(0)
            else:
                bid_x = ct.bid(0)
            attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, bid_x, batch_idx, head_idx,
                              kv_head, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, FAST_MATH,
                              SPLIT_LOOP, LAZY_RESCALE, EXP_POLY, UNCHECKED_KV, K_LAT, V_LAT,
                              WRITE_LSE, PIPELINE)
