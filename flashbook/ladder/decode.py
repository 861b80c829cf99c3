"""Split-KV decoding (flash-decoding) over a contiguous or paged KV cache: two kernels.

(The book's ladder file: the library's ``flashattn/kernels/decode.py`` with its off
switches kept, see ``flashbook/ladder/variants.py``; the library folds them away.)

A decode step has a few query rows per sequence (Nq = 1 for plain decoding, up to 16 for
speculative decoding) and a long KV cache, so one program per (batch, head) leaves most SMs idle
and each query head of a GQA group would read the same K/V again. Here:

* the query heads of one GQA group are packed as the rows of one tile (row ``r = g * Nq + i`` is
  query ``i`` of head ``kv_head * G + g``), so each K/V tile is read once per group;
* the cache length is split across programs (``decode_split_kernel``), each writing a partial
  output and its log-sum-exp; ``decode_combine_kernel`` merges them with the exact LSE algebra:
  ``lse = log2(sum_s 2^lse_s)``, ``o = sum_s 2^(lse_s - lse) o_s``; with one split (large
  batches fill the GPU without splitting) the split kernel writes the output itself (``FINAL``)
  and the combine does not run;
* the per-sequence lengths (and the block table) are read from device tensors inside the kernel,
  so one launch can be captured in a CUDA graph and replayed while the lengths change.

Layouts (``Hq = Hkv * G``; the host views q and out as below, which is free for contiguous
tensors)::

    Q, Out:  (B, Hkv, G * Nq, D)              q, out (B, Hq, Nq, D) viewed group by group
    K, V:    (B, Hkv, S, D)                   contiguous cache (PAGED=False), S = capacity
             (num_pages, Hkv, page_size, D)   paged cache (PAGED=True)
    BlockTable: (B, max_pages) int32          page id of slot p of sequence b (PAGED)
    SeqLens: (B,) int32                       keys of sequence b: 0 .. SeqLens[b] - 1
    Opart:   (num_splits, B * Hkv, M_pad, TILE_D) fp32   normalised partial outputs
    Lse:     (num_splits, B * Hkv, M_pad) fp32            partial log-sum-exps, base 2
             (FINAL: small placeholders, never read or written)

Query row ``i`` of a sequence sits at position ``SeqLens[b] - Nq + i`` (the new tokens are the
last ``Nq`` entries of the cache) and sees keys ``0 .. SeqLens[b] - Nq + i``; a row that sees no
key (``SeqLens[b] == 0``, or ``i < Nq - SeqLens[b]``) gets output 0, as FlashAttention does.

Split rule, evaluated in the kernel from the length it reads: the ``n = cdiv(len, TILE_N)`` K/V
tiles of a sequence are dealt in runs of ``cdiv(n, num_splits)`` tiles; split ``s`` takes run
``s`` (possibly empty). So the split count is fixed at launch (graph capture), while each
sequence's work follows its current length.

Invalid device data never causes an out-of-bounds read: a length outside ``[0, capacity]`` or a
page id outside ``[0, num_pages)`` is clamped for addressing, and the program writes NaN for that
sequence instead of a silent wrong answer (the host checks these values up front when it can;
under CUDA-graph capture it cannot).
"""
import math

import cuda.tile as ct

from flashattn.kernels.common import INV_LOG_2, mask_scores, merge_lse, online_softmax_update

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


def merge_splits(Opart, Lse, bh, bid_m, TILE_M: ConstInt, TILE_D: ConstInt):
    """The merged output ``[TILE_M, TILE_D]`` fp32 of row block ``bid_m`` of group ``bh``: the
    LSE algebra as an online softmax over the splits, one split at a time (a row whose splits
    all have ``lse = -inf`` gets 0; a NaN partial stays NaN). Used by ``decode_combine_kernel``
    and by the fused merge of ``decode_split_kernel``."""
    num_splits = Opart.shape[0]
    m = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)            # running max of lse_s
    l = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)                  # sum of 2^(lse_s - m)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)          # sum of 2^(lse_s - m) o_s
    for s in range(num_splits):
        lse = ct.load(Lse, index=(s, bh, bid_m), shape=(1, 1, TILE_M))
        lse = lse.reshape((TILE_M, 1))                               # [TILE_M, 1]
        o = ct.load(Opart, index=(s, bh, bid_m, 0), shape=(1, 1, TILE_M, TILE_D))
        o = o.reshape((TILE_M, TILE_D))                              # [TILE_M, TILE_D]
        m, l, acc = merge_lse(m, l, acc, lse, o, False)              # one split per row
    return ct.truediv(acc, ct.where(l > 0.0, l, 1.0))               # [TILE_M, TILE_D]


