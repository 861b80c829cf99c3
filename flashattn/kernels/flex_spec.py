"""The flex kernels' contract: their specs, the configuration tables per architecture and the
pure plans (shapes, BlockMask block size and mods in; constants, hints and grid out; no launch,
no cuda.tile), as ``varlen_spec.py`` is to ``varlen.py``.

The kernels are built per mod by factories (``flex.make_flex_kernel``,
``flex_bwd.make_flex_bwd_kernels``); their specs name the factory's inner kernel, so
``check_signature`` reads it from the source. A mod's tensors are one ``ArrayTuple`` each
(``ST``, ``MT``), filled per mod for a compile (``with_mod_arrays``).
"""
from __future__ import annotations

from dataclasses import replace

from ..config import Config
from ..contract import tile_d_for
from .spec import Array, ArrayTuple, KernelSpec

__all__ = ["FLEX_CONFIGS", "DEFAULT_CONFIG", "FLEX_BWD_CONFIGS", "FLEX_BWD_SCORE_CONFIGS",
           "BWD_CONFIG", "FLEX_CONSTANTS", "FLEX_BWD_CONSTANTS", "FLEX", "FLEX_DQ", "FLEX_DKDV",
           "FLEX_SPECS", "block_mask_tiles", "flex_plan", "flex_bwd_configs", "flex_bwd_plan",
           "mod_arrays", "with_mod_arrays"]

# Forward tiles and launch hints per architecture (arch_tuned's); the tiles shrink to divide a
# BlockMask's block size.
FLEX_CONFIGS: dict[str, Config] = {
    "sm_90": Config(64, 128, occupancy=2),
    "sm_100": Config(128, 128, occupancy=2),
    "sm_120": Config(64, 64),
}
DEFAULT_CONFIG = Config(64, 64)

# The backward's (dK/dV, dQ) per architecture and padded head dim (the entry for the smallest
# key >= TILE_D): dK/dV's TILE_N is its own key tile and TILE_M its inner query tile, dQ's
# TILE_M its own query tile. Chosen from the compiler's report: no spills at D = 128.
FLEX_BWD_CONFIGS: dict[str, dict[int, tuple[Config, Config]]] = {
    # Hopper: two consumer warp groups (num_worker_warps=8), each owning 64 keys' rows of dK, dV.
    "sm_90": {128: (Config(64, 128, num_worker_warps=8), Config(128, 64, num_worker_warps=8)),
              256: (Config(64, 64, num_worker_warps=8), Config(64, 64, num_worker_warps=8))},
    "sm_100": {128: (Config(64, 128), Config(128, 64))},
    # Consumer Blackwell: the largest dK/dV found without spills at D = 128.
    "sm_120": {128: (Config(32, 16), Config(32, 32))},
}
# dK/dV with a score function, where it differs: the score's derivative makes the tiles above
# spill (softcap and ALiBi, D = 128). sm_120: the least spilling found (64x64: 144 bytes of
# stack with softcap, 96 with ALiBi; 32x16: 1224 and 0).
FLEX_BWD_SCORE_CONFIGS: dict[str, dict[int, Config]] = {
    "sm_90": {128: Config(128, 64, num_worker_warps=8)},
    "sm_100": {128: Config(64, 64)},
    "sm_120": {128: Config(64, 64)},
}
BWD_CONFIG = Config(64, 64)     # elsewhere, and where an entry's tiles do not divide the blocks

FLEX_CONSTANTS = ("TILE_M", "TILE_N", "TILE_D", "EVEN_K", "HAS_SCORE", "HAS_MASK", "HAS_BLOCKS",
                  "HAS_FULL", "Q_TILES_PER_BLOCK", "KV_TILES_PER_BLOCK", "TAIL", "HAS_SINK",
                  "GUARD", "WRITE_LSE", "BLASST", "BLASST_T")
FLEX_BWD_CONSTANTS = ("TILE_M", "TILE_N", "TILE_D", "EVEN_K", "EVEN_M", "HAS_SCORE", "HAS_GRAD",
                      "HAS_MASK", "HAS_BLOCKS", "HAS_FULL", "Q_TILES_PER_BLOCK",
                      "KV_TILES_PER_BLOCK")
_SCALARS = (("sm_scale", float), ("num_heads", int), ("group_size", int), ("mask_bmul", int),
            ("mask_hmul", int))
_BLOCKS = ((3, "Num"), (4, "Idx"))

