"""``flashattn.flex_attention``: PyTorch's FlexAttention interface on the cuTile kernels.

    from torch.nn.attention.flex_attention import create_block_mask
    from flashattn import flex_attention, mods
    bm = create_block_mask(mods.sliding_window(1024), None, None, N, N, device="cuda")
    out = flex_attention(q, k, v, score_mod=mods.softcap(50.0), block_mask=bm)

The signature and the semantics are those of ``torch.nn.attention.flex_attention
.flex_attention``: ``score_mod(score, b, h, q_idx, kv_idx)`` changes each scaled score, the
``BlockMask`` (PyTorch's own, from ``create_block_mask``) lists which key blocks each query
block visits and carries the ``mask_mod``; a row that sees no key gets output 0 and LSE -inf;
the LSE is in natural-log units. Two keyword extras: ``sinks`` (a learnable per-head logit in
every row's denominator, gpt-oss) and ``blasst_threshold`` (dynamic tile skipping, opt-in).

How a mod reaches the kernel: a mod is a ``flashattn.mods.ScoreMod``/``MaskMod`` (a cuTile
``def``, its torch twin and the tensors it reads) or a plain function written with torch
operations (``mods.as_mod``: traced into tile code and its derivative by ``flashattn.modtrace``). Before its first use a mod runs once on small tiles in the
interpreter (``flex_build.probe``): one that cannot, or returns the wrong type or shape, gets a
``TypeError``/``ModError`` naming it before anything compiles; a compiler failure on the GPU is
re-raised as ``ModError`` with the compiler's message.

The modules: this one (the operator, its checks, ``attention(window_size=, softcap=)``);
``flex_blockmask`` (the BlockMask's checks and cache); ``flex_build`` (probe, kernels built once
per mod pair); ``flex_launch`` (the launches); ``flex_op`` (the torch.library operators:
autograd and ``torch.compile``); ``flex_aot`` (ahead-of-time compiles); ``kernels/flex.py``,
``kernels/flex_bwd.py`` (the kernels) and ``kernels/flex_spec.py`` (specs, tables, plans).
A score function needs a derivative (``ScoreMod.grad``) or ``additive=True`` for the backward;
the sink gets its gradient.
"""
from __future__ import annotations

import math

from .contract import (DENSE_DTYPE_HINT, DENSE_LAYOUT, check_groups, check_head_dims,
                       check_kernel_device, check_kernel_dtype, check_one_device,
                       check_one_dtype, check_rank, check_same_shape, check_scale,
                       check_torch_tensors)
from .dispatch import device_arch, interpreting
from .flex_aot import compile_flex, compile_flex_bwd
from .flex_blockmask import cached_block_mask, check_block_mask
from .flex_build import ModError, flex_bwd_kernels, flex_kernel, probe
from .flex_launch import check_differentiable, forward
from .kernels.flex_spec import (BWD_CONFIG, DEFAULT_CONFIG, FLEX_BWD_CONFIGS,
                                FLEX_BWD_SCORE_CONFIGS, FLEX_CONFIGS, Config, block_mask_tiles,
                                flex_bwd_configs, flex_bwd_plan, flex_plan)

__all__ = ["flex_attention", "ModError", "flex_plan", "FLEX_CONFIGS", "flex_kernel",
           "block_mask_tiles", "attention_masked", "compile_flex", "compile_flex_bwd",
           "flex_bwd_kernels", "FLEX_BWD_CONFIGS", "FLEX_BWD_SCORE_CONFIGS", "BWD_CONFIG",
           "flex_bwd_configs", "flex_bwd_plan", "cached_block_mask"]

