"""Split-KV decoding over an FP8 KV cache on FP8 tensor cores (chapter 14): both products of the
online softmax read the cache's fp8 bytes as they arrive; nothing is widened.

``fp8.decode_split_fp8_kernel`` widens each fp8 K and V tile to fp16 on chip and multiplies in
fp16; on Hopper the widening (a converter warp group, through shared memory) costs more than
the halved bytes save (chapter 14 measures both). Here:

* S = Q8 K8^T: the query rows are quantised to e4m3 once per program, one scale per row
  (``amax / Q8_MAX``), folded into the softmax scale of that row; K's natural (S, D) layout is
  already K-major for the FP8 MMA.
* O += P8 V8: P is scaled into fp8's range (``2^(s - m + P_SHIFT)``, as the FP8 forward) and
  multiplied with V kept **transposed in the cache**, (D, S) per kv head: the key axis, this
  product's reduction, contiguous (K-major), as Hopper's FP8 MMA reads both operands. The
  factor ``2^P_SHIFT`` cancels in the normalisation and is taken out of the log-sum-exp.

Layouts (as ``decode.py``, V transposed)::

    Q, Out:  (B, Hkv, G * Nq, D) fp16/bf16
    K:       (B, Hkv, S, D) fp8, or paged (num_pages, Hkv, page_size, D)
    V:       (B, Hkv, D, S) fp8, or paged (num_pages, Hkv, D, page_size)
    KDescale, VDescale: (B, Hkv) fp32
    BlockTable, SeqLens, Opart, Lse: as decode.py (the same combine kernels merge the partials)

Grid, split rule, paging, FINAL and the NaN poisoning of invalid lengths or pages are those of
``decode.decode_split_kernel``; the plan is ``fp8_decode_spec.fp8_decode_plan``.
"""
import math

import cuda.tile as ct

from .common import INV_LOG_2, ConstBool, ConstInt, mask_scores, online_softmax_update

# q rows are scaled so their largest |value| lands here: e4m3's largest finite value (e5m2
# holds it too, with the same relative spacing of its values).
Q8_MAX = 448.0


