"""The decode kernel (``decode_split_fp8_kernel``) is ``decode.decode_split_kernel`` with K and V
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
