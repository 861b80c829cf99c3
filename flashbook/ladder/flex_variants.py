"""The flex backward's A/B variants (chapter 13), out of the library: which kernel pair computes
dQ and dK/dV ("mn": ``flex_bwd.make_flex_bwd_kernels_mn`` beside this module, score tiles
[queries, keys]; "t": the library's ``flashattn.kernels.flex_bwd``, the dense backward's shape)
and how Delta = rowsum(dO o O) is computed ("torch": fp32 copies of dO and O; "kernel": the dense
backward's preprocess, one read of each):

    "mn"        dq mn, dkdv mn, delta torch   (the first backward)
    "mn+delta"  dq mn, dkdv mn, delta kernel
    "t-dq"      dq t,  dkdv mn, delta kernel
    "t"         dq t,  dkdv t (mn with a score function), delta kernel: the library's default
                before it kept one pair
    "t-all"     dq t,  dkdv t, delta kernel: what the library runs now

``flex_attention(q, k, v, ..., variant=NAME)`` is ``flashattn.flex_attention`` whose backward
runs the variant (``backward``); ``bwd_plan`` is its pure plan (tables: ``FLEX_BWD_CONFIGS_MN``
for "mn", the library's for "t", so "t-all" plans what the library launches).
"""
from __future__ import annotations

import threading

from flashattn.config import Config
from flashattn.kernels.flex_spec import BWD_CONFIG, flex_bwd_configs, flex_bwd_plan

__all__ = ["VARIANTS", "DEFAULT_VARIANT", "FLEX_BWD_CONFIGS_MN", "mn_configs", "bwd_plan",
           "bwd_kernels", "backward", "flex_attention", "compile_bwd"]

VARIANTS: dict[str, dict[str, str]] = {
    "mn": dict(dq="mn", dkdv="mn", delta="torch"),
    "mn+delta": dict(dq="mn", dkdv="mn", delta="kernel"),
    "t-dq": dict(dq="t", dkdv="mn", delta="kernel"),
    "t": dict(dq="t", dkdv="t", dkdv_score="mn", delta="kernel"),
    "t-all": dict(dq="t", dkdv="t", delta="kernel"),
}
DEFAULT_VARIANT = "t"

# (dK/dV, dQ) of the "mn" pair per architecture and padded head dim: two consumer warp groups
# on Hopper; dK/dV at the dense 64x128 spills with a score function, 128 queries x 64 keys not.
FLEX_BWD_CONFIGS_MN: dict[str, dict[int, tuple[Config, Config]]] = {
    "sm_90": {128: (Config(128, 64, num_worker_warps=8), Config(128, 64, num_worker_warps=8)),
              256: (Config(64, 64, num_worker_warps=8), Config(64, 64, num_worker_warps=8))},
    "sm_100": {128: (Config(128, 64), Config(128, 64))},
}
_KERNELS: dict = {}
_LOCK = threading.Lock()


def mn_configs(arch: str | None, head_dim: int) -> tuple[Config, Config]:
    """(dK/dV, dQ) of the "mn" pair for ``arch`` and ``head_dim`` (BWD_CONFIG where none)."""
    from flashattn.contract import tile_d_for
    table = FLEX_BWD_CONFIGS_MN.get(arch or "", {})
    keys = [d for d in table if d >= tile_d_for(head_dim)]
    return table[min(keys)] if keys else (BWD_CONFIG, BWD_CONFIG)


def _variant(name: str) -> dict:
    if name not in VARIANTS:
        raise ValueError(f"flex backward variant {name!r}: choose from "
                         f"{', '.join(map(repr, VARIANTS))}")
    return VARIANTS[name]