@ct.kernel
def decode_split_kernel(Q, K, V, BlockTable, SeqLens, Opart, Lse, Out, Counter,
                        qk_scale: float, num_q: int,
                        TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                        PAGED: ConstBool, FINAL: ConstBool, FUSED: ConstBool, PDL: ConstBool):
    """Partial attention of one GQA group over one run of the cache.

    Grid: ``(cdiv(G * Nq, TILE_M), num_splits, B * Hkv)``. qk_scale: the softmax scale (natural
    units); num_q: Nq. With PAGED, ``page_size = K.shape[2]`` is a multiple of TILE_N, so a K/V
    tile never straddles two pages. With FINAL (one split: the partial is the answer) the
    program writes its normalised output to ``Out`` in Out's dtype and no combine runs; Opart
    and Lse are then not touched. Otherwise ``Out`` is not touched, unless FUSED: then each
    program, after storing its partial, counts itself in ``Counter[bh, bid_m]`` (an atomic
    add, acquire-release at device scope: its partial is published, the others' it sees are
    visible), and the program that counts last merges all the splits of its row block as
    ``decode_combine_kernel`` does, writes ``Out`` and sets the counter back to 0 (E23: the
    merge without a second launch). ``Counter`` (B * Hkv, row blocks) int32 must be 0 at
    launch; without FUSED it is a placeholder, never touched.
    """
    # --- Program id -> (row block, split, batch, kv head) ---
    bid_m = ct.bid(0)
    split = ct.bid(1)
    bh = ct.bid(2)
    num_splits = ct.num_blocks(1)
    num_kv_heads = K.shape[1]
    batch_idx = bh // num_kv_heads
    kv_head = bh % num_kv_heads
    qk_scale = qk_scale * INV_LOG_2                                  # softmax in base 2

    # --- This sequence's length, read on the device (CUDA-graph replay sees the new value) ---
    page_size = K.shape[2]
    if PAGED:
        capacity = BlockTable.shape[1] * page_size
    else:
        capacity = page_size
    seqlen_raw = ct.gather(SeqLens, (batch_idx,), padding_value=0).item()
    seqlen = min(max(seqlen_raw, 0), capacity)                       # never read past the cache
    bad = ct.where(seqlen == seqlen_raw, 0, 1)                       # 1: poison the output

    # --- Which K/V tiles this split visits ---
    n_tiles = ct.cdiv(seqlen, TILE_N)
    per_split = ct.cdiv(n_tiles, num_splits)
    t_start = min(split * per_split, n_tiles)
    t_end = min(t_start + per_split, n_tiles)
    # Keys before seqlen - num_q + 1 are visible to every row: only later tiles need the mask.
    mask_from = seqlen - num_q + 1

    # --- Query tile: the G heads x Nq queries of this group, and their positions ---
    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)       # [TILE_M]
    q_pos = (seqlen - num_q + rows % num_q)[:, None]                 # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)                  # [TILE_N]
    q = ct.load(Q, index=(batch_idx, kv_head, bid_m, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)          # running max (log2 units)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)               # running sum of exp2
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)          # unnormalised output

    # --- Main loop over this split's K/V tiles ---
    num_pages = K.shape[0]
    for t in range(t_start, t_end):
        n0 = t * TILE_N                                              # first key of the tile
        if PAGED:
            # The block table maps slot n0 // page_size of this sequence to a physical page.
            slot = n0 // page_size
            page_raw = ct.gather(BlockTable, (batch_idx, slot), padding_value=-1).item()
            page = min(max(page_raw, 0), num_pages - 1)
            bad = max(bad, ct.where(page == page_raw, 0, 1))
            tile_in_page = (n0 - slot * page_size) // TILE_N
        else:
            page = batch_idx
            tile_in_page = t
        # K is read transposed straight from (page_size, D) memory (as in fmha.py).
        k = ct.load(K, index=(page, kv_head, 0, tile_in_page), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        k = k.reshape((TILE_D, TILE_N))                              # [TILE_D, TILE_N]
        v = ct.load(V, index=(page, kv_head, tile_in_page, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((TILE_N, TILE_D))                              # [TILE_N, TILE_D]
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)       # [TILE_M, TILE_N]
        qk = ct.mma(q, k, qk)                                        # S = Q K^T

        if n0 + TILE_N > mask_from:
            # The causal edge and the end of the sequence. Cache slots past seqlen may hold
            # anything (NaN included): select -inf instead of adding it, and zero those V rows
            # so that 0 * garbage cannot reach P V.
            offs_n = n0 + offs_n_tile                                # [TILE_N]
            qk = mask_scores(qk, q_pos, offs_n[None, :], seqlen, True, True)  # causal edge
            v = ct.where(offs_n[:, None] < seqlen, v, 0.0)           # [TILE_N, TILE_D]

        # --- Online softmax (chapter 2); a row with no visible key yet keeps m_i = -inf ---
        p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, True, False)
        acc = ct.mma(p.astype(Q.dtype), v, acc)                      # O += P V

    # --- Normalise, and the split's log-sum-exp (-inf for a split with no visible key) ---
    has_keys = l_i > 0.0                                             # [TILE_M, 1]
    o = ct.truediv(acc, ct.where(has_keys, l_i, 1.0))                # [TILE_M, TILE_D]
    lse = ct.where(has_keys, m_i + ct.log2(ct.where(has_keys, l_i, 1.0)), -math.inf)
    if bad > 0:
        # A length past the cache or a page id out of range: NaN, never a wrong number.
        o = ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32)
        lse = ct.full((TILE_M, 1), math.nan, dtype=ct.float32)
    if FINAL:
        # Rows past G * Nq and columns past D are dropped by the store (as in the combine).
        ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                 tile=o.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
    else:
        ct.store(Opart, index=(split, bh, bid_m, 0), tile=o.reshape((1, 1, TILE_M, TILE_D)))
        ct.store(Lse, index=(split, bh, bid_m), tile=lse.reshape((1, 1, TILE_M)))
        if PDL:
            # E27 (off): the combine, a programmatic dependent, may be scheduled now; it
            # waits for this grid to finish before it reads a partial.
            ct.grid_dependency_control_launch_dependents()
        if FUSED:
            # Count this split in; the last one merges. acq_rel: the stores above are
            # published before the count, and the last program sees every split's stores.
            arrived = ct.atomic_add(Counter, (bh, bid_m), 1,
                                    memory_order=ct.MemoryOrder.ACQ_REL,
                                    memory_scope=ct.MemoryScope.DEVICE)
            if arrived == num_splits - 1:
                ct.atomic_xchg(Counter, (bh, bid_m), 0)               # ready for the next call
                out = merge_splits(Opart, Lse, bh, bid_m, TILE_M, TILE_D)  # as the combine
                ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                         tile=out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))


