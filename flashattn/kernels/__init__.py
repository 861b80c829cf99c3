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


# The decode kernels' contract (chapter 12): kernels/decode_spec.py.
from .decode_spec import *  # noqa: E402,F401,F403
from . import decode_spec as _decode_spec  # noqa: E402

SPECS.update(_decode_spec.DECODE)
__all__ += _decode_spec.__all__


# The backward kernels' contract (chapter 11): kernels/fmha_bwd_spec.py.
from .fmha_bwd_spec import *  # noqa: E402,F401,F403
from . import fmha_bwd_spec as _bwd_spec  # noqa: E402

SPECS.update(_bwd_spec.BWD)
SPECS.update(_bwd_spec.BWD_ATOMIC)
__all__ += _bwd_spec.__all__


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


# === FP8 (chapter 14): kernels/fp8.py, their specs and configurations in kernels/fp8_spec.py =====
from .fp8_spec import FP8_SPECS  # noqa: E402  (appended section)

SPECS.update(FP8_SPECS)
# === end of FP8 =================================================================================
