"""flex_attention as torch.library operators: ``flashattn::flex_fwd`` and
``flashattn::flex_bwd``, so autograd and ``torch.compile`` see one opaque operator each.

A mod is a Python object and cannot be an operator argument (its tensors can): the operator
takes the tensors (the BlockMask's block lists, each mod's tensors, the sinks) and an int, the
id of a *plan* registered here once per distinct (score_mod, mask_mod, block size, sequence
lengths, options): the mods' functions, the block size, and which tensors are which. The
forward returns (out, lse); its backward (``register_autograd``) calls ``flex_bwd``, which
returns dq, dk, dv and the sinks' gradient.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from . import flex_launch

__all__ = ["flex_fwd", "flex_bwd", "register_plan", "forward"]

_PLANS: list = []
_PLAN_IDS: dict = {}
_BLOCK_NAMES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
                "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def register_plan(*, score, mask, block_mask, ko) -> tuple[int, list]:
    """(plan id, the block tensors in the plan's order) for one call's static part."""
    names = () if block_mask is None else tuple(n for n in _BLOCK_NAMES
                                                if getattr(block_mask, n, None) is not None)
    seq = None if block_mask is None else tuple(block_mask.seq_lengths)
    bs = None if block_mask is None else _bs(block_mask.BLOCK_SIZE)
    pid = _plan_id(score, mask, names, seq, bs, tuple(sorted(ko.items())))
    return pid, [getattr(block_mask, n) for n in names]


@torch.compiler.assume_constant_result
def _plan_id(score, mask, names, seq, bs, ko_items) -> int:
    """The plan's id, registered now (run at trace time under torch.compile: a constant)."""
    key = (score.tile if score else None, score.grad if score else None,
           tuple(score.params.items()) if score else None, len(score.tensors) if score else 0,
           mask.tile if mask else None, tuple(mask.params.items()) if mask else None,
           len(mask.tensors) if mask else 0, names, seq, bs, ko_items)
    pid = _PLAN_IDS.get(key)
    if pid is None:
        _PLANS.append(dict(score=score, mask=mask, names=list(names), ko=dict(ko_items),
                           seq=seq, bs=bs))
        pid = _PLAN_IDS.setdefault(key, len(_PLANS) - 1)
    return pid


def _bs(bs):
    return (bs, bs) if isinstance(bs, int) else tuple(int(x) for x in bs)


def _rebuild(plan_id, blocks, score_tensors, mask_tensors):
    """The plan's mods with these tensors, and a BlockMask stand-in of these block lists."""
    p = _PLANS[plan_id]
    score = p["score"].with_values(score_tensors) if p["score"] is not None else None
    mask = p["mask"].with_values(mask_tensors) if p["mask"] is not None else None
    bm = None
    if p["names"]:
        bm = SimpleNamespace(**{n: None for n in _BLOCK_NAMES})
        for n, t in zip(p["names"], blocks):
            setattr(bm, n, t)
        bm.seq_lengths, bm.BLOCK_SIZE, bm.mask_mod = p["seq"], p["bs"], mask
    tensors = [] if bm is None else [(n, getattr(bm, n)) for n in _BLOCK_NAMES[:4]
                                     if getattr(bm, n) is not None]
    return dict(score=score, mask=mask, tensors=tensors, block_size=p["bs"], ko=p["ko"],
                block_mask=bm, blasst=None)


@torch.library.custom_op("flashattn::flex_fwd", mutates_args=())
def flex_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
             blocks: list[torch.Tensor], score_tensors: list[torch.Tensor],
             mask_tensors: list[torch.Tensor], plan_id: int, scale: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of flex attention under plan ``plan_id``; ``sinks``: (Hq,) or empty."""
    plan = _rebuild(plan_id, blocks, score_tensors, mask_tensors)
    return flex_launch.forward(q, k, v, sinks if sinks.numel() else None, want_lse=True,
                               scale=scale, **plan)


@flex_fwd.register_fake
def _flex_fwd_fake(q, k, v, sinks, blocks, score_tensors, mask_tensors, plan_id, scale):
    B, Hq, Nq, D = q.shape
    return q.new_empty((B, Hq, Nq, D)), q.new_empty((B, Hq, Nq), dtype=torch.float32)


@torch.library.custom_op("flashattn::flex_bwd", mutates_args=())
def flex_bwd(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             out: torch.Tensor, lse: torch.Tensor, sinks: torch.Tensor,
             blocks: list[torch.Tensor], score_tensors: list[torch.Tensor],
             mask_tensors: list[torch.Tensor], plan_id: int, scale: float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks) of ``flex_fwd``; dsinks empty without sinks."""
    plan = _rebuild(plan_id, blocks, score_tensors, mask_tensors)
    dq, dk, dv, ds = flex_launch.backward(q, k, v, out, dout, lse,
                                          sinks if sinks.numel() else None, scale=scale, **plan)
    return dq, dk, dv, (ds.to(sinks.dtype) if ds is not None else sinks.new_empty(0))


@flex_bwd.register_fake
def _flex_bwd_fake(dout, q, k, v, out, lse, sinks, blocks, score_tensors, mask_tensors,
                   plan_id, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), \
        sinks.new_empty(sinks.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, sinks, blocks, st, mt, plan_id, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, sinks, *blocks, *st, *mt)
    ctx.n = (len(blocks), len(st), len(mt))
    ctx.plan_id, ctx.scale = plan_id, scale
    ctx.mark_non_differentiable(lse)


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse, sinks, *rest = ctx.saved_tensors
    nb, ns, nm = ctx.n
    blocks, st, mt = rest[:nb], rest[nb:nb + ns], rest[nb + ns:nb + ns + nm]
    dq, dk, dv, ds = flex_bwd(dout.contiguous(), q, k, v, out, lse, sinks, list(blocks),
                              list(st), list(mt), ctx.plan_id, ctx.scale)
    return (dq, dk, dv, (ds if sinks.numel() else None), [None] * nb, [None] * ns, [None] * nm,
            None, None)


flex_fwd.register_autograd(_backward, setup_context=_setup_context)


def forward(q, k, v, sinks, *, score, mask, block_mask, ko, scale):
    """(out, lse) through the operator (differentiable in q, k, v and sinks)."""
    pid, blocks = register_plan(score=score, mask=mask, block_mask=block_mask, ko=ko)
    if sinks is None:
        sinks = q.new_empty(0, dtype=torch.float32)
    st = list(score.tensor_values()) if score is not None else []
    mt = list(mask.tensor_values()) if mask is not None else []
    return flex_fwd(q, k, v, sinks, list(blocks), st, mt, pid, float(scale))
