"""Compile ahead of the first call: ``flashattn.precompile(configs)``.

    import flashattn
    flashattn.precompile([dict(op="attention", head_dim=128, heads=(32, 8), causal=True),
                          dict(op="attention_backward", head_dim=128, heads=(32, 8)),
                          dict(op="flash_attn_func", head_dim=128, heads=(32, 8),
                               window_size=(4096, 0))], processes=4)

A configuration names a public operator and what its kernels are specialised on (dtype, head
dim, head counts, causal, a window, softcap, ALiBi); never lengths or batch sizes: the kernels
do not specialise on them beyond a few length classes (``tests/test_compile_once.py``), and
cuTile's JIT keys each array dimension on whether it is 1 or a multiple of 16. Each
configuration is enumerated on representative shapes covering those classes (``LENGTHS``,
``BATCHES``): the operator runs in the interpreter with ``dispatch.record_launches(run=False)``,
which lists every kernel launch (function, hints, constants, arrays) without running it
(``enumerate_kernels``).

Then, one configuration per worker process, in parallel:

* ``how="export"`` (no GPU needed): each recorded launch is compiled by cuTile's own compile
  path (``compile_tile``, what ``ct.launch`` calls on a cache miss) for ``arch``, with the
  signature cuTile's JIT derives from such arguments, into cuTile's disk cache
  (``CUDA_TILE_CACHE_DIR``); nothing is launched. A first call whose bytecode matches finds its
  cubin there.
* ``how="launch"`` (a GPU): the operator runs once on the representative shapes on the GPU, so
  cuTile's JIT itself compiles and caches exactly what later calls need.

``how=None``: "launch" where a CUDA GPU is present, else "export". Returns one dict per
compiled kernel (configuration, kernel, constants, seconds, error).
"""
from __future__ import annotations

import time
from contextlib import nullcontext

__all__ = ["precompile", "enumerate_kernels", "OPS", "LENGTHS", "BATCHES"]

OPS = ("attention", "attention_backward", "attention_varlen", "attention_varlen_backward",
       "decode", "flash_attn_func", "flash_attn_with_kvcache")
# Sequence lengths covering the classes the kernels and cuTile's JIT key on: whole key tiles,
# a multiple of 16 that is not one, and neither.
LENGTHS = (256, 208, 200)
# Batch sizes: 1 (cuTile keys a dimension of 1) and more.
BATCHES = (1, 2)
_KEYS = {"op", "dtype", "head_dim", "heads", "causal", "window_size", "softcap", "alibi"}


def _check(config) -> dict:
    if not isinstance(config, dict):
        raise TypeError(f"a precompile configuration is a dict, got {type(config).__name__}")
    bad = set(config) - _KEYS
    if bad:
        raise ValueError(f"unknown configuration keys {sorted(bad)}; known: {sorted(_KEYS)}")
    c = dict(dict(dtype="float16", head_dim=128, heads=(32, 8), causal=True, window_size=None,
                  softcap=None, alibi=False), **config)
    if c.get("op") not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {c.get('op')!r}")
    from .contract import check_head_dim, dtype_name, parse_gqa
    c["dtype"] = dtype_name(c["dtype"])
    check_head_dim(c["head_dim"])
    c["heads"] = parse_gqa(c["heads"])
    return c


