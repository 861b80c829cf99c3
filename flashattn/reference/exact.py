"""Exact attention with the contract of ``flashattn.attention``, on any device (fp32/fp64)."""
from __future__ import annotations

import math

import numpy as np
import torch

from ..contract import check_shapes


def causal_mask(Nq: int, Nk: int, input_pos: int = 0) -> np.ndarray:
    """(Nq, Nk) bool: True where query row i, at position input_pos + i, sees key j."""
    return np.arange(Nk)[None, :] <= input_pos + np.arange(Nq)[:, None]  # (Nq, Nk)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, input_pos: int = 0):
    """Exact attention with the contract of ``flashattn.attention``, on any device.

    Args:
        q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 (query head h reads
            key/value head h // (Hq // Hkv)). torch tensors (any device, any float dtype) or
            NumPy arrays.
        causal: query row i sits at position input_pos + i and sees keys 0 .. input_pos + i.
        scale: default 1/sqrt(D).
        input_pos: 0 .. max(0, Nk - Nq), causal only (a prefill appended to a KV cache).

    Returns:
        (B, Hq, Nq, D) in float64 if the inputs are float64, else float32 (fp16/bf16 upcast);
        a torch tensor on the input device for torch inputs, a NumPy array for NumPy inputs.

    Raises:
        ValueError, TypeError: bad shapes or arguments, as ``flashattn.attention``.
    """
    is_numpy = isinstance(q, np.ndarray)
    if is_numpy:
        q, k, v = (torch.from_numpy(np.asarray(t)) for t in (q, k, v))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(t).__name__}")
        if not (t.is_floating_point()):
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}")
    check_shapes(q.shape, k.shape, v.shape, causal=bool(causal), scale=scale,
                 input_pos=input_pos)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype, v.dtype) else torch.float32
    q, k, v = (t.to(device=q.device, dtype=dtype) for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if Hkv and Hq != Hkv:
        # GQA: repeat each key/value head for its Hq // Hkv query heads.
        k = k.repeat_interleave(Hq // Hkv, dim=1)                     # (B, Hq, Nk, D)
        v = v.repeat_interleave(Hq // Hkv, dim=1)                     # (B, Hq, Nk, D)
    s = (q @ k.transpose(-1, -2)) * scale                             # (B, Hq, Nq, Nk)
    if causal:
        mask = torch.from_numpy(causal_mask(Nq, Nk, input_pos)).to(q.device)  # (Nq, Nk)
        s = s.masked_fill(~mask, -math.inf)
    o = torch.softmax(s, dim=-1) @ v                                  # (B, Hq, Nq, D)
    return o.numpy() if is_numpy else o
