"""The cuTile kernels and their contracts.

    fmha.py     the fused FlashAttention forward behind every step (chapter 3 on)
    naive.py    standard attention in three kernels (chapter 1)
    spec.py     KernelSpec: a kernel's parameters by name, checked against its source
    source.py   a step's kernel source with its flags folded away, and step diffs

This module holds one ``KernelSpec`` per kernel and the rules that turn a step and a
configuration into the kernel's constants and grid. The launch (``flashattn.launch``) and the
compiler report (``flashattn.aot``) both use them. Importing it does not import cuda.tile.
"""
from __future__ import annotations

from ..contract import tile_d_for
from ..steps import Config, Step
from .spec import Array, KernelContractError, KernelSpec, hinted

__all__ = ["FMHA", "NAIVE", "SPECS", "KernelSpec", "KernelContractError", "Array", "hinted",
           "kernels_of", "fmha_constants", "fmha_grid", "naive_constants", "NAIVE_ROW_TILE"]

# --- the fused kernel -------------------------------------------------------------------------
FMHA = KernelSpec(
    "fmha", "flashattn.kernels.fmha", "fmha_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4)),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int), ("num_m_blocks", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "FAST_MATH", "SPLIT_LOOP",
               "REMAP", "PAIR", "LAZY_RESCALE", "EXP_POLY", "UNCHECKED_KV", "K_LAT", "V_LAT",
               "PERSISTENT"))


def fmha_constants(step: Step, config: Config, *, head_dim: int, causal: bool,
                   even_k: bool) -> dict:
    """The ``ct.Constant`` values of ``fmha_kernel`` for a step, by name."""
    flags = step.flag_values()
    td = tile_d_for(head_dim)
    return dict(flags, TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=td,
                CAUSAL=bool(causal), EVEN_K=bool(even_k),
                # Unchecked loads only where every K/V tile is provably in bounds.
                UNCHECKED_KV=flags["UNCHECKED_KV"] and even_k and td == head_dim)


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
    return list(NAIVE.values()) if step.kernel == "naive" else [FMHA]


def constants_for(spec: KernelSpec, step: Step, config: Config, *, head_dim: int,
                  causal: bool, even_k: bool) -> dict:
    """The constants of any kernel of a step, by name (what ``aot`` compiles)."""
    if spec.name == "fmha":
        return fmha_constants(step, config, head_dim=head_dim, causal=causal, even_k=even_k)
    return naive_constants(spec.name, config, head_dim=head_dim, causal=causal)
