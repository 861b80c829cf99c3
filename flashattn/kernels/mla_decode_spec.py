"""The MLA decode kernels' contract (kernels/mla_decode.py): specs, per-arch tiles and hints, and
``mla_plan``, the pure plan of a call (no GPU, no launch). Does not import cuda.tile."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .spec import Array, KernelSpec

__all__ = ["MLA_DECODE", "MLA_SPLIT", "MLA_SPLIT_FP8", "MLA_COMBINE", "MLA_HINTS", "MLA_TILES",
           "MLA_MAX_SPLITS", "MlaDims", "mla_tiles", "mla_num_splits", "mla_plan", "mla_steps"]

MLA_SPLIT = KernelSpec(
    "mla_decode_split", "flashattn.kernels.mla_decode", "mla_decode_split_kernel",
    arrays=(Array("Q", 4), Array("KV", 4), Array("BlockTable", 2, "int32"),
            Array("SeqLens", 1, "int32"), Array("Descale", 1, "float32"),
            Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4),
            Array("LseOut", 3, "float32")),
    scalars=(("qk_scale", float), ("num_q", int)),
    constants=("TILE_M", "TILE_N", "D_LAT", "D_ROPE", "CAUSAL", "FP8", "FINAL"))

# The same kernel over an e4m3 latent cache (FP8=True): its own spec, for the signature's dtype.
MLA_SPLIT_FP8 = replace(MLA_SPLIT, name="mla_decode_split_fp8", arrays=tuple(
    replace(a, dtype="float8_e4m3fn") if a.name == "KV" else a for a in MLA_SPLIT.arrays))

MLA_COMBINE = KernelSpec(
    "mla_combine", "flashattn.kernels.mla_decode", "mla_combine_kernel",
    arrays=(Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4),
            Array("LseOut", 3, "float32")),
    scalars=(), constants=("TILE_M", "D_LAT"))

MLA_DECODE = {"mla_decode_split": MLA_SPLIT, "mla_decode_split_fp8": MLA_SPLIT_FP8,
              "mla_combine": MLA_COMBINE}

# (TILE_M, TILE_N) per architecture and cache kind: 64 rows (one warpgroup MMA) and the widest
# key tile whose 64 x 512 fp32 accumulator, scores and widened FP8 tile fit the registers
# without spilling (experiments/mla_sass.py; tests/test_mla.py checks the sm_90 rows).
MLA_TILES: dict[str, dict[bool, tuple[int, int]]] = {
    "sm_90": {False: (64, 32), True: (64, 16)},
    "sm_100": {False: (64, 32), True: (64, 32)},
    "sm_120": {False: (32, 16), True: (32, 16)},
}
MLA_DEFAULT_TILES = (64, 32)
MLA_MAX_SPLITS = 128
# Launch hints per architecture: two consumer warpgroups hold the accumulator's 512 columns.
MLA_HINTS: dict[str, dict] = {"sm_90": dict(occupancy=1, num_worker_warps=8),
                              "sm_100": dict(num_worker_warps=8)}
# fp32 values per combine tile.
MLA_COMBINE_ELEMS = 4096


@dataclass(frozen=True)
class MlaDims:
    """What the contract found: batch, new tokens, query heads, cache heads, head dims, pages."""
    B: int
    Sq: int
    Hq: int
    Hkv: int
    D: int            # query/key head dim (latent + rotary)
    Dv: int           # value head dim: the latent part
    page_size: int
    max_pages: int
    num_pages: int

    @property
    def rows(self) -> int:
        return self.Sq * (self.Hq // self.Hkv)

    @property
    def capacity(self) -> int:
        return self.max_pages * self.page_size


def mla_tiles(*, rows: int, page_size: int, arch: str | None = None,
              fp8: bool = False) -> tuple[int, int]:
    """(TILE_M, TILE_N): the arch's tiles, with rows cut to the rows rounded up to a power of
    two (at least 16) and keys to the largest power of two dividing the page size (a tile never
    straddles two pages)."""
    if rows < 1:
        raise ValueError(f"rows must be positive, got {rows}")
    if page_size < 16 or page_size % 16:
        raise ValueError(f"page_size must be a positive multiple of 16, got {page_size}")
    tm, tn = MLA_TILES.get(arch, {}).get(bool(fp8), MLA_DEFAULT_TILES)
    tile_m = min(max(16, 1 << (int(rows) - 1).bit_length()), tm)
    return tile_m, min(tn, page_size & -page_size)


def mla_num_splits(*, B: int, Hkv: int, rows: int, max_seqlen: int, page_size: int,
                   sm_count: int, arch: str | None = None, fp8: bool = False,
                   max_splits: int = MLA_MAX_SPLITS) -> int:
    """Splits of the cache: one wave of programs (``sm_count``), never a split without a tile
    of the longest sequence."""
    tile_m, tile_n = mla_tiles(rows=rows, page_size=page_size, arch=arch, fp8=fp8)
    base = int(B) * int(Hkv) * (-(-int(rows) // tile_m))
    n_tiles = -(-max(int(max_seqlen), 0) // tile_n)
    splits = max(1, min(int(sm_count) // base, n_tiles, int(max_splits)))
    if n_tiles:
        splits = -(-n_tiles // -(-n_tiles // splits))       # drop the runs left empty
    return splits


def mla_plan(dims: MlaDims, *, num_splits: int, causal: bool, fp8: bool,
             arch: str | None = None) -> dict:
    """The launch plan (pure): constants, grids, scratch shapes."""
    if int(num_splits) < 1 or int(num_splits) > 65535:
        raise ValueError(f"num_splits must be in 1..65535, got {num_splits}")
    rows = dims.rows
    tile_m, tile_n = mla_tiles(rows=rows, page_size=dims.page_size, arch=arch, fp8=fp8)
    blocks = -(-rows // tile_m)
    final = int(num_splits) == 1
    split_c = dict(TILE_M=tile_m, TILE_N=tile_n, D_LAT=dims.Dv, D_ROPE=dims.D - dims.Dv,
                   CAUSAL=bool(causal), FP8=bool(fp8), FINAL=final)
    comb_m = max(1, min(tile_m, MLA_COMBINE_ELEMS // dims.Dv))
    m_pad = blocks * tile_m
    bh = dims.B * dims.Hkv
    if bh > 65535:
        raise ValueError(f"B x Hkv = {bh} exceeds 65535 (a grid axis): decode the batch in parts")
    return dict(rows=rows, num_splits=int(num_splits), split_constants=split_c,
                split_grid=(blocks, int(num_splits), bh),
                combine_constants=None if final else dict(TILE_M=comb_m, D_LAT=dims.Dv),
                combine_grid=None if final else (-(-rows // comb_m), bh, 1),
                opart_shape=(int(num_splits), bh, m_pad, dims.Dv),
                lse_shape=(int(num_splits), bh, m_pad))


def mla_steps(plan: dict, cache_seqlens, dims: MlaDims) -> int:
    """(row block, key tile) steps of a call, for the interpreter's progress estimate."""
    tile_n = plan["split_constants"]["TILE_N"]
    lens = [min(max(int(n), 0), dims.capacity) for n in cache_seqlens.tolist()]
    blocks = plan["split_grid"][0] * dims.Hkv
    return blocks * sum(-(-n // tile_n) + plan["num_splits"] for n in lens)