def _calls(c, n: int, b: int, device):
    """Run configuration ``c``'s operator once on length ``n``, batch ``b``."""
    import torch
    from . import flash_attn_interface as fai
    from .api import attention
    from .decoding import decode
    from .varlen import attention_varlen
    dt = getattr(torch, c["dtype"])
    hq, hkv = c["heads"]
    D = c["head_dim"]

    def t(*shape, grad=False):
        return torch.randn(*shape, dtype=dt, device=device).requires_grad_(grad)
    op = c["op"]
    if op in ("attention", "attention_backward"):
        grad = op == "attention_backward"
        q, k, v = t(b, hq, n, D, grad=grad), t(b, hkv, n, D, grad=grad), t(b, hkv, n, D, grad=grad)
        out = attention(q, k, v, causal=c["causal"], window_size=c["window_size"],
                                  softcap=c["softcap"])
        if grad:
            out.sum().backward()
    elif op in ("attention_varlen", "attention_varlen_backward"):
        grad = op == "attention_varlen_backward"
        lens = [n, max(1, n // 3)] if b > 1 else [n]
        total = sum(lens)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                          device=device)
        q, k, v = t(total, hq, D, grad=grad), t(total, hkv, D, grad=grad), t(total, hkv, D,
                                                                           grad=grad)
        out = attention_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                         causal=c["causal"])
        if grad:
            out.sum().backward()
    elif op == "decode":
        cache = t(b, hkv, 4 * n, D)
        decode(t(b, hq, 1, D), cache, cache,
                         torch.full((b,), 3 * n, dtype=torch.int32, device=device))
    elif op == "flash_attn_func":
        slopes = torch.rand(hq, device=device) if c["alibi"] else None
        fai.flash_attn_func(t(b, n, hq, D), t(b, n, hkv, D), t(b, n, hkv, D),
                            causal=c["causal"], window_size=c["window_size"] or (-1, -1),
                            softcap=c["softcap"] or 0.0, alibi_slopes=slopes)
    elif op == "flash_attn_with_kvcache":
        cache = t(b, 4 * n, hkv, D)
        fai.flash_attn_with_kvcache(t(b, 1, hq, D), cache, cache, t(b, 1, hkv, D),
                                    t(b, 1, hkv, D), cache_seqlens=3 * n, causal=True)


def enumerate_kernels(config, *, arch: str = "sm_90", lengths=LENGTHS, batches=BATCHES):
    """The distinct launches configuration ``config`` makes on the representative shapes, as
    ``dispatch.launch_key`` dicts (with the recorded ``args``), on ``arch``: no GPU, nothing
    run (the interpreter records the launches)."""
    import torch
    from . import interpret
    from .dispatch import _RECORDERS, launch_key
    c = _check(config)
    seen, out = set(), []

    def keep(device, grid, kernel, args):
        key = launch_key(kernel, args)
        ident = (id(key["fn"]), key["hints"], key["constants"], key["arrays"])
        if ident not in seen:
            seen.add(ident)
            out.append(dict(key, grid=tuple(grid), args=tuple(args)))
        return True                                     # record only
    with interpret.enabled(arch), torch.no_grad() if "backward" not in c["op"] else nullcontext():
        _RECORDERS.append(keep)
        try:
            for b in batches:
                for n in lengths:
                    _calls(c, int(n), int(b), "cpu")
        finally:
            _RECORDERS.remove(keep)
    return out


def jit_signature(kernel, args):
    """The ``KernelSignature`` cuTile's JIT derives for ``args`` (CPU tensors standing in for
    device arrays of the same shapes and strides, 16-byte aligned): per array its dtype, rank,
    stride-1 dimensions, 16-byte stride divisibility and shapes divisible by 16; scalars
    int32/float32; the ``ct.Constant`` values."""
    import inspect
    import cuda.tile as ct
    from cuda.tile.compilation import (ArrayConstraint, CallingConvention, ConstantConstraint,
                                       KernelSignature, ScalarConstraint)
    from .dispatch import _is_constant
    fn = kernel._pyfunc
    params = list(inspect.signature(fn).parameters.values())
    cons = []
    for p, a in zip(params, args):
        if _is_constant(p.annotation):
            cons.append(ConstantConstraint(a))
        elif hasattr(a, "shape") and hasattr(a, "dtype"):
            dtype = getattr(ct, str(a.dtype).replace("torch.", ""))
            item = a.element_size()
            per16 = 16 // item if 16 % item == 0 else 1
            cons.append(ArrayConstraint(
                dtype, a.dim(), index_dtype=ct.int32, stride_lower_bound_incl=0,
                alias_groups=(), may_alias_internally=False,
                stride_constant=tuple(1 if s == 1 else None for s in a.stride()),
                stride_divisible_by=tuple(per16 if s % per16 == 0 else 1 for s in a.stride()),
                shape_divisible_by=tuple(16 if d % 16 == 0 else 1 for d in a.shape),
                base_addr_divisible_by=16))
        elif isinstance(a, bool) or isinstance(a, int):
            cons.append(ScalarConstraint(ct.int32))
        else:
            cons.append(ScalarConstraint(ct.float32))
    return KernelSignature(cons, calling_convention=CallingConvention.cutile_python_v1())