@ct.kernel
def decode_combine_kernel(Opart, Lse, Out, TILE_M: ConstInt, TILE_D: ConstInt, PDL: ConstBool):
    """Merge the splits' partial outputs: the LSE algebra, as an online softmax over splits.

    Grid: ``(cdiv(G * Nq, TILE_M), B * Hkv, 1)``. Out is written in its own dtype; rows past
    G * Nq and columns past D are dropped by the store. A row whose splits all have
    ``lse = -inf`` (no visible key) gets 0; a NaN partial stays NaN.
    """
    if PDL:
        # E27 (off): launched as a programmatic dependent of the split kernel.
        ct.grid_dependency_control_wait()
    bid_m = ct.bid(0)
    bh = ct.bid(1)
    num_kv_heads = Out.shape[1]
    batch_idx = bh // num_kv_heads
    kv_head = bh % num_kv_heads
    out = merge_splits(Opart, Lse, bh, bid_m, TILE_M, TILE_D)       # [TILE_M, TILE_D]
    out = out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)
    ct.store(Out, index=(batch_idx, kv_head, bid_m, 0), tile=out)


@ct.kernel
def decode_combine_row_kernel(Opart, Lse, Out, TILE_D: ConstInt, TILE_S: ConstInt,
                              PDL: ConstBool):
    """Merge the splits' partial outputs of one row: the LSE algebra, ``TILE_S`` splits a step.

    Grid: ``(G * Nq, B * Hkv, 1)``: one program per packed row. Each step loads the
    log-sum-exps ``[TILE_S, 1]`` and partial outputs ``[TILE_S, TILE_D]`` of ``TILE_S`` splits
    (splits past the last read ``lse = -inf`` and ``o = 0``: weight 0), reduces them over the
    split axis, and folds the result into a running (max, sum, output) as the online softmax of
    chapter 2 does with key tiles. So the loop is ``cdiv(num_splits, TILE_S)`` steps long, not
    ``num_splits``. The alternative to ``decode_combine_kernel`` for few rows and many splits
    (E18b: faster at B=1, slower with thousands of rows); the host picks it with
    ``kernels.decode_combine_kind`` (few rows and many splits: E21).
    Out is written in its own dtype; columns past D are dropped by the store. A row whose
    splits all have ``lse = -inf`` (no visible key) gets 0; a NaN partial stays NaN.
    """
    if PDL:
        # E27 (off): launched as a programmatic dependent of the split kernel.
        ct.grid_dependency_control_wait()
    row = ct.bid(0)
    bh = ct.bid(1)
    num_splits = Opart.shape[0]
    num_kv_heads = Out.shape[1]
    batch_idx = bh // num_kv_heads
    kv_head = bh % num_kv_heads

    m = ct.full((1, 1), -math.inf, dtype=ct.float32)                 # running max of lse_s
    l = ct.full((1, 1), 0.0, dtype=ct.float32)                       # sum of 2^(lse_s - m)
    acc = ct.full((1, TILE_D), 0.0, dtype=ct.float32)               # sum of 2^(lse_s - m) o_s
    for c in range(ct.cdiv(num_splits, TILE_S)):
        lse = ct.load(Lse, index=(c, bh, row), shape=(TILE_S, 1, 1),
                      padding_mode=ct.PaddingMode.NEG_INF).reshape((TILE_S, 1))
        o = ct.load(Opart, index=(c, bh, row, 0), shape=(TILE_S, 1, 1, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_S, TILE_D))
        m, l, acc = merge_lse(m, l, acc, lse, o, True)               # TILE_S splits, one row

    out = ct.truediv(acc, ct.where(l > 0.0, l, 1.0))                # [1, TILE_D]
    out = out.reshape((1, 1, 1, TILE_D)).astype(Out.dtype)
    ct.store(Out, index=(batch_idx, kv_head, row, 0), tile=out)
