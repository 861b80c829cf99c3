"""The FP8 kernels' contracts (chapter 14): specs, configurations per architecture, constants.

    FMHA_FP8          kernels/fp8.py fmha_fp8_kernel: the FP8 forward

(Decoding over an FP8 cache: ``decode_spec.py``.) Imports nothing from cuda.tile.
``kernels/__init__.py`` adds it to ``SPECS``. The specs name
e4m3 for the fp8 arrays (what ``aot.compile_spec`` compiles by default); ``with_fp8`` gives the
same spec with e5m2 arrays for the compiler.
"""
from __future__ import annotations

import dataclasses

from ..contract import tile_d_for
from ..config import Config
from .spec import Array, KernelSpec

__all__ = ["FMHA_FP8", "FP8_SPECS", "FP8_CONFIGS", "FP8_ALT_CONFIGS",
           "FP8_P_SHIFT", "FP8_FAST_ACC", "FP8_SPLIT_TILE_N", "FP8_SPLIT_WIDTH", "fp8_config",
           "fp8_constants", "fp8_grid", "with_fp8", "FP8_DTYPES"]

FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")

# Q, K, V fp8; Out bf16 or fp16 ("io"); QDescale, KDescale, VDescale (B, Hkv) fp32.
FMHA_FP8 = KernelSpec(
    "fmha_fp8", "flashattn.kernels.fp8", "fmha_fp8_kernel",
    arrays=(Array("Q", 4, "float8_e4m3fn"), Array("K", 4, "float8_e4m3fn"),
            Array("V", 4, "float8_e4m3fn"), Array("Out", 4), Array("QDescale", 2, "float32"),
            Array("KDescale", 2, "float32"), Array("VDescale", 2, "float32")),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "V_T", "FAST_ACC",
               "P_SHIFT", "SPLIT"))

FP8_SPECS = {"fmha_fp8": FMHA_FP8}


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


# P = 2^(s - m + FP8_P_SHIFT) lies in [0, 256]: inside e4m3's range (448), and its small values
# sit 8 binades above e4m3's subnormals. FlashAttention-3/4 scale P by 2^8 the same way
# (arXiv 2606.06521, "P-Cast Precision in FP8 Attention", abstract: S = 256 "already deployed
# in FlashAttention-3/4"; it derives 2^8 as the best power-of-two scale for e4m3).
FP8_P_SHIFT = 8
# ct.mma(use_fast_acc=True) on Hopper: FP8 accumulation without the periodic promotion to
# fp32; the sums here are D (<= 256) or TILE_N long. The compile report shows both.
FP8_FAST_ACC = True

# The kernel's SPLIT (the masked key tiles, causal diagonal and ragged end, at half the keys in
# a loop of their own) for key tiles of FP8_SPLIT_TILE_N keys or more, or where TILE_N + TILE_D
# reaches FP8_SPLIT_WIDTH: a warp group's 64 rows then hold S and O in at least 192 fp32
# registers a thread, and with the mask inside the one loop the compiler spilled (sm_90:
# 128x256 at D=128 248 bytes causal, 128x128 at D=256 64 bytes); split, neither does, nor
# 128x256 at D=64 (compile report, chapter 14).
FP8_SPLIT_TILE_N = 256
FP8_SPLIT_WIDTH = 384

# Tiles and hints per architecture and padded head dim (the smallest listed TILE_D >= it),
# chosen from the compiler's report (tests/test_fp8_aot.py prints it; experiments/data/
# 42-fp8-aot/report.txt): no spills. Chapter 14 times them (python -m flashbook record --part fp8).
FP8_CONFIGS: dict[str, dict[int, Config]] = {
    # Hopper: two consumer warp groups (nww=8) of 64 rows each, FP8 HGMMA; 256-key tiles with
    # the masked ones split to 128 (SPLIT: fewer instructions per key than 128-key tiles; an
    # fp8 K/V tile is half the bytes of fp16's: the same shared memory holds twice the keys).
    # D=256: 128x128 split (128x256 spills 528 bytes even split).
    "sm_90": {128: Config(128, 256, occupancy=1, num_worker_warps=8),
              256: Config(128, 128, occupancy=1, num_worker_warps=8)},
    # Datacenter Blackwell (tcgen05 on fp8: UTCQMMA); at D=256, 128x64 spilled 8 bytes and
    # 64x64 8 bytes causal; 128x32 does not (255 registers).
    "sm_100": {128: Config(128, 128, occupancy=1), 256: Config(128, 32, occupancy=1)},
    # Consumer Blackwell (and Ampere-style mma.sync): operands in registers, small tiles.
    "sm_120": {128: Config(64, 64), 256: Config(64, 32)},
}
FP8_CONFIGS["sm_80"] = FP8_CONFIGS["sm_120"]

# Alternatives to FP8_CONFIGS at D=128 that compile without spills (tileiras 13.4, sm_90,
# causal and not, V^T), for python -m flashbook.measure.bench_fp8 --configs to time against the default.
# Registers / shared memory (full, causal), from the compile report:
#   128x256 occ=1 nww=8  168 regs, 181 / 116 KB   (the default, SPLIT: one CTA per SM)
#   128x128 occ=1 nww=8  168 regs, 165 / 165 KB   (the default before SPLIT)
#   128x64 occ=1 nww=8   168 regs, 116 / 182 KB
#   64x128 occ=2         128 regs, 116 /  67 KB   (two CTAs per SM causal)
#   64x128 occ=1         255 regs, 173 / 132 KB
# Not listed: 128x128 without nww=8 (occ=1, or nww=4) spills 256-264 bytes; 256x128 nww=16
# fails to compile (UnsupportedFeatureError).
FP8_ALT_CONFIGS: dict[str, list[str]] = {
    "sm_90": ["128x128 occ=1 nww=8", "128x64 occ=1 nww=8", "64x128 occ=2", "64x128 occ=1"],
}


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
