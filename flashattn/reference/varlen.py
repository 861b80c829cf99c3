"""Packed variable-length attention (FlashAttention's varlen interface), in NumPy.

    varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)   exact, one sequence at a time
    varlen_visible(len_q, len_k, causal)                         the (len_q, len_k) mask
    emulate_varlen_kernel(grid, Q, K, V, Out, ...)               the kernel, program by program
    emulate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)     the host's launch, emulated
    pack / unpack                                                padded (B, H, N, D) <-> packed

q (total_q, Hq, D), k and v (total_k, Hkv, D), offsets (B + 1,) int32, as
``flashattn.varlen.attention_varlen``; causal aligned to the bottom right; a row that sees no
key gets 0.
"""
from __future__ import annotations

import math

import numpy as np

from ..contract import check_varlen
from .decode import _compute_dtype, _float, _np, _wrap   # the same array plumbing as decode
from .decode import online_step

__all__ = ["varlen_attention", "varlen_visible", "emulate_varlen_kernel", "emulate_varlen",
           "pack", "unpack"]


def varlen_visible(len_q: int, len_k: int, causal: bool) -> np.ndarray:
    """(len_q, len_k) bool: query row i sees key j (bottom-right causal alignment)."""
    if not causal:
        return np.ones((len_q, len_k), bool)
    pos = len_k - len_q + np.arange(len_q)                            # (len_q,)
    return np.arange(len_k)[None, :] <= pos[:, None]


def varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                     max_seqlen_k=None, *, causal: bool = False, scale=None,
                     return_lse: bool = False):
    """Exact attention of each packed sequence (see the module docstring).

    Args:
        q: (total_q, Hq, D); k, v: (total_k, Hkv, D); cu_seqlens_q, cu_seqlens_k: (B + 1,)
            int32. torch tensors (any device) or NumPy arrays; offsets checked on the host.
        max_seqlen_q, max_seqlen_k: bounds on the lengths (default: the longest).
        causal: bottom-right aligned. scale: default 1/sqrt(D).
        return_lse: also return the (total_q, Hq) log-sum-exp (natural log; -inf where a row
            sees no key).

    Returns:
        (total_q, Hq, D) in float64 if an input is float64, else float32; a torch tensor on q's
        device for torch inputs, a NumPy array otherwise.

    Raises:
        ValueError, TypeError: as ``flashattn.contract.check_varlen``.
    """
    cq, ck = _np(cu_seqlens_q).astype(np.int64), _np(cu_seqlens_k).astype(np.int64)
    mq = int(np.diff(cq).max(initial=0)) if max_seqlen_q is None else max_seqlen_q
    mk = int(np.diff(ck).max(initial=0)) if max_seqlen_k is None else max_seqlen_k
    dims = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=mq, max_seqlen_k=mk,
                        causal=causal, scale=scale, check_values=True)
    dt = _compute_dtype(q, k, v)
    qn, kn, vn = _float(q, dt), _float(k, dt), _float(v, dt)
    scale = 1.0 / math.sqrt(dims.D) if scale is None else float(scale)
    G = dims.Hq // dims.Hkv
    out = np.zeros(qn.shape, dt)
    lse = np.full(qn.shape[:2], -np.inf, dt)
    for b in range(dims.B):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq == 0:
            continue
        visible = varlen_visible(lq, lk, causal)                        # (lq, lk)
        for h in range(dims.Hq):
            qh, kh, vh = qn[qs, h], kn[ks, h // G], vn[ks, h // G]       # (lq, D), (lk, D)
            s = np.where(visible, (qh @ kh.T) * scale, -np.inf)          # (lq, lk)
            m = s.max(axis=1, keepdims=True, initial=-np.inf)
            m_use = np.where(np.isneginf(m), 0.0, m)
            p = np.exp(s - m_use)
            l = p.sum(axis=1, keepdims=True)
            out[qs, h] = np.where(l > 0, (p @ vh) / np.where(l > 0, l, 1.0), 0.0)
            lse[qs, h] = np.where(l[:, 0] > 0, m_use[:, 0] + np.log(np.where(l[:, 0] > 0,
                                                                             l[:, 0], 1.0)),
                                  -np.inf)
    if return_lse:
        return _wrap(out, q), _wrap(lse, q)
    return _wrap(out, q)


# --- the kernel, program by program ---------------------------------------------------------------
def emulate_varlen_kernel(grid, Q, K, V, Out, CuSeqlensQ, CuSeqlensK, qk_scale, group_size,
                          max_seqlen_q, max_seqlen_k, TILE_M, TILE_N, TILE_D, CAUSAL,
                          Q_TILES=1, K_LAT=2, V_LAT=4):
    """``varlen_fwd_kernel`` on NumPy arrays in the kernel's layout (Q, Out (Hq, total_q, D);
    K, V (Hkv, total_k, D)), program by program, arguments in the kernel's order (``grid``
    first). Writes ``Out`` in place; computes in Out's dtype if it is float64, else float32.

    Follows the kernel line by line: offsets clamped, the sequence's rows sliced (tiles past
    its end read 0), programs past the end exit, ``Q_TILES`` query tiles per program, causal
    tiles in reverse order, the key tiles a causal query tile visits, the mask only from
    ``mask_start`` on, the guarded online softmax, NaN for bad offsets.
    """
    dt = np.float64 if Out.dtype == np.float64 else np.float32
    total_q, total_k, D = Q.shape[1], K.shape[1], Q.shape[2]
    scale2 = float(qk_scale) / math.log(2)
    with np.errstate(invalid="ignore", over="ignore"):
        for bid0, head, seq in np.ndindex(*grid):
            kv_head = head // group_size
            raw = [int(CuSeqlensQ[seq]), int(CuSeqlensQ[seq + 1]), int(CuSeqlensK[seq]),
                   int(CuSeqlensK[seq + 1])]
            q_start = min(max(raw[0], 0), total_q)
            q_end = min(max(raw[1], q_start), total_q)
            k_start = min(max(raw[2], 0), total_k)
            k_end = min(max(raw[3], k_start), total_k)
            len_q, len_k = q_end - q_start, k_end - k_start
            bad = ([q_start, q_end, k_start, k_end] != raw or len_q > max_seqlen_q
                   or len_k > max_seqlen_k)
            n_m = -(-len_q // TILE_M)
            first = bid0 * Q_TILES
            if first >= n_m:
                continue                                                # past the end: exit
            for tile in range(first, min(first + Q_TILES, n_m)):
                bid_m = n_m - 1 - tile if CAUSAL else tile              # longest tiles first
                _emulate_varlen_tile(Q, K, V, Out, head, kv_head, bid_m, q_start, q_end,
                                     k_start, k_end, bad, scale2, dt, TILE_M, TILE_N, TILE_D,
                                     CAUSAL)


def _emulate_varlen_tile(Q, K, V, Out, head, kv_head, bid_m, q_start, q_end, k_start, k_end,
                         bad, scale2, dt, TILE_M, TILE_N, TILE_D, CAUSAL):
    """One query tile of ``emulate_varlen_kernel``'s program."""
    D = Q.shape[2]
    len_q, len_k = q_end - q_start, k_end - k_start
    shift = len_k - len_q
    offs_m = (shift + bid_m * TILE_M + np.arange(TILE_M))[:, None]
    q = np.zeros((TILE_M, TILE_D), dt)
    part = Q[head, q_start + bid_m * TILE_M:q_end][:TILE_M]
    q[:part.shape[0], :D] = part
    if CAUSAL:
        last_row = min(bid_m * TILE_M + TILE_M, len_q) - 1
        visible = min(max(shift + last_row + 1, 0), len_k)
        Tc = -(-visible // TILE_N)
        mask_start = min(max(shift + bid_m * TILE_M + 1, 0), len_k) // TILE_N
    else:
        Tc = -(-len_k // TILE_N)
        mask_start = len_k // TILE_N
    m_i = np.full((TILE_M, 1), -np.inf, dt)
    l_i = np.zeros((TILE_M, 1), dt)
    acc = np.zeros((TILE_M, TILE_D), dt)
    for j in range(Tc):
        k = np.zeros((TILE_N, TILE_D), dt)
        v = np.zeros((TILE_N, TILE_D), dt)
        kp = K[kv_head, k_start + j * TILE_N:k_end][:TILE_N]
        vp = V[kv_head, k_start + j * TILE_N:k_end][:TILE_N]
        k[:kp.shape[0], :D], v[:vp.shape[0], :D] = kp, vp
        qk = q @ k.T                                            # (TILE_M, TILE_N)
        if j >= mask_start:
            offs_n = (j * TILE_N + np.arange(TILE_N))[None, :]
            mask = offs_n < len_k
            if CAUSAL:
                mask = mask & (offs_n <= offs_m)
            qk = np.where(mask, qk, -np.inf)
        m_i, l_i, acc = online_step(qk, m_i, l_i, acc, v, scale2)
    o = acc / np.where(l_i > 0, l_i, 1.0)
    if bad:
        o = np.full_like(o, np.nan)
    n = min(TILE_M, len_q - bid_m * TILE_M)
    r0 = q_start + bid_m * TILE_M
    Out[head, r0:r0 + n] = o[:n, :D]


def emulate_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k=None, *,
                   causal: bool = False, scale=None, tile_m: int = 64, tile_n: int = 64,
                   q_tiles: int = 1):
    """The host's launch of ``varlen_fwd_kernel`` (``flashattn.varlen``), in NumPy, with *no
    host check of the offsets*: bad ones give NaN for their sequences, as on the GPU.

    Returns (total_q, Hq, D) NumPy, float64 if an input is float64, else float32 (P is not
    rounded to fp16: the emulation checks the algorithm, the GPU tests the rounding).
    """
    from ..contract import tile_d_for
    if max_seqlen_k is None:
        max_seqlen_k = int(np.diff(_np(cu_seqlens_k).astype(np.int64)).max(initial=0))
    dims = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                        check_values=False)
    dt = _compute_dtype(q, k, v)
    qn, kn, vn = _float(q, dt), _float(k, dt), _float(v, dt)
    out = np.zeros(qn.shape, dt)
    scale = 1.0 / math.sqrt(dims.D) if scale is None else float(scale)
    grid = (-(-max(1, -(-max_seqlen_q // tile_m)) // q_tiles), dims.Hq, dims.B)
    emulate_varlen_kernel(grid, qn.transpose(1, 0, 2), kn.transpose(1, 0, 2),
                          vn.transpose(1, 0, 2), out.transpose(1, 0, 2), _np(cu_seqlens_q),
                          _np(cu_seqlens_k), scale, dims.Hq // dims.Hkv, max_seqlen_q,
                          max_seqlen_k, tile_m, tile_n, tile_d_for(dims.D), bool(causal),
                          q_tiles)
    return out


# --- padded <-> packed -----------------------------------------------------------------------------
def pack(x, lens):
    """(B, H, N, D) padded -> ((sum(lens), H, D) packed, cu_seqlens (B + 1,) int32): row n < lens[b]
    of sequence b. torch in, torch out (on x's device); NumPy in, NumPy out."""
    lens = [int(n) for n in lens]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    if hasattr(x, "detach"):
        import torch
        parts = [x[b, :, :n].transpose(0, 1) for b, n in enumerate(lens)]
        return torch.cat(parts, 0), torch.from_numpy(cu).to(x.device)
    parts = [np.asarray(x)[b, :, :n].transpose(1, 0, 2) for b, n in enumerate(lens)]
    return np.concatenate(parts, 0), cu


def unpack(x, cu_seqlens, max_len: int | None = None, *, fill=0.0):
    """(total, H, D) packed -> (B, H, max_len, D) padded with ``fill`` (torch or NumPy)."""
    cu = [int(c) for c in _np(cu_seqlens)]
    lens = [b - a for a, b in zip(cu, cu[1:])]
    n = max(lens, default=0) if max_len is None else max_len
    H, D = x.shape[1], x.shape[2]
    if hasattr(x, "detach"):
        import torch
        out = torch.full((len(lens), H, n, D), fill, dtype=x.dtype, device=x.device)
    else:
        out = np.full((len(lens), H, n, D), fill, dtype=np.asarray(x).dtype)
    for b, (a, e) in enumerate(zip(cu, cu[1:])):
        out[b, :, :e - a] = x[a:e].transpose(0, 1) if hasattr(x, "detach") else \
            np.asarray(x)[a:e].transpose(1, 0, 2)
    return out


# --- the backward ----------------------------------------------------------------------------------
def varlen_attention_backward(q, k, v, dout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None,
                              max_seqlen_k=None, *, causal: bool = False, scale=None):
    """Exact gradients (dq, dk, dv) of ``varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k,
    causal=, scale=)`` for the upstream gradient ``dout`` (total_q, Hq, D), one sequence and
    one head at a time (the reference of ``flashattn.varlen.attention_varlen_backward``).

    With P the softmax of each row's visible scaled scores (bottom-right causal mask; a row
    that sees no key has P = 0, so its dq is 0 and it adds nothing to dk, dv)::

        dV = P^T dO    dP = dO V^T    dS = P o (dP - rowsum(P o dP))
        dQ = scale * dS K             dK = scale * dS^T Q

    dk and dv sum the query heads of each GQA group. Returns arrays shaped as q, k, v, in
    float64 if an input is float64, else float32; torch tensors on q's device for torch inputs,
    NumPy arrays otherwise. Raises as ``varlen_attention``, and ValueError for a dout not of
    q's shape.
    """
    cq, ck = _np(cu_seqlens_q).astype(np.int64), _np(cu_seqlens_k).astype(np.int64)
    mq = int(np.diff(cq).max(initial=0)) if max_seqlen_q is None else max_seqlen_q
    mk = int(np.diff(ck).max(initial=0)) if max_seqlen_k is None else max_seqlen_k
    dims = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=mq, max_seqlen_k=mk,
                        causal=causal, scale=scale, check_values=True)
    if tuple(dout.shape) != tuple(q.shape):
        raise ValueError(f"dout must have the shape of q {tuple(q.shape)}, got "
                         f"{tuple(dout.shape)}")
    dt = _compute_dtype(q, k, v, dout)
    qn, kn, vn, don = (_float(t, dt) for t in (q, k, v, dout))
    scale = 1.0 / math.sqrt(dims.D) if scale is None else float(scale)
    G = dims.Hq // dims.Hkv
    dq, dk, dv = np.zeros(qn.shape, dt), np.zeros(kn.shape, dt), np.zeros(vn.shape, dt)
    for b in range(dims.B):
        qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq == 0 or lk == 0:
            continue
        visible = varlen_visible(lq, lk, causal)                        # (lq, lk)
        for h in range(dims.Hq):
            qh, kh, vh, doh = qn[qs, h], kn[ks, h // G], vn[ks, h // G], don[qs, h]
            s = np.where(visible, (qh @ kh.T) * scale, -np.inf)          # (lq, lk)
            m = s.max(axis=1, keepdims=True, initial=-np.inf)
            p = np.where(visible, np.exp(s - np.where(np.isneginf(m), 0.0, m)), 0.0)
            l = p.sum(axis=1, keepdims=True)
            p = p / np.where(l > 0, l, 1.0)                               # 0 rows stay 0
            dp = doh @ vh.T                                               # (lq, lk)
            ds = p * (dp - (p * dp).sum(axis=1, keepdims=True))
            dq[qs, h] = scale * (ds @ kh)
            dk[ks, h // G] += scale * (ds.T @ qh)
            dv[ks, h // G] += p.T @ doh
    return _wrap(dq, q), _wrap(dk, q), _wrap(dv, q)