def bwd_plan(variant: str = DEFAULT_VARIANT, *, B, Hq, Hkv, Nq, Nk, D, block_size=None,
             has_full=False, score=None, mask=None, arch=None, kernel_options=None,
             configs=None) -> dict:
    """The variant's plan: per kernel ("dq", "dkdv") the library plan's entry of its pair's
    tables (or ``configs``: (dK/dV, dQ)) plus "kind", and "delta"."""
    v = _variant(variant)
    plans = {"delta": v["delta"]}
    kw = dict(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, block_size=block_size, has_full=has_full,
              score=score, mask=mask, arch=arch, kernel_options=kernel_options)
    for i, name in enumerate(("dkdv", "dq")):
        kind = v[name]
        if name == "dkdv" and score is not None:
            kind = v.get("dkdv_score", kind)
        cfgs = configs or (mn_configs(arch, D) if kind == "mn" else
                           flex_bwd_configs(arch, D, score is not None))
        p = dict(flex_bwd_plan(**kw, configs=cfgs)[name], kind=kind)
        if kind == "mn":
            # This pair masks every ragged tile (no per-block branch): "even" is per tile.
            c = dict(p["constants"])
            c["EVEN_K"], c["EVEN_M"] = Nk % c["TILE_N"] == 0, Nq % c["TILE_M"] == 0
            p["constants"] = c
        plans[name] = p
    return plans


def bwd_kernels(score=None, mask=None, kind: str = "mn"):
    """(dq kernel, dkdv kernel) of the pair ``kind`` for a mod pair, built once."""
    if kind == "t":
        from flashattn.flex_build import flex_bwd_kernels
        return flex_bwd_kernels(score, mask)
    key = (score.tile if score else None, score.grad if score else None,
           mask.tile if mask else None)
    with _LOCK:
        ks = _KERNELS.get(key)
        if ks is None:
            from flashattn.interpret import install_shim
            install_shim()
            from .flex_bwd import make_flex_bwd_kernels_mn
            ks = _KERNELS[key] = make_flex_bwd_kernels_mn(*key)
    return ks


