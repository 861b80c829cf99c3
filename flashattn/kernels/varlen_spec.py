"""The packed variable-length forward's contract: its spec, its configuration per
architecture and head dim, and a pure plan (configuration, constants, grid) that needs no GPU.

kernels/varlen.py: ``varlen_fwd_kernel``, one program per (query tile, sequence, head) over
packed (total, H, D) tensors viewed head-major, cu_seqlens read on the device. Not a step: the
host module flashattn/varlen.py launches it, aot.compile_spec compiles it.
"""
from __future__ import annotations

from ..config import Config
from ..contract import tile_d_for
from .fmha_fwd_spec import FMHA_LATENCIES
from .spec import Array, KernelSpec

__all__ = ["VARLEN", "VARLEN_FWD", "VARLEN_CONFIGS", "VARLEN_Q_TILES", "VARLEN_Q_TILES_BELOW",
           "VARLEN_LATENCIES", "varlen_config", "varlen_constants", "varlen_grid",
           "varlen_q_tiles", "varlen_plan"]

VARLEN_FWD = KernelSpec(
    "varlen_fwd", "flashattn.kernels.varlen", "varlen_fwd_kernel",
    arrays=(Array("Q", 3), Array("K", 3), Array("V", 3), Array("Out", 3),
            Array("CuSeqlensQ", 1, "int32"), Array("CuSeqlensK", 1, "int32")),
    scalars=(("qk_scale", float), ("group_size", int), ("max_seqlen_q", int),
             ("max_seqlen_k", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "Q_TILES", "K_LAT", "V_LAT"))

VARLEN = {"varlen_fwd": VARLEN_FWD}

# The loads' latency hints: the dense forward's.
VARLEN_LATENCIES = dict(FMHA_LATENCIES)

# Query tiles per varlen program (the kernel's Q_TILES) per architecture (absent: 1), used when
# the sequences average fewer than VARLEN_Q_TILES_BELOW query tiles: each program builds its
# sequence's tensor maps once and runs this many tiles with them: short sequences gain, long
# ones lose (timed on sm_90 only).
VARLEN_Q_TILES: dict[str, int] = {"sm_90": 4}
VARLEN_Q_TILES_BELOW = 64

# Tiles and hints per architecture and padded head dim (TILE_D up to the key): the forward
# steps' configurations (warp_groups' first on Hopper, arch_tuned's elsewhere), smaller where
# the compiler report showed spills (tests/test_varlen_aot.py prints it). Only sm_90 at D=128
# was timed; the others are not measured yet.
VARLEN_CONFIGS: dict[str, dict[int, Config]] = {
    # sm_90, D=128: 64x128 occupancy=2 the fastest or tied of four tiles.
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
    longest, ``max_seqlen_q``), else 1. Two values whatever the lengths (not capped at the
    longest sequence's tiles: a program's tiles past its sequence's end exit, and a cap would
    compile a kernel per short length)."""
    mean_rows = int(max_seqlen_q) if not total_q or not B else int(total_q) / int(B)
    if mean_rows >= VARLEN_Q_TILES_BELOW * config.TILE_M:
        return 1
    return max(1, int(VARLEN_Q_TILES.get(arch or "sm_80", 1)))


def varlen_constants(config: Config, *, head_dim: int, causal: bool, q_tiles: int = 1) -> dict:
    """The ``ct.Constant`` values of ``varlen_fwd_kernel`` by name."""
    if int(q_tiles) < 1:
        raise ValueError(f"q_tiles (query tiles per program) must be >= 1, got {q_tiles}")
    return dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=tile_d_for(head_dim),
                CAUSAL=bool(causal), Q_TILES=int(q_tiles), **VARLEN_LATENCIES)


def varlen_grid(config: Config, *, B: int, Hq: int, max_seqlen_q: int,
                q_tiles: int = 1) -> tuple[int, int, int]:
    """(cdiv(query tiles of the longest sequence, q_tiles), Hq, B): programs past a shorter
    sequence's end exit at once; the heads of a sequence are adjacent in launch order (GQA
    groups share K/V in L2)."""
    if int(q_tiles) < 1:
        raise ValueError(f"q_tiles (query tiles per program) must be >= 1, got {q_tiles}")
    n_tiles = max(1, -(-int(max_seqlen_q) // config.TILE_M))
    return (-(-n_tiles // int(q_tiles)), int(Hq), int(B))


def varlen_plan(dims, *, max_seqlen_q: int, causal: bool, arch=None, config=None,
                q_tiles=None) -> dict:
    """The launch plan (pure: no GPU): configuration, constants, grid. ``dims``: a
    ``contract.VarlenDims``; ``config``: a ``flashattn.config.Config`` to pin (default
    ``varlen_config(arch, D)``); ``q_tiles``: query tiles per program (default
    ``varlen_q_tiles``)."""
    config = config or varlen_config(arch, dims.D)
    if q_tiles is None:
        q_tiles = varlen_q_tiles(config, max_seqlen_q=max_seqlen_q, arch=arch,
                                 total_q=dims.total_q, B=dims.B)
    grid = varlen_grid(config, B=dims.B, Hq=dims.Hq, max_seqlen_q=max_seqlen_q,
                       q_tiles=q_tiles)
    if dims.B > 65535 or dims.Hq > 65535:
        raise ValueError(f"B = {dims.B} sequences and Hq = {dims.Hq} heads must each be at most "
                         "65535 (grid axes): split the batch")
    return dict(config=config, grid=grid,
                constants=varlen_constants(config, head_dim=dims.D, causal=causal,
                                           q_tiles=q_tiles))
