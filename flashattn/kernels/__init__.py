"""The cuTile kernels and their contracts.

    fmha.py     the fused FlashAttention forward as it ships (the flags of ``best`` folded in)
    naive.py    standard attention in three kernels
    spec.py     KernelSpec: a kernel's parameters by name, checked against its source

Each kernel module has a contract module beside it: its ``KernelSpec``, its configuration per
architecture and a pure plan (constants, grid) that needs no GPU: ``fmha_fwd_spec``,
``varlen_spec``, ``decode_spec``, ``fmha_bwd_spec``, ``fp8_fwd_spec``; the naive kernels' are here.
This package gathers them (``SPECS``); the launches and the compiler report (``flashattn.aot``)
use them.
Importing it does not import cuda.tile.
"""
from __future__ import annotations

from ..config import Config
from ..contract import tile_d_for
from .fmha_fwd_spec import *  # noqa: F401,F403
from . import fmha_fwd_spec as _fmha_spec
from .fmha_fwd_spec import FMHA, fmha_constants, fmha_spec
from .spec import Array, KernelContractError, KernelSpec, hinted

__all__ = ["NAIVE", "SPECS", "KernelSpec", "KernelContractError", "Array", "hinted",
           "kernels_of", "naive_constants", "NAIVE_ROW_TILE", "constants_for",
           *_fmha_spec.__all__]


# --- the naive kernels ---------------------------------------------------------------------------
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


def kernels_of(step) -> list[KernelSpec]:
    """The kernels a step launches, in launch order."""
    return list(NAIVE.values()) if step.kernel == "naive" else [fmha_spec(step)]


def constants_for(spec: KernelSpec, step, config: Config, *, head_dim: int,
                  causal: bool, even_k: bool, write_lse: bool = False) -> dict:
    """The constants of any kernel of a step, by name (what ``aot`` compiles)."""
    if spec.name == "fmha":
        return fmha_constants(step, config, head_dim=head_dim, causal=causal, even_k=even_k,
                              write_lse=write_lse, spec=spec)
    return naive_constants(spec.name, config, head_dim=head_dim, causal=causal)


# The decode kernels' contract: kernels/decode_spec.py.
from .decode_spec import *  # noqa: E402,F401,F403
from . import decode_spec as _decode_spec  # noqa: E402

SPECS.update(_decode_spec.DECODE)
__all__ += _decode_spec.__all__


# The backward kernels' contract: kernels/fmha_bwd_spec.py.
from .fmha_bwd_spec import *  # noqa: E402,F401,F403
from . import fmha_bwd_spec as _bwd_spec  # noqa: E402

SPECS.update(_bwd_spec.BWD)
SPECS.update(_bwd_spec.BWD_ATOMIC)
__all__ += _bwd_spec.__all__


# The packed variable-length forward's contract: kernels/varlen_spec.py.
from .varlen_spec import *  # noqa: E402,F401,F403
from . import varlen_spec as _varlen_spec  # noqa: E402

SPECS.update(_varlen_spec.VARLEN)
__all__ += _varlen_spec.__all__


# The FP8 forward's contract: kernels/fp8_fwd_spec.py (FP8 caches: decode_spec.py).
from .fp8_fwd_spec import FMHA_FP8  # noqa: E402

SPECS[FMHA_FP8.name] = FMHA_FP8


# The MLA decode kernels' contract: kernels/mla_decode_spec.py.
from .mla_decode_spec import MLA_DECODE  # noqa: E402

SPECS.update(MLA_DECODE)