def backward(variant, q, k, v, out, dout, lse, sinks, *, score, mask, block_mask, scale,
             kernel_options=None):
    """(dq, dk, dv, dsinks or None) of the flex forward, by the variant's kernels."""
    import torch
    from flashattn.contract import tile_d_for
    from flashattn.dispatch import device_arch, launch_kernel, on_device
    from flashattn.flex_launch import block_lists, mod_tensors, sink_grad
    from flashattn.kernels import hinted
    from flashattn.kernels.fmha_bwd import bwd_preprocess_kernel
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    device = q.device
    q, k, v, out, dout, lse = (t.contiguous() for t in (q, k, v, out, dout, lse))
    st, mt = mod_tensors(score), mod_tensors(mask)
    kvt, qt, has_full, bmul, hmul = block_lists(block_mask, device)
    bs = None
    if block_mask is not None:
        b = block_mask.BLOCK_SIZE
        bs = (b, b) if isinstance(b, int) else tuple(int(x) for x in b)
    plan = bwd_plan(variant, B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, block_size=bs,
                    has_full=has_full, score=score, mask=mask, arch=device_arch(device),
                    kernel_options=kernel_options)
    pq, pkv = plan["dq"], plan["dkdv"]
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    with on_device(device):
        if plan["delta"] == "kernel":
            delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=device)
            launch_kernel(device, (-(-Nq // 64), B * Hq, 1), bwd_preprocess_kernel,
                          (out, dout, delta, Hq, 64, tile_d_for(D)))
        else:
            delta = (dout.float() * out.float()).sum(-1).contiguous()
        launch_kernel(device, pq["grid"],
                      hinted(bwd_kernels(score, mask, pq["kind"])[0], pq["hints"]),
                      (q, k, v, dout, lse, delta, dq, *kvt, st, mt, float(scale), Hq,
                       Hq // Hkv, bmul, hmul, *pq["constants"].values()))
        launch_kernel(device, pkv["grid"],
                      hinted(bwd_kernels(score, mask, pkv["kind"])[1], pkv["hints"]),
                      (q, k, v, dout, lse, delta, dk, dv, *qt, st, mt, float(scale), Hkv,
                       Hq // Hkv, bmul, hmul, *pkv["constants"].values()))
    return dq, dk, dv, sink_grad(sinks, lse, delta) if sinks is not None else None


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, kernel_options=None, *, sinks=None,
                   variant: str = DEFAULT_VARIANT):
    """``flashattn.flex_attention`` (the forward as it ships) whose backward runs ``variant``."""
    import math

    import torch
    import flashattn
    from flashattn.mods import as_mod
    _variant(variant)
    score = as_mod(score_mod, "score") if score_mod is not None else None
    mask = None
    if block_mask is not None and block_mask.mask_mod is not None:
        from torch.nn.attention.flex_attention import noop_mask
        if block_mask.mask_mod is not noop_mask:
            mask = as_mod(block_mask.mask_mod, "mask")
    sc = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)

    class _Variant(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, s):
            out, lse = flashattn.flex_attention(q, k, v, score_mod=score, block_mask=block_mask,
                                                scale=sc, enable_gqa=enable_gqa,
                                                return_lse=True, kernel_options=kernel_options,
                                                sinks=s)
            ctx.save_for_backward(q, k, v, out, lse, s)
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse, s = ctx.saved_tensors
            return backward(variant, q, k, v, out, dout, lse, s, score=score, mask=mask,
                            block_mask=block_mask, scale=sc, kernel_options=kernel_options)

    return _Variant.apply(query, key, value, sinks)


def compile_bwd(arch: str, variant: str = DEFAULT_VARIANT, *, score=None, mask=None,
                block_size=(128, 128), head_dim=128, Nk=8192, dtype="float16", configs=None,
                keep_sass=False):
    """Compile the variant's dQ and dK/dV kernels for ``arch`` (tileiras): a KernelReport each,
    as ``flashattn.flex.compile_flex_bwd``. ``configs``: (dK/dV, dQ) for every kernel."""
    import dataclasses
    import hashlib
    import json

    from flashattn import aot
    from flashattn.aot import KernelReport
    from flashattn.flex_aot import _as_opt, _mod_key
    from flashattn.interpret import install_shim
    from flashattn.kernels import hinted
    from flashattn.kernels.flex_spec import FLEX_DKDV, FLEX_DQ, with_mod_arrays
    install_shim()
    score = _as_opt(score, "score")
    mask = _as_opt(mask, "mask") if block_size is not None else None
    plan = bwd_plan(variant, B=4, Hq=32, Hkv=32, Nq=Nk, Nk=Nk, D=head_dim,
                    block_size=block_size, has_full=block_size is not None, score=score,
                    mask=mask, arch=arch, configs=configs)
    names = "+".join(m.name for m in (score, mask) if m) or "identity"
    reps = []
    for i, (name, spec) in enumerate((("dq", FLEX_DQ), ("dkdv", FLEX_DKDV))):
        p = plan[name]
        consts, hints = p["constants"], p["hints"]
        if p["kind"] == "mn":
            spec = dataclasses.replace(spec, module="flashbook.ladder.flex_bwd")
        spec = with_mod_arrays(spec, score, mask)
        rep = KernelReport(step=f"flex_bwd[{names}]", arch=arch,
                           kernel=spec.name + ("_t" if p["kind"] == "t" else ""),
                           config=p["config"].label() if hints else
                           f"{consts['TILE_M']}x{consts['TILE_N']}")
        key = hashlib.sha256(json.dumps(
            [aot._source_hash(), aot._module_hash("flashbook.ladder.flex_bwd"), spec.name,
             p["kind"], names, _mod_key(score), _mod_key(mask), sorted(consts.items()),
             sorted(hints.items()), arch, dtype, repr(spec.arrays)],
            default=str).encode()).hexdigest()[:20]
        kernel = bwd_kernels(score, mask, p["kind"])[i]
        reps.append(aot.compile_into(
            rep, aot._cache_dir() / f"{spec.name}-{p['kind']}-{arch}-{key}.cubin",
            lambda k=kernel, h=hints: hinted(k, h),
            lambda s=spec, c=consts: s.signature(dtype=dtype, constants=c),
            arch, keep_sass=keep_sass, full_error=True))
    return reps
