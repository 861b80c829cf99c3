"""The fused attention forward that ships: what ``attention(...)`` runs on every architecture.

It is the book's ladder kernel (``flashbook/ladder/fmha.py``, 16 compile-time flags) with the
flags the library ships folded in: fast math (chapter 6), the mask only on the diagonal tiles
(chapter 7) and the longest causal tiles first (chapter 8). ``tests/test_shipped_kernel.py``
checks that folding the ladder gives this file. The mask, the online softmax and the key-tile
range are ``common.py``'s, shared with the backward, decoding and varlen kernels. Tile shapes
and hints per architecture (the search spaces), the constants, the grid and the pure plan are
in ``fmha_fwd_spec.py``.

Layout is that of ``torch.nn.functional.scaled_dot_product_attention``::

    Q, Out: (B, Hq, Nq, D)      K, V: (B, Hkv, Nk, D)      Hq % Hkv == 0

Grid: ``(cdiv(Nq, TILE_M), B * Hq, 1)``, one program per query tile per (batch, head).
"""
import math

import cuda.tile as ct
from cuda.tile import RoundingMode as RMd

from flashattn.kernels.common import (INV_LOG_2, ConstBool, ConstInt, key_tile_range, mask_scores,
                                      online_softmax_update)


def attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, bid_x, batch_idx, head_idx, kv_head,
                      TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                      CAUSAL: ConstBool, EVEN_K: ConstBool, K_LAT: ConstInt, V_LAT: ConstInt,
                      WRITE_LSE: ConstBool):
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
    # Chapter 7: and from which one on the mask is needed.
    Tc, mask_start = key_tile_range(input_pos + bid_x * TILE_M,
                                    input_pos + (bid_x + 1) * TILE_M, k_seqlen, TILE_N, CAUSAL)

    # --- Main loop over key/value tiles ---
    for j in range(0, Tc):
        # K is read transposed straight from (Nk, D) memory: order swaps the last two axes.
        k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), latency=K_LAT, padding_mode=ct.PaddingMode.ZERO)
        k = k.reshape((TILE_D, TILE_N))                              # [TILE_D, TILE_N]
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)       # [TILE_M, TILE_N]
        qk = ct.mma(q, k, qk)                                        # S = Q K^T

        # Only tiles that straddle the diagonal (or the end of K) need the mask.
        if (CAUSAL or not EVEN_K) and j >= mask_start:
            qk = mask_scores(qk, offs_m, j * TILE_N + offs_n_tile, k_seqlen, CAUSAL, EVEN_K)

        # Every row sees key 0 (the contract): no guard. FLUSH: fast math, chapter 6.
        p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, GUARD=False,
                                                 FLUSH=True)

        v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    latency=V_LAT, padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((TILE_N, TILE_D))                              # [TILE_N, TILE_D]
        acc = ct.mma(p.astype(Q.dtype), v, acc)                      # O += P V, [TILE_M, TILE_D]

    # --- Normalise and store ---
    acc = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=RMd.APPROX)
    acc = acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)
    ct.store(Out, index=(batch_idx, head_idx, bid_x, 0), tile=acc)   # rows past Nq are dropped
    if WRITE_LSE:
        # The backward's statistic, only when asked: Lse is fp32 (B, Hq, Nq), else a
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
                CAUSAL: ConstBool, EVEN_K: ConstBool, K_LAT: ConstInt, V_LAT: ConstInt,
                WRITE_LSE: ConstBool):
    """FlashAttention forward. See the module docstring for shapes and grid.

    qk_scale: softmax scale (1/sqrt(D) by default); input_pos: absolute position of query row 0
    (causal only); group_size = Hq // Hkv; num_m_blocks = cdiv(Nq, TILE_M).
    """
    qk_scale = qk_scale * INV_LOG_2                                  # softmax in base 2
    # --- Program id -> (query tile, batch, head); GQA maps Hq heads onto Hkv ---
    bid_y = ct.bid(1)
    batch_idx = bid_y // num_heads
    head_idx = bid_y % num_heads
    kv_head = head_idx // group_size                                 # chapter 4
    if CAUSAL:
        # Chapter 8: launch the longest query tiles (bottom rows) first.
        bid_x = num_m_blocks - 1 - ct.bid(0)
    else:
        bid_x = ct.bid(0)
    attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, bid_x, batch_idx, head_idx,
                      kv_head, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K, K_LAT, V_LAT, WRITE_LSE)
