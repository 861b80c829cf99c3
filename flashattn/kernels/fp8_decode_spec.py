"""The FP8-MMA decode kernel's contract (kernels/fp8_decode.py, chapter 14): its spec, where it
runs per architecture, and ``fp8_decode_plan``, the pure plan of a decode call over an fp8
cache (which kernel, constants, grid, scratch; no GPU, no launch). Does not import cuda.tile.

    DECODE_FP8MMA   kernels/fp8_decode.py decode_fp8mma_kernel: FP8 MMAs, V cache transposed

Which fp8-cache kernel a call runs depends on the layout of its V cache:

* V transposed, (B, Hkv, D, S) or paged (num_pages, Hkv, D, page_size): ``decode_fp8mma``
  on every architecture (``FP8_DECODE_MMA_TILE_M`` sets its row tile where listed);
* V as K, (B, Hkv, S, D): ``decode_split_fp8`` (kernels/fp8.py), which widens the tiles to
  fp16; an FP8 MMA there would need V transposed on chip per tile.
"""
from __future__ import annotations

from .decode_spec import (decode_combine_constants, decode_combine_grid, decode_partial_shapes,
                          decode_plan, decode_split_grid)
from .spec import Array, KernelSpec

__all__ = ["DECODE_FP8MMA", "FP8_DECODE_SPECS", "FP8_DECODE_MMA_TILE_M",
           "FP8_DECODE_MMA_MAX_TILE_N", "FP8_DECODE_MMA_HINTS", "FP8_DECODE_MMA_P_SHIFT",
           "FP8_DECODE_KERNELS", "fp8_decode_mma_constants", "fp8_decode_mma_hints",
           "fp8_decode_plan"]