KERNEL_OPTIONS = ("BLOCK_M", "BLOCK_N", "BLASST_THRESHOLD")


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None,
                   sinks=None, blasst_threshold=None):
    """FlexAttention (``torch.nn.attention.flex_attention.flex_attention``'s signature) on the
    cuTile kernel.

    Args:
        query: (B, Hq, Nq, D) float16 or bfloat16 CUDA tensor (or CPU, run by the interpreter
            with ``FLASHATTN_INTERPRET=1`` or inside ``flashattn.interpret.enabled()``).
        key, value: (B, Hkv, Nk, D), query's dtype and device; Hq != Hkv needs ``enable_gqa``
            (query head h reads key/value head h // (Hq // Hkv)). D up to 256.
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score`` on the scaled score: a
            ``flashattn.mods.ScoreMod`` or a ``def`` written with Python operators and
            ``cuda.tile`` functions; None: plain attention.
        block_mask: a ``BlockMask`` from PyTorch's ``create_block_mask`` for (Nq, Nk), on the
            query's device; its ``mask_mod`` (a ``MaskMod`` or such a ``def``) is compiled in and
            evaluated on the partial blocks only; blocks it does not list are never loaded. Its
            block sizes must be multiples of 16 (the kernel's tiles divide them).
        scale: softmax scale, default 1/sqrt(D).
        return_lse / return_aux: also return the natural-log LSE (fp32 (B, Hq, Nq); -inf for a
            row with no key): ``(out, lse)``, or ``(out, AuxOutput(lse=...))`` for
            ``return_aux=AuxRequest(lse=True)``. ``max_scores`` is not implemented (raises).
        kernel_options: ``{"BLOCK_M": int, "BLOCK_N": int, "BLASST_THRESHOLD": float}``;
            other keys raise.
        sinks: float (Hq,) per-head sink logits (gpt-oss): ``exp(sinks[h])`` joins every row's
            denominator (the LSE returned includes it). Not in PyTorch's FlexAttention.
        blasst_threshold: T > 0 (log2 units): drop a key tile whose row maxima all fall more
            than T below the running maxima (BLASST): approximate, off by default.

    Returns:
        (B, Hq, Nq, D) in query's dtype (and the LSE as asked). Differentiable in query, key,
        value and sinks (the flex backward kernels, through a ``torch.autograd.Function``) for
        any mask and a score_mod with a derivative (``ScoreMod.grad`` or ``additive``: the
        shipped ones); a score_mod without one, or BLASST, raises NotImplementedError when a
        gradient is needed. The LSE is not differentiable.

    Raises:
        TypeError, ValueError: bad tensors, block masks, mods or options (the message names
            which); ``ModError`` (a ValueError) for a mod that cannot run or compile.
    """
    return _flex(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
                 kernel_options, return_aux=return_aux, sinks=sinks,
                 blasst_threshold=blasst_threshold, checked=False)


def _flex(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
          kernel_options, *, return_aux, sinks, blasst_threshold, checked: bool):
    """``flex_attention``; ``checked``: the caller ran the dense contract on the tensors and the
    scale (``attention(window_size=...)``), so they are checked once per call."""
    import torch
    ko = dict(kernel_options or {})
    bad = [k for k in ko if k not in KERNEL_OPTIONS]
    if bad:
        raise ValueError(f"kernel_options {bad} are not supported by flashattn.flex_attention "
                         f"(supported: {', '.join(KERNEL_OPTIONS)})")
    if "BLASST_THRESHOLD" in ko:
        if blasst_threshold is not None:
            raise ValueError("give the BLASST threshold once: blasst_threshold= or "
                             "kernel_options['BLASST_THRESHOLD']")
        blasst_threshold = ko.pop("BLASST_THRESHOLD")
    if blasst_threshold is not None:
        if isinstance(blasst_threshold, bool) or not isinstance(blasst_threshold, (int, float)) \
                or not blasst_threshold > 0 or not math.isfinite(blasst_threshold):
            raise ValueError(f"blasst_threshold must be a positive finite number of log2 units, "
                             f"got {blasst_threshold!r}")
    want_lse = bool(return_lse)
    if return_aux is not None:
        if return_lse:
            raise ValueError("give return_lse or return_aux, not both (return_lse is deprecated "
                             "in PyTorch for return_aux=AuxRequest(lse=True))")
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("flashattn.flex_attention does not return max_scores")
        want_lse = bool(getattr(return_aux, "lse", False))
    from .flex_inputs import adapt       # PyTorch's broadcast K/V, Dv != D, empty BlockMask
    query, key, value, block_mask, scale, dv = adapt(query, key, value, block_mask, scale)
    if not checked:
        # The dense family's rules (contract), under the names of torch's flex_attention.
        check_torch_tensors(query=query, key=key, value=value)
        for n, t in (("query", query), ("key", key), ("value", value)):
            check_rank(n, t.shape, 4, DENSE_LAYOUT)
        check_kernel_dtype("query", query, "flashattn kernels take", DENSE_DTYPE_HINT)
        check_one_dtype(query=query, key=key, value=value)
        check_one_device(query=query, key=key, value=value)
        check_kernel_device(query, interpreting(query.device), "flashattn kernels run",
                            "torch.nn.attention.flex_attention.flex_attention")
    device = query.device
    B, Hq, Nq, D = query.shape
    Bk, Hkv, Nk, Dk = key.shape
    if not checked:
        check_same_shape("key", "value", key.shape, value.shape)
        if Bk != B:
            raise ValueError(f"batch size differs: query has {B}, key and value have {Bk}")
        check_head_dims(D, Dk, "key and value")
        if Hq != Hkv:
            if not enable_gqa:
                raise ValueError(f"query has {Hq} heads and key {Hkv}: pass enable_gqa=True for "
                                 "grouped-query attention")
            check_groups(Hq, Hkv)
        check_scale(scale, positive=False)      # any finite scale, as torch's flex_attention
    if scale is None:
        scale = 1.0 / math.sqrt(D)

    from .mods import as_mod
    score = as_mod(score_mod, "score") if score_mod is not None else None
    tensors, block_size, mask = [], None, None
    if block_mask is not None:
        tensors, block_size, mask_fn = check_block_mask(block_mask, B=B, Hq=Hq, Nq=Nq, Nk=Nk,
                                                         device=device)
        mask = as_mod(mask_fn, "mask") if mask_fn is not None else None
    for m in (score, mask):
        if m is None:
            continue
        for n, t in m.tensors:
            if t.device != device:
                raise ValueError(f"{m.kind}_mod {m.name!r}: its tensor {n} is on {t.device} but "
                                 f"the query on {device} (mod.to(device))")
        if not torch.compiler.is_compiling():      # the compiled kernel checks it then
            probe(m, m.kind)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (Hq,):
            raise ValueError(f"sinks must be a ({Hq},) tensor (one logit per query head), got "
                             f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else sinks!r}")
        if sinks.device != device:
            raise ValueError(f"sinks is on {sinks.device} but query on {device}")
        sinks = sinks.to(torch.float32).contiguous()

    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (query, key, value)) or
        (sinks is not None and sinks.requires_grad))
    if sinks is not None and not needs_grad:
        sinks = sinks.detach()
    plan_args = dict(score=score, mask=mask, tensors=tensors, block_size=block_size,
                     scale=float(scale), blasst=blasst_threshold, ko=ko,
                     block_mask=block_mask)
    if needs_grad or torch.compiler.is_compiling():
        # Through the torch.library operator: autograd, and torch.compile sees one opaque op.
        if needs_grad:
            check_differentiable(score, block_mask, blasst_threshold)
        elif blasst_threshold is not None:
            raise NotImplementedError("blasst_threshold under torch.compile: call it eagerly")
        from . import flex_op
        out, lse = flex_op.forward(query, key, value, sinks, score=score, mask=mask,
                                   block_mask=block_mask, ko=ko, scale=float(scale))
        if not want_lse:
            lse = None
    else:
        out, lse = forward(query, key, value, sinks, want_lse=want_lse, **plan_args)
    if dv is not None:
        out = out[..., :dv].contiguous()     # V was padded to the query's head dim
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse, max_scores=None)
    return (out, lse) if want_lse else out


