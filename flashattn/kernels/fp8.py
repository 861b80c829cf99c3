"""FP8 attention kernels (chapter 14): a forward built for FP8 tensor cores, and split-KV decoding
over an FP8 KV cache.

The forward (``fmha_fp8_kernel``), FlashAttention-3's recipe in cuTile::

    Q: (B, Hq, Nq, D) fp8       K: (B, Hkv, Nk, D) fp8       Out: (B, Hq, Nq, D) bf16/fp16
    V: (B, Hkv, Nk, D) fp8, or with V_T (V transposed in memory): (B, Hkv, D, Nk) fp8
    QDescale, KDescale, VDescale: (B, Hkv) fp32: the descale factors of each (batch, kv head)

* S = Q K^T on FP8 tensor cores with fp32 accumulation; the descales of Q and K fold into the
  softmax scale (one multiply per row, as in fmha.py).
* The softmax in fp32, online (chapter 2), in base 2.
* P is scaled into e4m3's range before its cast: ``p = 2^(s - m + P_SHIFT)`` lies in
  ``[0, 2^P_SHIFT]`` (256 for P_SHIFT = 8, below e4m3's 448), so the small probabilities keep
  their relative precision instead of falling into e4m3's subnormals (below 2^-6) or to zero
  (below 2^-10). The same factor is in the row sum, so the final division cancels it.
* O += P V with P cast to the operands' fp8 type (cuTile's ``mma`` takes two operands of one
  dtype) and fp32 accumulation; the v descale multiplies the output once at the end.
* Hopper's FP8 warpgroup MMA reads both operands K-major (the reduction axis contiguous). For
  S = Q K^T that is K's natural (Nk, D) layout; for O = P V the reduction axis is the key axis,
  so V must be (D, Nk) in memory: ``V_T``. Without it the kernel reads V as (Nk, D) and the
  compiler transposes each tile on chip (the compile report compares both).

* SPLIT (Hopper's wide tiles: 128x256, at D=256 128x128): the key tiles that need no mask run
  in one loop of TILE_N keys, the masked ones (the causal diagonal, the ragged end of K) in a
  second loop of TILE_N // 2; with the mask inside their one loop these tiles spilled. The
  mask is added (``-inf`` where hidden), not selected: the select form spilled on sm_100 and
  sm_120.

Grid: ``(cdiv(Nq, TILE_M), B * Hq, 1)``, one program per query tile per (batch, head), GQA
query head h reading key/value head ``h // group_size``; causal, the longest query tiles (the
last ones) first, as the fp16 forward (chapter 8).

The decode kernel (``decode_split_fp8_kernel``) is ``decode.decode_split_kernel`` with K and V
read as fp8 (half the bytes of an fp16 cache: decoding is memory-bound) and widened to the
query's dtype on chip; the k descale folds into the softmax scale and the v descale into the
output (both per (batch, kv head), ``KDescale, VDescale: (B, Hkv) fp32``). Splits, paging, the fused
merge and the NaN poisoning of invalid lengths or pages are those of the fp16 kernel, and the
partials it writes are merged by the same combine kernels. A V cache stored transposed takes
``fp8_decode.py`` instead (both products on FP8 tensor cores, nothing widened).
"""
import math

import cuda.tile as ct

from .common import (INV_LOG_2, ConstBool, ConstInt, key_tile_range, mask_scores,
                     online_softmax_update)