def _fp8_tile(K, V, q8, row_scale, m_i, l_i, acc, page, kv_head, tile_in_page, n0, seqlen,
              q_pos, offs_n_tile, TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
              P_SHIFT: ConstInt, MASKED: ConstBool):
    """One key tile of the online softmax on FP8 MMAs (inlined). MASKED: the tile holds keys
    past a query's position or past seqlen (slots that may hold anything, NaN included)."""
    # S = Q8 K8^T: K read (D, TILE_N) from its (S, D) memory, K-major.
    k = ct.load(K, index=(page, kv_head, 0, tile_in_page), shape=(1, 1, TILE_D, TILE_N),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    k = k.reshape((TILE_D, TILE_N))                                  # [TILE_D, TILE_N] fp8
    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    qk = ct.mma(q8, k, qk, use_fast_acc=True)                        # [TILE_M, TILE_N]
    if MASKED:
        qk = mask_scores(qk, q_pos, (n0 + offs_n_tile)[None, :], seqlen, True, True)
    p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, row_scale, True, True,
                                             P_SHIFT)                # p in [0, 2^P_SHIFT]
    # O += P8 V8: V read (TILE_N, D) from its (D, S) memory: the key axis contiguous.
    v = ct.load(V, index=(page, kv_head, tile_in_page, 0), shape=(1, 1, TILE_N, TILE_D),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    v = v.reshape((TILE_N, TILE_D))                                  # [TILE_N, TILE_D] fp8
    if MASKED:
        # A NaN slot past seqlen times P = 0 is NaN: zero those keys' values.
        v = ct.where((n0 + offs_n_tile)[:, None] < seqlen, v, 0.0).astype(V.dtype)
    acc = ct.mma(p.astype(V.dtype), v, acc, use_fast_acc=True)
    return m_i, l_i, acc


def _page_of(BlockTable, batch_idx, t, bad, page_size, num_pages, TILE_N: ConstInt,
             PAGED: ConstBool):
    """(page, tile within it, bad) of key tile ``t`` (inlined): paged, the block table's page
    of slot ``t * TILE_N // page_size``, clamped for addressing (an id out of range sets bad);
    contiguous, the sequence's own cache."""
    if PAGED:
        n0 = t * TILE_N
        slot = n0 // page_size
        page_raw = ct.gather(BlockTable, (batch_idx, slot), padding_value=-1).item()
        page = min(max(page_raw, 0), num_pages - 1)
        bad = max(bad, ct.where(page == page_raw, 0, 1))
        tile_in_page = (n0 - slot * page_size) // TILE_N
    else:
        page = batch_idx
        tile_in_page = t
    return page, tile_in_page, bad


@ct.kernel
def decode_fp8mma_kernel(Q, K, V, BlockTable, SeqLens, KDescale, VDescale, Opart, Lse, Out,
                         qk_scale: float, num_q: int,
                         TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                         PAGED: ConstBool, FINAL: ConstBool, P_SHIFT: ConstInt):
    """Partial attention of one GQA group over one run of an fp8 cache (V transposed), on FP8
    MMAs. Grid ``(cdiv(G * Nq, TILE_M), num_splits, B * Hkv)``; qk_scale in natural units;
    num_q: Nq. With PAGED, ``page_size = K.shape[2]`` is a multiple of TILE_N. With FINAL the
    program writes ``Out`` itself (one split) and leaves Opart and Lse alone."""
    bid_m = ct.bid(0)
    split = ct.bid(1)
    bh = ct.bid(2)
    num_splits = ct.num_blocks(1)
    num_kv_heads = K.shape[1]
    batch_idx = bh // num_kv_heads
    kv_head = bh % num_kv_heads
    k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
    v_ds = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
    scale = qk_scale * INV_LOG_2 * k_ds                              # base 2, K dequantised

    # --- This sequence's length, read on the device (as decode.py) ---
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
    mask_from = seqlen - num_q + 1                                   # keys every row sees

    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)       # [TILE_M]
    q_pos = (seqlen - num_q + rows % num_q)[:, None]                 # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)                  # [TILE_N]
    q = ct.load(Q, index=(batch_idx, kv_head, bid_m, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    # --- q to fp8 once, one scale per row (its amax at Q8_MAX), folded into the row's scale ---
    qf = q.astype(ct.float32)
    amax = ct.max(ct.abs(qf), axis=-1, keepdims=True)               # [TILE_M, 1]
    amax = ct.where(amax > 0.0, amax, 1.0)                           # zero rows (padding)
    q8 = (qf * (Q8_MAX / amax)).astype(K.dtype)                      # [TILE_M, TILE_D] fp8
    row_scale = (amax * (1.0 / Q8_MAX)) * scale                      # [TILE_M, 1]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)

    # Tiles every row sees in full first, with no mask at all, then the tile(s) the mask
    # touches: one loop with the mask under an ``if`` made the compiler route every V tile
    # through registers for a select only the last tile needs (chapter 14, SASS).
    t_mid = min(max(t_start, max(mask_from, 0) // TILE_N), t_end)
    for t in range(t_start, t_mid):
        page, tile_in_page, bad = _page_of(BlockTable, batch_idx, t, bad, page_size, K.shape[0],
                                           TILE_N, PAGED)
        m_i, l_i, acc = _fp8_tile(K, V, q8, row_scale, m_i, l_i, acc, page, kv_head,
                                  tile_in_page, t * TILE_N, seqlen, q_pos, offs_n_tile,
                                  TILE_M, TILE_N, TILE_D, P_SHIFT, False)
    for t in range(t_mid, t_end):
        page, tile_in_page, bad = _page_of(BlockTable, batch_idx, t, bad, page_size, K.shape[0],
                                           TILE_N, PAGED)
        m_i, l_i, acc = _fp8_tile(K, V, q8, row_scale, m_i, l_i, acc, page, kv_head,
                                  tile_in_page, t * TILE_N, seqlen, q_pos, offs_n_tile,
                                  TILE_M, TILE_N, TILE_D, P_SHIFT, True)

    # --- Normalise (2^P_SHIFT cancels), V dequantised; the LSE without 2^P_SHIFT ---
    has_keys = l_i > 0.0
    l_safe = ct.where(has_keys, l_i, 1.0)
    o = ct.truediv(acc, l_safe) * v_ds                               # [TILE_M, TILE_D]
    lse = ct.where(has_keys, m_i + ct.log2(l_safe) - P_SHIFT, -math.inf)
    if bad > 0:
        o = ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32)
        lse = ct.full((TILE_M, 1), math.nan, dtype=ct.float32)
    if FINAL:
        ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                 tile=o.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
    else:
        ct.store(Opart, index=(split, bh, bid_m, 0), tile=o.reshape((1, 1, TILE_M, TILE_D)))
        ct.store(Lse, index=(split, bh, bid_m), tile=lse.reshape((1, 1, TILE_M)))
