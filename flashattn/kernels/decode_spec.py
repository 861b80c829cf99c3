"""The decode kernels' contract (kernels/decode.py): their specs, the tile, split and hint rules
per architecture and cache dtype, and ``decode_plan``, the pure plan of a call (no GPU, no
launch). Does not import cuda.tile.

One split kernel serves every cache: ``decode_split_spec(cache)`` is its spec for the cache's
dtype (``DECODE_SPLIT`` for fp16/bf16, ``DECODE_SPLIT_FP8`` for e4m3, an e5m2 twin on demand),
``decode_kernel_constants`` its constants (the arithmetic picked by ``KV_FP8``,
``V_TRANSPOSED``, ``SLICE_D``, ``P_SHIFT``) and ``decode_hints`` its launch hints.
"""
from __future__ import annotations

import dataclasses
import functools
import numbers

from ..contract import tile_d_for
from .spec import Array, KernelSpec

__all__ = ["DECODE", "DECODE_SPLIT", "DECODE_SPLIT_FP8", "DECODE_COMBINE", "decode_tiles",
           "decode_split_constants", "decode_kernel_constants", "decode_hints",
           "decode_split_spec", "decode_combine_constants", "decode_split_grid",
           "DECODE_SPLIT_HINTS", "DECODE_COMBINE_ROW", "decode_combine_row_constants",
           "decode_combine_kind", "decode_combine_grid", "decode_partial_shapes",
           "decode_num_splits", "decode_row_blocks", "decode_plan", "decode_steps",
           "DECODE_MAX_TILE_M", "DECODE_WAVES", "DECODE_MAX_SPLITS", "DECODE_COMBINE_ELEMS",
           "DECODE_COMBINE_CHUNK", "DECODE_ROW_COMBINE_MAX", "DECODE_ROW_COMBINE_MIN_SPLITS",
           "DECODE_TILE_BUDGET", "DECODE_TILE_BUDGET_WIDE", "DECODE_WIDE_MMA_ARCHS",
           "DECODE_CACHE_DTYPES", "DECODE_FP8_DTYPES", "DECODE_FP8_TILE_M",
           "DECODE_FP8_SLICE_D", "DECODE_FP8_MMA_MAX_TILE_N", "DECODE_FP8_MMA_HINTS",
           "DECODE_FP8_P_SHIFT"]

# Not steps: flashattn/decoding.py launches them, aot.compile_spec compiles them.
DECODE_MAX_TILE_M = 64        # rows (query heads x new tokens of a group) per program
DECODE_WAVES = 1              # the split rule fills at most this many programs per SM
DECODE_MAX_SPLITS = 256       # beyond this, partials and the combine's loop outweigh the gain
# Launch hints of the 16-bit cache's split kernel per architecture (none: the compiler's
# choice; occupancy=2 on sm_90 did not pay at the one-wave grid).
DECODE_SPLIT_HINTS: dict[str, dict] = {}
DECODE_COMBINE_ELEMS = 2048   # fp32 values per combine tile (its loop keeps two such tiles)
DECODE_COMBINE_CHUNK = 4096   # fp32 partial-output values one step of the one-row combine loads
# The one-row combine (decode_combine_row_kernel) when its programs (B x Hkv x rows) fit one wave
# and the splits are many, else the multi-row combine, whose programs walk the splits.
DECODE_ROW_COMBINE_MAX = 128
DECODE_ROW_COMBINE_MIN_SPLITS = 8

