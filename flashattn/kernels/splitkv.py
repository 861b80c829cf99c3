"""Tile helpers of a split-KV decode kernel: what every decode-style kernel does around its math.

cuTile inlines them (no call). A decode-style kernel runs one program per (row block, split,
batch x kv head): its ``TILE_M`` rows are a *head group* of queries that share every K/V tile
it reads (the query heads of one GQA group times the new tokens, row ``r`` being token
``r % num_q``; an MLA decode's heads over one latent cache are the same shape with one kv
head). The cache length is split across programs; each program writes a normalised partial
output and its log-sum-exp, and a combine merges them. A kernel built on these helpers::

    bid_m, split, num_splits, bh, batch_idx, kv_head = split_program(num_kv_heads)
    seqlen, bad = sequence_length(SeqLens, BlockTable, batch_idx, page_size, PAGED)
    t_start, t_end, mask_from = split_tiles(seqlen, split, num_splits, num_q, TILE_N)
    q_pos = query_positions(seqlen, num_q, bid_m, TILE_M)
    for t in range(t_start, t_end):
        page, tile_in_page, bad = page_of(BlockTable, batch_idx, t, bad, page_size, num_pages,
                                          TILE_N, PAGED)
        ...                                    # K/V tile (page, tile_in_page): the math
    o, lse = finalize(acc, m_i, l_i, bad, v_scale, TILE_M, TILE_D, SCALE_V, P_SHIFT)
    store_split(Out, Opart, Lse, o, lse, batch_idx, kv_head, split, bh, bid_m, TILE_M, TILE_D,
                FINAL)

and its combine (``combine_program``) reads the partials with ``merge_splits``. Invalid device data (a length outside
``[0, capacity]``, a page id outside ``[0, num_pages)``) is clamped for addressing and turns the
program's output into NaN (``bad``): never an out-of-bounds read, never a silent wrong answer.

Layouts the helpers assume: ``SeqLens (B,)`` and ``BlockTable (B, max_pages)`` int32; a cache
page holds ``page_size`` keys, a multiple of ``TILE_N`` (a tile never straddles two pages);
``Out (B, Hkv, rows, D)``, ``Opart (num_splits, B * Hkv, M_pad, TILE_D)`` and
``Lse (num_splits, B * Hkv, M_pad)`` fp32, LSE in base 2.
"""
import math

import cuda.tile as ct

from .common import ConstBool, ConstInt, merge_lse


def split_program(num_kv_heads):
    """(bid_m, split, num_splits, bh, batch_idx, kv_head) of this program, on the grid
    ``(row blocks, num_splits, B * Hkv)``."""
    bid_m = ct.bid(0)
    split = ct.bid(1)
    bh = ct.bid(2)
    num_splits = ct.num_blocks(1)
    return bid_m, split, num_splits, bh, bh // num_kv_heads, bh % num_kv_heads


def combine_program(num_kv_heads):
    """(row, bh, batch_idx, kv_head) of a combine program, on the grid ``(rows or row blocks,
    B * Hkv, 1)``."""
    row = ct.bid(0)
    bh = ct.bid(1)
    return row, bh, bh // num_kv_heads, bh % num_kv_heads


def sequence_length(SeqLens, BlockTable, batch_idx, page_size, PAGED: ConstBool):
    """(seqlen, bad): sequence ``batch_idx``'s length read on the device (a CUDA-graph replay
    sees the new value), clamped to the cache's capacity (paged: the block table's pages);
    ``bad`` is 1 when the clamp changed it."""
    if PAGED:
        capacity = BlockTable.shape[1] * page_size
    else:
        capacity = page_size
    seqlen_raw = ct.gather(SeqLens, (batch_idx,), padding_value=0).item()
    seqlen = min(max(seqlen_raw, 0), capacity)                       # never read past the cache
    bad = ct.where(seqlen == seqlen_raw, 0, 1)                       # 1: poison the output
    return seqlen, bad


