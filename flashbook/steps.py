"""The steps of the book, as data, and the book's views of them.

Each step is a named, runnable configuration of the fused kernel: which compile-time flags are
on, which tile shape and launch hints it uses on each GPU architecture. Importing this module
registers every step and experiment with the library (``flashattn.registry``), so
``flashattn.attention(..., step=NAME)`` and ``python -m flashbook compile --step NAME`` run
them. The library itself ships only what ``step="best"`` runs (``arch_tuned``, ``warp_groups``);
the ladder reuses those two steps as its last rungs. Also here: the Hopper ladder of chapters
6-8, each step's predecessor for the diffs, and ``python -m flashbook steps``.
"""
from __future__ import annotations

from flashattn.config import ARCHS, Config
from flashattn.kernels.fmha_fwd_spec import FMHA_LATENCIES, SEARCH_SPACE, WARP_GROUP_SPACE
import dataclasses
from dataclasses import dataclass

from flashattn.registry import BEST_STEP, DEFAULT_BEST, best_step_name, get_step
from flashattn.registry import Step as LibraryStep
from flashattn.registry import register_step, resolve_name, with_config

from .ladder import fused_for

__all__ = ["Step", "Config", "ARCHS", "FLAG_DEFAULTS", "FLAGS", "STEPS", "STEP_NAMES",
           "SEED_STEPS", "EXPERIMENTS", "SEARCH_SPACE", "WARP_GROUP_SPACE", "seed_space",
           "BEST_STEP", "DEFAULT_BEST", "best_step_name", "get_step", "resolve_name",
           "with_config", "HOPPER_LADDER", "previous_step", "describe", "main"]

# The compile-time switches of the ladder kernel (flashbook/ladder/fmha.py), in signature order,
# with their defaults: the seed's baseline. K_LAT/V_LAT are the loads' DRAM-latency hints (1-10),
# the library's.
FLAG_DEFAULTS = {"FAST_MATH": False, "SPLIT_LOOP": False, "REMAP": False, "PAIR": False,
                 "LAZY_RESCALE": False, "EXP_POLY": 0, "UNCHECKED_KV": False,
                 **FMHA_LATENCIES, "PERSISTENT": False, "PIPELINE": False}
FLAGS = tuple(FLAG_DEFAULTS)


@dataclass(frozen=True)
class Step(LibraryStep):
    """A step of the book: the library's ``Step`` with where it comes from, ``source``: "seed"
    (the blog's walkthrough), "book" (beyond it; the library's own two steps) or "experiment"
    (measured and refuted)."""
    source: str = "book"


def source_of(step) -> str:
    """A registered step's source; the library's own steps (plain ``Step``) are the book's."""
    return getattr(step, "source", "book")


def _step(name, title, description, *, flags=None, source="seed", **kw) -> Step:
    """A book step: its flags checked and completed with the ladder's defaults."""
    flags = dict(flags or {})
    unknown = set(flags) - set(FLAGS)
    if unknown:
        raise ValueError(f"step {name!r}: unknown flags {sorted(unknown)}")
    values = {f: type(d)(flags.get(f, d)) for f, d in FLAG_DEFAULTS.items()}
    return Step(name, title, description, flags=values, source=source,
                fused=fused_for(values), **kw)


def _the_library_step(name: str) -> Step:
    """A step the library ships, as a book step: the same tiles and spaces, the ladder's flags
    written out (the seed's: the shipped kernel is the ladder with them folded)."""
    lib = get_step(name)
    kw = {f.name: getattr(lib, f.name) for f in dataclasses.fields(LibraryStep)}
    return Step(**dict(kw, flags=_step(name, "", "", flags=_SEED).flags, fused=None),
                source="book")


def seed_space(arch: str | None) -> list[Config]:
    """The seed walkthrough's search space: one list for every architecture but sm_120."""
    if arch in ("sm_120", "sm_121"):
        return [Config(64, 64, occupancy=2)]
    return [Config(64, 64, occupancy=2), Config(128, 128, occupancy=2),
            Config(256, 128, occupancy=1)]


_SEED = dict(FAST_MATH=True, SPLIT_LOOP=True, REMAP=True)

_STEP_LIST = [
    _step("naive", "Standard attention",
          "Three kernels that write the N x N scores and probabilities to global memory.",
          kernel="naive", config=Config(64, 64)),
    _step("baseline", "First fused kernel",
          "FlashAttention with 64x64 tiles, exact exp2 and division, every visited tile masked.",
          config=Config(64, 64)),
    _step("large_tiles", "The large-tile trap",
          "Same kernel with 256x128 tiles.",
          config=Config(256, 128)),
    _step("fast_math", "The fast-math rescue",
          "exp2 with flush-to-zero and approximate division.",
          flags=dict(FAST_MATH=True), config=Config(256, 128)),
    _step("loop_split", "Splitting the K loop",
          "Mask only the tiles on the diagonal (and the ragged end of K).",
          flags=dict(FAST_MATH=True, SPLIT_LOOP=True), config=Config(256, 128)),
    _step("remap", "Program-ID remapping",
          "Causal: launch the query tiles with the most work first.",
          flags=dict(_SEED), config=Config(256, 128)),
    _step("autotune", "Autotuning",
          "Search tile shapes and hints per shape and architecture; cache the winner per GPU.",
          flags=dict(_SEED), config=Config(64, 64, occupancy=2), tuned=True, space=seed_space),
    # --- Beyond the blog (chapter 10): what step="best" ships, the library's two steps ---
    _the_library_step("arch_tuned"),
    _the_library_step("warp_groups"),
]

