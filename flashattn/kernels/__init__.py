"""The cuTile kernels and their contracts.

    fmha.py     the fused FlashAttention forward as it ships (the flags of ``best`` folded in)
    naive.py    standard attention in three kernels (chapter 1)
    spec.py     KernelSpec: a kernel's parameters by name, checked against its source

This module holds one ``KernelSpec`` per kernel and the rules that turn a step and a
configuration into the kernel's constants and grid. The launch (``flashattn.launch``) and the
compiler report (``flashattn.aot``) both use them. Importing it does not import cuda.tile.

The book's ladder kernel (every step's flag, ``flashbook/ladder/fmha.py``) is not part of the
library: the book registers its spec (``register_ladder``), and a step whose flags differ from
``SHIPPED_FLAGS`` runs it.
"""
from __future__ import annotations

from ..contract import tile_d_for
from ..steps import FLAG_DEFAULTS, Config, Step
from .spec import Array, KernelContractError, KernelSpec, hinted

__all__ = ["FMHA", "NAIVE", "SPECS", "KernelSpec", "KernelContractError", "Array", "hinted",
           "kernels_of", "fmha_constants", "fmha_grid", "fmha_spec", "naive_constants",
           "NAIVE_ROW_TILE", "SHIPPED_FLAGS", "register_ladder"]

# --- the fused kernel -------------------------------------------------------------------------
# Lse: fp32 (B, Hq, Nq), the natural-log LSE of each query row, written only with WRITE_LSE (the
# backward's forward); without it the launch passes a one-element stand-in.
FMHA_ARRAYS = (Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4),
               Array("Lse", 3, "float32"))
FMHA_SCALARS = (("qk_scale", float), ("input_pos", int), ("num_heads", int),
                ("group_size", int), ("num_m_blocks", int))
FMHA = KernelSpec(
    "fmha", "flashattn.kernels.fmha", "fmha_kernel", arrays=FMHA_ARRAYS, scalars=FMHA_SCALARS,
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "K_LAT", "V_LAT", "WRITE_LSE"))
# The flags folded into fmha.py: what step="best" runs (fast math, the diagonal-only mask, the
# longest causal tiles first); every other flag at its default.
SHIPPED_FLAGS = dict(FAST_MATH=True, SPLIT_LOOP=True, REMAP=True, PAIR=False,
                     LAZY_RESCALE=False, EXP_POLY=0, UNCHECKED_KV=False, PERSISTENT=False,
                     PIPELINE=False)

_LADDER: list[KernelSpec] = []      # the book's ladder kernel, once flashbook registers it


def register_ladder(spec: KernelSpec) -> None:
    """The book's ladder kernel (all the steps' flags): steps off the shipped flags run it."""
    _LADDER[:] = [spec]


def fmha_spec(step: Step) -> KernelSpec:
    """The fused kernel a step runs: the shipped one when its flags are the shipped flags, else
    the book's ladder (registered by ``import flashbook``)."""
    flags = step.flag_values()
    if all(flags[f] == v for f, v in SHIPPED_FLAGS.items()):
        return FMHA
    if not _LADDER:
        raise ValueError(f"step {step.name!r} runs the book's ladder kernel, which the library "
                         "does not ship: import flashbook first (flashbook.attention(..., "
                         "step=NAME))")
    return _LADDER[0]


def fmha_constants(step: Step, config: Config, *, head_dim: int, causal: bool,
                   even_k: bool, write_lse: bool = False, spec: KernelSpec | None = None) -> dict:
    """The ``ct.Constant`` values of the fused kernel ``step`` runs (``fmha_spec``; or of
    ``spec``, the ladder say), by name. ``write_lse``: also write the LSE of each row (the
    forward of a training step)."""
    flags = step.flag_values()
    td = tile_d_for(head_dim)
    out = dict(flags, TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=td,
               CAUSAL=bool(causal), EVEN_K=bool(even_k), WRITE_LSE=bool(write_lse),
               # Unchecked loads only where every K/V tile is provably in bounds.
               UNCHECKED_KV=flags["UNCHECKED_KV"] and even_k and td == head_dim)
    names = (spec or fmha_spec(step)).constants
    return {k: v for k, v in out.items() if k in names}