FLEX = KernelSpec(
    "flex", "flashattn.kernels.flex", "flex_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4),
            Array("Lse", 3, "float32"), Array("KvNum", 3, "int32"), Array("KvIdx", 4, "int32"),
            Array("FullNum", 3, "int32"), Array("FullIdx", 4, "int32"),
            Array("Sink", 1, "float32"), ArrayTuple("ST"), ArrayTuple("MT")),
    scalars=_SCALARS, constants=FLEX_CONSTANTS)
_BWD_IN = (Array("Q", 4), Array("K", 4), Array("V", 4), Array("dO", 4),
           Array("Lse", 3, "float32"), Array("Delta", 3, "float32"))
FLEX_DQ = KernelSpec(
    "flex_dq", "flashattn.kernels.flex_bwd", "flex_dq_kernel",
    arrays=(*_BWD_IN, Array("dQ", 4), Array("KvNum", 3, "int32"), Array("KvIdx", 4, "int32"),
            Array("FullNum", 3, "int32"), Array("FullIdx", 4, "int32"), ArrayTuple("ST"),
            ArrayTuple("MT")),
    scalars=_SCALARS, constants=FLEX_BWD_CONSTANTS)
FLEX_DKDV = KernelSpec(
    "flex_dkdv", "flashattn.kernels.flex_bwd", "flex_dkdv_kernel",
    arrays=(*_BWD_IN, Array("dK", 4), Array("dV", 4), Array("QNum", 3, "int32"),
            Array("QIdx", 4, "int32"), Array("FullQNum", 3, "int32"),
            Array("FullQIdx", 4, "int32"), ArrayTuple("ST"), ArrayTuple("MT")),
    scalars=(("sm_scale", float), ("num_kv_heads", int), *_SCALARS[2:]),
    constants=FLEX_BWD_CONSTANTS)
FLEX_SPECS = {s.name: s for s in (FLEX, FLEX_DQ, FLEX_DKDV)}


def mod_arrays(mod) -> tuple:
    """A mod's tensors as spec arrays (rank; int32 indices or float32 values)."""
    if mod is None:
        return ()
    return tuple(Array(n, t.dim(), "float32" if t.dtype.is_floating_point else "int32")
                 for n, t in mod.tensors)


def with_mod_arrays(spec: KernelSpec, score=None, mask=None) -> KernelSpec:
    """``spec`` with its ``ST``/``MT`` tuples filled from the mods (for a compile)."""
    fill = {"ST": mod_arrays(score), "MT": mod_arrays(mask)}
    return replace(spec, arrays=tuple(replace(a, items=fill[a.name])
                                      if isinstance(a, ArrayTuple) else a
                                      for a in spec.arrays))


def _pow2_divisor(block: int, cap: int, what: str) -> int:
    """The largest power of two <= cap (at least 16) dividing ``block``."""
    t = 16
    while t * 2 <= cap and block % (t * 2) == 0:
        t *= 2
    if block % t:
        raise ValueError(f"the BlockMask's {what} block size {block} cannot be served: the "
                         f"kernel's {what} tile is a power of two from 16 to {max(cap, 16)} "
                         "and must divide it (use a BLOCK_SIZE that is a multiple of 16)")
    return t


def block_mask_tiles(block_size, config: Config, kernel_options=None) -> tuple[int, int]:
    """(TILE_M, TILE_N) serving a BlockMask of ``block_size`` = (Q_BLOCK, KV_BLOCK) (None: no
    block mask), from ``config`` and the BLOCK_M/BLOCK_N of ``kernel_options``."""
    ko = kernel_options or {}
    tm = int(ko.get("BLOCK_M", config.TILE_M))
    tn = int(ko.get("BLOCK_N", config.TILE_N))
    for n, t in (("BLOCK_M", tm), ("BLOCK_N", tn)):
        if t < 16 or t > 256 or t & (t - 1):
            raise ValueError(f"kernel_options {n}={t}: a tile is a power of two from 16 to 256")
    if block_size is None:
        return tm, tn
    qb, kb = block_size
    if "BLOCK_M" in ko and qb % tm:
        raise ValueError(f"kernel_options BLOCK_M={tm} does not divide the BlockMask's query "
                         f"block size {qb}")
    if "BLOCK_N" in ko and kb % tn:
        raise ValueError(f"kernel_options BLOCK_N={tn} does not divide the BlockMask's key "
                         f"block size {kb}")
    return _pow2_divisor(qb, tm, "query"), _pow2_divisor(kb, tn, "key")



