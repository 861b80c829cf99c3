"""The fused forward's contract: its spec, its search spaces per architecture and a pure plan
(kernel, constants, grid) that needs no GPU. A registered step may carry another build of the
kernel (``FusedKernel``); the library's steps run ``FMHA``. Does not import cuda.tile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import Config
from ..contract import tile_d_for
from .spec import Array, KernelSpec

__all__ = ["FMHA", "FMHA_ARRAYS", "FMHA_SCALARS", "FMHA_LATENCIES", "SEARCH_SPACE",
           "WARP_GROUP_SPACE", "arch_space", "warp_group_space", "FusedKernel", "fmha_spec",
           "fmha_constants", "fmha_grid", "FmhaPlan", "fmha_plan"]

# Lse: fp32 (B, Hq, Nq), the natural-log LSE of each query row, written only with WRITE_LSE (the
# backward's forward); without it the launch passes a one-element stand-in.
FMHA_ARRAYS = (Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4),
               Array("Lse", 3, "float32"))
FMHA_SCALARS = (("qk_scale", float), ("input_pos", int), ("num_heads", int),
                ("group_size", int), ("num_m_blocks", int))
FMHA = KernelSpec(
    "fmha", "flashattn.kernels.fmha", "fmha_kernel", arrays=FMHA_ARRAYS, scalars=FMHA_SCALARS,
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "K_LAT", "V_LAT", "WRITE_LSE"))
# The loads' DRAM-latency hints (1-10) the forward ships with; the varlen forward shares them.
FMHA_LATENCIES = dict(K_LAT=2, V_LAT=4)
# A space per architecture, from what the compiler report and the H200 showed.
SEARCH_SPACE: dict[str, list[Config]] = {
    # Hopper: registers hold the fp32 accumulators; small M tiles and 2 programs/SM.
    "sm_90": [Config(64, 128, occupancy=2), Config(64, 64, occupancy=2),
              Config(128, 64, occupancy=2), Config(128, 128, occupancy=1),
              Config(128, 64, occupancy=1)],
    # Datacenter Blackwell: the seed's space (tensor-memory accumulators, large tiles pay).
    "sm_100": [Config(256, 128, occupancy=1), Config(128, 128, occupancy=2),
               Config(64, 64, occupancy=2), Config(256, 128, occupancy=2)],
    # Consumer Blackwell and Ampere: less shared memory, small tiles only; not timed, ordered
    # by the compiler's report (fewest spill bytes first).
    "sm_120": [Config(64, 64), Config(64, 64, occupancy=2), Config(64, 128, occupancy=1)],
    "sm_80": [Config(64, 128, occupancy=1), Config(128, 64, occupancy=1),
              Config(64, 64, occupancy=2)],
}
# Hopper: num_worker_warps=8 gives 128-row tiles two consumer warp groups of 64 rows (and a
# producer group), which run without spilling; elsewhere arch_tuned's space.
WARP_GROUP_SPACE: dict[str, list[Config]] = {
    "sm_90": [Config(128, 128, occupancy=1, num_worker_warps=8),
              Config(64, 128, occupancy=2),
              Config(128, 64, occupancy=1, num_worker_warps=8),
              Config(128, 256, occupancy=1, num_worker_warps=8)],
}
SEARCH_SPACE["sm_103"] = SEARCH_SPACE["sm_100"]
SEARCH_SPACE["sm_121"] = SEARCH_SPACE["sm_120"]
SEARCH_SPACE["sm_89"] = SEARCH_SPACE["sm_86"] = SEARCH_SPACE["sm_80"]


def arch_space(arch: str | None) -> list[Config]:
    """arch_tuned's search space on ``arch`` (unknown: sm_80's, which compiles everywhere)."""
    return list(SEARCH_SPACE.get(arch, SEARCH_SPACE["sm_80"]))


def warp_group_space(arch: str | None) -> list[Config]:
    """warp_groups' search space: the warp-group tiles on Hopper, arch_tuned's elsewhere."""
    return list(WARP_GROUP_SPACE[arch]) if arch in WARP_GROUP_SPACE else arch_space(arch)


@dataclass(frozen=True)
class FusedKernel:
    """A build of the fused forward other than the shipped ``FMHA`` that a registered step runs
    (``Step.fused``): its spec (``FMHA``'s arrays and scalars), ``constants(flags, *, head_dim,
    even_k) -> dict`` adjusting its constants, ``grid(flags, config, *, B, Hq, Nq, sm_count)``
    replacing the shipped grid."""
    spec: KernelSpec
    constants: Callable | None = None
    grid: Callable | None = None


def _rule(step, spec: KernelSpec, which: str):
    fused = getattr(step, "fused", None)
    return getattr(fused, which) if fused is not None and spec is fused.spec else None


def fmha_spec(step) -> KernelSpec:
    """The fused kernel a step runs: its own build (``Step.fused``), else the shipped one."""
    fused = getattr(step, "fused", None)
    return FMHA if fused is None else fused.spec


def fmha_constants(step, config: Config, *, head_dim: int, causal: bool,
                   even_k: bool, write_lse: bool = False, spec: KernelSpec | None = None) -> dict:
    """The ``ct.Constant`` values of the fused kernel ``step`` runs (``fmha_spec``; or of
    ``spec``), by name. ``write_lse``: also write the LSE of each row (the
    forward of a training step)."""
    flags = step.flag_values()
    spec = spec or fmha_spec(step)
    out = dict(flags, TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=tile_d_for(head_dim),
               CAUSAL=bool(causal), EVEN_K=bool(even_k), WRITE_LSE=bool(write_lse))
    rule = _rule(step, spec, "constants")
    if rule is not None:
        out.update(rule(flags, head_dim=head_dim, even_k=even_k))
    return {k: v for k, v in out.items() if k in spec.constants}


def fmha_grid(step, config: Config, *, B: int, Hq: int, Nq: int,
              sm_count=None) -> tuple[int, int, int]:
    """The launch grid: one program per query tile per (batch, head). A step's own build may
    have its own grid rule, which may need the GPU's SM count (an int, or a function)."""
    rule = _rule(step, fmha_spec(step), "grid")
    if rule is not None:
        return rule(step.flag_values(), config, B=B, Hq=Hq, Nq=Nq, sm_count=sm_count)
    return (-(-Nq // config.TILE_M), B * Hq, 1)


@dataclass(frozen=True)
class FmhaPlan:
    """One launch of the fused forward: the kernel, its configuration, constants, scalars
    and grid. ``fmha_plan`` makes it from shapes alone."""
    spec: KernelSpec
    config: Config
    constants: dict
    scalars: dict
    grid: tuple[int, int, int]


def fmha_plan(step, config: Config, *, B: int, Hq: int, Hkv: int, Nq: int, Nk: int,
              head_dim: int, causal: bool, scale: float, input_pos: int = 0,
              write_lse: bool = False, sm_count=None) -> FmhaPlan:
    """What the launch of ``step`` at ``config`` runs on these shapes: pure, no GPU, no tensor.
    ``sm_count`` (an int, or a function giving it) only for a grid rule that needs it."""
    spec = fmha_spec(step)
    constants = fmha_constants(step, config, head_dim=head_dim, causal=causal,
                               even_k=Nk % config.TILE_N == 0, write_lse=write_lse, spec=spec)
    scalars = dict(qk_scale=scale, input_pos=input_pos, num_heads=Hq, group_size=Hq // Hkv,
                   num_m_blocks=-(-Nq // config.TILE_M))
    grid = fmha_grid(step, config, B=B, Hq=Hq, Nq=Nq, sm_count=sm_count)
    return FmhaPlan(spec, config, constants, scalars, grid)