# The cache dtypes the split kernel reads: fp16/bf16 (the query's dtype) and fp8 with descales.
DECODE_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
DECODE_CACHE_DTYPES = ("float16", "bfloat16", *DECODE_FP8_DTYPES)
# An fp8 cache's row tile where the MMA reads shared memory (Hopper's warpgroup MMA,
# Blackwell's tcgen05): at least 64 rows; a 16-row tile gets a warp MMA with register operands
# (the fp8 tiles then read a byte or two at a time). Elsewhere the fp16 plan's tile.
DECODE_FP8_TILE_M = {"sm_90": 64, "sm_100": 64}
# Widened fp8 (V in K's layout): S in head-dim slices of at most this many columns (the whole
# widened K tile at D=256 spilled).
DECODE_FP8_SLICE_D = 128
# FP8 MMAs (V transposed), per arch and TILE_D, where the fp16 plan's key tile spills with fp8
# operands (sm_120: warp MMAs, S and O in registers) ...
DECODE_FP8_MMA_MAX_TILE_N: dict[str, dict[int, int]] = {"sm_120": {128: 64, 256: 32}}
# ... and launch hints (two consumer warp groups where one spilled).
DECODE_FP8_MMA_HINTS: dict[str, dict[int, dict]] = {
    "sm_90": {64: {"num_worker_warps": 8}, 256: {"num_worker_warps": 8}},
    "sm_100": {256: {"num_worker_warps": 8}},
}
# FP8 MMAs: P = 2^(s - m + P_SHIFT) in [0, 256], inside e4m3's range (448).
DECODE_FP8_P_SHIFT = 8


