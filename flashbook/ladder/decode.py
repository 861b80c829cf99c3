"""Split-KV decoding (flash-decoding) over a contiguous or paged KV cache: one split kernel for
every cache dtype, and the combines.

(The book's ladder file: the library's ``flashattn/kernels/decode.py`` with its off switches
kept, see ``flashbook/ladder/variants.py``; the library folds them away.)

A decode step has a few query rows per sequence (Nq = 1 for plain decoding, up to 16 for
speculative decoding) and a long KV cache, so one program per (batch, head) leaves most SMs idle
and each query head of a GQA group would read the same K/V again. Here:

* the query heads of one GQA group are packed as the rows of one tile (row ``r = g * Nq + i`` is
  query ``i`` of head ``kv_head * G + g``), so each K/V tile is read once per group;
* the cache length is split across programs (``decode_split_kernel``), each writing a partial
  output and its log-sum-exp; ``decode_combine_kernel`` (or ``decode_combine_row_kernel``)
  merges them: ``lse = log2(sum_s 2^lse_s)``, ``o = sum_s 2^(lse_s - lse) o_s``; with one split
  the split kernel writes the output itself (``FINAL``) and no combine runs;
* lengths and the block table are read on the device (``kernels/splitkv.py``), so one launch
  can be captured in a CUDA graph and replayed while the lengths change.

The cache's dtype picks the arithmetic, by constants:

* fp16/bf16 (``KV_FP8`` off): both products in the cache's dtype.
* fp8 with V in K's layout (``KV_FP8``): each tile widened to the query's dtype on chip, S in
  head-dim slices of ``SLICE_D`` columns; the descales fold into the softmax scale (K) and the
  output (V).
* fp8 with V transposed in the cache (``V_TRANSPOSED``): both products on FP8 MMAs. The query
  rows are quantised once per program (one scale per row, folded into that row's softmax
  scale); P is scaled into fp8's range (``2^(s - m + P_SHIFT)``, cancelled by the
  normalisation); V is read (TILE_N, D) from its (D, S) memory, the key axis contiguous, as the
  FP8 MMA reads its operands. The unmasked tiles run in a loop of their own, so that only the
  masked ones route V through registers for the select.

Layouts (``Hq = Hkv * G``; the host views q and out as below, which is free for contiguous
tensors)::

    Q, Out:  (B, Hkv, G * Nq, D)              q, out (B, Hq, Nq, D) viewed group by group
    K, V:    (B, Hkv, S, D)                   contiguous cache (PAGED=False), S = capacity
             (num_pages, Hkv, page_size, D)   paged cache (PAGED=True)
             V_TRANSPOSED: V (B, Hkv, D, S) or (num_pages, Hkv, D, page_size)
    KDescale, VDescale: (B, Hkv) fp32         KV_FP8 only (else placeholders, never read)
    BlockTable: (B, max_pages) int32          page id of slot p of sequence b (PAGED)
    SeqLens: (B,) int32                       keys of sequence b: 0 .. SeqLens[b] - 1
    Opart:   (num_splits, B * Hkv, M_pad, TILE_D) fp32   normalised partial outputs
    Lse:     (num_splits, B * Hkv, M_pad) fp32            partial log-sum-exps, base 2

Query row ``i`` of a sequence sits at position ``SeqLens[b] - Nq + i`` and sees keys ``0 ..``
that position; a row that sees no key gets output 0, as FlashAttention does. A length or page id
out of range makes the sequence's output NaN (``splitkv.py``).
"""
import math

import cuda.tile as ct

from flashattn.kernels.common import (INV_LOG_2, ConstBool, ConstInt, mask_scores, merge_lse,
                                     online_softmax_update)
from flashattn.kernels.splitkv import (combine_program, finalize, merge_splits, page_of,
                                      query_positions, sequence_length, split_program,
                                      split_tiles, store_split)

# q rows are scaled so their largest |value| lands here (V_TRANSPOSED): e4m3's largest finite
# value (e5m2 holds it too, with the same relative spacing of its values).
Q8_MAX = 448.0