from .decode import merge_splits


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
    tiles spilled; chapter 14).
    """
    # --- Program id -> (query tile, batch, head, kv head) ---
    if CAUSAL:
        # Chapter 8: launch the longest query tiles (bottom rows) first.
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

    # --- Which key tiles this query tile visits (chapter 7) ---
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


@ct.kernel
def decode_split_fp8_kernel(Q, K, V, BlockTable, SeqLens, KDescale, VDescale, Opart, Lse, Out,
                            Counter,
                            qk_scale: float, num_q: int,
                            TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                            PAGED: ConstBool, FINAL: ConstBool, FUSED: ConstBool,
                            PDL: ConstBool, HALF_D: ConstInt):
    """``decode.decode_split_kernel`` over an FP8 cache: partial attention of one GQA group over
    one run of the cache.

    Q, Out: (B, Hkv, G * Nq, D) fp16/bf16; K, V: fp8 (B, Hkv, S, D), or paged
    (num_pages, Hkv, page_size, D); KDescale, VDescale (B, Hkv) fp32. Grid, split rule,
    FINAL, FUSED (with ``Counter``) and PDL as in ``decode_split_kernel``. HALF_D: S = Q K^T in
    slices of HALF_D of the head dim (``TILE_D``: one slice), each K slice widened on its own:
    at D=256 the whole widened K tile spilled (8-96 bytes); 128-wide slices do not.
    """
    bid_m = ct.bid(0)
    split = ct.bid(1)
    bh = ct.bid(2)
    num_splits = ct.num_blocks(1)
    num_kv_heads = K.shape[1]
    batch_idx = bh // num_kv_heads
    kv_head = bh % num_kv_heads
    k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
    v_ds = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
    qk_scale = qk_scale * INV_LOG_2 * k_ds                           # base 2, K dequantised

    # --- This sequence's length, read on the device ---
    page_size = K.shape[2]
    if PAGED:
        capacity = BlockTable.shape[1] * page_size
    else:
        capacity = page_size
    seqlen_raw = ct.gather(SeqLens, (batch_idx,), padding_value=0).item()
    seqlen = min(max(seqlen_raw, 0), capacity)
    bad = ct.where(seqlen == seqlen_raw, 0, 1)                       # 1: poison the output

    n_tiles = ct.cdiv(seqlen, TILE_N)
    per_split = ct.cdiv(n_tiles, num_splits)
    t_start = min(split * per_split, n_tiles)
    t_end = min(t_start + per_split, n_tiles)
    mask_from = seqlen - num_q + 1

    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)       # [TILE_M]
    q_pos = (seqlen - num_q + rows % num_q)[:, None]                 # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)                  # [TILE_N]
    q = ct.load(Q, index=(batch_idx, kv_head, bid_m, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)

    num_pages = K.shape[0]
    for t in range(t_start, t_end):
        n0 = t * TILE_N
        if PAGED:
            slot = n0 // page_size
            page_raw = ct.gather(BlockTable, (batch_idx, slot), padding_value=-1).item()
            page = min(max(page_raw, 0), num_pages - 1)
            bad = max(bad, ct.where(page == page_raw, 0, 1))
            tile_in_page = (n0 - slot * page_size) // TILE_N
        else:
            page = batch_idx
            tile_in_page = t
        # fp8 from memory (half the bytes), widened to q's dtype on chip, in TILE_D // HALF_D
        # slices of the head dim (at D=256 one widened tile of the whole head dim spills).
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        if HALF_D == TILE_D:
            k = ct.load(K, index=(page, kv_head, 0, tile_in_page), shape=(1, 1, TILE_D, TILE_N),
                        order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
            k = k.reshape((TILE_D, TILE_N)).astype(Q.dtype)          # [TILE_D, TILE_N]
            qk = ct.mma(q, k, qk)                                    # S = Q K^T (unscaled K)
        else:
            for c in range(TILE_D // HALF_D):
                k = ct.load(K, index=(page, kv_head, c, tile_in_page),
                            shape=(1, 1, HALF_D, TILE_N), order=(0, 1, 3, 2),
                            padding_mode=ct.PaddingMode.ZERO)
                k = k.reshape((HALF_D, TILE_N)).astype(Q.dtype)      # [HALF_D, TILE_N]
                qc = ct.load(Q, index=(batch_idx, kv_head, bid_m, c),
                             shape=(1, 1, TILE_M, HALF_D),
                             padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, HALF_D))
                qk = ct.mma(qc, k, qk)                               # S += Q_c K_c^T
        if n0 + TILE_N > mask_from:
            # Slots past seqlen may hold anything (fp8 NaN included): the mask selects.
            qk = mask_scores(qk, q_pos, (n0 + offs_n_tile)[None, :], seqlen, True, True)
        # A row may see no key of this split yet: the guard keeps it NaN-free.
        p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, GUARD=True,
                                                 FLUSH=False)

        # V after the softmax: its widened tile is not live beside K's (registers at D=256).
        v = ct.load(V, index=(page, kv_head, tile_in_page, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((TILE_N, TILE_D)).astype(Q.dtype)              # [TILE_N, TILE_D]
        if n0 + TILE_N > mask_from:
            v = ct.where((n0 + offs_n_tile)[:, None] < seqlen, v, 0.0)
        acc = ct.mma(p.astype(Q.dtype), v, acc)                      # O += P V (unscaled V)

    has_keys = l_i > 0.0
    o = ct.truediv(acc, ct.where(has_keys, l_i, 1.0)) * v_ds         # V dequantised here
    lse = ct.where(has_keys, m_i + ct.log2(ct.where(has_keys, l_i, 1.0)), -math.inf)
    if bad > 0:
        o = ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32)
        lse = ct.full((TILE_M, 1), math.nan, dtype=ct.float32)
    if FINAL:
        ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                 tile=o.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
    else:
        ct.store(Opart, index=(split, bh, bid_m, 0), tile=o.reshape((1, 1, TILE_M, TILE_D)))
        ct.store(Lse, index=(split, bh, bid_m), tile=lse.reshape((1, 1, TILE_M)))
        if PDL:
            ct.grid_dependency_control_launch_dependents()
        if FUSED:
            arrived = ct.atomic_add(Counter, (bh, bid_m), 1,
                                    memory_order=ct.MemoryOrder.ACQ_REL,
                                    memory_scope=ct.MemoryScope.DEVICE)
            if arrived == num_splits - 1:
                ct.atomic_xchg(Counter, (bh, bid_m), 0)
                out = merge_splits(Opart, Lse, bh, bid_m, TILE_M, TILE_D)
                ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                         tile=out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