def fmha_grid(step: Step, config: Config, *, B: int, Hq: int, Nq: int,
              sm_count: int | None = None) -> tuple[int, int, int]:
    """The launch grid: one program per query tile per (batch, head); PAIR halves the first
    axis; PERSISTENT launches one program per SM slot (``sm_count`` x occupancy)."""
    flags = step.flag_values()
    num_m_blocks = -(-Nq // config.TILE_M)
    if flags["PERSISTENT"]:
        if sm_count is None:
            raise ValueError("a persistent grid needs the GPU's SM count")
        return (min(num_m_blocks * B * Hq, sm_count * (config.occupancy or 1)), 1, 1)
    grid_x = -(-num_m_blocks // 2) if flags["PAIR"] else num_m_blocks
    return (grid_x, B * Hq, 1)


# --- the naive kernels (chapter 1) ------------------------------------------------------------
NAIVE_ROW_TILE = 16      # rows of S per softmax program

NAIVE = {
    "naive_scores": KernelSpec(
        "naive_scores", "flashattn.kernels.naive", "scores_kernel",
        arrays=(Array("Q", 4), Array("K", 4), Array("S", 3, "float32")),
        scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
                 ("group_size", int), ("bh_offset", int)),
        constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL")),
    "naive_softmax": KernelSpec(
        "naive_softmax", "flashattn.kernels.naive", "softmax_kernel",
        arrays=(Array("S", 3, "float32"), Array("P", 3)), scalars=(),
        constants=("TILE_R", "TILE_N")),
    "naive_pv": KernelSpec(
        "naive_pv", "flashattn.kernels.naive", "pv_kernel",
        arrays=(Array("P", 3), Array("V", 4), Array("Out", 4)),
        scalars=(("num_heads", int), ("group_size", int), ("bh_offset", int)),
        constants=("TILE_M", "TILE_N", "TILE_D")),
}


def naive_constants(kernel: str, config: Config, *, head_dim: int, causal: bool) -> dict:
    """The constants of one naive kernel, by name."""
    td = tile_d_for(head_dim)
    return {"naive_scores": dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=td,
                                 CAUSAL=bool(causal)),
            "naive_softmax": dict(TILE_R=NAIVE_ROW_TILE, TILE_N=config.TILE_N),
            "naive_pv": dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=td)}[kernel]


SPECS: dict[str, KernelSpec] = {"fmha": FMHA, **NAIVE}


def kernels_of(step: Step) -> list[KernelSpec]:
    """The kernels a step launches, in launch order."""
    return list(NAIVE.values()) if step.kernel == "naive" else [fmha_spec(step)]


def constants_for(spec: KernelSpec, step: Step, config: Config, *, head_dim: int,
                  causal: bool, even_k: bool, write_lse: bool = False) -> dict:
    """The constants of any kernel of a step, by name (what ``aot`` compiles)."""
    if spec.name == "fmha":
        return fmha_constants(step, config, head_dim=head_dim, causal=causal, even_k=even_k,
                              write_lse=write_lse, spec=spec)
    return naive_constants(spec.name, config, head_dim=head_dim, causal=causal)


