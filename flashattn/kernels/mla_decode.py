"""Multi-head latent attention (MLA) decoding over a paged latent cache: split and combine.

In MLA every cached token is one latent vector shared by all heads: ``D_LAT`` latent values
(which are also V) followed by ``D_ROPE`` rotary values (DeepSeek-V3: 512 + 64). With the
up-projections absorbed into the queries, decoding is multi-query attention with head dim
``D_LAT + D_ROPE`` for Q K^T and ``D_LAT`` for P V, over many query heads (16-128) per cache.

* All query rows of one cache head (``Sq x G`` rows, row ``r = t * G + g``: new token ``t`` of
  head ``g``) are the rows of the program's tile, so each latent tile is loaded once and feeds
  both products: S = Q_lat K_lat^T + Q_rope K_rope^T, then O += P K_lat.
* tiles need power-of-two sides, so a cache row is loaded as two tiles: the latent columns and
  the rotary columns (``D_LAT`` must be a multiple of ``D_ROPE``);
* the cache length is split across programs (split-KV); ``mla_combine_kernel`` merges the
  partials with the LSE algebra and also writes the merged log-sum-exp;
* an FP8 cache is widened tile by tile (exact: e4m3 values are bf16/fp16 values) and its
  per-sequence descale folded into the softmax scale and the final normalisation.

Layouts::

    Q:          (B, Hkv, R, D_LAT + D_ROPE)        R = Sq * G rows per cache head
    KV:         (num_pages, page_size, Hkv, D_LAT + D_ROPE)
    BlockTable: (B, max_pages) int32;  SeqLens: (B,) int32;  Descale: (B,) float32 (FP8)
    Opart:      (num_splits, B * Hkv, R_pad, D_LAT) fp32;  Lse: (num_splits, B * Hkv, R_pad) fp32
    Out:        (B, Hkv, R, D_LAT);  LseOut: (B, Hkv, R) fp32, natural log, +inf for a row with
                no visible key (whose output is 0), as FlashMLA returns it.

New token ``t`` sits at position ``SeqLens[b] - Sq + t``; with CAUSAL it sees keys up to that
position, without it every key of the sequence. A length outside ``[0, capacity]`` or a page id
outside the cache is clamped for addressing and poisons that sequence's output with NaN.
"""
import math

import cuda.tile as ct

from flashattn.kernels.common import (INV_LOG_2, ConstBool, ConstInt, mask_scores, merge_lse,
                                      online_softmax_update)
from flashattn.kernels.splitkv import (combine_program, finalize, page_of, sequence_length,
                                      split_program, split_tiles, store_split)

LN_2 = math.log(2.0)


