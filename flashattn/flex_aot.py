"""The flex kernels ahead of time (tileiras, no GPU): ``compile_flex`` (the forward) and
``compile_flex_bwd`` (dQ, dK/dV) for a mod pair, an architecture and a configuration, each a
``flashattn.aot.KernelReport`` (registers, shared memory, the SASS's opcodes; errors in
``.error``)."""
from __future__ import annotations

import hashlib
import inspect
import json

from . import aot
from .aot import KernelReport
from .config import Config
from .flex_build import flex_bwd_kernels, flex_kernel
from .interpret import install_shim
from .kernels import hinted
from .kernels.flex_spec import (DEFAULT_CONFIG, FLEX, FLEX_CONFIGS, FLEX_DKDV, FLEX_DQ,
                                flex_bwd_plan, flex_plan, with_mod_arrays)

__all__ = ["compile_flex", "compile_flex_bwd"]


def compile_flex(arch: str, *, score=None, mask=None, block_size=(128, 128), head_dim=128,
                 Nk=8192, has_full=True, sinks=False, write_lse=False, blasst=None,
                 config: Config | None = None, dtype="float16", keep_sass=False):
    """Compile the flex kernel for ``arch`` with tileiras and read the cubin back
    (``flashattn.aot.KernelReport``; errors in ``.error``). ``block_size=None``: no block mask
    (the dense path). ``config``: tiles and hints (default ``FLEX_CONFIGS[arch]``)."""
    install_shim()
    score = _as_opt(score, "score")
    mask = _as_opt(mask, "mask")
    cfg = config or FLEX_CONFIGS.get(arch, DEFAULT_CONFIG)
    ko = {"BLOCK_M": cfg.TILE_M, "BLOCK_N": cfg.TILE_N}
    plan = flex_plan(B=4, Hq=32, Hkv=32, Nq=Nk, Nk=Nk, D=head_dim, block_size=block_size,
                     has_full=has_full and block_size is not None, score=score,
                     mask=mask if block_size is not None else None, sinks=sinks,
                     write_lse=write_lse, blasst=blasst, arch=arch, kernel_options=ko)
    consts = plan["constants"]
    hints = cfg.hints()
    spec = with_mod_arrays(FLEX, score, mask if block_size is not None else None)
    names = "+".join(m.name for m in (score, mask) if m) or "identity"
    rep = KernelReport(step=f"flex[{names}]", arch=arch, kernel="flex",
                       config=cfg.label())

    key = hashlib.sha256(json.dumps([aot._source_hash(), names, _mod_key(score), _mod_key(mask),
                                     sorted(consts.items()),
                                     sorted(hints.items()), arch, dtype,
                                     repr(spec.arrays)],
                                    default=str).encode()).hexdigest()[:20]
    cubin = aot._cache_dir() / f"flex-{arch}-{key}.cubin"
    return aot.compile_into(
        rep, cubin,
        lambda: hinted(flex_kernel(score, mask if block_size is not None else None), hints),
        lambda: spec.signature(dtype=dtype, constants=consts,
                               align=8 if head_dim % 8 == 0 else 1),
        arch, keep_sass=keep_sass, full_error=True)


def compile_flex_bwd(arch: str, *, score=None, mask=None, block_size=(128, 128), head_dim=128,
                     Nk=8192, dtype="float16", configs: tuple[Config, Config] | None = None,
                     keep_sass=False):
    """Compile the two backward kernels for ``arch`` (tileiras); a KernelReport each (dQ, then
    dK/dV). ``configs``: (dK/dV, dQ) tiles and hints (default: the tables')."""
    install_shim()
    score = _as_opt(score, "score")
    mask = _as_opt(mask, "mask") if block_size is not None else None
    plan = flex_bwd_plan(B=4, Hq=32, Hkv=32, Nq=Nk, Nk=Nk, D=head_dim, block_size=block_size,
                         has_full=block_size is not None, score=score, mask=mask, arch=arch,
                         configs=configs)
    names = "+".join(m.name for m in (score, mask) if m) or "identity"
    kernels = dict(zip(("dq", "dkdv"), flex_bwd_kernels(score, mask)))
    reps = []
    for name, spec in (("dq", FLEX_DQ), ("dkdv", FLEX_DKDV)):
        p = plan[name]
        consts, hints = p["constants"], p["hints"]
        spec = with_mod_arrays(spec, score, mask)
        rep = KernelReport(step=f"flex_bwd[{names}]", arch=arch, kernel=spec.name,
                           config=p["config"].label() if hints else
                           f"{consts['TILE_M']}x{consts['TILE_N']}")
        key = hashlib.sha256(json.dumps([aot._source_hash(), spec.name, names, _mod_key(score),
                                         _mod_key(mask), sorted(consts.items()),
                                         sorted(hints.items()), arch, dtype, repr(spec.arrays)],
                                        default=str).encode()).hexdigest()[:20]
        reps.append(aot.compile_into(
            rep, aot._cache_dir() / f"{spec.name}-{arch}-{key}.cubin",
            lambda k=kernels[name], h=hints: hinted(k, h),
            lambda s=spec, c=consts: s.signature(dtype=dtype, constants=c),
            arch, keep_sass=keep_sass, full_error=True))
    return reps


def _mod_key(m):
    """A mod's own code and parameters, for a cubin's cache key (mods.py is not hashed)."""
    if m is None:
        return None
    try:
        src = inspect.getsource(m.tile)
    except (OSError, TypeError):
        src = repr(m.tile)
    cells = [repr(c.cell_contents) for c in (m.tile.__closure__ or ())]
    return [src, cells, sorted(m.params.items())]


def _as_opt(m, kind):
    if m is None:
        return None
    from .mods import as_mod
    return as_mod(m, kind)
