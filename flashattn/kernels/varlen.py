"""Packed variable-length prefill (FlashAttention's varlen interface): one kernel.

Sequence ``b`` is rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1`` of q and rows
``cu_seqlens_k[b] .. cu_seqlens_k[b+1] - 1`` of k and v, passed head-major (a free view)::

    Q, Out:  (Hq, total_q, D)         K, V:  (Hkv, total_k, D)
    CuSeqlensQ, CuSeqlensK: (B + 1,) int32, non-decreasing, starting at 0

Grid ``(cdiv(cdiv(max_seqlen_q, TILE_M), Q_TILES), Hq, B)``: the heads of one sequence side by
side, so a GQA group shares its K/V tiles through L2. A program views its sequence with
``Array.slice`` (a tile past the end reads zeros and stores nothing), exits at once past its
sequence's last tile, and with ``Q_TILES > 1`` builds those views once for several tiles.
Causal programs take the longest, bottom tiles first.

The body is ``fmha.py``'s, with causal aligned to the bottom right (row ``i`` sits at position
``len_k - len_q + i``) and a row that sees no key written as 0, as FlashAttention's. Offsets are
clamped for addressing; a sequence with bad offsets, or longer than ``max_seqlen_q`` /
``max_seqlen_k``, gets NaN rows, never a silent wrong answer.
"""
import math

import cuda.tile as ct
from cuda.tile import RoundingMode as RMd

from flashattn.kernels.common import (INV_LOG_2, ConstBool, ConstInt, key_tile_range,
                                      mask_scores, online_softmax_update)


@ct.kernel
def varlen_fwd_kernel(Q, K, V, Out, CuSeqlensQ, CuSeqlensK,
                      qk_scale: float, group_size: int, max_seqlen_q: int, max_seqlen_k: int,
                      TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                      CAUSAL: ConstBool, Q_TILES: ConstInt, K_LAT: ConstInt, V_LAT: ConstInt):
    """Attention of ``Q_TILES`` query tiles of one sequence and one head, one after the other.
    See the module docstring.

    qk_scale: the softmax scale (natural units); group_size: Hq // Hkv; max_seqlen_q,
    max_seqlen_k: the longest lengths the caller declared (the grid is sized by the first; a
    longer sequence means corrupt offsets). K_LAT, V_LAT: the loads' latency hints, the
    forward's.
    """
    # --- Program id -> (query tile, head, sequence); GQA maps Hq heads onto Hkv ---
    head = ct.bid(1)
    seq = ct.bid(2)
    kv_head = head // group_size
    qk_scale = qk_scale * INV_LOG_2                                  # softmax in base 2

    # --- This sequence's rows, read on the device; clamped so no access leaves the tensors ---
    total_q = Q.shape[1]
    total_k = K.shape[1]
    q_start_raw = ct.gather(CuSeqlensQ, (seq,), padding_value=0).item()
    q_end_raw = ct.gather(CuSeqlensQ, (seq + 1,), padding_value=0).item()
    k_start_raw = ct.gather(CuSeqlensK, (seq,), padding_value=0).item()
    k_end_raw = ct.gather(CuSeqlensK, (seq + 1,), padding_value=0).item()
    q_start = min(max(q_start_raw, 0), total_q)
    q_end = min(max(q_end_raw, q_start), total_q)
    k_start = min(max(k_start_raw, 0), total_k)
    k_end = min(max(k_end_raw, k_start), total_k)
    len_q = q_end - q_start
    len_k = k_end - k_start
    bad = ct.where((q_start == q_start_raw) & (q_end == q_end_raw) & (k_start == k_start_raw)
                   & (k_end == k_end_raw) & (len_q <= max_seqlen_q) & (len_k <= max_seqlen_k),
                   0, 1)

    n_m = ct.cdiv(len_q, TILE_M)                                     # this sequence's tiles
    first = ct.bid(0) * Q_TILES                                      # this program's first

    if first < n_m:                                                  # else: past the end, exit
        # The sequence's rows as arrays of their own (built once per program: their
        # tensor maps are the per-program cost): tiles past the end read zeros.
        q_seq = Q.slice(axis=1, start=q_start, stop=q_end)           # (Hq, len_q, D)
        o_seq = Out.slice(axis=1, start=q_start, stop=q_end)         # (Hq, len_q, D)
        k_first = min(k_start, total_k - 1)                          # start < size, even if empty
        k_seq = K.slice(axis=1, start=k_first, stop=k_first + len_k)  # (Hkv, len_k, D)
        v_seq = V.slice(axis=1, start=k_first, stop=k_first + len_k)  # (Hkv, len_k, D)

        shift = len_k - len_q                                        # causal: bottom-right
        offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]     # [1, TILE_N]

        for t in range(Q_TILES):                     # the views above serve Q_TILES tiles
            if first + t < n_m:
                if CAUSAL:
                    bid_m = n_m - 1 - (first + t)    # the longest query tiles first
                else:
                    bid_m = first + t

                # --- Query tile and running state (fp32 statistics and output) ---
                offs_m = shift + bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)
                offs_m = offs_m[:, None]                             # [TILE_M, 1] positions
                m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)  # running max (log2)
                l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)   # running sum of exp2
                acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)  # unnormalised output
                q = ct.load(q_seq, index=(head, bid_m, 0), shape=(1, TILE_M, TILE_D),
                            padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))

                # --- The key tiles this query tile visits; from which one on they need a mask
                # (causal: the keys up to its last real row's position, and up to its first's)
                last_row = min(bid_m * TILE_M + TILE_M, len_q) - 1
                Tc, mask_start = key_tile_range(max(shift + bid_m * TILE_M + 1, 0),
                                                max(shift + last_row + 1, 0), len_k,
                                                TILE_N, CAUSAL)

                # --- Main loop over key/value tiles ---
                for j in range(0, Tc):
                    # K is read transposed straight from (len_k, D) memory (as in fmha.py).
                    k = ct.load(k_seq, index=(kv_head, 0, j), shape=(1, TILE_D, TILE_N),
                                order=(0, 2, 1), latency=K_LAT, padding_mode=ct.PaddingMode.ZERO)
                    k = k.reshape((TILE_D, TILE_N))                  # [TILE_D, TILE_N]
                    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
                    qk = ct.mma(q, k, qk)                            # S = Q K^T

                    if j >= mask_start:
                        # The ragged end of K and, if causal, the diagonal: -inf.
                        qk = mask_scores(qk, offs_m, j * TILE_N + offs_n_tile, len_k, CAUSAL,
                                         False)

                    # --- Online softmax; a row with no visible key keeps -inf ---
                    p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, True,
                                                             True)
                    v = ct.load(v_seq, index=(kv_head, j, 0), shape=(1, TILE_N, TILE_D),
                                latency=V_LAT, padding_mode=ct.PaddingMode.ZERO)
                    v = v.reshape((TILE_N, TILE_D))                  # [TILE_N, TILE_D]
                    acc = ct.mma(p.astype(Q.dtype), v, acc)          # O += P V

                # --- Normalise (0 for a row with no visible key), store; rows past len_q drop
                acc = ct.truediv(acc, ct.where(l_i > 0.0, l_i, 1.0), flush_to_zero=True,
                                 rounding_mode=RMd.APPROX)           # [TILE_M, TILE_D]
                if bad > 0:
                    # Offsets out of range or decreasing, or a sequence past max_seqlen_q/k.
                    acc = ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32)
                acc = acc.reshape((1, TILE_M, TILE_D)).astype(Out.dtype)
                ct.store(o_seq, index=(head, bid_m, 0), tile=acc)
