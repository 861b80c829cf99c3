"""The steps of the book, as data.

Each step is a named, runnable configuration of the kernels in ``flashattn.kernels``: which
compile-time flags are on, which tile shape and launch hints it uses on each GPU architecture.
``attention(..., step=NAME)`` runs it, ``python -m flashattn compile --step NAME`` compiles it,
``flashattn.source.step_diff(NAME)`` shows the kernel lines it changes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# The compile-time switches of flashattn.kernels.fmha.fmha_kernel, in signature order, with
# their defaults: the seed's baseline. K_LAT/V_LAT are the loads' DRAM-latency hints (1-10).
FLAG_DEFAULTS = {"FAST_MATH": False, "SPLIT_LOOP": False, "REMAP": False, "PAIR": False,
                 "LAZY_RESCALE": False, "EXP_POLY": 0, "UNCHECKED_KV": False,
                 "K_LAT": 2, "V_LAT": 4, "PERSISTENT": False}
FLAGS = tuple(FLAG_DEFAULTS)

# Architectures we compile for. sm_80: Ampere, sm_90: Hopper (H100/H200),
# sm_100: datacenter Blackwell (B200), sm_120: consumer Blackwell (RTX 50).
ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120")


@dataclass(frozen=True)
class Config:
    """A tile shape and launch hints. ``None`` hints leave the choice to the compiler."""
    TILE_M: int
    TILE_N: int
    occupancy: int | None = None
    num_ctas: int | None = None

    def hints(self) -> dict:
        return {k: v for k, v in (("occupancy", self.occupancy), ("num_ctas", self.num_ctas))
                if v is not None}

    def label(self) -> str:
        s = f"{self.TILE_M}x{self.TILE_N}"
        if self.occupancy is not None:
            s += f" occ={self.occupancy}"
        if self.num_ctas is not None:
            s += f" ctas={self.num_ctas}"
        return s


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    description: str            # one line: what this step changes
    kernel: str = "fmha"        # "fmha" (fused) or "naive" (three kernels)
    flags: dict = field(default_factory=dict)
    config: Config = Config(64, 64)
    arch_configs: dict = field(default_factory=dict)   # arch -> Config, overrides `config`
    tuned: bool = False         # chooses its Config per shape by measurement (autotune)
    source: str = "seed"        # "seed" (NVIDIA's walkthrough), "book" (ours), "experiment"

    def flag_values(self) -> dict:
        unknown = set(self.flags) - set(FLAGS)
        if unknown:
            raise ValueError(f"step {self.name!r}: unknown flags {sorted(unknown)}")
        return {f: type(d)(self.flags.get(f, d)) for f, d in FLAG_DEFAULTS.items()}

    def config_for(self, arch: str | None) -> Config:
        return self.arch_configs.get(arch, self.config)


_SEED = dict(FAST_MATH=True, SPLIT_LOOP=True, REMAP=True)

_STEP_LIST = [
    Step("naive", "Standard attention",
         "Three kernels that write the N x N scores and probabilities to global memory.",
         kernel="naive", config=Config(64, 64)),
    Step("baseline", "First fused kernel",
         "FlashAttention with 64x64 tiles, exact exp2 and division, every visited tile masked.",
         config=Config(64, 64)),
    Step("large_tiles", "The large-tile trap",
         "Same kernel with 256x128 tiles.",
         config=Config(256, 128)),
    Step("fast_math", "The fast-math rescue",
         "exp2 with flush-to-zero and approximate division.",
         flags=dict(FAST_MATH=True), config=Config(256, 128)),
    Step("loop_split", "Splitting the K loop",
         "Mask only the tiles on the diagonal (and the ragged end of K).",
         flags=dict(FAST_MATH=True, SPLIT_LOOP=True), config=Config(256, 128)),
    Step("remap", "Program-ID remapping",
         "Causal: launch the query tiles with the most work first.",
         flags=dict(_SEED), config=Config(256, 128)),
    Step("autotune", "Autotuning",
         "Search tile shapes and hints per shape and architecture; cache the winner per GPU.",
         flags=dict(_SEED), config=Config(64, 64, occupancy=2), tuned=True),
    # --- Beyond the blog (chapter 10): each measured on the H200 against cuDNN in one run ---
    Step("arch_tuned", "A search space per architecture",
         "Autotune over tiles and hints chosen per architecture (Hopper: 64x128, 2 programs/SM).",
         flags=dict(_SEED), config=Config(64, 128, occupancy=2), tuned=True, source="book"),
]

# Techniques we measured that did not pay on the H200 (chapter 10 tells why). They are kept
# runnable and compilable so the book can show their code and numbers; they are not steps.
_ON_HOPPER = Config(64, 128, occupancy=2)
_EXPERIMENT_LIST = [
    Step("lazy_rescale", "Lazy rescaling",
         "Rescale the accumulator only when some row max grows by more than 2^8.",
         flags=dict(_SEED, LAZY_RESCALE=True), config=_ON_HOPPER, source="experiment"),
    Step("pair", "Causal pairing",
         "Each program does query tiles i and n-1-i, so causal programs carry equal work.",
         flags=dict(FAST_MATH=True, SPLIT_LOOP=True, PAIR=True), config=_ON_HOPPER,
         source="experiment"),
    Step("exp_poly", "Exponentials on the FMA pipe",
         "A quarter of the exp2 evaluated as a cubic polynomial on the FMA units.",
         flags=dict(_SEED, EXP_POLY=4), config=_ON_HOPPER, source="experiment"),
    Step("persistent", "A persistent grid",
         "One program per SM slot looping over (query tile, head) work items.",
         flags=dict(_SEED, PERSISTENT=True), config=_ON_HOPPER, source="experiment"),
    Step("unchecked_kv", "Unchecked K/V loads",
         "K and V tiles loaded without bounds checks where the host proves them in bounds.",
         flags=dict(_SEED, UNCHECKED_KV=True), config=_ON_HOPPER, source="experiment"),
]
EXPERIMENTS: dict[str, Step] = {s.name: s for s in _EXPERIMENT_LIST}

STEPS: dict[str, Step] = {s.name: s for s in _STEP_LIST}
STEP_NAMES: tuple[str, ...] = tuple(STEPS)
SEED_STEPS = tuple(s.name for s in _STEP_LIST if s.source == "seed")


def get_step(name: str) -> Step:
    """A step (or a chapter-10 experiment) by name."""
    if name in STEPS:
        return STEPS[name]
    if name in EXPERIMENTS:
        return EXPERIMENTS[name]
    raise ValueError(f"unknown step {name!r}; choose one of {', '.join(STEP_NAMES)}, "
                     f"'best', or an experiment: {', '.join(EXPERIMENTS)}")


def previous_step(name: str) -> str | None:
    """The step before ``name`` in book order; experiments are measured against arch_tuned."""
    if name in EXPERIMENTS:
        return "arch_tuned"
    i = STEP_NAMES.index(get_step(name).name)
    return STEP_NAMES[i - 1] if i > 0 else None


def with_config(step: Step, config: Config) -> Step:
    """The same step run with another tile shape / hints (used by autotune and sweeps)."""
    return replace(step, config=config, arch_configs={})


def describe() -> str:
    """A table of the steps, one line each, in book order."""
    w = max(len(n) for n in STEP_NAMES)
    lines = [f"{s.name:<{w}}  {s.description}" for s in _STEP_LIST]
    lines += ["", "experiments (chapter 10; did not pay on the H200):"]
    lines += [f"{s.name:<{w}}  {s.description}" for s in _EXPERIMENT_LIST]
    return "\n".join(lines)
