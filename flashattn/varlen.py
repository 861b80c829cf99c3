"""Packed variable-length prefill: attention over sequences packed without padding.

    out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=True)
    dq, dk, dv = attention_varlen_backward(q, k, v, out, dout, cu_seqlens_q, cu_seqlens_k,
                                           max_seqlen_q, max_seqlen_k, causal=True)

FlashAttention's ``flash_attn_varlen_func`` interface. The forward is one launch of
``kernels/varlen.py``; the backward is composed from the square kernels, once per sequence (a
recomputed forward with its LSE, then the three backward kernels). Differentiable, and traced
by ``torch.compile``, through the operators of ``varlen_op``.
"""
from __future__ import annotations

import math

from .contract import check_varlen_tensors
from .dispatch import (attention_steps, device_arch, expect, interpreting, launch_kernel,
                       on_device)
from .kernels import VARLEN_FWD, hinted
from .kernels.varlen_spec import varlen_plan  # the pure plan (configuration, constants, grid)

__all__ = ["attention_varlen", "attention_varlen_backward", "varlen_plan"]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool = False, scale: float | None = None,
                     check_values: bool = True, config=None, out=None):
    """Attention of sequences packed without padding (FlashAttention's varlen forward).

    Args:
        q: (total_q, Hq, D) float16 or bfloat16 CUDA tensor: every sequence's queries, one
            after the other.
        k, v: (total_k, Hkv, D), q's dtype and device; Hq % Hkv == 0 (GQA/MQA: query head h
            reads key/value head h // (Hq // Hkv)). Any strides with a contiguous last
            dimension (others are copied). v may have its own head dim Dv (the output's).
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 on q's device: 0, then the cumulative
            lengths; ``cu_seqlens_q[-1] == total_q``, ``cu_seqlens_k[-1] == total_k``. Empty
            sequences are allowed.
        max_seqlen_q, max_seqlen_k: the longest query and key lengths (the grid is sized by
            ``max_seqlen_q``; a sequence longer than either is an error).
        causal: query row ``i`` of a sequence with ``len_q`` queries and ``len_k`` keys sits at
            position ``len_k - len_q + i`` and sees keys ``0 ..`` that position (bottom-right,
            as FlashAttention 2.1 and later; ``len_q == len_k`` is the usual causal mask)::

                len_q = len_k = 3          len_q = 2, len_k = 4
                    k0 k1 k2                   k0 k1 k2 k3
                q0   x  .  .               q0   x  x  x  .
                q1   x  x  .               q1   x  x  x  x
                q2   x  x  x

        scale: softmax scale, default 1/sqrt(D).
        check_values: read the offsets on the host and raise ValueError for a bad one (a
            synchronisation). With False (e.g. under CUDA-graph capture) the kernel clamps
            offsets for addressing and writes NaN for a sequence whose offsets are out of
            range or decreasing, or that is longer than ``max_seqlen_q`` / ``max_seqlen_k``.
        config: a ``flashattn.config.Config`` (tiles and hints) to pin; default
            ``kernels.varlen_config(arch, D)``.
        out: optional (total_q, Hq, D) output tensor of q's dtype (its last dimension
            contiguous).

    Returns:
        (total_q, Hq, D) in q's dtype. A row that sees no key (an empty key sequence, or
        causal with ``len_q > len_k``) is 0, as FlashAttention's. On ``meta`` tensors (all of
        q, k, v and the offsets; a model built on the meta device) an empty meta tensor of that
        shape, as ``flashattn.attention`` gives: shapes and dtypes checked, offsets not read.

    Differentiable in q, k, v (``varlen_op``); ``out=`` is then refused, as PyTorch's ``out=``
    functions refuse autograd.

    Raises:
        TypeError, ValueError: as ``flashattn.contract.check_varlen_tensors``; bad offsets (with
            ``check_values``) name the offset and the rule it breaks.
        RuntimeError: ``out=`` while q, k or v requires grad (and grad mode is on).
    """
    import torch
    grad = torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v))
    from .value_dim import differs, pad_heads
    if differs(q, k, v) and not (grad and out is not None):
        # A value head dim other than the query's: zero-padded to one head dim, sliced back.
        q, k, v, scale, dv = pad_heads(q, k, v, scale)
        o = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             causal=causal, scale=scale, check_values=check_values,
                             config=config)[..., :dv]
        return o.contiguous() if out is None else out.copy_(o)
    if grad or torch.compiler.is_compiling():
        if out is not None:
            raise RuntimeError(
                "attention_varlen(): out= does not support automatic differentiation, but one "
                "of q, k, v requires grad; drop out= (or call it under torch.no_grad())" if grad
                else "attention_varlen(): out= is not supported under torch.compile; drop out=")
        _check_scalars(max_seqlen_q, max_seqlen_k, causal, scale, check_values, config)
        return _operator().forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, causal=bool(causal), scale=scale,
                                   check_values=bool(check_values), config=config)
    return _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    causal=causal, scale=scale, check_values=check_values, config=config,
                    out=out)