def _export_one(config, arch, lengths, batches):
    from cuda.tile._compile import compile_tile
    rows = []
    for k in enumerate_kernels(config, arch=arch, lengths=lengths, batches=batches):
        t0 = time.perf_counter()
        err = ""
        try:
            kernel = k["kernel_obj"]
            compile_tile(kernel._annotated_function, [jit_signature(kernel, k["args"])],
                         sm_arch=arch, compiler_options=kernel._compiler_options)
        except Exception as e:  # reported per kernel, not fatal: the others still compile
            err = f"{type(e).__name__}: {str(e).strip()[-300:]}"
        rows.append(dict(config=config, kernel=k["kernel"], constants=dict(k["constants"]),
                         arrays=k["arrays"], seconds=time.perf_counter() - t0, error=err))
    return rows


def _launch_one(config, arch, lengths, batches):
    import torch
    c = _check(config)
    t0 = time.perf_counter()
    err = ""
    try:
        for b in batches:
            for n in lengths:
                _calls(c, int(n), int(b), "cuda")
        torch.cuda.synchronize()
    except Exception as e:  # reported, not fatal
        err = f"{type(e).__name__}: {str(e).strip()[-300:]}"
    return [dict(config=config, kernel="(all of the configuration's)", constants={},
                 arrays=(), seconds=time.perf_counter() - t0, error=err)]


def _worker(args):
    how, config, arch, lengths, batches = args
    return (_launch_one if how == "launch" else _export_one)(config, arch, lengths, batches)


def precompile(configs, *, processes: int | None = None, how: str | None = None,
               arch: str | None = None, lengths=LENGTHS, batches=BATCHES) -> list[dict]:
    """Compile the kernels of ``configs`` (dicts: ``op`` one of ``OPS``, and ``dtype``,
    ``head_dim``, ``heads`` (Hq, Hkv), ``causal``, ``window_size``, ``softcap``, ``alibi``) ahead
    of the first call, one configuration per process (``processes``, default the CPU count,
    at most the configurations). ``how``: "export" or "launch" (see the module docstring);
    ``arch``: the target (default this GPU's, else sm_90). Returns one row per kernel (or per
    configuration with "launch"): seconds and error ("" when it compiled)."""
    import os
    configs = [_check(c) and c for c in configs]
    gpu = _has_gpu()
    how = how or ("launch" if gpu else "export")
    if how not in ("export", "launch"):
        raise ValueError(f"how must be 'export' or 'launch', got {how!r}")
    if how == "launch" and not gpu:
        raise ValueError("how='launch' needs a CUDA GPU; use how='export' to compile without one")
    if arch is None:
        from .dispatch import device_arch
        arch = device_arch(0) if gpu else "sm_90"
    jobs = [(how, c, arch, tuple(lengths), tuple(batches)) for c in configs]
    n = max(1, min(len(jobs), processes or os.cpu_count() or 1))
    if n == 1:
        return [r for j in jobs for r in _worker(j)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as ex:
        return [r for rows in ex.map(_worker, jobs) for r in rows]


def _has_gpu() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:       # pragma: no cover
        return False