def _sliced_scores(Q, K, page, kv_head, tile_in_page, batch_idx, bid_m, TILE_M: ConstInt,
                   TILE_N: ConstInt, TILE_D: ConstInt, SLICE_D: ConstInt):
    """S = Q K^T of one fp8 key tile widened in head-dim slices of SLICE_D (a widened K tile of
    the whole head dim spills at D=256), [TILE_M, TILE_N] fp32."""
    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    for c in range(TILE_D // SLICE_D):
        k = ct.load(K, index=(page, kv_head, c, tile_in_page), shape=(1, 1, SLICE_D, TILE_N),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        k = k.reshape((SLICE_D, TILE_N)).astype(Q.dtype)             # [SLICE_D, TILE_N]
        qc = ct.load(Q, index=(batch_idx, kv_head, bid_m, c), shape=(1, 1, TILE_M, SLICE_D),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, SLICE_D))
        qk = ct.mma(qc, k, qk)                                       # S += Q_c K_c^T
    return qk


def _values(Q, V, page, kv_head, tile_in_page, TILE_N: ConstInt, TILE_D: ConstInt,
            KV_FP8: ConstBool, V_TRANSPOSED: ConstBool):
    """V of one key tile, [TILE_N, TILE_D]: fp8 as stored with V_TRANSPOSED (read from its
    (D, S) memory, the key axis contiguous), widened to q's dtype with KV_FP8 alone."""
    if V_TRANSPOSED:
        v = ct.load(V, index=(page, kv_head, tile_in_page, 0), shape=(1, 1, TILE_N, TILE_D),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        return v.reshape((TILE_N, TILE_D))
    v = ct.load(V, index=(page, kv_head, tile_in_page, 0), shape=(1, 1, TILE_N, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, TILE_D))
    if KV_FP8:
        v = v.astype(Q.dtype)
    return v


def _key_tile(Q, K, V, q, scale, m_i, l_i, acc, page, kv_head, tile_in_page, n0, seqlen, q_pos,
              offs_n_tile, batch_idx, bid_m, masked, TILE_M: ConstInt, TILE_N: ConstInt,
              TILE_D: ConstInt, KV_FP8: ConstBool, V_TRANSPOSED: ConstBool, SLICE_D: ConstInt,
              P_SHIFT: ConstInt):
    """One key tile of the online softmax: (m_i, l_i, acc) updated; a 16-bit V is loaded beside
    K, an fp8 one after the softmax (its tile not live beside K's). ``masked``: the tile holds
    keys past a query's position or past seqlen (slots that may hold anything, NaN included:
    the mask selects and those V rows are zeroed, so 0 * garbage cannot reach P V)."""
    if SLICE_D == TILE_D:
        # S = Q K^T, K read (D, TILE_N) from its (S, D) memory: K-major.
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        k = ct.load(K, index=(page, kv_head, 0, tile_in_page), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        k = k.reshape((TILE_D, TILE_N))                              # [TILE_D, TILE_N]
        if not KV_FP8:
            v = _values(Q, V, page, kv_head, tile_in_page, TILE_N, TILE_D, KV_FP8, V_TRANSPOSED)
        if V_TRANSPOSED:
            qk = ct.mma(q, k, qk, use_fast_acc=True)                 # fp8 x fp8
        elif KV_FP8:
            qk = ct.mma(q, k.astype(Q.dtype), qk)                    # widened on chip
        else:
            qk = ct.mma(q, k, qk)
    else:
        qk = _sliced_scores(Q, K, page, kv_head, tile_in_page, batch_idx, bid_m, TILE_M, TILE_N,
                            TILE_D, SLICE_D)
    if masked:
        qk = mask_scores(qk, q_pos, (n0 + offs_n_tile)[None, :], seqlen, True, True)
        if not KV_FP8:
            v = ct.where((n0 + offs_n_tile)[:, None] < seqlen, v, 0.0)
    # GUARD: a row may see no key of this split yet; P_SHIFT: P in fp8's range.
    p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, scale, True, V_TRANSPOSED,
                                             P_SHIFT)
    if KV_FP8:
        v = _values(Q, V, page, kv_head, tile_in_page, TILE_N, TILE_D, KV_FP8, V_TRANSPOSED)
        if masked:
            v = ct.where((n0 + offs_n_tile)[:, None] < seqlen, v, 0.0)
            if V_TRANSPOSED:
                v = v.astype(V.dtype)                                # fp8 again for the MMA
    if V_TRANSPOSED:
        acc = ct.mma(p.astype(V.dtype), v, acc, use_fast_acc=True)
    else:
        acc = ct.mma(p.astype(Q.dtype), v, acc)                      # O += P V
    return m_i, l_i, acc


def _key_tiles(Q, K, V, BlockTable, q, scale, m_i, l_i, acc, bad, t_start, t_end, mask_from,
               seqlen, q_pos, offs_n_tile, batch_idx, kv_head, bid_m, page_size, num_pages,
               MASK: ConstInt,
               TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, PAGED: ConstBool,
               KV_FP8: ConstBool, V_TRANSPOSED: ConstBool, SLICE_D: ConstInt,
               P_SHIFT: ConstInt):
    """Key tiles ``t_start .. t_end - 1`` of the online softmax: (m_i, l_i, acc, bad). MASK: 0
    no tile needs the mask, 1 every tile does, 2 the tiles reaching ``mask_from``."""
    for t in range(t_start, t_end):
        n0 = t * TILE_N                                              # first key of the tile
        page, tile_in_page, bad = page_of(BlockTable, batch_idx, t, bad, page_size, num_pages,
                                          TILE_N, PAGED)
        if MASK == 2:
            masked = n0 + TILE_N > mask_from
        else:
            masked = MASK == 1
        m_i, l_i, acc = _key_tile(Q, K, V, q, scale, m_i, l_i, acc, page, kv_head, tile_in_page,
                                  n0, seqlen, q_pos, offs_n_tile, batch_idx, bid_m, masked,
                                  TILE_M, TILE_N, TILE_D, KV_FP8, V_TRANSPOSED, SLICE_D,
                                  P_SHIFT)
    return m_i, l_i, acc, bad


@ct.kernel
def decode_split_kernel(Q, K, V, BlockTable, SeqLens, KDescale, VDescale, Opart, Lse, Out,
                        Counter, qk_scale: float, num_q: int,
                        TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                        PAGED: ConstBool, FINAL: ConstBool, KV_FP8: ConstBool,
                        V_TRANSPOSED: ConstBool, SLICE_D: ConstInt, P_SHIFT: ConstInt,
                        FUSED: ConstBool, PDL: ConstBool):
    """Partial attention of one GQA group over one run of the cache.

    Grid: ``(cdiv(G * Nq, TILE_M), num_splits, B * Hkv)``. qk_scale: the softmax scale (natural
    units); num_q: Nq. With PAGED, ``page_size = K.shape[2]`` is a multiple of TILE_N. FINAL
    (one split): the program writes ``Out`` and leaves Opart and Lse alone; otherwise the
    reverse. KV_FP8, V_TRANSPOSED, SLICE_D, P_SHIFT: the cache's arithmetic (module docstring).
    """
    bid_m, split, num_splits, bh, batch_idx, kv_head = split_program(K.shape[1])
    if KV_FP8:
        k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
        v_scale = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
        scale = qk_scale * INV_LOG_2 * k_ds                          # base 2, K dequantised
    else:
        v_scale = qk_scale                                           # unused (SCALE_V off)
        scale = qk_scale * INV_LOG_2                                 # softmax in base 2

    page_size = K.shape[2]
    seqlen, bad = sequence_length(SeqLens, BlockTable, batch_idx, page_size, PAGED)
    t_start, t_end, mask_from = split_tiles(seqlen, split, num_splits, num_q, TILE_N)
    q_pos = query_positions(seqlen, num_q, bid_m, TILE_M)            # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)                  # [TILE_N]
    q = ct.load(Q, index=(batch_idx, kv_head, bid_m, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)          # running max (log2 units)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)               # running sum of exp2
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)          # unnormalised output
    num_pages = K.shape[0]

    if V_TRANSPOSED:
        # q to fp8 once, one scale per row (its amax at Q8_MAX), folded into the row's scale.
        qf = q.astype(ct.float32)
        amax = ct.max(ct.abs(qf), axis=-1, keepdims=True)           # [TILE_M, 1]
        amax = ct.where(amax > 0.0, amax, 1.0)                       # zero rows (padding)
        q8 = (qf * (Q8_MAX / amax)).astype(K.dtype)                  # [TILE_M, TILE_D] fp8
        row_scale = (amax * (1.0 / Q8_MAX)) * scale                  # [TILE_M, 1]
        # The unmasked tiles first, then the masked: a mask under an ``if`` in one loop made
        # the compiler route every V tile through registers.
        t_mid = min(max(t_start, max(mask_from, 0) // TILE_N), t_end)
        m_i, l_i, acc, bad = _key_tiles(Q, K, V, BlockTable, q8, row_scale, m_i, l_i, acc, bad,
                                        t_start, t_mid, mask_from, seqlen, q_pos, offs_n_tile,
                                        batch_idx, kv_head, bid_m, page_size, num_pages, 0,
                                        TILE_M, TILE_N, TILE_D, PAGED, KV_FP8, V_TRANSPOSED,
                                        SLICE_D, P_SHIFT)
        m_i, l_i, acc, bad = _key_tiles(Q, K, V, BlockTable, q8, row_scale, m_i, l_i, acc, bad,
                                        t_mid, t_end, mask_from, seqlen, q_pos, offs_n_tile,
                                        batch_idx, kv_head, bid_m, page_size, num_pages, 1,
                                        TILE_M, TILE_N, TILE_D, PAGED, KV_FP8, V_TRANSPOSED,
                                        SLICE_D, P_SHIFT)
    else:
        m_i, l_i, acc, bad = _key_tiles(Q, K, V, BlockTable, q, scale, m_i, l_i, acc, bad,
                                        t_start, t_end, mask_from, seqlen, q_pos, offs_n_tile,
                                        batch_idx, kv_head, bid_m, page_size, num_pages, 2,
                                        TILE_M, TILE_N, TILE_D, PAGED, KV_FP8, V_TRANSPOSED,
                                        SLICE_D, P_SHIFT)

    o, lse = finalize(acc, m_i, l_i, bad, v_scale, TILE_M, TILE_D, KV_FP8, P_SHIFT)
    store_split(Out, Opart, Lse, o, lse, batch_idx, kv_head, split, bh, bid_m, TILE_M, TILE_D,
                FINAL)
    if PDL:
        # E27 (off): the combine, a programmatic dependent, may be scheduled now; it waits for
        # this grid to finish before it reads a partial.
        ct.grid_dependency_control_launch_dependents()
    if FUSED:
        # E23 (off, not with FINAL): each program counts itself in Counter[bh, bid_m] (B * Hkv,
        # row blocks) int32, 0 at launch; the last to count merges its row block as the
        # combine does and sets the counter back to 0. acq_rel: the stores above are
        # published before the count, and the last program sees every split's stores.
        arrived = ct.atomic_add(Counter, (bh, bid_m), 1, memory_order=ct.MemoryOrder.ACQ_REL,
                                memory_scope=ct.MemoryScope.DEVICE)
        if arrived == num_splits - 1:
            ct.atomic_xchg(Counter, (bh, bid_m), 0)                   # ready for the next call
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
    bid_m, bh, batch_idx, kv_head = combine_program(Out.shape[1])
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
    split axis, and folds the result into a running (max, sum, output) as the online softmax
    does with key tiles. So the loop is ``cdiv(num_splits, TILE_S)`` steps long, not
    ``num_splits``. The alternative to ``decode_combine_kernel`` for few rows and many splits;
    the host picks it with ``kernels.decode_combine_kind``.
    Out is written in its own dtype; columns past D are dropped by the store. A row whose
    splits all have ``lse = -inf`` (no visible key) gets 0; a NaN partial stays NaN.
    """
    if PDL:
        # E27 (off): launched as a programmatic dependent of the split kernel.
        ct.grid_dependency_control_wait()
    row, bh, batch_idx, kv_head = combine_program(Out.shape[1])
    num_splits = Opart.shape[0]

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
