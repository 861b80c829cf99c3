"""The FP8 decode kernels' contracts: specs, per-arch constants and hints.

    DECODE_SPLIT_FP8  kernels/fp8.py decode_split_fp8_kernel: split-KV decoding, FP8 cache
                      widened to fp16 on chip (a V cache in K's layout)
    DECODE_FP8MMA     kernels/fp8_decode.py (spec: fp8_decode_spec.py): FP8 MMAs, V transposed

The FP8 forward's contract is ``fp8_fwd_spec.py`` (re-exported here). Imports nothing from
cuda.tile. ``kernels/__init__.py`` adds ``FP8_SPECS`` to ``SPECS``.
"""
from __future__ import annotations

from .fp8_decode_spec import DECODE_FP8MMA
from .fp8_fwd_spec import *  # noqa: F401,F403
from .fp8_fwd_spec import FMHA_FP8, FP8_DTYPES, with_fp8  # noqa: F401
from .fp8_fwd_spec import __all__ as _fwd_all
from .spec import Array, KernelSpec

__all__ = [*_fwd_all, "DECODE_SPLIT_FP8", "FP8_SPECS", "FP8_DECODE_SLICE",
           "FP8_DECODE_WIDE_TILE_M", "fp8_decode_constants", "fp8_decode_hints"]


# Q, Out fp16/bf16 ("io"); K, V fp8 caches; KDescale, VDescale (B, Hkv) fp32. The rest
# as DECODE_SPLIT (kernels/__init__.py), whose constants, grid and scratch it shares.
DECODE_SPLIT_FP8 = KernelSpec(
    "decode_split_fp8", "flashattn.kernels.fp8", "decode_split_fp8_kernel",
    arrays=(Array("Q", 4), Array("K", 4, "float8_e4m3fn"), Array("V", 4, "float8_e4m3fn"),
            Array("BlockTable", 2, "int32"), Array("SeqLens", 1, "int32"),
            Array("KDescale", 2, "float32"), Array("VDescale", 2, "float32"),
            Array("Opart", 4, "float32"),
            Array("Lse", 3, "float32"), Array("Out", 4), Array("Counter", 2, "int32")),
    scalars=(("qk_scale", float), ("num_q", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "PAGED", "FINAL", "FUSED", "PDL", "HALF_D"))

# decode_fp8mma (kernels/fp8_decode.py, V cache transposed) has its own spec module.
FP8_SPECS = {"fmha_fp8": FMHA_FP8, "decode_split_fp8": DECODE_SPLIT_FP8,
             "decode_fp8mma": DECODE_FP8MMA}

# The fp8-cache decode kernel computes S in head-dim slices of at most this many columns (its
# HALF_D) where it widens K in registers (warp MMA, TILE_M < 64): widening a whole 256-wide K
# tile to bf16 there spilled (compile report).
FP8_DECODE_SLICE = 128
# The fp8-cache decode kernel's row tile where the MMA reads its operands from shared memory
# (Hopper's warpgroup MMA, Blackwell's tcgen05): at least 64 rows. A 16-row tile gets a warp MMA
# with register operands, and the compiler then reads the fp8 tiles one or two bytes at a time;
# with 64 rows a converter warp group widens them with 16-byte loads beside the MMA (chapter 14;
# the SASS counts are in experiments/LOG.md). The split plan stays the fp16 kernel's.
FP8_DECODE_WIDE_TILE_M = {"sm_90": 64, "sm_100": 64}


def fp8_decode_constants(split_constants: dict, arch: str | None = None) -> dict:
    """``decode_split_fp8_kernel``'s constants: the fp16 split kernel's (``decode_plan``) with
    TILE_M raised to ``FP8_DECODE_WIDE_TILE_M[arch]`` (where listed), and HALF_D (head-dim
    slices of at most ``FP8_DECODE_SLICE``: with the 64-row tile too, D=256 in one slice spilled
    592 bytes paged on sm_90 with bf16 queries; two slices do not)."""
    td = split_constants["TILE_D"]
    out = dict(split_constants, HALF_D=min(td, FP8_DECODE_SLICE))
    wide = FP8_DECODE_WIDE_TILE_M.get(arch or "")
    if wide:
        out["TILE_M"] = max(int(split_constants["TILE_M"]), wide)
    return out


def fp8_decode_hints(constants: dict, arch: str | None, base: dict | None = None) -> dict:
    """The split kernel's hints for ``constants`` on ``arch``: ``base`` (the fp16 kernel's
    ``DECODE_SPLIT_HINTS``), plus ``num_worker_warps=8`` for the paged one-split (FINAL) kernel
    on sm_90, the one variant of the 64-row tile that spilled without it (8 bytes, bf16
    queries, D=128; with it 168 registers, no spill: compile report)."""
    hints = dict(base or {})
    if arch == "sm_90" and constants.get("PAGED") and constants.get("FINAL"):
        hints.setdefault("num_worker_warps", 8)
    return hints