def split_tiles(seqlen, split, num_splits, num_q, TILE_N: ConstInt):
    """(t_start, t_end, mask_from): split ``split`` visits key tiles ``t_start .. t_end - 1``.
    The ``cdiv(seqlen, TILE_N)`` tiles are dealt in runs of ``cdiv(n, num_splits)``, so the
    split count is fixed at launch while the work follows the current length. Keys before
    ``mask_from`` are visible to every row: only tiles reaching it need the causal mask."""
    n_tiles = ct.cdiv(seqlen, TILE_N)
    per_split = ct.cdiv(n_tiles, num_splits)
    t_start = min(split * per_split, n_tiles)
    t_end = min(t_start + per_split, n_tiles)
    mask_from = seqlen - num_q + 1
    return t_start, t_end, mask_from


def query_positions(seqlen, num_q, bid_m, TILE_M: ConstInt):
    """[TILE_M, 1] positions of row block ``bid_m``'s rows: row ``r`` is new token
    ``r % num_q``, at ``seqlen - num_q + r % num_q`` (the new tokens end the cache)."""
    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)       # [TILE_M]
    return (seqlen - num_q + rows % num_q)[:, None]                  # [TILE_M, 1]


def page_of(BlockTable, batch_idx, t, bad, page_size, num_pages, TILE_N: ConstInt,
            PAGED: ConstBool):
    """(page, tile within it, bad) of key tile ``t``: paged, the block table's page of slot
    ``t * TILE_N // page_size``, clamped for addressing (an id out of range sets ``bad``);
    contiguous, the sequence's own cache (``page = batch_idx``)."""
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


def finalize(acc, m_i, l_i, bad, v_scale, TILE_M: ConstInt, TILE_D: ConstInt,
             SCALE_V: ConstBool, P_SHIFT: ConstInt):
    """(o [TILE_M, TILE_D], lse [TILE_M, 1]) of a split: the output normalised (times
    ``v_scale`` with SCALE_V: a quantised V's descale), the log-sum-exp in base 2 without the
    ``2^P_SHIFT`` that P carried; a row with no visible key gets o = 0, lse = -inf; ``bad``
    makes both NaN."""
    has_keys = l_i > 0.0                                             # [TILE_M, 1]
    l_safe = ct.where(has_keys, l_i, 1.0)
    o = ct.truediv(acc, l_safe)                                      # [TILE_M, TILE_D]
    if SCALE_V:
        o = o * v_scale
    lse = m_i + ct.log2(l_safe)
    if P_SHIFT:
        lse = lse - P_SHIFT
    lse = ct.where(has_keys, lse, -math.inf)
    if bad > 0:
        o = ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32)
        lse = ct.full((TILE_M, 1), math.nan, dtype=ct.float32)
    return o, lse


def store_split(Out, Opart, Lse, o, lse, batch_idx, kv_head, split, bh, bid_m,
                TILE_M: ConstInt, TILE_D: ConstInt, FINAL: ConstBool):
    """Store a split's result: with FINAL (one split: the partial is the answer) ``o`` in
    Out's dtype (rows past the group and columns past D dropped by the store), else the fp32
    partial and its LSE for the combine."""
    if FINAL:
        ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                 tile=o.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
    else:
        ct.store(Opart, index=(split, bh, bid_m, 0), tile=o.reshape((1, 1, TILE_M, TILE_D)))
        ct.store(Lse, index=(split, bh, bid_m), tile=lse.reshape((1, 1, TILE_M)))


def merge_splits(Opart, Lse, bh, bid_m, TILE_M: ConstInt, TILE_D: ConstInt):
    """The merged output ``[TILE_M, TILE_D]`` fp32 of row block ``bid_m`` of group ``bh``: the
    LSE algebra (``lse = log2(sum_s 2^lse_s)``, ``o = sum_s 2^(lse_s - lse) o_s``) as an online
    softmax over the splits; a row whose splits all have ``lse = -inf`` gets 0, a NaN partial
    stays NaN."""
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
