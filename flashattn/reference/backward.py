"""The backward pass of attention: exact gradients, and a CPU emulation of the tiled kernels.

    attention_backward(q, k, v, dout, causal=...)   exact dQ, dK, dV in fp32/fp64
    attention_lse(q, k, causal=...)                 the natural-log LSE of each query row
    backward_delta(out, dout)                       delta = rowsum(dO o O)
    dkdv_schedule, dq_schedule                      which tiles each backward program visits
    emulate_backward(q, k, v, out, dout, lse, ...)  kernels/fmha_bwd.py tile by tile, float32

Shapes and GQA as ``flashattn.reference.attention`` (dK, dV sum a group's query heads); the
products are those of ``kernels/fmha_bwd.py``, with P = exp(scale * S - lse).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..contract import check_shapes, tile_d_for
from ..config import Config
from .tiles import INV_LOG_2, as_f32, exp2, key_tiles
from .exact import attention, causal_mask

# --- exact ------------------------------------------------------------------------------------
def _as_torch(tensors, names):
    """Torch tensors of one float dtype (float64 if any input is, else float32), and whether
    the inputs were NumPy arrays."""
    is_numpy = isinstance(tensors[0], np.ndarray)
    if is_numpy:
        tensors = [torch.from_numpy(np.asarray(t)) for t in tensors]
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}")
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    dev = tensors[0].device
    return [t.to(device=dev, dtype=dtype) for t in tensors], is_numpy


def _scores(q, k, *, causal, scale, input_pos):
    """Masked, scaled scores (B, Hq, Nq, Nk) with k repeated over each GQA group."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hkv and Hq != Hkv:
        k = k.repeat_interleave(Hq // Hkv, dim=1)                     # (B, Hq, Nk, D)
    s = (q @ k.transpose(-1, -2)) * scale                             # (B, Hq, Nq, Nk)
    if causal:
        mask = torch.from_numpy(causal_mask(Nq, Nk, input_pos)).to(q.device)  # (Nq, Nk)
        s = s.masked_fill(~mask, -math.inf)
    return s


def _group_sum(x, Hkv):
    """(B, Hq, N, D) -> (B, Hkv, N, D): the sum over the query heads of each GQA group."""
    B, Hq, N, D = x.shape
    if not Hkv or Hq == Hkv:
        return x
    return x.reshape(B, Hkv, Hq // Hkv, N, D).sum(dim=2)


def attention_lse(q, k, *, causal: bool = False, scale: float | None = None,
                  input_pos: int = 0):
    """The log-sum-exp (natural log) of each query row's scaled, masked scores: (B, Hq, Nq).

    float64 for float64 inputs, else float32; torch in, torch out (same device), NumPy in,
    NumPy out. Every row sees at least key 0, so the LSE is finite for finite inputs.
    """
    (q, k), is_numpy = _as_torch([q, k], ("q", "k"))
    check_shapes(q.shape, k.shape, k.shape, causal=bool(causal), scale=scale,
                 input_pos=input_pos)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    lse = torch.logsumexp(_scores(q, k, causal=causal, scale=scale, input_pos=input_pos),
                          dim=-1)                                     # (B, Hq, Nq)
    return lse.numpy() if is_numpy else lse


def backward_delta(out, dout):
    """delta = rowsum(dO o O): (B, Hq, Nq), in float64 if either input is, else float32."""
    (out, dout), is_numpy = _as_torch([out, dout], ("out", "dout"))
    if out.shape != dout.shape:
        raise ValueError(f"out and dout must have one shape, got {tuple(out.shape)} and "
                         f"{tuple(dout.shape)}")
    delta = (out * dout).sum(dim=-1)
    return delta.numpy() if is_numpy else delta


def attention_backward(q, k, v, dout, *, causal: bool = False, scale: float | None = None,
                       input_pos: int = 0):
    """Exact gradients of ``reference.attention(q, k, v, ...)`` for the upstream gradient dout.

    Args:
        q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D); dout: (B, Hq, Nq, D). torch tensors (any
            device, any float dtype) or NumPy arrays. causal, scale, input_pos: as
            ``reference.attention``.

    Returns:
        (dq, dk, dv), shaped as q, k, v; dk and dv summed over each GQA group's query heads.
        float64 if any input is float64, else float32; torch in, torch out; NumPy in, NumPy out.
    """
    (q, k, v, dout), is_numpy = _as_torch([q, k, v, dout], ("q", "k", "v", "dout"))
    check_shapes(q.shape, k.shape, v.shape, causal=bool(causal), scale=scale,
                 input_pos=input_pos)
    if tuple(dout.shape) != tuple(q.shape):
        raise ValueError(f"dout must have the shape of q {tuple(q.shape)}, got "
                         f"{tuple(dout.shape)}")
    B, Hq, Nq, D = q.shape
    Hkv = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if B * Hq * Nq == 0:
        grads = (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v))
    else:
        vr = v.repeat_interleave(Hq // Hkv, dim=1) if Hq != Hkv else v  # (B, Hq, Nk, D)
        kr = k.repeat_interleave(Hq // Hkv, dim=1) if Hq != Hkv else k
        s = _scores(q, k, causal=causal, scale=scale, input_pos=input_pos)  # (B, Hq, Nq, Nk)
        p = torch.softmax(s, dim=-1)                                  # (B, Hq, Nq, Nk)
        dv = p.transpose(-1, -2) @ dout                               # (B, Hq, Nk, D)
        dp = dout @ vr.transpose(-1, -2)                              # (B, Hq, Nq, Nk)
        delta = (p * dp).sum(dim=-1, keepdim=True)                    # = rowsum(dO o O)
        ds = p * (dp - delta)                                         # (B, Hq, Nq, Nk)
        dq = scale * (ds @ kr)                                        # (B, Hq, Nq, D)
        dk = scale * (ds.transpose(-1, -2) @ q)                       # (B, Hq, Nk, D)
        grads = (dq, _group_sum(dk, Hkv), _group_sum(dv, Hkv))
    return tuple(g.numpy() for g in grads) if is_numpy else grads


# --- the kernels' schedules -------------------------------------------------------------------
@dataclass(frozen=True)
class DkdvProgram:
    """One program of bwd_dkdv_kernel's first grid axis (the same for every batch, kv head).

    key_tile: ct.bid(0); query_tiles: ((i, kind), ...) the query tiles it visits, for each
    query head of the group in turn, kind "masked" or "full" as in the forward.
    """
    key_tile: int
    query_tiles: tuple[tuple[int, str], ...]


def dkdv_query_tiles(j: int, Nq: int, Nk: int, *, causal: bool, input_pos: int,
                     TILE_M: int, TILE_N: int) -> tuple[tuple[int, str], ...]:
    """The query tiles bwd_dkdv_kernel visits for key tile j, with its formulas:
    m_start, mask_end and the ragged last key tile."""
    n_m = -(-Nq // TILE_M)
    if causal:
        m_start = max(j * TILE_N - input_pos, 0) // TILE_M
        mask_end = -(-max((j + 1) * TILE_N - input_pos, 0) // TILE_M)
    else:
        m_start, mask_end = 0, 0
    ragged = Nk % TILE_N != 0 and j >= Nk // TILE_N
    return tuple((i, "masked" if (causal and i < mask_end) or ragged else "full")
                 for i in range(m_start, n_m))


def dkdv_schedule(Nq: int, Nk: int, *, causal: bool, input_pos: int = 0,
                  config: Config = Config(64, 64)) -> list[DkdvProgram]:
    """The programs of bwd_dkdv_kernel, key tile by key tile. Equal to the forward's schedule
    (``tiles.schedule``) transposed: tests/test_backward_reference.py."""
    TM, TN = config.TILE_M, config.TILE_N
    return [DkdvProgram(j, dkdv_query_tiles(j, Nq, Nk, causal=causal, input_pos=input_pos,
                                            TILE_M=TM, TILE_N=TN))
            for j in range(-(-Nk // TN))]


def dq_schedule(Nq: int, Nk: int, *, causal: bool, input_pos: int = 0,
                config: Config = Config(64, 64)) -> list[tuple[int, tuple]]:
    """[(query tile i, ((j, kind), ...))] of bwd_dq_kernel: the forward's key tiles per query
    tile (``tiles.key_tiles``: masked only on the diagonal and the ragged end)."""
    TM, TN = config.TILE_M, config.TILE_N
    return [(i, key_tiles(i, Nk, tile_m=TM, tile_n=TN, causal=causal, input_pos=input_pos))
            for i in range(-(-Nq // TM))]


# --- the emulation ----------------------------------------------------------------------------
def _pad(x, axis, length, fill=0.0):
    """x padded along ``axis`` to ``length`` with ``fill`` (ct.load's padding_mode)."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return np.pad(x, widths, constant_values=fill)


def _mask(Nk, TN, TM, j, i, *, causal, input_pos, transposed):
    """The kernels' mask for tile (query tile i, key tile j): True where the key is seen."""
    offs_n = j * TN + np.arange(TN)[:, None]                          # (TILE_N, 1)
    offs_m = input_pos + i * TM + np.arange(TM)[None, :]              # (1, TILE_M)
    mask = np.broadcast_to(offs_n < Nk, (TN, TM))                     # keys past Nk
    if causal:
        mask = mask & (offs_m >= offs_n)                              # future keys
    return mask if transposed else mask.T                             # [TILE_N, TILE_M] or .T


def _round(x, on: bool):
    return x.astype(np.float16).astype(np.float32) if on else x


def emulate_backward(q, k, v, out, dout, lse, *, causal: bool = False,
                     scale: float | None = None, input_pos: int = 0,
                     config: Config | None = None, dq_config: Config | None = None,
                     round_p: bool = False):
    """The backward kernels in NumPy float32, tile by tile, in their order and rules.

    Args:
        q, k, v, out, dout: as the forward's (out: (B, Hq, Nq, D), the forward's output; dout
            its gradient). NumPy or torch. ``out=None``: the exact forward's.
        lse: (B, Hq, Nq) natural-log LSE, or None for ``attention_lse``'s.
        config: TILE_M x TILE_N of bwd_dkdv_kernel (query tile x its key/value tile), default
            64x64; dq_config: of bwd_dq_kernel, default ``config``.
        round_p: cast P^T and dS^T (dS) to float16 before their products, as the kernels do for
            fp16 inputs.

    Returns:
        (dq, dk, dv) float32 NumPy arrays shaped as q, k, v.

    Mirrors kernels/fmha_bwd.py: delta from the preprocess; one dK/dV program per key tile
    looping over the query heads of its group and ``dkdv_query_tiles``; one dQ program per
    query tile looping over ``dq_schedule``'s key tiles; zero padding of Q, dO, K, V, Delta
    and +inf padding of the LSE past the sequences, so padded rows give P = 0. A row whose LSE
    is -inf (or +inf: it sees no key) gets P = 0 and dS = 0: dQ 0, nothing added to dK, dV.
    """
    q, k, v, dout = (as_f32(t) for t in (q, k, v, dout))
    check_shapes(q.shape, k.shape, v.shape, causal=causal, scale=scale, input_pos=input_pos)
    if dout.shape != q.shape:
        raise ValueError(f"dout must have the shape of q {q.shape}, got {dout.shape}")
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    dq = np.zeros(q.shape, np.float32)
    dk = np.zeros(k.shape, np.float32)
    dv = np.zeros(v.shape, np.float32)
    if B * Hq * Nq == 0:
        return dq, dk, dv
    if out is None:
        out = attention(*(t.astype(np.float64) for t in (q, k, v)), causal=causal,
                        scale=scale, input_pos=input_pos)
    if lse is None:
        lse = attention_lse(q.astype(np.float64), k.astype(np.float64), causal=causal,
                            scale=scale, input_pos=input_pos)
    out, lse = as_f32(out), as_f32(lse)
    if out.shape != q.shape or lse.shape != (B, Hq, Nq):
        raise ValueError(f"out must be shaped {q.shape} and lse {(B, Hq, Nq)}, got "
                         f"{out.shape} and {lse.shape}")
    # A row that sees no key (LSE -inf, or +inf): P = 0 and dS = 0, as the kernels make it.
    empty = np.isinf(lse)
    lse = np.where(empty, np.float32(np.inf), lse)
    config = config or Config(64, 64)
    dq_config = dq_config or config
    G = Hq // Hkv
    TD = tile_d_for(D)
    c2 = np.float32(scale * INV_LOG_2)                                 # qk_scale_log2
    f32 = np.float32

    # --- bwd_preprocess_kernel ---
    delta = (out * dout).sum(axis=-1, dtype=np.float32)                # (B, Hq, Nq)
    delta = np.where(empty, np.float32(0), delta)                      # the kernels' select

    with np.errstate(over="ignore", invalid="ignore"):
        # --- bwd_dkdv_kernel: grid (key tiles, B * Hkv); batched here over (B, Hkv) ---
        TM, TN = config.TILE_M, config.TILE_N
        n_m, n_n = -(-Nq // TM), -(-Nk // TN)
        qp = _pad(_pad(q, 2, n_m * TM), 3, TD)                         # (B, Hq, n_m*TM, TD)
        dop = _pad(_pad(dout, 2, n_m * TM), 3, TD)
        lsep = _pad(lse, 2, n_m * TM, np.inf) * f32(INV_LOG_2)         # LSE in log2 units
        deltap = _pad(delta, 2, n_m * TM)
        kp = _pad(_pad(k, 2, n_n * TN), 3, TD)                         # (B, Hkv, n_n*TN, TD)
        vp = _pad(_pad(v, 2, n_n * TN), 3, TD)
        for prog in dkdv_schedule(Nq, Nk, causal=causal, input_pos=input_pos, config=config):
            j = prog.key_tile
            keys = slice(j * TN, (j + 1) * TN)
            kt, vt = kp[:, :, keys], vp[:, :, keys]                    # (B, Hkv, TILE_N, TILE_D)
            dk_acc = np.zeros((B, Hkv, TN, TD), f32)
            dv_acc = np.zeros((B, Hkv, TN, TD), f32)
            for g in range(G):                                         # t // num_tiles
                heads = np.arange(Hkv) * G + g                         # head of each kv head
                for i, kind in prog.query_tiles:                       # t % num_tiles
                    rows = slice(i * TM, (i + 1) * TM)
                    qt, dot = qp[:, heads, rows], dop[:, heads, rows]  # (B, Hkv, TILE_M, TILE_D)
                    lse_t = lsep[:, heads, rows][:, :, None, :]        # (B, Hkv, 1, TILE_M)
                    delta_t = deltap[:, heads, rows][:, :, None, :]    # (B, Hkv, 1, TILE_M)
                    st = kt @ qt.swapaxes(-1, -2)                      # S^T (B, Hkv, TN, TM)
                    if kind == "masked":
                        m = _mask(Nk, TN, TM, j, i, causal=causal, input_pos=input_pos,
                                  transposed=True)
                        st = st + np.where(m, f32(0), f32(-np.inf))
                    pt = exp2(st * c2 - lse_t, True)                   # P^T
                    dv_acc += _round(pt, round_p) @ dot                # dV += P^T dO
                    dpt = vt @ dot.swapaxes(-1, -2)                    # dP^T = V dO^T
                    dst = pt * (dpt - delta_t)                         # dS^T
                    dk_acc += _round(dst, round_p) @ qt                # dK += dS^T Q
            dk[:, :, keys.start:min(keys.stop, Nk)] = (dk_acc * f32(scale))[:, :, :Nk - j * TN,
                                                                           :D]
            dv[:, :, keys.start:min(keys.stop, Nk)] = dv_acc[:, :, :Nk - j * TN, :D]

        # --- bwd_dq_kernel: grid (query tiles, B * Hq); batched over (B, Hq) ---
        TM, TN = dq_config.TILE_M, dq_config.TILE_N
        n_m, n_n = -(-Nq // TM), -(-Nk // TN)
        qp = _pad(_pad(q, 2, n_m * TM), 3, TD)
        dop = _pad(_pad(dout, 2, n_m * TM), 3, TD)
        lsep = _pad(lse, 2, n_m * TM, np.inf) * f32(INV_LOG_2)
        deltap = _pad(delta, 2, n_m * TM)
        kv_head = np.arange(Hq) // G
        kp = _pad(_pad(k, 2, n_n * TN), 3, TD)[:, kv_head]             # (B, Hq, n_n*TN, TD)
        vp = _pad(_pad(v, 2, n_n * TN), 3, TD)[:, kv_head]
        for i, visits in dq_schedule(Nq, Nk, causal=causal, input_pos=input_pos,
                                     config=dq_config):
            rows = slice(i * TM, (i + 1) * TM)
            qt, dot = qp[:, :, rows], dop[:, :, rows]                  # (B, Hq, TILE_M, TILE_D)
            lse_t = lsep[:, :, rows][..., None]                        # (B, Hq, TILE_M, 1)
            delta_t = deltap[:, :, rows][..., None]
            dq_acc = np.zeros((B, Hq, TM, TD), f32)
            for j, kind in visits:
                keys = slice(j * TN, (j + 1) * TN)
                kt, vt = kp[:, :, keys], vp[:, :, keys]                # (B, Hq, TILE_N, TILE_D)
                s = qt @ kt.swapaxes(-1, -2)                           # S (B, Hq, TM, TN)
                if kind == "masked":
                    m = _mask(Nk, TN, TM, j, i, causal=causal, input_pos=input_pos,
                              transposed=False)
                    s = s + np.where(m, f32(0), f32(-np.inf))
                p = exp2(s * c2 - lse_t, True)                         # P
                dp = dot @ vt.swapaxes(-1, -2)                         # dP = dO V^T
                ds = p * (dp - delta_t)                                # dS
                dq_acc += _round(ds, round_p) @ kt                     # dQ += dS K
            dq[:, :, rows.start:min(rows.stop, Nq)] = (dq_acc * f32(scale))[:, :, :Nq - i * TM,
                                                                           :D]
    return dq, dk, dv