# Techniques we measured that did not pay on the H200 (chapter 10 tells why). They are kept
# runnable and compilable so the book can show their code and numbers; they are not steps.
_ON_HOPPER = Config(64, 128, occupancy=2)
_EXPERIMENT_LIST = [
    _step("lazy_rescale", "Lazy rescaling",
          "Rescale the accumulator only when some row max grows by more than 2^8.",
          flags=dict(_SEED, LAZY_RESCALE=True), config=_ON_HOPPER, source="experiment"),
    _step("pair", "Causal pairing",
          "Each program does query tiles i and n-1-i, so causal programs carry equal work.",
          flags=dict(FAST_MATH=True, SPLIT_LOOP=True, PAIR=True), config=_ON_HOPPER,
          source="experiment"),
    _step("exp_poly", "Exponentials on the FMA pipe",
          "A quarter of the exp2 evaluated as a cubic polynomial on the FMA units.",
          flags=dict(_SEED, EXP_POLY=4), config=_ON_HOPPER, source="experiment"),
    _step("persistent", "A persistent grid",
          "One program per SM slot looping over (query tile, head) work items.",
          flags=dict(_SEED, PERSISTENT=True), config=_ON_HOPPER, source="experiment"),
    _step("unchecked_kv", "Unchecked K/V loads",
          "K and V tiles loaded without bounds checks where the host proves them in bounds.",
          flags=dict(_SEED, UNCHECKED_KV=True), config=_ON_HOPPER, source="experiment"),
    _step("pipeline", "Softmax overlapped with the next product",
          "S of key tile j+1 issued before the softmax of tile j (FlashAttention-3's overlap).",
          flags=dict(_SEED, PIPELINE=True), config=_ON_HOPPER, source="experiment"),
]
EXPERIMENTS: dict[str, Step] = {s.name: s for s in _EXPERIMENT_LIST}

STEPS: dict[str, Step] = {s.name: s for s in _STEP_LIST}
STEP_NAMES: tuple[str, ...] = tuple(STEPS)
SEED_STEPS = tuple(s.name for s in _STEP_LIST if source_of(s) == "seed")

for _s in (*_STEP_LIST, *_EXPERIMENT_LIST):
    register_step(_s)          # runnable by name through the library (flashattn.attention)
assert all(n in STEPS for n in BEST_STEP.values()) and DEFAULT_BEST in STEPS
# The library's two steps are the seed's flags on the ladder (the kernel they run is the ladder's
# with those flags folded: tests/test_shipped_kernel.py).
assert all(STEPS[n].flags == _step(n, "", "", flags=_SEED).flags
           for n in ("arch_tuned", "warp_groups"))


# Chapters 6-8 on Hopper: the seed's steps replayed at a tile that does not spill on sm_90
# (64x128; chapter 5), each rung one change, ending with the launch hint of chapter 9.
# Benchmark names: "STEP@CONFIG" runs a step pinned to a configuration.
HOPPER_LADDER: tuple[tuple[str, str], ...] = (
    ("baseline@64x128", "baseline at 64x128"),
    ("fast_math@64x128", "+ fast math"),
    ("loop_split@64x128", "+ loop split"),
    ("remap@64x128", "+ remap"),
    ("remap@64x128:occ=2", "+ occupancy=2 (arch_tuned's configuration)"),
)


def previous_step(name: str) -> str | None:
    """The step before ``name`` in book order; experiments are measured against arch_tuned."""
    if name in EXPERIMENTS:
        return "arch_tuned"
    i = STEP_NAMES.index(get_step(name).name)
    return STEP_NAMES[i - 1] if i > 0 else None


def describe() -> str:
    """A table of the steps, one line each, in book order."""
    w = max(len(n) for n in STEP_NAMES)
    lines = [f"{s.name:<{w}}  {s.description}" for s in STEPS.values()]
    lines += ["", "experiments (chapter 10; did not pay on the H200):"]
    lines += [f"{s.name:<{w}}  {s.description}" for s in EXPERIMENTS.values()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse
    argparse.ArgumentParser(prog="python -m flashbook steps",
                            description="List the steps of the book, in order, and the "
                                        "experiments of chapter 10.",
                            epilog="example: python -m flashbook steps").parse_args(argv)
    print(describe())
    return 0