# === decoding: split-KV over a contiguous or paged KV cache (chapter 12) ======================
# kernels/decode.py: decode_split_kernel (partials per split) and decode_combine_kernel (the LSE
# merge). Not steps: the host module flashattn/decode.py launches them, aot.compile_spec compiles
# them. Their integer tables (block table, lengths) are int32 arrays (``Array(..., "int32")``).
DECODE_MAX_TILE_M = 64        # rows (query heads x new tokens of a group) per program
DECODE_WAVES = 1              # the split rule fills at most this many programs per SM (ch. 12)
DECODE_MAX_SPLITS = 256       # beyond this, partials and the combine's loop outweigh the gain
# Launch hints of decode_split_kernel per architecture (none: the compiler's choice; occupancy=2
# on sm_90 did not pay at the one-wave grid, chapter 12).
DECODE_SPLIT_HINTS: dict[str, dict] = {}
DECODE_COMBINE_ELEMS = 2048   # fp32 values per combine tile (its loop keeps two such tiles)
DECODE_COMBINE_CHUNK = 4096   # fp32 partial-output values one step of the one-row combine loads
# The one-row combine (decode_combine_row_kernel) when its programs (B x Hkv x rows) fit one wave
# and the splits are many, else the multi-row combine, whose programs walk the splits (ch. 12).
DECODE_ROW_COMBINE_MAX = 128
DECODE_ROW_COMBINE_MIN_SPLITS = 8
# The book's ladder (flashbook/ladder/decode.py) adds the merge fused into the split kernel and
# a dependent launch of the combine: both off in what ships (chapter 12).