def flex_plan(*, B, Hq, Hkv, Nq, Nk, D, block_size=None, has_full=False, score=None,
              mask=None, sinks=False, write_lse=False, blasst=None, arch=None,
              kernel_options=None) -> dict:
    """The forward's launch plan: config, constants, hints and grid."""
    config = FLEX_CONFIGS.get(arch or "", DEFAULT_CONFIG)
    tm, tn = block_mask_tiles(block_size, config, kernel_options)
    qpb = block_size[0] // tm if block_size else 1
    tpb = block_size[1] // tn if block_size else 1
    has_blocks = block_size is not None
    consts = dict(
        TILE_M=tm, TILE_N=tn, TILE_D=tile_d_for(D), EVEN_K=Nk % tn == 0,
        HAS_SCORE=score is not None, HAS_MASK=mask is not None, HAS_BLOCKS=has_blocks,
        HAS_FULL=bool(has_full), Q_TILES_PER_BLOCK=qpb, KV_TILES_PER_BLOCK=tpb,
        TAIL=has_blocks and tpb > 1 and Nk % block_size[1] != 0,
        HAS_SINK=bool(sinks),
        GUARD=(has_blocks or score is not None) and not sinks,
        WRITE_LSE=bool(write_lse), BLASST=blasst is not None,
        BLASST_T=float(blasst) if blasst is not None else 0.0)
    hints = config.hints() if (config.TILE_M, config.TILE_N) == (tm, tn) else {}
    return dict(config=config, constants=consts, hints=hints, grid=(-(-Nq // tm), B * Hq, 1))


def flex_bwd_configs(arch: str | None, head_dim: int, score: bool = False
                     ) -> tuple[Config, Config]:
    """(dK/dV config, dQ config) for ``arch`` and ``head_dim`` (BWD_CONFIG where none); with
    ``score``, dK/dV from FLEX_BWD_SCORE_CONFIGS where it has an entry."""
    td = tile_d_for(head_dim)
    table = FLEX_BWD_CONFIGS.get(arch or "", {})
    keys = [d for d in table if d >= td]
    dkdv, dq = table[min(keys)] if keys else (BWD_CONFIG, BWD_CONFIG)
    if score:
        st = FLEX_BWD_SCORE_CONFIGS.get(arch or "", {})
        keys = [d for d in st if d >= td]
        if keys:
            dkdv = st[min(keys)]
    return dkdv, dq


def flex_bwd_plan(*, B, Hq, Hkv, Nq, Nk, D, block_size=None, has_full=False, score=None,
                  mask=None, arch=None, kernel_options=None, configs=None) -> dict:
    """The backward's launch plan: per kernel ("dq", "dkdv") its config, constants, hints and
    grid. A config whose tiles the BlockMask's blocks (or kernel_options) change falls back to
    BWD_CONFIG's tiles, without hints. ``configs``: (dK/dV, dQ) in place of the tables'."""
    plans = {}
    for i, name in enumerate(("dkdv", "dq")):
        cfg = (configs or flex_bwd_configs(arch, D, score is not None))[i]
        tm, tn = block_mask_tiles(block_size, cfg, kernel_options)
        if (tm, tn) != (cfg.TILE_M, cfg.TILE_N):
            cfg = BWD_CONFIG
            tm, tn = block_mask_tiles(block_size, cfg, kernel_options)
        qpb = block_size[0] // tm if block_size else 1
        tpb = block_size[1] // tn if block_size else 1
        # The kernels branch on the bounds only where a listed block can hold a sub-tile
        # wholly past the end, and mask the ragged rest: "even" is per block.
        consts = dict(TILE_M=tm, TILE_N=tn, TILE_D=tile_d_for(D),
                      EVEN_K=Nk % (tn * tpb) == 0, EVEN_M=Nq % (tm * qpb) == 0,
                      HAS_SCORE=score is not None,
                      HAS_GRAD=score is not None and score.grad is not None,
                      HAS_MASK=mask is not None, HAS_BLOCKS=block_size is not None,
                      HAS_FULL=bool(has_full), Q_TILES_PER_BLOCK=qpb, KV_TILES_PER_BLOCK=tpb)
        hints = cfg.hints() if (cfg.TILE_M, cfg.TILE_N) == (tm, tn) else {}
        grid = (-(-Nq // tm), B * Hq, 1) if name == "dq" else (-(-Nk // tn), B * Hkv, 1)
        plans[name] = dict(config=cfg, constants=consts, hints=hints, grid=grid)
    return plans
