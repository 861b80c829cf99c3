"""The FP8 forward's contract: its spec, configuration per architecture and pure plan
(constants, grid) for ``kernels/fp8_fwd.py``. Imports nothing from cuda.tile. The spec names e4m3
for the fp8 arrays; ``with_fp8`` gives the same spec with e5m2 arrays for the compiler.
"""
from __future__ import annotations

import dataclasses

from ..config import Config
from ..contract import tile_d_for
from .spec import Array, KernelSpec

__all__ = ["FMHA_FP8", "FP8_CONFIGS", "FP8_P_SHIFT", "FP8_FAST_ACC", "FP8_SPLIT_TILE_N",
           "FP8_SPLIT_WIDTH", "FP8_DTYPES", "fp8_config", "fp8_constants", "fp8_grid",
           "fp8_plan", "with_fp8"]

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")

# Q, K, V fp8; Out bf16 or fp16 ("io"); QDescale, KDescale, VDescale (B, Hkv) fp32.
FMHA_FP8 = KernelSpec(
    "fmha_fp8", "flashattn.kernels.fp8_fwd", "fmha_fp8_kernel",
    arrays=(Array("Q", 4, "float8_e4m3fn"), Array("K", 4, "float8_e4m3fn"),
            Array("V", 4, "float8_e4m3fn"), Array("Out", 4), Array("QDescale", 2, "float32"),
            Array("KDescale", 2, "float32"), Array("VDescale", 2, "float32")),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "V_T", "FAST_ACC",
               "P_SHIFT", "SPLIT"))


def with_fp8(spec: KernelSpec, fp8: str) -> KernelSpec:
    """``spec`` with its e4m3 arrays declared as ``fp8`` (for the compiler's signature)."""
    if fp8 not in FP8_DTYPES:
        raise ValueError(f"fp8 must be one of {', '.join(FP8_DTYPES)}, got {fp8!r}")
    arrays = tuple(dataclasses.replace(a, dtype=fp8) if a.dtype in FP8_DTYPES else a
                   for a in spec.arrays)
    if arrays == spec.arrays:
        return spec
    # A name of its own: aot.compile_spec's cubin cache is keyed by the spec's name, not its
    # arrays' dtypes.
    return dataclasses.replace(spec, name=f"{spec.name}_{fp8.split('_')[1]}", arrays=arrays)


# P = 2^(s - m + FP8_P_SHIFT) lies in [0, 256]: inside e4m3's range (448), its small values 8
# binades above e4m3's subnormals (FlashAttention-3/4 scale P by 2^8 the same way).
FP8_P_SHIFT = 8
# Hopper's FP8 accumulation without periodic promotion: the sums here are only D or TILE_N long.
FP8_FAST_ACC = True

# SPLIT (the masked key tiles at half the keys, in a loop of their own) where S and O fill at
# least 192 fp32 registers a thread: with the mask inside the one loop those tiles spilled.
FP8_SPLIT_TILE_N = 256
FP8_SPLIT_WIDTH = 384

# Tiles and hints per architecture and padded head dim (the smallest listed TILE_D >= it): the
# fastest spill-free ones.
FP8_CONFIGS: dict[str, dict[int, Config]] = {
    # Hopper: two consumer warp groups of 64 rows; an fp8 K/V tile is half fp16's bytes, so
    # 256 keys fit (128 at D=256, where 128x256 spills even split).
    "sm_90": {128: Config(128, 256, occupancy=1, num_worker_warps=8),
              256: Config(128, 128, occupancy=1, num_worker_warps=8)},
    # Datacenter Blackwell (tcgen05 on fp8); at D=256 wider key tiles spill.
    "sm_100": {128: Config(128, 128, occupancy=1), 256: Config(128, 32, occupancy=1)},
    # Consumer Blackwell (and Ampere-style mma.sync): operands in registers, small tiles.
    "sm_120": {128: Config(64, 64), 256: Config(64, 32)},
}
FP8_CONFIGS["sm_80"] = FP8_CONFIGS["sm_120"]

def fp8_config(arch: str | None, head_dim: int) -> Config:
    """The FP8 forward's configuration for ``arch`` (unknown: sm_120's) and ``head_dim``."""
    td = tile_d_for(head_dim)
    table = FP8_CONFIGS.get(arch or "sm_120", FP8_CONFIGS["sm_120"])
    return table[min(d for d in table if d >= td)]


def fp8_constants(config: Config, *, head_dim: int, causal: bool, even_k: bool,
                  v_transposed: bool, fast_acc: bool = FP8_FAST_ACC,
                  p_shift: int = FP8_P_SHIFT) -> dict:
    """The ``ct.Constant`` values of ``fmha_fp8_kernel`` by name; SPLIT (the masked key tiles
    at half the keys, in a loop of their own) for TILE_N >= ``FP8_SPLIT_TILE_N`` or
    TILE_N + TILE_D >= ``FP8_SPLIT_WIDTH``."""
    td = tile_d_for(head_dim)
    return dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=td,
                CAUSAL=bool(causal), EVEN_K=bool(even_k), V_T=bool(v_transposed),
                FAST_ACC=bool(fast_acc), P_SHIFT=int(p_shift),
                SPLIT=(config.TILE_N >= FP8_SPLIT_TILE_N
                       or config.TILE_N + td >= FP8_SPLIT_WIDTH))


def fp8_grid(config: Config, *, B: int, Hq: int, Nq: int) -> tuple[int, int, int]:
    """One program per query tile per (batch, query head)."""
    return (-(-int(Nq) // config.TILE_M), int(B) * int(Hq), 1)


def fp8_plan(arch: str | None, *, B: int, Hq: int, Nq: int, Nk: int, head_dim: int,
             causal: bool, v_transposed: bool, fast_acc: bool = FP8_FAST_ACC,
             config: Config | None = None) -> tuple[Config, dict, tuple[int, int, int]]:
    """(config, constants, grid) of one launch of the FP8 forward: pure, no GPU. ``config``:
    pinned tiles, default the arch's (``fp8_config``)."""
    config = fp8_config(arch, head_dim) if config is None else config
    constants = fp8_constants(config, head_dim=head_dim, causal=causal,
                              even_k=Nk % config.TILE_N == 0, v_transposed=v_transposed,
                              fast_acc=fast_acc)
    return config, constants, fp8_grid(config, B=B, Hq=Hq, Nq=Nq)