DECODE_SPLIT = KernelSpec(
    "decode_split", "flashattn.kernels.decode", "decode_split_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("BlockTable", 2, "int32"),
            Array("SeqLens", 1, "int32"), Array("Opart", 4, "float32"),
            Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(("qk_scale", float), ("num_q", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "PAGED", "FINAL"))

DECODE_COMBINE = KernelSpec(
    "decode_combine", "flashattn.kernels.decode", "decode_combine_kernel",
    arrays=(Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(), constants=("TILE_M", "TILE_D"))

DECODE_COMBINE_ROW = KernelSpec(
    "decode_combine_row", "flashattn.kernels.decode", "decode_combine_row_kernel",
    arrays=(Array("Opart", 4, "float32"), Array("Lse", 3, "float32"), Array("Out", 4)),
    scalars=(), constants=("TILE_D", "TILE_S"))

DECODE = {"decode_split": DECODE_SPLIT, "decode_combine": DECODE_COMBINE,
          "decode_combine_row": DECODE_COMBINE_ROW}


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
    """The constants of ``decode_split_kernel`` by name; ``page_size=None``: contiguous cache;
    ``final``: one split, the kernel writes the output (no combine)."""
    tile_m, tile_n = decode_tiles(rows=rows, head_dim=head_dim, page_size=page_size, arch=arch)
    return dict(TILE_M=tile_m, TILE_N=tile_n, TILE_D=tile_d_for(head_dim),
                PAGED=page_size is not None, FINAL=bool(final))


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
    splits (at least 1) with ``waves = 1``, the fastest on the H200 (chapter 12). Bounded above by the K/V tiles of the longest sequence over
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


SPECS.update(DECODE)
__all__ += ["DECODE", "DECODE_SPLIT", "DECODE_COMBINE", "decode_tiles",
            "decode_split_constants", "decode_combine_constants", "decode_split_grid",
            "DECODE_SPLIT_HINTS", "DECODE_COMBINE_ROW", "decode_combine_row_constants",
            "decode_combine_kind",
            "decode_combine_grid", "decode_partial_shapes", "decode_num_splits"]
# === end of decoding ============================================================================


# === the backward pass (chapter 11) =============================================================
# kernels/fmha_bwd.py: bwd_preprocess_kernel (Delta = rowsum(dO o O)), bwd_dkdv_kernel (one
# program per K/V tile and (batch, kv head), looping over the query heads of its group and the
# query tiles that see it) and bwd_dq_kernel (one program per query tile). Not steps: the host
# module flashattn/launch_bwd.py launches them, aot.compile_spec compiles them. LSE and Delta
# are fp32 (B, Hq, Nq); the LSE is in natural-log units.
BWD_PREPROCESS = KernelSpec(
    "bwd_preprocess", "flashattn.kernels.fmha_bwd", "bwd_preprocess_kernel",
    arrays=(Array("Out", 4), Array("dO", 4), Array("Delta", 3, "float32")),
    scalars=(("num_heads", int),),
    constants=("TILE_M", "TILE_D"))

BWD_DKDV = KernelSpec(
    "bwd_dkdv", "flashattn.kernels.fmha_bwd", "bwd_dkdv_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("dO", 4),
            Array("LSE", 3, "float32"), Array("Delta", 3, "float32"), Array("dK", 4),
            Array("dV", 4)),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_kv_heads", int),
             ("group_size", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K"))

BWD_DQ = KernelSpec(
    "bwd_dq", "flashattn.kernels.fmha_bwd", "bwd_dq_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("dO", 4),
            Array("LSE", 3, "float32"), Array("Delta", 3, "float32"), Array("dQ", 4)),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K"))

BWD = {"bwd_preprocess": BWD_PREPROCESS, "bwd_dkdv": BWD_DKDV, "bwd_dq": BWD_DQ}  # launch order

# The opt-in, non-deterministic variant (attention_backward(..., deterministic=False)): one
# dK/dV pass that also adds dQ to an fp32 buffer with atomics; launched after bwd_preprocess
# with bwd_dkdv's configuration, in place of bwd_dkdv and bwd_dq.
BWD_DKDV_DQ_ATOMIC = KernelSpec(
    "bwd_dkdv_dq_atomic", "flashattn.kernels.fmha_bwd", "bwd_dkdv_dq_atomic_kernel",
    arrays=(*BWD_DKDV.arrays, Array("dQacc", 4, "float32")),
    scalars=BWD_DKDV.scalars,
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K"))
BWD_ATOMIC = {"bwd_preprocess": BWD_PREPROCESS, "bwd_dkdv_dq_atomic": BWD_DKDV_DQ_ATOMIC}
BWD_PREPROCESS_CONFIG = Config(64, 64)     # 64 rows of Delta per program (TILE_N unused)

# (bwd_dkdv, bwd_dq) configurations per architecture and padded head dim (TILE_D up to the key).
# bwd_dkdv's TILE_M is its inner query tile and TILE_N its own K/V tile; bwd_dq's TILE_M is its
# own query tile. Chosen from the compiler's report (python -m pytest -m slow
# tests/test_backward_kernels.py prints it): no spills where a configuration without them was
# found, else the fewest. Not measured on a GPU yet.
BWD_CONFIGS: dict[str, dict[int, tuple[Config, Config]]] = {
    # Hopper: two consumer warp groups (num_worker_warps=8, 168 registers) hold the fp32 dK and
    # dV (or dQ) accumulators without spilling; 64x64 without the hint spills at D=128.
    "sm_90": {128: (Config(64, 128, num_worker_warps=8), Config(128, 64, num_worker_warps=8)),
              256: (Config(64, 64, num_worker_warps=8), Config(64, 64, num_worker_warps=8))},
    # Datacenter Blackwell: tensor-memory MMAs (UTCHMMA). At D=256, dK and dV (2 x 256 fp32
    # columns) fill tensor memory: the compiler falls back to HMMA and spills whatever the tiles.
    "sm_100": {64: (Config(64, 64), Config(64, 64)),
               128: (Config(64, 128), Config(128, 64)),
               256: (Config(16, 32), Config(64, 64))},
    # Consumer Blackwell (and Ampere): mma.sync with operands in registers, small tiles.
    "sm_120": {64: (Config(64, 32), Config(64, 64)),
               128: (Config(64, 32), Config(32, 32)),
               256: (Config(16, 32), Config(32, 32))},
}
BWD_CONFIGS["sm_80"] = BWD_CONFIGS["sm_120"]


def bwd_configs(arch: str | None, head_dim: int) -> dict[str, Config]:
    """The configuration of each backward kernel, by kernel name, for ``arch`` and ``head_dim``
    (unknown architectures get sm_80's)."""
    td = tile_d_for(head_dim)
    table = BWD_CONFIGS.get(arch or "sm_80", BWD_CONFIGS["sm_80"])
    dkdv, dq = table[min(d for d in table if d >= td)]
    return {"bwd_preprocess": BWD_PREPROCESS_CONFIG, "bwd_dkdv": dkdv, "bwd_dq": dq}


def bwd_constants(kernel: str, config: Config, *, head_dim: int, causal: bool,
                  even_k: bool) -> dict:
    """The ``ct.Constant`` values of one backward kernel, by name. ``even_k``: Nk is a multiple
    of ``config.TILE_N`` (the key tile of both bwd_dkdv and bwd_dq)."""
    td = tile_d_for(head_dim)
    if kernel == "bwd_preprocess":
        return dict(TILE_M=config.TILE_M, TILE_D=td)
    if kernel not in ("bwd_dkdv", "bwd_dq", "bwd_dkdv_dq_atomic"):
        raise ValueError(f"unknown backward kernel {kernel!r}; choose from "
                         f"{', '.join([*BWD, *BWD_ATOMIC])}")
    return dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=td, CAUSAL=bool(causal),
                EVEN_K=bool(even_k))


def bwd_grid(kernel: str, config: Config, *, B: int, Hq: int, Hkv: int, Nq: int,
             Nk: int) -> tuple[int, int, int]:
    """The launch grid: bwd_preprocess and bwd_dq one program per query tile per (batch, query
    head), bwd_dkdv one per key/value tile per (batch, key/value head)."""
    if kernel in ("bwd_dkdv", "bwd_dkdv_dq_atomic"):
        return (-(-Nk // config.TILE_N), B * Hkv, 1)
    if kernel not in ("bwd_preprocess", "bwd_dq"):
        raise ValueError(f"unknown backward kernel {kernel!r}; choose from {', '.join(BWD)}")
    return (-(-Nq // config.TILE_M), B * Hq, 1)


SPECS.update(BWD)
SPECS.update(BWD_ATOMIC)
__all__ += ["BWD", "BWD_PREPROCESS", "BWD_DKDV", "BWD_DQ", "BWD_CONFIGS", "BWD_ATOMIC",
            "BWD_DKDV_DQ_ATOMIC",
            "BWD_PREPROCESS_CONFIG", "bwd_configs", "bwd_constants", "bwd_grid"]
# === end of the backward pass ===================================================================


# === packed variable-length prefill (chapter 12) ================================================
# kernels/varlen.py: varlen_fwd_kernel, one program per (query tile, sequence, head) over packed
# (total, H, D) tensors viewed head-major, cu_seqlens read on the device. Not a step: the host
# module flashattn/varlen.py launches it, aot.compile_spec compiles it.
VARLEN_FWD = KernelSpec(
    "varlen_fwd", "flashattn.kernels.varlen", "varlen_fwd_kernel",
    arrays=(Array("Q", 3), Array("K", 3), Array("V", 3), Array("Out", 3),
            Array("CuSeqlensQ", 1, "int32"), Array("CuSeqlensK", 1, "int32")),
    scalars=(("qk_scale", float), ("group_size", int), ("max_seqlen_q", int),
             ("max_seqlen_k", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "Q_TILES", "K_LAT", "V_LAT"))

VARLEN = {"varlen_fwd": VARLEN_FWD}

# Query tiles per varlen program (the kernel's Q_TILES) per architecture (absent: 1), used when
# the sequences average fewer than VARLEN_Q_TILES_BELOW query tiles: each program builds its
# sequence's tensor maps once and runs this many tiles with them: short sequences gain, long
# ones lose (chapter 12; timed on sm_90 only).
VARLEN_Q_TILES: dict[str, int] = {"sm_90": 4}
VARLEN_Q_TILES_BELOW = 64

# Tiles and hints per architecture and padded head dim (TILE_D up to the key): the forward
# steps' configurations (steps.py: warp_groups' first on Hopper, arch_tuned's elsewhere),
# smaller where the compiler report showed spills (tests/test_varlen_aot.py prints it). Only
# sm_90 at D=128 was timed (chapter 12); the others are not measured yet.
VARLEN_CONFIGS: dict[str, dict[int, Config]] = {
    # sm_90, D=128: 64x128 occupancy=2 the fastest or tied of four tiles (chapter 12).
    "sm_90": {128: Config(64, 128, occupancy=2),
              256: Config(128, 64, occupancy=1, num_worker_warps=8)},
    "sm_100": {128: Config(128, 128, occupancy=2), 256: Config(128, 64, occupancy=1)},
    # sm_120 (HMMA, operands in registers): at D=256, 64x32 tiles spill ~210 B of stack and
    # causal 32x32 8 B; 16x32 does not.
    "sm_120": {64: Config(64, 64), 128: Config(64, 64), 256: Config(16, 32)},
}
VARLEN_CONFIGS["sm_80"] = VARLEN_CONFIGS["sm_120"]


def varlen_config(arch: str | None, head_dim: int) -> Config:
    """The configuration of ``varlen_fwd_kernel`` for ``arch`` (unknown: sm_80's, which
    compiles everywhere) and ``head_dim``: the entry of the smallest listed TILE_D >= it."""
    td = tile_d_for(head_dim)
    table = VARLEN_CONFIGS.get(arch or "sm_80", VARLEN_CONFIGS["sm_80"])
    return table[min(d for d in table if d >= td)]


def varlen_q_tiles(config: Config, *, max_seqlen_q: int, arch: str | None = None,
                   total_q: int | None = None, B: int | None = None) -> int:
    """Query tiles per program: ``VARLEN_Q_TILES[arch]`` (1 if absent) when the sequences
    average fewer than ``VARLEN_Q_TILES_BELOW`` query tiles (``total_q / B``; unknown: the
    longest, ``max_seqlen_q``), else 1; at most the longest sequence's tiles."""
    n_tiles = max(1, -(-int(max_seqlen_q) // config.TILE_M))
    mean_rows = int(max_seqlen_q) if not total_q or not B else int(total_q) / int(B)
    if mean_rows >= VARLEN_Q_TILES_BELOW * config.TILE_M:
        return 1
    return max(1, min(int(VARLEN_Q_TILES.get(arch or "sm_80", 1)), n_tiles))


def varlen_constants(config: Config, *, head_dim: int, causal: bool, q_tiles: int = 1) -> dict:
    """The ``ct.Constant`` values of ``varlen_fwd_kernel`` by name."""
    if int(q_tiles) < 1:
        raise ValueError(f"q_tiles (query tiles per program) must be >= 1, got {q_tiles}")
    return dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=tile_d_for(head_dim),
                CAUSAL=bool(causal), Q_TILES=int(q_tiles),
                K_LAT=FLAG_DEFAULTS["K_LAT"], V_LAT=FLAG_DEFAULTS["V_LAT"])   # the forward's


def varlen_grid(config: Config, *, B: int, Hq: int, max_seqlen_q: int,
                q_tiles: int = 1) -> tuple[int, int, int]:
    """(cdiv(query tiles of the longest sequence, q_tiles), Hq, B): programs past a shorter
    sequence's end exit at once; the heads of a sequence are adjacent in launch order (GQA
    groups share K/V in L2)."""
    if int(q_tiles) < 1:
        raise ValueError(f"q_tiles (query tiles per program) must be >= 1, got {q_tiles}")
    n_tiles = max(1, -(-int(max_seqlen_q) // config.TILE_M))
    return (-(-n_tiles // int(q_tiles)), int(Hq), int(B))


SPECS.update(VARLEN)
__all__ += ["VARLEN", "VARLEN_FWD", "VARLEN_CONFIGS", "VARLEN_Q_TILES", "VARLEN_Q_TILES_BELOW",
            "varlen_config", "varlen_constants", "varlen_grid", "varlen_q_tiles"]
# === end of packed variable-length prefill ======================================================


# === FP8 (issue 24): kernels/fp8.py, their specs and configurations in kernels/fp8_spec.py =====
from .fp8_spec import FP8_SPECS  # noqa: E402  (appended section)

SPECS.update(FP8_SPECS)
# === end of FP8 =================================================================================
