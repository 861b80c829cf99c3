"""flashattn as a differentiable PyTorch operator.

    out = flashattn.attention(q, k, v, causal=True)   # q, k or v requires grad: through the op
    out.float().square().sum().backward()               # dq, dk, dv from kernels/fmha_bwd.py

Two ``torch.library`` custom operators, one opaque node each for autograd,
``torch.compile(fullgraph=True)`` and FakeTensor tracing:

    flashattn::attention_fwd(q, k, v, causal, scale, input_pos, step) -> (out, lse)
    flashattn::attention_bwd(dout, q, k, v, out, lse, causal, scale, input_pos) -> (dq, dk, dv)

The first writes the LSE (``WRITE_LSE``; fp32, natural log) and has the second as its backward
(``register_autograd``); their fake implementations serve tracing and the ``meta`` device.
``attention`` and ``sdpa`` take this path when an input requires grad or under
``torch.compile``. Tensors are checked once per call, with the same errors eagerly and traced.
"""
from __future__ import annotations

import math

import torch

from .contract import (check_causal, check_scale, check_tensor_meta, check_tensors,
                       check_torch_tensors, is_meta)

__all__ = ["attention", "attention_forward", "attention_fwd", "attention_bwd"]


def _check_meta(q, k, v, causal, scale, input_pos) -> None:
    """The contract without the device: what a fake tensor can be checked for."""
    check_tensor_meta(q, k, v, causal=causal, scale=scale, input_pos=input_pos)


# --- the forward ----------------------------------------------------------------------------
@torch.library.custom_op("flashattn::attention_fwd", mutates_args=())
def attention_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float | None, input_pos: int, step: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): the fused forward of ``step`` (``"best"``: ``autotune.resolve``'s choice)
    with the LSE written; lse is fp32 (B, Hq, Nq) in natural-log units."""
    from .dispatch import target_of
    target = target_of(q.device)                     # asked once, passed down
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                  interpret=target.interpreting)
    return forward_lse(q, k, v, causal=causal, scale=scale, input_pos=input_pos, step=step,
                       target=target)


def forward_lse(q, k, v, *, causal: bool, scale: float | None, input_pos: int = 0,
                step: str = "best", config=None, target=None):
    """``attention_fwd`` on inputs ``contract.check_tensors`` has passed: (out, lse), no check
    of the tensors again (the varlen backward calls this once per sequence). ``config``: run
    ``step`` with these tiles instead of the ones chosen for the shape, or ``"first"``: its
    first configuration on this architecture, whatever the shape (no autotuning: the same
    compiled kernels for every length). ``target``: the ``dispatch.Target`` of q's device,
    if the caller has it."""
    from .autotune import resolve
    from .launch import launch
    B, Hq, Nq, D = q.shape
    out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    s, config = resolve(step, q, k, causal, target, config=config)
    if s.kernel != "fmha":
        raise ValueError(f"step {s.name!r} does not write the LSE the backward needs; "
                         "use a fused step (any but 'naive')")
    launch(q, k, v, out, s, config, causal=causal, scale=scale, input_pos=input_pos, lse=lse,
           target=target)
    return out, lse


@attention_fwd.register_fake
def _attention_fwd_fake(q, k, v, causal, scale, input_pos, step):
    _check_meta(q, k, v, causal, scale, input_pos)
    B, Hq, Nq, D = q.shape
    return q.new_empty((B, Hq, Nq, D)), q.new_empty((B, Hq, Nq), dtype=torch.float32)


# --- the backward ---------------------------------------------------------------------------
@torch.library.custom_op("flashattn::attention_bwd", mutates_args=())
def attention_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float | None,
                  input_pos: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``attention_fwd`` for the upstream gradient ``dout``."""
    from .launch_bwd import attention_backward
    return attention_backward(q, k, v, out, dout, lse, causal=causal, scale=scale,
                              input_pos=input_pos)


@attention_bwd.register_fake
def _attention_bwd_fake(dout, q, k, v, out, lse, causal, scale, input_pos):
    _check_meta(q, k, v, causal, scale, input_pos)
    for name, t in (("out", out), ("dout", dout)):
        if tuple(t.shape) != tuple(q.shape) or t.dtype != q.dtype:
            raise ValueError(f"{name} must have q's shape and dtype")
    if tuple(lse.shape) != tuple(q.shape[:3]) or lse.dtype != torch.float32:
        raise ValueError("lse must be float32 (B, Hq, Nq)")
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, input_pos, _step = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale, ctx.input_pos = causal, scale, input_pos
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, ctx.causal, ctx.scale, ctx.input_pos)
    return dq, dk, dv, None, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)


# --- entry points ---------------------------------------------------------------------------
def _checked(q, k, v, causal, scale, input_pos, step):
    from .registry import get_step
    if torch.compiler.is_compiling():
        # contract.check_causal reads type(causal).__module__, which dynamo cannot trace.
        if isinstance(causal, torch.Tensor) or not isinstance(causal, (bool, int)):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        causal = bool(causal)
    else:
        # Eager: the errors at the call, as flashattn.attention's inference path raises them.
        causal = check_causal(causal)
        if not isinstance(step, str):
            raise TypeError(f"step must be a str, got {type(step).__name__}")
        if step != "best" and get_step(step).kernel != "fmha":
            raise ValueError(f"step {step!r} does not write the LSE the backward needs; use a "
                             "fused step (any but 'naive')")
        # The tensors are the operator's to check, once: the real implementation checks them
        # all, the fake one (meta tensors, tracing) all but the device.
        check_torch_tensors(q=q, k=k, v=v)
        if len({is_meta(t) for t in (q, k, v)}) > 1:      # else the dispatcher picks one
            raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, "
                             f"{v.device}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float, type(None))):
        check_scale(scale)                    # its TypeError, before float() raises another
    return causal, (None if scale is None else float(scale))


def attention_forward(q, k, v, *, causal: bool = False, scale: float | None = None,
                      input_pos: int = 0, step: str = "best"):
    """``(out, lse)``: ``flashattn.attention``'s output and each query row's log-sum-exp of its
    scaled scores, fp32 (B, Hq, Nq), natural log (what PyTorch's flash kernel returns as
    ``logsumexp``). Differentiable in out; lse carries no gradient."""
    causal, scale = _checked(q, k, v, causal, scale, input_pos, step)
    return attention_fwd(q, k, v, causal, scale, int(input_pos), step)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              input_pos: int = 0, step: str = "best"):
    """``flashattn.attention`` through the differentiable operator (see the module docstring)."""
    return attention_forward(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                             step=step)[0]

