"""The FP8 forward (``fmha_fp8_kernel``), FlashAttention-3's recipe in cuTile::

    Q: (B, Hq, Nq, D) fp8       K: (B, Hkv, Nk, D) fp8       Out: (B, Hq, Nq, D) bf16/fp16
    V: (B, Hkv, Nk, D) fp8, or with V_T: (B, Hkv, D, Nk) fp8
    QDescale, KDescale, VDescale: (B, Hkv) fp32

* S = Q K^T on FP8 tensor cores, fp32 accumulation; the q and k descales fold into the scale.
* P = 2^(s - m + P_SHIFT) lies in [0, 2^P_SHIFT], below e4m3's 448, so small probabilities
  keep their precision instead of falling into e4m3's subnormals; the row sum carries the same
  factor, so the final division cancels it.
* O += P V with P cast to V's fp8 type; the v descale multiplies the output once at the end.
  Hopper's FP8 MMA reads both operands K-major, so V is read as (D, Nk) (``V_T``); without it
  the compiler transposes each tile on chip.
* SPLIT (wide tiles): unmasked key tiles in one loop of TILE_N keys, the masked ones in a
  second of TILE_N // 2 (with the mask in one loop these tiles spilled). The mask is added,
  not selected: the select form spilled on sm_100 and sm_120.

Grid ``(cdiv(Nq, TILE_M), B * Hq, 1)``; causal, the longest query tiles first.
"""
import math

import cuda.tile as ct

from .common import (INV_LOG_2, ConstBool, ConstInt, key_tile_range, online_softmax_update)


def _scores(q, K, batch_idx, kv_head, j, TILE_M: ConstInt, TILE_N: ConstInt,
            TILE_D: ConstInt, FAST_ACC: ConstBool):
    """S = Q K^T of key tile ``j`` (TILE_N keys), fp32. K is read transposed from its (Nk, D)
    memory: K-major, as the FP8 MMA reads its operands."""
    k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    k = k.reshape((TILE_D, TILE_N))                                  # [TILE_D, TILE_N] fp8
    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    return ct.mma(q, k, qk, use_fast_acc=FAST_ACC)                   # [TILE_M, TILE_N] fp32


def _mask_add(qk, offs_m, offs_n, k_seqlen, CAUSAL: ConstBool, EVEN_K: ConstBool):
    """-inf added where a key is past ``k_seqlen`` or (causal) after the query: the add form
    of ``common.mask_scores``. With the select form tileiras 13.4 spills this kernel on sm_100
    and sm_120 (tests/test_fp8_aot.py); the values are the same."""
    mask = ct.full(qk.shape, True, dtype=ct.bool_)
    if not EVEN_K:
        mask = mask & (offs_n < k_seqlen)                            # keys past Nk
    if CAUSAL:
        mask = mask & (offs_m >= offs_n)                             # future keys
    return qk + ct.where(mask, 0.0, -math.inf)


def _add_pv(p, acc, V, batch_idx, kv_head, j, TILE_N: ConstInt, TILE_D: ConstInt,
            V_T: ConstBool, FAST_ACC: ConstBool):
    """O += P V over key tile ``j``, P cast to the operands' fp8 type."""
    if V_T:
        # V stored (D, Nk): the key axis (this MMA's reduction) is contiguous, K-major.
        v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    else:
        # V stored (Nk, D): the compiler must transpose the tile for the FP8 MMA.
        v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO)
    v = v.reshape((TILE_N, TILE_D))                                  # [TILE_N, TILE_D] fp8
    return ct.mma(p.astype(V.dtype), v, acc, use_fast_acc=FAST_ACC)  # [TILE_M, TILE_D]