# K, V in the query's dtype ("io"); KDescale, VDescale placeholders unless KV_FP8.
DECODE_SPLIT = KernelSpec(
    "decode_split", "flashattn.kernels.decode", "decode_split_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("BlockTable", 2, "int32"),
            Array("SeqLens", 1, "int32"), Array("KDescale", 2, "float32"),
            Array("VDescale", 2, "float32"), Array("Opart", 4, "float32"),
            Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(("qk_scale", float), ("num_q", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "PAGED", "FINAL", "KV_FP8", "V_TRANSPOSED",
               "SLICE_D", "P_SHIFT"))


@functools.lru_cache(maxsize=None)
def decode_split_spec(cache: str | None = None) -> KernelSpec:
    """The split kernel's spec for a cache of dtype ``cache`` (a name of
    ``DECODE_CACHE_DTYPES``; None or 16-bit: K and V in the query's dtype)."""
    if cache is None or cache in ("float16", "bfloat16"):
        return DECODE_SPLIT
    if cache not in DECODE_FP8_DTYPES:
        raise ValueError(f"cache must be one of {', '.join(DECODE_CACHE_DTYPES)}, got {cache!r}")
    arrays = tuple(dataclasses.replace(a, dtype=cache) if a.name in ("K", "V") else a
                   for a in DECODE_SPLIT.arrays)
    # A name per dtype: aot's cubin cache is keyed by the spec's name.
    name = {"float8_e4m3fn": "decode_split_fp8", "float8_e5m2": "decode_split_fp8_e5m2"}.get(
        cache, f"decode_split_{cache}")
    return dataclasses.replace(DECODE_SPLIT, name=name, arrays=arrays)


DECODE_SPLIT_FP8 = decode_split_spec("float8_e4m3fn")

DECODE_COMBINE = KernelSpec(
    "decode_combine", "flashattn.kernels.decode", "decode_combine_kernel",
    arrays=(Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(), constants=("TILE_M", "TILE_D"))

DECODE_COMBINE_ROW = KernelSpec(
    "decode_combine_row", "flashattn.kernels.decode", "decode_combine_row_kernel",
    arrays=(Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(), constants=("TILE_D", "TILE_S"))

DECODE = {"decode_split": DECODE_SPLIT, "decode_split_fp8": DECODE_SPLIT_FP8,
          "decode_combine": DECODE_COMBINE, "decode_combine_row": DECODE_COMBINE_ROW}


# Register budget of the split kernel, in elements of TILE_M x TILE_N x TILE_D: the largest
# products that compiled without spills (tileiras 13.4, every head dim, tests/test_decode_aot.py).
# Warp MMA (HMMA: 16/32-row tiles, and sm_120 always) keeps S and the accumulator in registers;
# Hopper's warpgroup MMA and Blackwell's tensor memory take 64-row tiles four times larger.
DECODE_TILE_BUDGET = 1 << 18
DECODE_TILE_BUDGET_WIDE = 1 << 20
DECODE_WIDE_MMA_ARCHS = ("sm_90", "sm_100")


def decode_tiles(*, rows: int, head_dim: int, page_size: int | None = None,
                 arch: str | None = None) -> tuple[int, int]:
    """(TILE_M, TILE_N) of the split kernel for ``rows = (Hq // Hkv) * Nq`` packed query rows.

    TILE_M: the rows rounded up to a power of two, at least 16 (the MMA's M granularity), at
    most ``DECODE_MAX_TILE_M`` (more rows take more row blocks), and with the smaller budget at
    most what leaves TILE_N >= 32. TILE_N: the most keys (up to 128) whose
    ``TILE_M x TILE_N x TILE_D`` product fits the register budget of ``arch`` (unknown arch: the
    smaller budget, which compiles everywhere); for a paged cache also a divisor of the page
    size, so that a K/V tile never straddles two pages.
    """
    if rows < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    td = tile_d_for(head_dim)
    tile_m = min(max(16, 1 << (int(rows) - 1).bit_length()), DECODE_MAX_TILE_M)
    wide = arch in DECODE_WIDE_MMA_ARCHS and tile_m >= 64
    budget = DECODE_TILE_BUDGET_WIDE if wide else DECODE_TILE_BUDGET
    if not wide:
        # Fewer rows rather than key tiles under 32 wide (64 x 16 x 256 spilled on sm_120).
        tile_m = min(tile_m, max(16, budget // (32 * td)))
    tile_n = max(16, min(128, budget // (tile_m * td)))
    if page_size is not None:
        if page_size < 16 or page_size % 16:
            raise ValueError(f"page_size must be a positive multiple of 16, got {page_size}")
        tile_n = min(tile_n, page_size & -page_size)       # largest power of two dividing it
    return tile_m, tile_n


def decode_split_constants(*, rows: int, head_dim: int, page_size: int | None,
                           arch: str | None = None, final: bool = False) -> dict:
    """The constants of ``decode_split_kernel`` over a 16-bit cache by name;
    ``page_size=None``: contiguous cache; ``final``: one split, the kernel writes the output
    (no combine)."""
    tile_m, tile_n = decode_tiles(rows=rows, head_dim=head_dim, page_size=page_size, arch=arch)
    td = tile_d_for(head_dim)
    return dict(TILE_M=tile_m, TILE_N=tile_n, TILE_D=td, PAGED=page_size is not None,
                FINAL=bool(final), KV_FP8=False, V_TRANSPOSED=False, SLICE_D=td, P_SHIFT=0)


def decode_kernel_constants(*, rows: int, head_dim: int, page_size: int | None,
                            arch: str | None = None, final: bool = False,
                            cache: str | None = None, v_transposed: bool = False) -> dict:
    """The split kernel's constants for a cache of dtype ``cache`` (None: 16-bit). fp8: the
    16-bit tiles with TILE_M raised to ``DECODE_FP8_TILE_M[arch]``; widened (V in K's layout)
    S in slices of ``DECODE_FP8_SLICE_D``; ``v_transposed`` (FP8 MMAs) TILE_N capped by
    ``DECODE_FP8_MMA_MAX_TILE_N`` (a power of two: still a divisor of the page) and P scaled by
    ``2^DECODE_FP8_P_SHIFT``. The split count stays the 16-bit plan's."""
    c = decode_split_constants(rows=rows, head_dim=head_dim, page_size=page_size, arch=arch,
                               final=final)
    if cache is None or cache in ("float16", "bfloat16"):
        if v_transposed:
            raise ValueError("v_transposed=True applies to fp8 caches only (the FP8-MMA path)")
        return c
    td = c["TILE_D"]
    c.update(KV_FP8=True, TILE_M=max(c["TILE_M"], DECODE_FP8_TILE_M.get(arch or "", 0)))
    if not v_transposed:
        return dict(c, SLICE_D=min(td, DECODE_FP8_SLICE_D))
    cap = DECODE_FP8_MMA_MAX_TILE_N.get(arch or "", {}).get(td)
    return dict(c, TILE_N=min(c["TILE_N"], cap) if cap else c["TILE_N"], V_TRANSPOSED=True,
                P_SHIFT=DECODE_FP8_P_SHIFT)


def decode_hints(constants: dict, arch: str | None) -> dict:
    """The split kernel's launch hints for ``constants`` on ``arch``: ``DECODE_SPLIT_HINTS``;
    FP8 MMAs ``DECODE_FP8_MMA_HINTS``; widened fp8 ``num_worker_warps=8`` for the paged
    one-split kernel on sm_90 (the one 64-row variant that spilled without it)."""
    hints = dict(DECODE_SPLIT_HINTS.get(arch or "", {}))
    if constants.get("V_TRANSPOSED"):
        return dict(DECODE_FP8_MMA_HINTS.get(arch or "", {}).get(int(constants["TILE_D"]), {}))
    if (constants.get("KV_FP8") and arch == "sm_90" and constants.get("PAGED")
            and constants.get("FINAL")):
        hints.setdefault("num_worker_warps", 8)
    return hints


def decode_combine_constants(*, split_tile_m: int, head_dim: int) -> dict:
    """The constants of ``decode_combine_kernel`` by name: the split kernel's row tile
    (``split_tile_m``), or fewer rows (a power of two, so a divisor of it) so that a tile holds
    at most ``DECODE_COMBINE_ELEMS`` fp32 values."""
    td = tile_d_for(head_dim)
    return dict(TILE_M=max(1, min(int(split_tile_m), DECODE_COMBINE_ELEMS // td)), TILE_D=td)


def decode_combine_row_constants(*, head_dim: int, num_splits: int) -> dict:
    """The constants of ``decode_combine_row_kernel`` by name. TILE_S: the splits merged per
    step, the split count rounded up to a power of two, as many as keep the ``TILE_S x TILE_D``
    partial outputs within ``DECODE_COMBINE_CHUNK`` fp32 values (at least 1)."""
    td = tile_d_for(head_dim)
    if int(num_splits) < 1:
        raise ValueError(f"num_splits must be positive, got {num_splits}")
    tile_s = min(1 << (int(num_splits) - 1).bit_length(), max(1, DECODE_COMBINE_CHUNK // td))
    return dict(TILE_D=td, TILE_S=tile_s)


def decode_combine_kind(*, B: int, Hkv: int, rows: int, num_splits: int,
                        row_max: int | None = None, min_splits: int | None = None) -> str | None:
    """Which merge a decode call runs: None (one split: the split kernel writes the output),
    "row" (``decode_combine_row_kernel``, one program per packed row) when ``B x Hkv x rows <=
    row_max`` (default ``DECODE_ROW_COMBINE_MAX``) and ``num_splits >= min_splits`` (default
    ``DECODE_ROW_COMBINE_MIN_SPLITS``), else "block" (``decode_combine_kernel``, one program
    per row block)."""
    if int(num_splits) == 1:
        return None
    limit = DECODE_ROW_COMBINE_MAX if row_max is None else int(row_max)
    least = DECODE_ROW_COMBINE_MIN_SPLITS if min_splits is None else int(min_splits)
    if int(B) * int(Hkv) * int(rows) <= limit and int(num_splits) >= least:
        return "row"
    return "block"


def decode_row_blocks(rows: int, tile_m: int) -> int:
    """Row blocks of one GQA group: cdiv(rows, tile_m)."""
    return -(-int(rows) // int(tile_m))


def decode_split_grid(*, B: int, Hkv: int, rows: int, tile_m: int,
                      num_splits: int) -> tuple[int, int, int]:
    """(row blocks, splits, B * Hkv): the row blocks of one group run side by side, so they
    share its K/V tiles through L2."""
    return (decode_row_blocks(rows, tile_m), int(num_splits), int(B) * int(Hkv))


def decode_combine_grid(*, B: int, Hkv: int, rows: int, tile_m: int) -> tuple[int, int, int]:
    """(row blocks of the combine's TILE_M, B * Hkv, 1)."""
    return (decode_row_blocks(rows, tile_m), int(B) * int(Hkv), 1)


def decode_partial_shapes(*, num_splits: int, B: int, Hkv: int, rows: int, tile_m: int,
                          head_dim: int) -> tuple[tuple, tuple]:
    """Shapes of the fp32 scratch: Opart (splits, B*Hkv, M_pad, TILE_D), Lse (splits, B*Hkv,
    M_pad), padded to whole tiles of the split kernel's ``tile_m`` so every store of it is in
    bounds."""
    m_pad = decode_row_blocks(rows, tile_m) * tile_m
    return ((num_splits, B * Hkv, m_pad, tile_d_for(head_dim)), (num_splits, B * Hkv, m_pad))


def decode_num_splits(*, B: int, Hkv: int, rows: int, max_seqlen: int, head_dim: int,
                      sm_count: int, page_size: int | None = None, arch: str | None = None,
                      waves: int = DECODE_WAVES, min_tiles_per_split: int = 1,
                      max_splits: int = DECODE_MAX_SPLITS) -> int:
    """How many splits of the KV length: one whole wave of programs, no empty work.

    Without splitting, the grid has ``base = B * Hkv * row_blocks`` programs. A decode step is
    memory-bound and every program streams its run of the cache at about the same rate, so the
    step takes as long as the SM with the most programs: the grid should fill the SMs once and
    not spill a partial second wave onto some of them. So ``floor(waves * sm_count / base)``
    splits (at least 1) with ``waves = 1``, the fastest measured on the H200. Bounded above by the K/V tiles of the longest sequence over
    ``min_tiles_per_split`` (a split with no tile is pure overhead: a partial written and read
    back) and by ``max_splits``; then lowered to the number of runs the kernel actually deals
    (``cdiv(n, cdiv(n, splits))`` for ``n`` tiles), so the longest sequence leaves no split
    empty. ``max_seqlen`` is the bound the host knows: the cache capacity under CUDA-graph
    capture, the actual longest length otherwise (shorter sequences leave their trailing splits
    empty, which cost one partial each).

    H100/H200 (132 SMs), GQA 32:8, Nq=1, D=128 (rows 4: one row block; 128-key tiles): B=1 and
    128K keys -> 16 splits of 64 tiles (128 programs); B=8 and 32K -> 2 splits; B=64 -> 1 (512
    programs: more than one wave without splitting).
    """
    for name, x in (("B", B), ("Hkv", Hkv), ("rows", rows), ("sm_count", sm_count),
                    ("waves", waves), ("min_tiles_per_split", min_tiles_per_split),
                    ("max_splits", max_splits)):
        if int(x) < 1:
            raise ValueError(f"{name} must be positive, got {x}")
    if max_seqlen < 0:
        raise ValueError(f"max_seqlen must be >= 0, got {max_seqlen}")
    tile_m, tile_n = decode_tiles(rows=rows, head_dim=head_dim, page_size=page_size, arch=arch)
    base = int(B) * int(Hkv) * decode_row_blocks(rows, tile_m)
    want = int(waves) * int(sm_count) // base
    n_tiles = -(-int(max_seqlen) // tile_n)
    splits = max(1, min(want, n_tiles // int(min_tiles_per_split), int(max_splits)))
    if n_tiles:
        # The kernel deals runs of cdiv(n_tiles, splits) tiles: drop the splits left empty.
        splits = -(-n_tiles // -(-n_tiles // splits))
    return splits


def decode_plan(dims, *, cache=None, v_transposed=False, num_splits=None, max_seqlen=None,
                sm_count: int, arch=None) -> dict:
    """The launch plan of a decode call (pure: no GPU): the split kernel's spec name, constants
    and hints, grids, split count, combine, scratch shapes. ``dims``: a ``contract.DecodeDims``
    (of the cache in (S, D) terms); ``cache``: the cache's dtype name (None: 16-bit);
    ``v_transposed``: an fp8 V cache stored (D, S) per kv head. The split count and key tile
    are the 16-bit plan's whatever the cache (a smaller key tile lengthens each split's run)."""
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    rows = (dims.Hq // dims.Hkv) * dims.Nq
    page = dims.page_size if dims.paged else None
    if num_splits is None:
        bound = dims.capacity if max_seqlen is None else min(int(max_seqlen), dims.capacity)
        num_splits = decode_num_splits(B=dims.B, Hkv=dims.Hkv, rows=rows, max_seqlen=bound,
                                       head_dim=dims.D, sm_count=sm_count, page_size=page,
                                       arch=arch)
    if (isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Real)
            or int(num_splits) != num_splits or num_splits < 1):
        raise ValueError(f"num_splits must be a positive integer, got {num_splits!r}")
    num_splits = int(num_splits)
    if num_splits > 65535:
        raise ValueError(f"num_splits must be at most 65535 (a grid axis), got {num_splits}")
    kind = decode_combine_kind(B=dims.B, Hkv=dims.Hkv, rows=rows, num_splits=num_splits)
    # One split (kind None): its normalised partial is the answer; the split kernel writes it.
    split_c = decode_kernel_constants(rows=rows, head_dim=dims.D, page_size=page, arch=arch,
                                      final=kind is None, cache=cache,
                                      v_transposed=v_transposed)
    if kind == "row":
        comb_c = decode_combine_row_constants(head_dim=dims.D, num_splits=num_splits)
    else:
        comb_c = decode_combine_constants(split_tile_m=split_c["TILE_M"], head_dim=dims.D)
    if dims.B * dims.Hkv > 65535:
        raise ValueError(f"B x Hkv = {dims.B * dims.Hkv} exceeds 65535 (a grid axis): decode "
                         "the batch in parts")
    opart_shape, lse_shape = decode_partial_shapes(num_splits=num_splits, B=dims.B,
                                                   Hkv=dims.Hkv, rows=rows,
                                                   tile_m=split_c["TILE_M"], head_dim=dims.D)
    return dict(rows=rows, num_splits=num_splits, kernel=decode_split_spec(cache).name,
                split_constants=split_c, hints=decode_hints(split_c, arch),
                combine_constants=comb_c,
                split_grid=decode_split_grid(B=dims.B, Hkv=dims.Hkv, rows=rows,
                                             tile_m=split_c["TILE_M"], num_splits=num_splits),
                combine=kind,
                combine_grid=(None if kind is None else decode_combine_grid(
                    B=dims.B, Hkv=dims.Hkv, rows=rows, tile_m=comb_c.get("TILE_M", 1))),
                opart_shape=opart_shape, lse_shape=lse_shape)


def decode_steps(plan, cache_seqlens, dims) -> int:
    """(query tile, key tile) steps of a decode call (``dispatch.expect``'s estimate): each row
    block of each (sequence, kv head) over its sequence's key tiles, plus a partial per split
    (``cache_seqlens`` read on the host: a CPU tensor)."""
    c = plan["split_constants"]
    lens = [min(max(int(n), 0), dims.capacity) for n in cache_seqlens.tolist()]
    blocks = plan["split_grid"][0] * dims.Hkv
    return blocks * sum(-(-n // c["TILE_N"]) + plan["num_splits"] for n in lens)
