"""The book's ladder kernel: ``fmha.py``, the fused forward with every step's compile-time flag
(the steps of chapters 3-10 and the experiments chapter 10 refuted).

The library ships this kernel with its shipped flags folded away (``flashattn/kernels/fmha.py``;
``tests/test_shipped_kernel.py`` checks the two agree). Importing this package registers the
ladder's spec with the library's kernels (``flashattn.kernels.register_ladder``), so a step whose
flags differ from the shipped ones runs the ladder. It does not import cuda.tile.

``decode.py`` and ``fmha_bwd.py`` are the decode and backward kernels with the switches the
library folds away (the fused merge, dependent launches; chapters 11-12); ``variants`` holds
their specs, the switches and the calls that run them (``variants.decode``,
``variants.attention_backward``).
"""
from flashattn.kernels import FMHA_ARRAYS, FMHA_SCALARS, KernelSpec, register_ladder

# Every flag of the ladder, in signature order (flashbook.steps.FLAGS are their names).
LADDER = KernelSpec(
    "fmha", "flashbook.ladder.fmha", "fmha_kernel", arrays=FMHA_ARRAYS, scalars=FMHA_SCALARS,
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "FAST_MATH", "SPLIT_LOOP",
               "REMAP", "PAIR", "LAZY_RESCALE", "EXP_POLY", "UNCHECKED_KV", "K_LAT", "V_LAT",
               "PERSISTENT", "WRITE_LSE", "PIPELINE"))
register_ladder(LADDER)

__all__ = ["LADDER"]
