"""The book's ladder kernel: ``fmha.py``, the fused forward with every step's compile-time flag
(the steps of chapters 3-10 and the experiments chapter 10 refuted).

The library ships this kernel with its shipped flags folded away (``flashattn/kernels/fmha.py``;
``tests/test_shipped_kernel.py`` checks the two agree): ``SHIPPED_FLAGS``. A book step whose
flags differ from those carries ``LADDER_KERNEL`` (``Step.fused``: the ladder's spec and its
rules) and runs the ladder. It does not import cuda.tile.

``decode.py`` and ``fmha_bwd.py`` are the decode and backward kernels with the switches the
library folds away (the fused merge, dependent launches; chapters 11-12); ``variants`` holds
their specs, the switches and the calls that run them (``variants.decode``,
``variants.attention_backward``). ``emulate.py`` is the ladder kernel in NumPy: every step's
launch schedule (``schedule``, ``tile_counts``) and arithmetic (``emulate``), on a CPU.
"""
from flashattn.kernels import FMHA_ARRAYS, FMHA_SCALARS, FusedKernel, KernelSpec

# The flags folded into the library's fmha.py: what step="best" runs (fast math, the
# diagonal-only mask, the longest causal tiles first); every other flag at its default.
SHIPPED_FLAGS = dict(FAST_MATH=True, SPLIT_LOOP=True, REMAP=True, PAIR=False,
                     LAZY_RESCALE=False, EXP_POLY=0, UNCHECKED_KV=False, PERSISTENT=False,
                     PIPELINE=False)

# Every flag of the ladder, in signature order (flashbook.steps.FLAGS are their names).
LADDER = KernelSpec(
    "fmha", "flashbook.ladder.fmha", "fmha_kernel", arrays=FMHA_ARRAYS, scalars=FMHA_SCALARS,
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "FAST_MATH", "SPLIT_LOOP",
               "REMAP", "PAIR", "LAZY_RESCALE", "EXP_POLY", "UNCHECKED_KV", "K_LAT", "V_LAT",
               "PERSISTENT", "WRITE_LSE", "PIPELINE"))


def ladder_constants(flags: dict, *, head_dim: int, even_k: bool) -> dict:
    """Unchecked K/V loads only where every K/V tile is provably in bounds."""
    from flashattn.contract import tile_d_for
    in_bounds = even_k and tile_d_for(head_dim) == head_dim
    return dict(UNCHECKED_KV=flags["UNCHECKED_KV"] and in_bounds)


def ladder_grid(flags: dict, config, *, B: int, Hq: int, Nq: int, sm_count=None):
    """One program per query tile per (batch, head); PAIR halves the first axis; PERSISTENT
    launches one program per SM slot (``sm_count``, an int or a function, x occupancy)."""
    num_m_blocks = -(-Nq // config.TILE_M)
    if flags["PERSISTENT"]:
        sms = sm_count() if callable(sm_count) else sm_count
        if sms is None:
            raise ValueError("a persistent grid needs the GPU's SM count")
        return (min(num_m_blocks * B * Hq, sms * (config.occupancy or 1)), 1, 1)
    grid_x = -(-num_m_blocks // 2) if flags["PAIR"] else num_m_blocks
    return (grid_x, B * Hq, 1)


LADDER_KERNEL = FusedKernel(LADDER, constants=ladder_constants, grid=ladder_grid)


def fused_for(flags: dict):
    """What a step with ``flags`` runs: None (the library's kernel) for the shipped flags, else
    the ladder."""
    return None if all(flags.get(f) == v for f, v in SHIPPED_FLAGS.items()) else LADDER_KERNEL


__all__ = ["LADDER", "LADDER_KERNEL", "SHIPPED_FLAGS", "fused_for"]