# Q, Out fp16/bf16 ("io"); K fp8 (B, Hkv, S, D) and V fp8 transposed (B, Hkv, D, S), or paged;
# KDescale, VDescale (B, Hkv) fp32; BlockTable, SeqLens, Opart, Lse as DECODE_SPLIT.
DECODE_FP8MMA = KernelSpec(
    "decode_fp8mma", "flashattn.kernels.fp8_decode", "decode_fp8mma_kernel",
    arrays=(Array("Q", 4), Array("K", 4, "float8_e4m3fn"), Array("V", 4, "float8_e4m3fn"),
            Array("BlockTable", 2, "int32"), Array("SeqLens", 1, "int32"),
            Array("KDescale", 2, "float32"), Array("VDescale", 2, "float32"),
            Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(("qk_scale", float), ("num_q", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "PAGED", "FINAL", "P_SHIFT"))

FP8_DECODE_SPECS = {"decode_fp8mma": DECODE_FP8MMA}

# The row tile per architecture: at least 64 rows where the FP8 MMA is a warpgroup MMA reading
# shared memory (Hopper's QGMMA, Blackwell's tcgen05 UTCQMMA; a smaller M is no such MMA).
# Elsewhere (sm_89, sm_120: the warp-level QMMA) the fp16 plan's tile. The key tile and the
# split count stay the fp16 plan's (``decode_plan``), so the splits cover the same runs.
FP8_DECODE_MMA_TILE_M = {"sm_90": 64, "sm_100": 64}
# Per architecture and TILE_D, from the compiler's report (tileiras 13.4, tests/test_fp8_aot.py:
# no spills), where the fp16 plan's tiles spill with fp8 operands:
# the largest key tile (sm_120, warp MMAs with S and O in registers: D=128 at 128 keys spilled
# 64 bytes, D=256 paged at 64 keys 64-72 bytes) ...
FP8_DECODE_MMA_MAX_TILE_N: dict[str, dict[int, int]] = {"sm_120": {128: 64, 256: 32}}
# ... and launch hints (two consumer warp groups: on sm_90 D=64 at 128 keys spilled 200 bytes
# without, D=256 544-592 bytes; on sm_100 D=256 8 bytes). D=128 keeps the compiler's default,
# the configuration chapter 14 times.
FP8_DECODE_MMA_HINTS: dict[str, dict[int, dict]] = {
    "sm_90": {64: {"num_worker_warps": 8}, 256: {"num_worker_warps": 8}},
    "sm_100": {256: {"num_worker_warps": 8}},
}
# P = 2^(s - m + P_SHIFT) in [0, 256]: in e4m3's range (448), as the FP8 forward's P.
FP8_DECODE_MMA_P_SHIFT = 8
# The two kernels of an fp8 cache, by V layout (the plan's "kernel").
FP8_DECODE_KERNELS = {True: "decode_fp8mma", False: "decode_split_fp8"}


def fp8_decode_mma_constants(split_constants: dict, arch: str | None = None) -> dict:
    """``decode_fp8mma_kernel``'s constants from the fp16 split kernel's (``decode_plan``):
    TILE_M raised to ``FP8_DECODE_MMA_TILE_M[arch]`` where listed, TILE_N capped by
    ``FP8_DECODE_MMA_MAX_TILE_N[arch][TILE_D]`` where listed (a power of two below a power of
    two: still a divisor of the page size), TILE_D, PAGED and FINAL as given, and P_SHIFT."""
    tile_m = int(split_constants["TILE_M"])
    wide = FP8_DECODE_MMA_TILE_M.get(arch or "")
    if wide:
        tile_m = max(tile_m, wide)
    tile_n = int(split_constants["TILE_N"])
    cap = FP8_DECODE_MMA_MAX_TILE_N.get(arch or "", {}).get(int(split_constants["TILE_D"]))
    if cap:
        tile_n = min(tile_n, cap)
    return dict(TILE_M=tile_m, TILE_N=tile_n,
                TILE_D=int(split_constants["TILE_D"]), PAGED=bool(split_constants["PAGED"]),
                FINAL=bool(split_constants.get("FINAL", False)),
                P_SHIFT=FP8_DECODE_MMA_P_SHIFT)


def fp8_decode_mma_hints(constants: dict, arch: str | None) -> dict:
    """The kernel's launch hints for ``constants`` on ``arch`` (``FP8_DECODE_MMA_HINTS``)."""
    return dict(FP8_DECODE_MMA_HINTS.get(arch or "", {}).get(int(constants["TILE_D"]), {}))


def fp8_decode_plan(dims, *, v_transposed: bool, num_splits=None, max_seqlen=None,
                    sm_count: int, arch=None) -> dict:
    """The launch plan of a decode call over an fp8 cache (pure: no GPU). ``dims``: a
    ``contract.DecodeDims`` (of the cache in (S, D) terms); ``v_transposed``: V is stored (D, S)
    per kv head. The fp16 plan (``decode_plan``: splits, key tile, combine) with the fp8
    kernel's row tile (and key tile cap), its hints, grid and scratch shapes (a smaller key
    tile keeps the split count: each split's run of tiles grows); ``kernel`` names the split kernel
    (``FP8_DECODE_KERNELS``). The widening kernel's constants are ``fp8_spec``'s
    ``fp8_decode_constants`` of ``split_constants`` (this module leaves them to it)."""
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    plan = decode_plan(dims, num_splits=num_splits, max_seqlen=max_seqlen, sm_count=sm_count,
                       arch=arch)
    kernel = FP8_DECODE_KERNELS[v_transposed]
    if not v_transposed:
        return dict(plan, kernel=kernel)
    c = fp8_decode_mma_constants(plan["split_constants"], arch)
    rows, splits = plan["rows"], plan["num_splits"]
    opart_shape, lse_shape = decode_partial_shapes(num_splits=splits, B=dims.B, Hkv=dims.Hkv,
                                                   rows=rows, tile_m=c["TILE_M"],
                                                   head_dim=dims.D)
    out = dict(plan, kernel=kernel, split_constants=c, hints=fp8_decode_mma_hints(c, arch),
               opart_shape=opart_shape,
               lse_shape=lse_shape,
               split_grid=decode_split_grid(B=dims.B, Hkv=dims.Hkv, rows=rows,
                                            tile_m=c["TILE_M"], num_splits=splits))
    if plan["combine"] == "block":
        comb = decode_combine_constants(split_tile_m=c["TILE_M"], head_dim=dims.D)
        out.update(combine_constants=comb,
                   combine_grid=decode_combine_grid(B=dims.B, Hkv=dims.Hkv, rows=rows,
                                                    tile_m=comb["TILE_M"]))
    return out