@ct.kernel
def fmha_fp8_kernel(Q, K, V, Out, QDescale, KDescale, VDescale,
                    qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                    TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                    CAUSAL: ConstBool, EVEN_K: ConstBool, V_T: ConstBool,
                    FAST_ACC: ConstBool, P_SHIFT: ConstInt, SPLIT: ConstBool):
    """FP8 FlashAttention forward. See the module docstring for shapes and grid.

    qk_scale: the softmax scale (natural units); input_pos: absolute position of query row 0
    (causal); group_size = Hq // Hkv. FAST_ACC: ``ct.mma(use_fast_acc=True)`` (Hopper's FP8
    accumulation without periodic promotion; the reductions here are only D or TILE_N long).
    P_SHIFT: P is computed as 2^(s - m + P_SHIFT), in [0, 2^P_SHIFT].
    SPLIT: the unmasked key tiles in one loop of TILE_N keys, the masked ones (causal diagonal,
    ragged end of K) in a second loop of TILE_N // 2 (with the mask inside one loop the wide
    tiles spilled).
    """
    # --- Program id -> (query tile, batch, head, kv head) ---
    if CAUSAL:
        # Launch the longest query tiles (bottom rows) first.
        bid_x = ct.num_blocks(0) - 1 - ct.bid(0)
    else:
        bid_x = ct.bid(0)
    bid_y = ct.bid(1)
    batch_idx = bid_y // num_heads
    head_idx = bid_y % num_heads
    kv_head = head_idx // group_size

    # --- Descales of this (batch, kv head): q and k fold into the scale, v into the output ---
    q_ds = ct.gather(QDescale, (batch_idx, kv_head), padding_value=1.0).item()
    k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
    v_ds = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
    scale = qk_scale * INV_LOG_2 * q_ds * k_ds                       # log2 units, dequantised

    # --- Query tile and running state (fp32 softmax statistics and output) ---
    offs_m = input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)  # [TILE_M]
    offs_m = offs_m[:, None]                                         # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]         # [1, TILE_N]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)          # running max (log2 units)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)               # running sum of P
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)          # unnormalised output
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D] fp8

    # --- Which key tiles this query tile visits ---
    k_seqlen = K.shape[2]
    Tc, mask_start = key_tile_range(input_pos + bid_x * TILE_M, input_pos + (bid_x + 1) * TILE_M,
                                    k_seqlen, TILE_N, CAUSAL)

    if SPLIT:
        Tc = mask_start                  # the unmasked tiles here, the masked ones below
    for j in range(0, Tc):
        qk = _scores(q, K, batch_idx, kv_head, j, TILE_M, TILE_N, TILE_D, FAST_ACC)
        if (CAUSAL or not EVEN_K) and not SPLIT and j >= mask_start:
            qk = _mask_add(qk, offs_m, j * TILE_N + offs_n_tile, k_seqlen, CAUSAL, EVEN_K)
        # --- Online softmax in fp32; P scaled by 2^P_SHIFT into e4m3's range ---
        p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, scale, GUARD=False,
                                                 FLUSH=True, P_SHIFT=P_SHIFT)
        acc = _add_pv(p, acc, V, batch_idx, kv_head, j, TILE_N, TILE_D, V_T, FAST_ACC)

    if SPLIT:
        # --- The masked key tiles (causal diagonal, ragged end) at half the keys ---
        TN2 = TILE_N // 2
        offs_n2 = ct.arange(TN2, dtype=ct.int32)[None, :]              # [1, TN2]
        if CAUSAL:
            Tc2 = ct.cdiv(min(input_pos + (bid_x + 1) * TILE_M, k_seqlen), TN2)
        else:
            Tc2 = ct.cdiv(k_seqlen, TN2)
        for j2 in range(2 * mask_start, Tc2):
            qk = _scores(q, K, batch_idx, kv_head, j2, TILE_M, TN2, TILE_D, FAST_ACC)
            qk = _mask_add(qk, offs_m, j2 * TN2 + offs_n2, k_seqlen, CAUSAL, EVEN_K)
            p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, scale, GUARD=False,
                                                     FLUSH=True, P_SHIFT=P_SHIFT)
            acc = _add_pv(p, acc, V, batch_idx, kv_head, j2, TN2, TILE_D, V_T, FAST_ACC)

    # --- Normalise (the 2^P_SHIFT cancels), dequantise V, store ---
    acc = ct.truediv(acc, l_i) * v_ds
    acc = acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)
    ct.store(Out, index=(batch_idx, head_idx, bid_x, 0), tile=acc)  # rows past Nq dropped
