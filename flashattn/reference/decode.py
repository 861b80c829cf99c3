"""Decode attention over a KV cache, and the split-KV algorithm (flash-decoding), in NumPy.

The references of ``flashattn.decode`` and of its kernels:

    decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None)   exact, fp32/fp64
    split_bounds(seqlen, num_splits, tile_n)       the key range of each split (the kernel's rule)
    split_partials(q, k_cache, ..., splits=...)    per split: normalised partial output and LSE
    merge_partials(o_parts, lse_parts)             the exact LSE merge of the partials
    split_kv_attention(...)                        partials + merge: equals decode_attention
    emulate_decode(...)                            the two kernels, tile by tile, with their guards
    emulate_split_kernel, emulate_combine_kernel, emulate_combine_row_kernel
                                                 each kernel on its own arguments and grid
    decode_reference_fp8(...)                      fp32 attention of dequantised fp8 caches
    emulate_decode_fp8mma(...)                     the FP8-MMA path (V transposed) in torch

(One module for every decode path's reference, 16-bit and fp8, so a change to the algorithm has
one place to be mirrored: hence its length.)
    gather_cache(cache, block_table, seqlen, b)    a sequence's keys (or values) out of the cache

Shapes (``Hq = G * Hkv``; query head ``h`` reads key/value head ``h // G``)::

    q                 (B, Hq, Nq, D)          Nq new tokens per sequence (decode: 1..16)
    k_cache, v_cache  (B, Hkv, S, D)          contiguous cache, S = capacity per sequence
                      (P, Hkv, page_size, D)  paged cache: P physical pages ...
    block_table       (B, max_pages) int      ... slot p of sequence b is page block_table[b, p]
    cache_seqlens     (B,) int                sequence b's keys are its first cache_seqlens[b]

Semantics, as ``flash_attn_with_kvcache`` with the new tokens already written to the cache:
query row ``i`` sits at position ``cache_seqlens[b] - Nq + i`` and sees keys ``0 ..`` that
position (causal, aligned to the end of the cache). A row that sees no key (``cache_seqlens[b]
== 0``, or ``i < Nq - cache_seqlens[b]``) gets output 0 and log-sum-exp ``-inf``, as
FlashAttention ("if the row of the mask is all zero, the output will be zero"). Cache entries past
``cache_seqlens[b]`` are never read: they may hold anything, NaN included.

The merge, in natural-log units here (the kernels use base 2, the same algebra)::

    lse = log(sum_s exp(lse_s))         o = sum_s exp(lse_s - lse) * o_s

exact for any partition of the keys, including empty parts (``lse_s = -inf``: weight 0).
"""
from __future__ import annotations

import math

import numpy as np

from ..contract import check_decode

__all__ = ["decode_attention", "split_bounds", "split_partials", "merge_partials",
           "split_kv_attention", "gather_cache", "decode_visible", "emulate_decode",
           "emulate_split_kernel", "emulate_combine_kernel", "emulate_combine_row_kernel",
           "merge_block", "decode_reference_fp8", "emulate_decode_fp8mma"]


def _np(x):
    """NumPy view of a torch tensor (any device) or an array-like."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _float(x, dtype):
    if hasattr(x, "detach"):
        import torch
        return x.detach().to("cpu", torch.float64 if dtype == np.float64 else torch.float32).numpy()
    return np.asarray(x, dtype=dtype)


def _compute_dtype(*ts):
    names = {str(t.dtype).replace("torch.", "") for t in ts}
    return np.float64 if "float64" in names else np.float32


def _wrap(out, like):
    """A torch tensor on ``like``'s device for torch inputs, else the NumPy array."""
    if hasattr(like, "detach"):
        import torch
        return torch.from_numpy(out).to(like.device)
    return out