def _check_window(window_size):
    if window_size is None:
        return -1, -1
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or any(
            isinstance(w, bool) or not isinstance(w, int) for w in window_size):
        raise TypeError(f"window_size must be a (left, right) pair of ints (-1: unbounded), "
                        f"got {window_size!r}")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1: unbounded), got {window_size}")
    return left, right


def _check_softcap(softcap):
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or \
            not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    return float(softcap)


def attention_masked(q, k, v, *, causal, scale, input_pos, step, window_size, softcap):
    """``flashattn.attention`` with flash-attn's ``window_size``/``softcap``: the flex kernel
    with ``mods.sliding_window`` (or ``mods.causal``) as a BlockMask and ``mods.softcap`` as the
    score function. None when both are off (window (-1, -1), softcap 0): the dense path then.

    Query row i sits at position ``p = input_pos + i`` (``attention``'s convention) and sees
    keys ``p - left .. p + right`` (-1: unbounded), and none past ``p`` when causal. Only
    ``step="best"`` routes here: a named step's kernel has no window or softcap, so naming one
    with them raises (nothing is silently dropped). Differentiable (the flex backward)."""
    import torch
    from . import mods
    left, right = _check_window(window_size)
    cap = _check_softcap(softcap)
    if (left, right) == (-1, -1) and cap == 0.0:
        return None
    if step != "best":
        raise ValueError(f"step={step!r} has no window_size/softcap: these run on the flex "
                         "kernels, which step='best' (the default) selects")
    if torch.compiler.is_compiling():
        raise NotImplementedError("window_size/softcap under torch.compile: the flex kernels are "
                                  "not a torch.library operator yet; call it eagerly")
    from .contract import check_tensors
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                  interpret=interpreting(getattr(q, "device", None)))
    if causal:
        right = 0 if right == -1 else min(right, 0)
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    mask = None
    if (left, right) != (-1, -1):
        # The window and the offset as a tensor the mask reads: one compiled kernel for every
        # window size and input_pos (a closure constant would compile one per value).
        from .flash_attn_mods import window_mask
        mask = window_mask(left, right, int(input_pos), q.device)
    score = mods.softcap(cap) if cap else None
    bm = None
    if mask is not None:
        arch = device_arch(q.device)
        cfg = FLEX_CONFIGS.get(arch, DEFAULT_CONFIG)
        bm = cached_block_mask(mask, Nq, Nk, q.device, (cfg.TILE_M, cfg.TILE_N))
    return _flex(q, k, v, score, bm, scale, q.shape[1] != k.shape[1], False, None,
                 return_aux=None, sinks=None, blasst_threshold=None, checked=True)