def _operator():
    """The torch.library operators (``varlen_op``), loaded on the first differentiable or
    compiled call so that importing this module does not import torch."""
    from . import varlen_op
    varlen_op._IMPL.update(forward=_forward, backward=attention_varlen_backward)
    return varlen_op


def _check_scalars(max_seqlen_q, max_seqlen_k, causal, scale, check_values, config) -> None:
    """The arguments the operator's schema types, checked before it (isinstance only:
    ``torch.compile`` traces this); the tensors are the operator's to check."""
    import torch
    from .config import Config
    for name, x in (("causal", causal), ("check_values", check_values)):
        if isinstance(x, torch.Tensor) or not isinstance(x, (bool, int)):
            raise TypeError(f"{name} must be a bool, got {type(x).__name__}")
    for name, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float, type(None))):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a flashattn.config.Config (tiles and hints, e.g. "
                        f"Config(64, 64)) or None, got {type(config).__name__}")


def _forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal,
             scale, check_values, config, out):
    """``attention_varlen`` without autograd: the checks and the kernel's launch."""
    import torch
    from .contract import check_causal, check_out
    causal = check_causal(causal)
    interp = interpreting(getattr(q, "device", None))
    dims = check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                causal=causal, scale=scale, check_values=check_values,
                                interpret=interp)
    check_out(out)
    from .config import Config
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a flashattn.config.Config (tiles and hints, e.g. "
                        f"Config(64, 64)) or None, got {type(config).__name__}")
    if out is None:
        out = torch.empty((dims.total_q, dims.Hq, dims.D), dtype=q.dtype, device=q.device)
    elif (tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device
          or out.stride(-1) != 1):
        raise ValueError(f"out must be a {tuple(q.shape)} tensor of {q.dtype} on {q.device} "
                         f"with a contiguous last dimension, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    if q.device.type == "meta":
        return out                  # shapes only (check_varlen_tensors): nothing launches
    if dims.total_q == 0:
        return out
    if dims.total_k == 0:
        return out.zero_()                        # no sequence has a key: every row is 0
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(dims.D)
    arch = device_arch(q.device)                  # interpreted: the GPU it stands in for
    plan = varlen_plan(dims, max_seqlen_q=max_seqlen_q, causal=causal, arch=arch,
                       config=config)
    cu_q = cu_seqlens_q if cu_seqlens_q.stride(0) == 1 else cu_seqlens_q.contiguous()
    cu_k = cu_seqlens_k if cu_seqlens_k.stride(0) == 1 else cu_seqlens_k.contiguous()
    # Head-major views, no copy: (total, H, D) -> (H, total, D).
    args = VARLEN_FWD.args(
        dict(Q=q.permute(1, 0, 2), K=k.permute(1, 0, 2), V=v.permute(1, 0, 2),
             Out=out.permute(1, 0, 2), CuSeqlensQ=cu_q, CuSeqlensK=cu_k),
        dict(qk_scale=scale, group_size=dims.Hq // dims.Hkv, max_seqlen_q=max_seqlen_q,
             max_seqlen_k=max_seqlen_k),
        plan["constants"])
    cfg = plan["config"]
    with on_device(q.device), expect(
            q.device, lambda: varlen_steps(cu_q, cu_k, dims, cfg, causal=causal),
            "flashattn.attention_varlen"):
        launch_kernel(q.device, plan["grid"], hinted(VARLEN_FWD.kernel(), cfg.hints()), args)
    return out


def _lengths(cu_seqlens_q, cu_seqlens_k) -> list[tuple[int, int]]:
    """(len_q, len_k) of each sequence, read on the host (negative lengths count as 0)."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(max(0, cq[b + 1] - cq[b]), max(0, ck[b + 1] - ck[b])) for b in range(len(cq) - 1)]


def varlen_steps(cu_seqlens_q, cu_seqlens_k, dims, config, *, causal: bool,
                 passes: int = 1) -> int:
    """(query tile, key tile) steps of ``passes`` kernels over every sequence at ``config``'s
    tiles (``dispatch.expect``'s estimate; the offsets are read on the host: CPU tensors)."""
    return passes * dims.Hq * sum(
        attention_steps(lq, lk, config.TILE_M, config.TILE_N, causal=causal, offset=lk - lq)
        for lq, lk in _lengths(cu_seqlens_q, cu_seqlens_k))


# --- the backward: the square kernels, once per sequence ----------------------------------------
def check_varlen_grad_tensors(q, out, dout) -> None:
    """out and dout: torch tensors of q's shape, dtype and device (any strides: copied)."""
    from .launch_bwd import check_like_q
    check_like_q(q, "(total_q, Hq, D)", out=out, dout=dout)


def _square(t):
    """(len, H, D) rows of one sequence -> a contiguous (1, H, len, D) copy."""
    return t.permute(1, 0, 2).unsqueeze(0).contiguous()


def _sequence_backward(q, k, v, dout, *, causal: bool, scale: float, input_pos: int,
                       config=None):
    """(dq, dk, dv) of one sequence, (len, H, D) each, where every query row sees a key: the
    square forward recomputes its output and LSE, the square backward differentiates it. The
    two are looked up on their modules at each call (the CPU tests replace them)."""
    from . import autograd, launch_bwd
    q4, k4, v4, do4 = (_square(t) for t in (q, k, v, dout))
    out4, lse = autograd.forward_lse(q4, k4, v4, causal=causal, scale=scale,
                                     input_pos=input_pos, config=config)
    grads = launch_bwd.launch_backward(q4, k4, v4, out4, do4, lse, causal=causal, scale=scale,
                                       input_pos=input_pos)
    return tuple(g[0].permute(1, 0, 2) for g in grads)


def attention_varlen_backward(q, k, v, out, dout, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                              scale: float | None = None, check_values: bool = True):
    """dQ, dK, dV of ``attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)``.

    Composed from the square kernels, once per sequence (a recomputed forward with its LSE,
    then the square backward): B sequences cost B forwards and 3B backward launches. It reads
    the offsets on the host, so it cannot run under CUDA-graph capture. A row that sees no key
    (bottom-right causal alignment, as the forward) gets dq 0.

    Args:
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale: the
            forward's (``attention_varlen``).
        out, dout: the forward's output and its gradient, (total_q, Hq, D) in q's dtype, any
            strides (out is checked; each sequence's output is recomputed with its LSE).
        check_values: the forward's; the offsets are always read and checked here.

    Returns:
        (dq, dk, dv) packed as q, k, v (contiguous), in their dtype; dk and dv summed over each
        GQA group. Rows of dq that see no key, and key rows no query sees, are 0.

    Raises:
        TypeError, ValueError: as the forward (``contract.check_varlen_tensors``), out or dout
            not of q's shape, dtype and device, bad offsets, or a call under CUDA-graph capture.
    """
    import torch

    from .contract import check_causal, check_varlen_values
    causal = check_causal(causal)
    if not isinstance(check_values, bool):
        raise TypeError(f"check_values must be True or False, got {check_values!r}")
    dims = check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                causal=causal, scale=scale, check_values=False,
                                interpret=interpreting(getattr(q, "device", None)))
    check_varlen_grad_tensors(q, out, dout)
    if q.device.type == "meta":     # shapes only, as the forward: no offsets to loop over
        return tuple(torch.empty(t.shape, dtype=t.dtype, device="meta") for t in (q, k, v))
    if cu_seqlens_q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise ValueError("attention_varlen_backward reads cu_seqlens on the host (it loops over "
                         "the sequences), which CUDA-graph capture does not allow")
    offsets = torch.stack([cu_seqlens_q, cu_seqlens_k]).tolist()      # one host read
    cq, ck = offsets
    check_varlen_values(cq, ck, dims, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    dq, dk, dv = (torch.zeros(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    scale = 1.0 / math.sqrt(dims.D) if scale is None else float(scale)
    # One forward configuration for every sequence, whatever its length (compile once; an
    # autotuned choice per length class compiled and timed a search space per new class).
    config = "first"
    # The estimate: a recomputed forward and two backward kernels per sequence (64x64 tiles).
    from .config import Config
    with torch.no_grad(), expect(
            q.device, lambda: varlen_steps(cu_seqlens_q, cu_seqlens_k, dims, Config(64, 64),
                                           causal=causal, passes=3),
            "flashattn.attention_varlen_backward"):
        for b in range(dims.B):
            len_q, len_k = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
            if len_q == 0 or len_k == 0:
                continue                                 # no query, or no key: gradients 0
            blind = len_q - len_k if causal and len_q > len_k else 0   # rows that see no key
            rows, keys = slice(cq[b] + blind, cq[b + 1]), slice(ck[b], ck[b + 1])
            input_pos = len_k - (len_q - blind) if causal else 0
            dq[rows], dk[keys], dv[keys] = _sequence_backward(
                q[rows].detach(), k[keys].detach(), v[keys].detach(), dout[rows].detach(),
                causal=causal, scale=scale, input_pos=input_pos, config=config)
    return dq, dk, dv
