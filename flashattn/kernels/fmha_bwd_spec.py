"""The backward kernels' contract (kernels/fmha_bwd.py): their specs, the
configuration table per architecture and head dim, and the pure rules for constants and grids.
Does not import cuda.tile."""
from __future__ import annotations

from ..contract import tile_d_for
from ..config import Config
from .spec import Array, KernelSpec

__all__ = ["BWD", "BWD_PREPROCESS", "BWD_DKDV", "BWD_DQ", "BWD_CONFIGS", "BWD_ATOMIC", "BWD_DKDV_DQ_ATOMIC", "BWD_PREPROCESS_CONFIG", "bwd_configs", "bwd_constants", "bwd_grid"]

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
