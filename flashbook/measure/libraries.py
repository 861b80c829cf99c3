"""The library baselines as callables: PyTorch SDPA's backends, FlexAttention and TileGym.

``library_fn(impl, q, k, v, causal=, scale=)`` gives ``(fn, context)``: ``fn()`` returns the
library's output (differentiable when the inputs require grad) and runs inside ``context()``.
Shared by the forward benchmarks (``bench``) and the backward ones (``bench_bwd``).
"""
from __future__ import annotations

from ..impls import IMPLS

_FLEX = {}


def _flex_fn():
    """flex_attention compiled once per process (torch.compile caches per shape)."""
    if "fn" not in _FLEX:
        import torch
        from torch.nn.attention.flex_attention import flex_attention
        # One compiled graph per shape and dtype: a record run sees a dozen, more than
        # dynamo's default limit of 8 (past it, flex_attention would run eagerly).
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = max(
                512, torch._dynamo.config.accumulated_cache_size_limit)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def _causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def library_fn(impl: str, q, k, v, *, causal: bool, scale: float):
    """(fn, context): ``fn()`` returns the library's output and runs inside ``context()``.

    The backend is chosen by a context entered around the whole measurement, not inside the
    timed call, so its Python overhead stays out of the numbers. Raises if unsupported.
    """
    import contextlib

    import torch
    backend = IMPLS[impl].backend
    gqa = q.shape[1] != k.shape[1]
    if backend == "tilegym":   # TileGym's cuTile kernels, as shipped (its own autotuning)
        from .tilegym import kernels
        fwd, fwd_bwd, _ = kernels()
        # Its inference forward, or its autograd forward (LSE kept) when gradients are wanted.
        f = fwd_bwd if any(t.requires_grad for t in (q, k, v)) else fwd
        return (lambda: f(q, k, v, scaling=scale, is_causal=causal)), contextlib.nullcontext
    if backend == "flex":   # FlexAttention
        from torch.nn.attention.flex_attention import create_block_mask
        flex = _flex_fn()
        N, Nk = q.shape[2], k.shape[2]
        bm = create_block_mask(_causal_mod, None, None, N, Nk, device=q.device) if causal else None
        return (lambda: flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=gqa),
                contextlib.nullcontext)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = getattr(SDPBackend, backend)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kw = dict(is_causal=causal, scale=scale, enable_gqa=True) if gqa else \
        dict(is_causal=causal, scale=scale)
    return (lambda: sdpa(q, k, v, **kw)), (lambda: sdpa_kernel(be))
