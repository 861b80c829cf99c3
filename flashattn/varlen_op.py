"""``attention_varlen`` as torch.library operators, as the dense path (``flashattn.autograd``):
autograd, ``torch.compile(fullgraph=True)`` and FakeTensor tracing see one opaque node each.

    flashattn::attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, causal, scale, check_values, config) -> out
    flashattn::attention_varlen_bwd(dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k,
                                    max_seqlen_q, max_seqlen_k, causal, scale) -> (dq, dk, dv)

The first runs ``varlen``'s forward (its contract checked there, once), the second
``varlen.attention_varlen_backward``; ``register_autograd`` wires one to the other. Both have
fake implementations (shapes and dtypes; the offsets' values are not read), which also serve
the ``meta`` device. A ``Config`` cannot be an operator argument: it travels as its label.
"""
from __future__ import annotations

import torch

from .contract import check_varlen_tensors

__all__ = ["attention_varlen_fwd", "attention_varlen_bwd", "forward"]

_IMPL: dict = {}        # "forward", "backward": set by flashattn.varlen (no import cycle)


def _config(label):
    from .config import Config
    return None if label is None else Config.parse(label)


# --- the forward ----------------------------------------------------------------------------
@torch.library.custom_op("flashattn::attention_varlen_fwd", mutates_args=())
def attention_varlen_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                         max_seqlen_q: int, max_seqlen_k: int, causal: bool,
                         scale: float | None, check_values: bool, config: str | None
                         ) -> torch.Tensor:
    """The packed output (total_q, Hq, D): ``varlen``'s checks and its kernel's launch."""
    return _IMPL["forward"](q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            causal=causal, scale=scale, check_values=check_values,
                            config=_config(config), out=None)


@attention_varlen_fwd.register_fake
def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
              check_values, config):
    # Shapes and dtypes: a fake tensor has no values to read and runs nothing, so neither the
    # offsets nor the device are checked here (the real implementation does, at run time).
    check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                         check_values=False, interpret=True)
    return q.new_empty(q.shape)


# --- the backward ---------------------------------------------------------------------------
@torch.library.custom_op("flashattn::attention_varlen_bwd", mutates_args=())
def attention_varlen_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         out: torch.Tensor, cu_seqlens_q: torch.Tensor,
                         cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int,
                         causal: bool, scale: float | None
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of ``attention_varlen_fwd`` for the upstream gradient ``dout``."""
    return _IMPL["backward"](q, k, v, out, dout, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                             max_seqlen_k, causal=causal, scale=scale)


@attention_varlen_bwd.register_fake
def _bwd_fake(dout, q, k, v, out, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
              causal, scale):
    from .launch_bwd import check_like_q
    check_like_q(q, "(total_q, Hq, D)", out=out, dout=dout)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, _check_values, _config_label = inputs
    ctx.save_for_backward(q, k, v, output, cu_q, cu_k)
    ctx.args = (max_q, max_k, causal, scale)


def _backward(ctx, dout):
    q, k, v, out, cu_q, cu_k = ctx.saved_tensors
    need = ctx.needs_input_grad[:3]
    grads = (None, None, None)
    if any(need):
        grads = attention_varlen_bwd(dout, q, k, v, out, cu_q, cu_k, *ctx.args)
        grads = tuple(g if n else None for g, n in zip(grads, need))
    return (*grads, None, None, None, None, None, None, None, None)


def _no_double_backward(ctx, *grads):
    raise RuntimeError("attention_varlen's backward is not differentiable: it cannot "
                       "differentiate twice (no double backward)")


attention_varlen_fwd.register_autograd(_backward, setup_context=_setup_context)
attention_varlen_bwd.register_autograd(_no_double_backward,
                                       setup_context=lambda ctx, inputs, output: None)


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal,
            scale, check_values, config):
    """``attention_varlen`` through the operator; ``config`` a ``flashattn.config.Config`` or None."""
    return attention_varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, causal, None if scale is None else float(scale),
                                check_values, None if config is None else config.label())