def gather_cache(cache, block_table, seqlen: int, b: int) -> np.ndarray:
    """(Hkv, seqlen, D): sequence ``b``'s first ``seqlen`` entries of a cache (NumPy).

    Contiguous (``block_table is None``): ``cache[b, :, :seqlen]``. Paged: token ``n`` is at
    ``cache[block_table[b, n // page_size], :, n % page_size]``.
    """
    cache = np.asarray(cache)
    if block_table is None:
        return cache[b, :, :seqlen]
    page_size = cache.shape[2]
    table = np.asarray(block_table)
    n = np.arange(seqlen)
    pages = table[b, n // page_size]                                  # (seqlen,)
    return cache[pages, :, n % page_size].transpose(1, 0, 2)          # (Hkv, seqlen, D)


def decode_visible(seqlen: int, num_q: int, keys: np.ndarray) -> np.ndarray:
    """(Nq, len(keys)) bool: query row i (position seqlen - Nq + i) sees key positions ``keys``."""
    pos = seqlen - num_q + np.arange(num_q)                           # (Nq,)
    return (keys[None, :] <= pos[:, None]) & (keys[None, :] < seqlen)


def _prepare(q, k_cache, v_cache, cache_seqlens, block_table, scale):
    dims = check_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                        check_values=True)
    dt = _compute_dtype(q, k_cache, v_cache)
    qn = _float(q, dt)
    kn, vn = _float(k_cache, dt), _float(v_cache, dt)
    lens = _np(cache_seqlens).astype(np.int64)
    table = None if block_table is None else _np(block_table).astype(np.int64)
    if scale is None:
        scale = 1.0 / math.sqrt(dims.D)
    return dims, dt, qn, kn, vn, lens, table, float(scale)


def _partial(q_bh, k, v, visible, scale):
    """Attention of (Nq, D) rows over keys k, v (n, D) with a (Nq, n) visibility mask.

    Returns (o, lse): o (Nq, D) normalised over the visible keys (0 where none), lse (Nq,)
    natural log (-inf where none).
    """
    nq, d = q_bh.shape
    if k.shape[0] == 0:
        return np.zeros((nq, v.shape[-1]), q_bh.dtype), np.full(nq, -np.inf, q_bh.dtype)
    s = (q_bh @ k.T) * scale                                          # (Nq, n)
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=1, keepdims=True)                                  # (Nq, 1)
    m_use = np.where(np.isneginf(m), 0.0, m)
    p = np.exp(s - m_use)                                             # 0 where masked
    l = p.sum(axis=1, keepdims=True)                                  # (Nq, 1)
    o = np.where(l > 0, (p @ v) / np.where(l > 0, l, 1.0), 0.0)
    lse = np.where(l[:, 0] > 0, m_use[:, 0] + np.log(np.where(l[:, 0] > 0, l[:, 0], 1.0)),
                   -np.inf)
    return o, lse