@ct.kernel
def mla_decode_split_kernel(Q, KV, BlockTable, SeqLens, Descale, Opart, Lse, Out, LseOut,
                            qk_scale: float, num_q: int,
                            TILE_M: ConstInt, TILE_N: ConstInt, D_LAT: ConstInt,
                            D_ROPE: ConstInt, CAUSAL: ConstBool, FP8: ConstBool,
                            FINAL: ConstBool):
    """Partial MLA attention of one row block of one cache head over one run of the cache.

    Grid: ``(cdiv(R, TILE_M), num_splits, B * Hkv)``. ``page_size`` is a multiple of TILE_N.
    FINAL (one split): writes Out and LseOut itself; otherwise Opart and Lse.
    """
    bid_m, split, num_splits, bh, batch_idx, kv_head = split_program(KV.shape[2])
    group = Q.shape[2] // num_q                                     # query heads per cache head
    page_size = KV.shape[1]

    seqlen, bad = sequence_length(SeqLens, BlockTable, batch_idx, page_size, True)
    t_start, t_end, mask_from = split_tiles(seqlen, split, num_splits, num_q, TILE_N)
    if not CAUSAL:
        mask_from = seqlen                                          # only the ragged end
    scale = qk_scale * INV_LOG_2
    descale = ct.gather(Descale, (batch_idx,), padding_value=1.0).item()
    if FP8:
        scale = scale * descale

    # Row r is new token r // group (q viewed as (B, Sq * Hq): no copy for one cache head).
    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)      # [TILE_M]
    q_pos = (seqlen - num_q + rows // group)[:, None]               # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)                 # [TILE_N]
    rope_col = D_LAT // D_ROPE                                      # rotary columns, in tiles
    q_lat = ct.load(Q, index=(batch_idx, kv_head, bid_m, 0), shape=(1, 1, TILE_M, D_LAT),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, D_LAT))
    q_rope = ct.load(Q, index=(batch_idx, kv_head, bid_m, rope_col),
                     shape=(1, 1, TILE_M, D_ROPE),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, D_ROPE))
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, D_LAT), 0.0, dtype=ct.float32)

    for t in range(t_start, t_end):
        n0 = t * TILE_N
        page, in_page, bad = page_of(BlockTable, batch_idx, t, bad, page_size, KV.shape[0],
                                     TILE_N, True)
        # One read of the latent tile: K for the scores, V for the output.
        kv = ct.load(KV, index=(page, in_page, kv_head, 0), shape=(1, TILE_N, 1, D_LAT),
                     padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, D_LAT))
        k_rope = ct.load(KV, index=(page, in_page, kv_head, rope_col),
                         shape=(1, TILE_N, 1, D_ROPE),
                         padding_mode=ct.PaddingMode.ZERO).reshape((TILE_N, D_ROPE))
        if FP8:
            kv = kv.astype(Q.dtype)                                 # exact: e4m3 fits 16 bits
            k_rope = k_rope.astype(Q.dtype)
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        qk = ct.mma(q_lat, ct.transpose(kv), qk)
        qk = ct.mma(q_rope, ct.transpose(k_rope), qk)
        if n0 + TILE_N > mask_from:
            # Slots past the sequence may hold anything: select -inf, and zero those V rows so
            # that 0 * garbage cannot reach P V.
            offs_n = n0 + offs_n_tile
            qk = mask_scores(qk, q_pos, offs_n[None, :], seqlen, CAUSAL, False)
            kv = ct.where(offs_n[:, None] < seqlen, kv, 0.0)
        p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, scale, True, False)
        acc = ct.mma(p.astype(Q.dtype), kv, acc)

    o, lse = finalize(acc, m_i, l_i, bad, descale, TILE_M, D_LAT, FP8, 0)
    store_split(Out, Opart, Lse, o, lse, batch_idx, kv_head, split, bh, bid_m, TILE_M, D_LAT,
                FINAL)
    if FINAL:
        # FlashMLA's LSE: natural log, +inf for a row with no visible key.
        lse_nat = ct.where(lse == -math.inf, math.inf, lse * LN_2)
        ct.store(LseOut, index=(batch_idx, kv_head, bid_m), tile=lse_nat.reshape((1, 1, TILE_M)))


@ct.kernel
def mla_combine_kernel(Opart, Lse, Out, LseOut, TILE_M: ConstInt, D_LAT: ConstInt):
    """Merge the splits' partials of ``TILE_M`` rows and write the output and its LSE.

    Grid: ``(cdiv(R, TILE_M), B * Hkv, 1)``. A row whose splits all have ``lse = -inf`` gets
    output 0 and LSE +inf; a NaN partial stays NaN.
    """
    bid_m, bh, batch_idx, kv_head = combine_program(Out.shape[1])
    num_splits = Opart.shape[0]
    m = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, D_LAT), 0.0, dtype=ct.float32)
    for s in range(num_splits):
        lse = ct.load(Lse, index=(s, bh, bid_m), shape=(1, 1, TILE_M)).reshape((TILE_M, 1))
        o = ct.load(Opart, index=(s, bh, bid_m, 0),
                    shape=(1, 1, TILE_M, D_LAT)).reshape((TILE_M, D_LAT))
        m, l, acc = merge_lse(m, l, acc, lse, o, False)
    has_keys = l > 0.0
    out = ct.truediv(acc, ct.where(has_keys, l, 1.0))
    lse_nat = ct.where(has_keys, (m + ct.log2(ct.where(has_keys, l, 1.0))) * LN_2, math.inf)
    lse_nat = ct.where(m != m, math.nan, lse_nat)                   # a poisoned split stays NaN
    ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
             tile=out.reshape((1, 1, TILE_M, D_LAT)).astype(Out.dtype))
    ct.store(LseOut, index=(batch_idx, kv_head, bid_m), tile=lse_nat.reshape((1, 1, TILE_M)))