def decode_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                     return_lse: bool = False):
    """Exact decode attention over a contiguous or paged KV cache (see the module docstring).

    Args:
        q: (B, Hq, Nq, D); k_cache, v_cache: (B, Hkv, S, D), or (num_pages, Hkv, page_size, D)
            with ``block_table`` (B, max_pages) int32; cache_seqlens: (B,) int32. torch tensors
            (any device) or NumPy arrays; values are checked on the host.
        scale: default 1/sqrt(D).
        return_lse: also return the (B, Hq, Nq) log-sum-exp (natural log, -inf for empty rows).

    Returns:
        (B, Hq, Nq, D) in float64 if an input is float64, else float32; a torch tensor on q's
        device for torch inputs, a NumPy array otherwise.

    Raises:
        ValueError, TypeError: as ``flashattn.contract.check_decode``.
    """
    dims, dt, qn, kn, vn, lens, table, scale = _prepare(q, k_cache, v_cache, cache_seqlens,
                                                        block_table, scale)
    B, Hq, Nq, D = qn.shape
    G = Hq // dims.Hkv
    out = np.zeros((B, Hq, Nq, D), dt)
    lse = np.full((B, Hq, Nq), -np.inf, dt)
    for b in range(B):
        L = int(lens[b])
        k, v = gather_cache(kn, table, L, b), gather_cache(vn, table, L, b)  # (Hkv, L, D)
        visible = decode_visible(L, Nq, np.arange(L))
        for h in range(Hq):
            out[b, h], lse[b, h] = _partial(qn[b, h], k[h // G], v[h // G], visible, scale)
    if return_lse:
        return _wrap(out, q), _wrap(lse, q)
    return _wrap(out, q)


def split_bounds(seqlen: int, num_splits: int, tile_n: int) -> list[tuple[int, int]]:
    """The key range [start, end) of each split, as ``decode_split_kernel`` deals them.

    The ``n = cdiv(seqlen, tile_n)`` key tiles are dealt in runs of ``cdiv(n, num_splits)``;
    split ``s`` takes run ``s``, clipped to the sequence (trailing splits may be empty).
    """
    if num_splits < 1 or tile_n < 1:
        raise ValueError(f"num_splits and tile_n must be positive, got {num_splits}, {tile_n}")
    n = -(-seqlen // tile_n)
    per = -(-n // num_splits)
    out = []
    for s in range(num_splits):
        t0 = min(s * per, n)
        t1 = min(t0 + per, n)
        out.append((min(t0 * tile_n, seqlen), min(t1 * tile_n, seqlen)))
    return out


def split_partials(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                   num_splits: int = 4, tile_n: int = 64, splits=None):
    """Per split, the normalised partial output and its log-sum-exp.

    ``splits``: an explicit list, per sequence, of ``num_splits`` key ranges ``(start, end)``
    (any partition of ``0 .. cache_seqlens[b]``, empty ranges allowed); by default
    ``split_bounds(cache_seqlens[b], num_splits, tile_n)``.

    Returns:
        o_parts (S, B, Hq, Nq, D) and lse_parts (S, B, Hq, Nq), NumPy, natural log; a split
        where a row sees no key has o = 0, lse = -inf.
    """
    dims, dt, qn, kn, vn, lens, table, scale = _prepare(q, k_cache, v_cache, cache_seqlens,
                                                        block_table, scale)
    B, Hq, Nq, D = qn.shape
    G = Hq // dims.Hkv
    if splits is None:
        splits = [split_bounds(int(lens[b]), num_splits, tile_n) for b in range(B)]
    if len(splits) != B:
        raise ValueError(f"splits must give one list of ranges per sequence ({B}), got "
                         f"{len(splits)}")
    S = len(splits[0])
    o_parts = np.zeros((S, B, Hq, Nq, D), dt)
    lse_parts = np.full((S, B, Hq, Nq), -np.inf, dt)
    for b in range(B):
        L = int(lens[b])
        if len(splits[b]) != S:
            raise ValueError("every sequence needs the same number of splits")
        k, v = gather_cache(kn, table, L, b), gather_cache(vn, table, L, b)
        covered = np.zeros(L, int)
        for s, (a, e) in enumerate(splits[b]):
            if not 0 <= a <= e <= L:
                raise ValueError(f"split {s} of sequence {b} is [{a}, {e}), outside "
                                 f"[0, {L}]")
            covered[a:e] += 1
            visible = decode_visible(L, Nq, np.arange(a, e))
            for h in range(Hq):
                o_parts[s, b, h], lse_parts[s, b, h] = _partial(
                    qn[b, h], k[h // G, a:e], v[h // G, a:e], visible, scale)
        if (covered != 1).any():
            raise ValueError(f"the splits of sequence {b} must cover each key once")
    return o_parts, lse_parts


def merge_partials(o_parts, lse_parts):
    """The exact merge: (S, ..., D) partial outputs and (S, ...) LSEs -> (out, lse).

    ``lse = log(sum_s exp(lse_s))`` and ``out = sum_s exp(lse_s - lse) o_s``, computed against
    the running maximum so that no exponent overflows; where every ``lse_s`` is -inf (a row
    that sees no key) ``out = 0`` and ``lse = -inf``. Done as the combine kernel does it: one
    split at a time (an online softmax over the splits).
    """
    o_parts, lse_parts = np.asarray(o_parts), np.asarray(lse_parts)
    if o_parts.shape[:-1] != lse_parts.shape:
        raise ValueError(f"o_parts {o_parts.shape} and lse_parts {lse_parts.shape} disagree")
    m = np.full(lse_parts.shape[1:], -np.inf, lse_parts.dtype)
    l = np.zeros_like(m)
    acc = np.zeros(o_parts.shape[1:], o_parts.dtype)
    with np.errstate(invalid="ignore"):
        for o_s, lse_s in zip(o_parts, lse_parts):
            m_new = np.maximum(m, lse_s)
            m_use = np.where(np.isneginf(m_new), 0.0, m_new)
            alpha, w = np.exp(m - m_use), np.exp(lse_s - m_use)
            l = l * alpha + w
            acc = acc * alpha[..., None] + w[..., None] * o_s
            m = m_new
    out = acc / np.where(l > 0, l, 1.0)[..., None]
    lse = np.where(l > 0, np.where(np.isneginf(m), 0.0, m) + np.log(np.where(l > 0, l, 1.0)),
                   -np.inf)
    return out, lse


def split_kv_attention(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                       num_splits: int = 4, tile_n: int = 64, splits=None,
                       return_lse: bool = False):
    """Split-KV decode attention: ``split_partials`` then ``merge_partials``; equals
    ``decode_attention`` up to rounding, for any split."""
    o_parts, lse_parts = split_partials(q, k_cache, v_cache, cache_seqlens, block_table,
                                        scale=scale, num_splits=num_splits, tile_n=tile_n,
                                        splits=splits)
    out, lse = merge_partials(o_parts, lse_parts)
    if return_lse:
        return _wrap(out, q), _wrap(lse, q)
    return _wrap(out, q)


# --- the two kernels, tile by tile ----------------------------------------------------------------
def online_step(qk, m_i, l_i, acc, v, scale2):
    """One key tile of the online softmax in base 2, as the split and varlen kernels run it:
    rows that have seen no key yet (running max -inf) use 0 in place of it, so
    ``-inf - -inf`` never makes a NaN. Returns the new (m_i, l_i, acc)."""
    m_ij = np.maximum(m_i, qk.max(axis=1, keepdims=True) * scale2)
    m_use = np.where(np.isneginf(m_ij), 0.0, m_ij)
    p = np.exp2(qk * scale2 - m_use)
    alpha = np.exp2(m_i - m_use)
    return m_ij, l_i * alpha + p.sum(axis=1, keepdims=True), acc * alpha + p @ v


def emulate_split_kernel(grid, Q, K, V, BlockTable, SeqLens, KDescale, VDescale, Opart, Lse,
                         Out, qk_scale, num_q, TILE_M, TILE_N, TILE_D, PAGED, FINAL=False,
                         KV_FP8=False, V_TRANSPOSED=False, SLICE_D=None, P_SHIFT=0, *,
                         programs=None):
    """``decode_split_kernel`` on NumPy arrays in the kernel's layout, program by program.

    Arguments in the kernel's order (``grid`` first); Opart and Lse are written in place and
    the arithmetic is done in Opart's dtype; with FINAL (one split) the normalised output is
    written to ``Out`` (B, Hkv, rows, D) instead, rows and columns past its shape dropped, and
    the arithmetic is done in float64 if Out is float64, else float32. KV_FP8 (V in K's
    layout): K and V hold the fp8 values as floats, the descales (B, Hkv) fold into the scale
    and the output (SLICE_D changes no value). ``programs``: the (bid_m, split, bh) to run, in
    that order (default: the whole grid). Follows the kernel line by line: the split rule read
    from each length, tiles loaded with zero padding, the mask only on tiles past
    ``len - Nq + 1``, -inf selected (not added), V rows past the length zeroed, and the
    device-side guards (a length outside ``[0, capacity]`` or a page id out of range: NaN).
    V_TRANSPOSED rounds q and P to fp8: ``emulate_decode_fp8mma`` replays it.
    """
    if V_TRANSPOSED:
        raise ValueError("V_TRANSPOSED (FP8 MMAs): use emulate_decode_fp8mma")
    dt = (np.float64 if Out.dtype == np.float64 else np.float32) if FINAL else Opart.dtype
    m_blocks, num_splits, _ = grid
    num_pages, num_kv_heads, page_size, D = K.shape
    capacity = BlockTable.shape[1] * page_size if PAGED else page_size
    qk_scale = float(qk_scale) / math.log(2)

    def load(cache, page, tile, kv_head):                            # (TILE_N, TILE_D), 0-padded
        t = np.zeros((TILE_N, TILE_D), dt)
        part = cache[page, kv_head, tile * TILE_N:(tile + 1) * TILE_N, :]
        t[:part.shape[0], :D] = part
        return t

    programs = list(np.ndindex(*grid)) if programs is None else programs
    with np.errstate(invalid="ignore", over="ignore"):
        for bid_m, split, bh in programs:
            b, kv_head = divmod(bh, num_kv_heads)
            scale = qk_scale * (float(KDescale[b, kv_head]) if KV_FP8 else 1.0)
            seqlen_raw = int(SeqLens[b])
            seqlen = min(max(seqlen_raw, 0), capacity)
            bad = seqlen != seqlen_raw
            n_tiles = -(-seqlen // TILE_N)
            per = -(-n_tiles // num_splits)
            t_start = min(split * per, n_tiles)
            t_end = min(t_start + per, n_tiles)
            mask_from = seqlen - num_q + 1
            r = bid_m * TILE_M + np.arange(TILE_M)
            q_pos = (seqlen - num_q + r % num_q)[:, None]             # (TILE_M, 1)
            q = np.zeros((TILE_M, TILE_D), dt)
            part = Q[b, kv_head, bid_m * TILE_M:(bid_m + 1) * TILE_M]
            q[:part.shape[0], :D] = part
            m_i = np.full((TILE_M, 1), -np.inf, dt)
            l_i = np.zeros((TILE_M, 1), dt)
            acc = np.zeros((TILE_M, TILE_D), dt)
            for t in range(t_start, t_end):
                n0 = t * TILE_N
                if PAGED:
                    slot = n0 // page_size
                    page_raw = int(BlockTable[b, slot]) if slot < BlockTable.shape[1] else -1
                    page = min(max(page_raw, 0), num_pages - 1)
                    bad = bad or page != page_raw
                    tile = (n0 - slot * page_size) // TILE_N
                else:
                    page, tile = b, t
                k, v = load(K, page, tile, kv_head), load(V, page, tile, kv_head)
                qk = q @ k.T                                          # (TILE_M, TILE_N)
                if n0 + TILE_N > mask_from:
                    offs_n = n0 + np.arange(TILE_N)
                    qk = np.where(offs_n[None, :] <= q_pos, qk, -np.inf)
                    v = np.where(offs_n[:, None] < seqlen, v, 0.0)
                m_i, l_i, acc = online_step(qk, m_i, l_i, acc, v, scale)
            has = l_i > 0
            o = acc / np.where(has, l_i, 1.0)
            if KV_FP8:
                o = o * float(VDescale[b, kv_head])
            lse = np.where(has, m_i + np.log2(np.where(has, l_i, 1.0)), -np.inf)
            if bad:
                o, lse = np.full_like(o, np.nan), np.full_like(lse, np.nan)
            if FINAL:
                rows = Out.shape[2]
                n = max(0, min(TILE_M, rows - bid_m * TILE_M))
                Out[b, kv_head, bid_m * TILE_M:bid_m * TILE_M + n] = o[:n, :D]
            else:
                Opart[split, bh, bid_m * TILE_M:(bid_m + 1) * TILE_M] = o
                Lse[split, bh, bid_m * TILE_M:(bid_m + 1) * TILE_M] = lse[:, 0]


def merge_block(Opart, Lse, Out, bh, bid_m, TILE_M, TILE_D):
    """Merge the splits of one row block (``decode_combine_kernel``'s program) into ``Out``
    (B, Hkv, rows, D)."""
    num_splits = Opart.shape[0]
    _, num_kv_heads, rows, D = Out.shape
    b, kv_head = divmod(bh, num_kv_heads)
    sl = slice(bid_m * TILE_M, (bid_m + 1) * TILE_M)
    m = np.full((TILE_M, 1), -np.inf, Opart.dtype)
    l = np.zeros((TILE_M, 1), Opart.dtype)
    acc = np.zeros((TILE_M, TILE_D), Opart.dtype)
    for s in range(num_splits):
        lse = Lse[s, bh, sl][:, None]
        o = Opart[s, bh, sl]
        m_new = np.fmax(m, lse)                        # the GPU's max drops a NaN operand
        m_use = np.where(np.isneginf(m_new), 0.0, m_new)
        alpha, w = np.exp2(m - m_use), np.exp2(lse - m_use)
        l = l * alpha + w
        acc = acc * alpha + w * o
        m = m_new
    out = acc / np.where(l > 0, l, 1.0)
    n = min(TILE_M, rows - bid_m * TILE_M)
    Out[b, kv_head, sl][:n] = out[:n, :D]


def emulate_combine_kernel(grid, Opart, Lse, Out, TILE_M, TILE_D):
    """``decode_combine_kernel`` on NumPy arrays: an online softmax over the splits (base 2);
    writes ``Out`` (B, Hkv, rows, D) in place, dropping rows and columns past its shape."""
    m_blocks, _, _ = grid
    with np.errstate(invalid="ignore", over="ignore"):
        for bid_m, bh in np.ndindex(m_blocks, grid[1]):
            merge_block(Opart, Lse, Out, bh, bid_m, TILE_M, TILE_D)


def emulate_combine_row_kernel(grid, Opart, Lse, Out, TILE_D, TILE_S):
    """``decode_combine_row_kernel`` on NumPy arrays, one program per packed row: an online softmax
    over the splits (base 2), ``TILE_S`` splits per step (those past the last read as
    ``lse = -inf``, ``o = 0``, the kernel's padding); writes ``Out`` (B, Hkv, rows, D) in place,
    dropping columns past D."""
    rows_grid, _, _ = grid
    num_splits = Opart.shape[0]
    _, num_kv_heads, rows, D = Out.shape
    s_pad = -(-num_splits // TILE_S) * TILE_S
    with np.errstate(invalid="ignore", over="ignore"):
        for row, bh in np.ndindex(rows_grid, grid[1]):
            b, kv_head = divmod(bh, num_kv_heads)
            lse_all = np.full((s_pad, 1), -np.inf, Opart.dtype)
            o_all = np.zeros((s_pad, TILE_D), Opart.dtype)
            lse_all[:num_splits, 0] = Lse[:, bh, row]
            o_all[:num_splits] = Opart[:, bh, row]
            m = np.full((1, 1), -np.inf, Opart.dtype)
            l = np.zeros((1, 1), Opart.dtype)
            acc = np.zeros((1, TILE_D), Opart.dtype)
            for c in range(s_pad // TILE_S):
                lse = lse_all[c * TILE_S:(c + 1) * TILE_S]
                o = o_all[c * TILE_S:(c + 1) * TILE_S]
                # The GPU's max drops a NaN operand (fmax); a NaN partial still makes w NaN.
                m_new = np.fmax(m, np.fmax.reduce(lse, axis=0, keepdims=True))
                m_use = np.where(np.isneginf(m_new), 0.0, m_new)
                alpha, w = np.exp2(m - m_use), np.exp2(lse - m_use)
                l = l * alpha + w.sum(axis=0, keepdims=True)
                acc = acc * alpha + (w * o).sum(axis=0, keepdims=True)
                m = m_new
            if row < rows:
                Out[b, kv_head, row] = (acc / np.where(l > 0, l, 1.0))[0, :D]


def emulate_decode(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                   num_splits: int = 1, tile_m: int = 16, tile_n: int = 64,
                   combine_tile_m: int | None = None, combine_tile_s: int | None = None,
                   return_partials: bool = False):
    """``decode_split_kernel`` then ``decode_combine_kernel`` (kernels/decode.py), in NumPy,
    with the host's layout (the GQA group's heads packed as rows) and *no host check of the
    values*: a length outside ``[0, capacity]`` or a page id out of range makes that sequence's
    output NaN, as on the GPU.

    Computes in float64 if an input is float64, else float32 (P is not rounded to fp16: the
    emulation checks the algorithm, the GPU tests the rounding).

    Returns:
        out (B, Hq, Nq, D) NumPy; with ``return_partials`` also Opart (S, B*Hkv, M_pad, TILE_D)
        and Lse (S, B*Hkv, M_pad) in base 2, as the split kernel writes them.
    """
    from ..contract import tile_d_for
    check_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                 check_values=False)
    dt = _compute_dtype(q, k_cache, v_cache)
    qn, kn, vn = _float(q, dt), _float(k_cache, dt), _float(v_cache, dt)
    lens = _np(cache_seqlens)
    table = np.zeros((1, 1), np.int32) if block_table is None else _np(block_table)
    B, Hq, Nq, D = qn.shape
    Hkv, page_size = kn.shape[1], kn.shape[2]
    rows, TD = Hq // Hkv * Nq, tile_d_for(D)
    if block_table is not None and page_size % tile_n:
        raise ValueError(f"tile_n ({tile_n}) must divide the page size ({page_size})")
    m_blocks = -(-rows // tile_m)
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    Opart = np.zeros((num_splits, B * Hkv, m_blocks * tile_m, TD), dt)
    Lse = np.zeros((num_splits, B * Hkv, m_blocks * tile_m), dt)
    out = np.zeros((B, Hkv, rows, D), dt)
    # One split: the split kernel writes the output itself (FINAL), as the host launches it
    # (the partials are then computed too when asked for, for return_partials).
    final = num_splits == 1 and not return_partials
    unread = np.ones((1, 1), dt)                                     # 16-bit: no descales
    emulate_split_kernel((m_blocks, num_splits, B * Hkv), qn.reshape(B, Hkv, rows, D), kn, vn,
                         table, lens, unread, unread, Opart, Lse, out, scale, Nq, tile_m,
                         tile_n, TD, block_table is not None, final)
    if not final and combine_tile_s is not None:
        # The one-row combine, combine_tile_s splits per step.
        emulate_combine_row_kernel((rows, B * Hkv, 1), Opart, Lse, out, TD, combine_tile_s)
    elif not final:
        ctm = tile_m if combine_tile_m is None else combine_tile_m
        emulate_combine_kernel((-(-rows // ctm), B * Hkv, 1), Opart, Lse, out, ctm, TD)
    out = out.reshape(B, Hq, Nq, D)
    if return_partials:
        return out, Opart, Lse
    return out


def decode_reference_fp8(q, k_cache8, v_cache8, cache_seqlens, k_descale, v_descale, *,
                         block_table=None, scale=None, v_transposed: bool = False):
    """fp32 decode attention of the dequantised fp8 caches (the widening path's exact answer;
    the FP8-MMA path's too, up to q and P rounded to fp8), a torch tensor on the CPU.
    Descales (B, Hkv) float32 (or a number); for a paged cache each sequence's pages are
    dequantised with its own row of them. ``v_transposed``: v_cache8 is (B, Hkv, D, S) (paged:
    (num_pages, Hkv, D, page_size))."""
    import torch
    if v_transposed:
        v_cache8 = v_cache8.transpose(-1, -2)
    B, Hkv = q.shape[0], k_cache8.shape[1]
    kd = torch.as_tensor(k_descale, dtype=torch.float32).cpu().expand(B, Hkv)
    vd = torch.as_tensor(v_descale, dtype=torch.float32).cpu().expand(B, Hkv)
    outs = []
    for b in range(B):
        # Contiguous: sequence b's own cache; paged: the page pool, in sequence b's descales.
        kb = k_cache8 if block_table is not None else k_cache8[b:b + 1]
        vb = v_cache8 if block_table is not None else v_cache8[b:b + 1]
        kc = kb.float().cpu() * kd[b][None, :, None, None]
        vc = vb.float().cpu() * vd[b][None, :, None, None]
        bt = None if block_table is None else block_table[b:b + 1].cpu()
        outs.append(decode_attention(q[b:b + 1].float().cpu(), kc, vc,
                                     cache_seqlens[b:b + 1].cpu(), bt, scale=scale))
    return torch.cat(outs)


def emulate_decode_fp8mma(q, k8, v8t, lens, kd, vd, *, tile_n, num_splits, block_table=None,
                          scale=None, p_shift=8):
    """The FP8-MMA decode kernel's arithmetic in torch (fp32, on the CPU), one (sequence, kv
    head) at a time: q rounded to the cache's fp8 per row (amax at 448), S = q8 k8^T, the
    online softmax over ``tile_n``-key tiles of each of ``num_splits`` runs with
    P = 2^(s - m + p_shift) rounded to fp8 before P V, the runs merged by their LSE.
    q (B, Hq, Nq, D); k8 (B, Hkv, S, D), v8t (B, Hkv, D, S) (paged: (num_pages, Hkv, ...)
    with ``block_table``); lens (B,); descales (B, Hkv). Returns fp32 (B, Hq, Nq, D). Slots
    past a length must be finite in v8t (the kernel zeroes them; so does this)."""
    import torch
    q, k8, v8t, lens = q.cpu(), k8.cpu(), v8t.cpu(), lens.cpu()
    kd, vd = torch.as_tensor(kd).cpu(), torch.as_tensor(vd).cpu()
    block_table = None if block_table is None else block_table.cpu()
    B, Hq, Nq, D = q.shape
    Hkv = k8.shape[1]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Hq, Nq, D)
    inv_log2 = 1.0 / math.log(2)
    for b in range(B):
        n = int(lens[b])
        if block_table is None:
            kb = k8[b].float()                                       # (Hkv, S, D)
            vb = v8t[b].float().transpose(-1, -2)
        else:
            pages = block_table[b].long()
            kb = torch.cat([k8[p].float() for p in pages], dim=1)
            vb = torch.cat([v8t[p].float().transpose(-1, -2) for p in pages], dim=1)
        n_tiles = -(-n // tile_n)
        per = -(-n_tiles // num_splits) if n_tiles else 0
        for h in range(Hkv):
            qf = q[b, h * G:(h + 1) * G].float().reshape(G * Nq, D)  # rows g * Nq + i
            amax = qf.abs().amax(-1, keepdim=True)
            amax = torch.where(amax > 0, amax, torch.ones_like(amax))
            q8 = (qf * (448.0 / amax)).to(k8.dtype).float()
            rs = (amax * (1.0 / 448.0)) * (scale * inv_log2 * float(kd[b, h]))
            pos = n - Nq + torch.arange(G * Nq) % Nq                 # each row's position
            parts = []
            for sp in range(num_splits):
                t0 = min(sp * per, n_tiles)
                t1 = min(t0 + per, n_tiles)
                m = torch.full((G * Nq, 1), -math.inf)
                l = torch.zeros(G * Nq, 1)
                acc = torch.zeros(G * Nq, D)
                for t in range(t0, t1):
                    j = torch.arange(t * tile_n, (t + 1) * tile_n)
                    jj = j.clamp(max=kb.shape[1] - 1)
                    s = q8 @ kb[h, jj].T
                    s = torch.where(j[None, :] <= pos[:, None], s, -math.inf)
                    m_new = torch.maximum(m, s.amax(-1, keepdim=True) * rs)
                    m_use = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
                    p = torch.exp2(s * rs - (m_use - p_shift))
                    alpha = torch.exp2(m - m_use)
                    l = l * alpha + p.sum(-1, keepdim=True)
                    vt = torch.where((j < n)[:, None], vb[h, jj], torch.zeros(()))
                    acc = acc * alpha + p.to(k8.dtype).float() @ vt
                    m = m_new
                has = l > 0
                ls = torch.where(has, l, torch.ones_like(l))
                o = acc / ls * float(vd[b, h])
                lse = torch.where(has, m + torch.log2(ls) - p_shift,
                                  torch.full_like(m, -math.inf))
                parts.append((o, lse))
            if num_splits == 1:
                o = parts[0][0]
            else:
                lses = torch.stack([p[1] for p in parts])            # (splits, R, 1)
                mx = lses.amax(0)
                mx = torch.where(mx == -math.inf, torch.zeros_like(mx), mx)
                w = torch.exp2(lses - mx)
                tot = w.sum(0)
                o = sum(w[i] * parts[i][0] for i in range(num_splits))
                o = o / torch.where(tot > 0, tot, torch.ones_like(tot))
            out[b, h * G:(h + 1) * G] = o.reshape(G, Nq, D)
    return out
