"""The steps of the book, as data.

Each step is a named, runnable configuration of the kernels in ``flashattn.kernels``: which
compile-time flags are on, which tile shape and launch hints it uses on each GPU architecture.
``attention(..., step=NAME)`` runs it, ``python -m flashattn compile --step NAME`` compiles it.
The book's views of them (the Hopper ladder, each step's predecessor, the ``steps`` command)
are ``flashbook.steps``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

# The compile-time switches of flashattn.kernels.fmha.fmha_kernel, in signature order, with
# their defaults: the seed's baseline. K_LAT/V_LAT are the loads' DRAM-latency hints (1-10).
FLAG_DEFAULTS = {"FAST_MATH": False, "SPLIT_LOOP": False, "REMAP": False, "PAIR": False,
                 "LAZY_RESCALE": False, "EXP_POLY": 0, "UNCHECKED_KV": False,
                 "K_LAT": 2, "V_LAT": 4, "PERSISTENT": False, "PIPELINE": False}
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
    num_worker_warps: int | None = None   # warps per CUDA-core warp group (warp-specialised)

    HINTS = ("occupancy", "num_ctas", "num_worker_warps")
    _SHORT = {"occupancy": "occ", "num_ctas": "ctas", "num_worker_warps": "nww"}

    def hints(self) -> dict:
        """The kernel hints for ``kernel.replace_hints(**hints)``; unset hints are left out."""
        return {k: getattr(self, k) for k in self.HINTS if getattr(self, k) is not None}

    def label(self) -> str:
        """"64x128 occ=2", "128x128 occ=1 nww=8": the inverse of ``Config.parse``."""
        return " ".join([f"{self.TILE_M}x{self.TILE_N}"] +
                        [f"{self._SHORT[k]}={v}" for k, v in self.hints().items()])

    def as_tuple(self) -> tuple:
        return (self.TILE_M, self.TILE_N, *(getattr(self, k) for k in self.HINTS))

    @classmethod
    def parse(cls, text: str) -> "Config":
        """"128x128", "128x128 occ=1 nww=8" or "128x128,occ=1,nww=8" -> Config."""
        parts = text.replace(",", " ").replace(":", " ").split()
        try:
            tm, tn = (int(x) for x in parts[0].lower().split("x"))
        except (IndexError, ValueError):
            raise ValueError(f"a configuration is TILE_MxTILE_N [occ=N] [ctas=N] [nww=N], "
                             f"got {text!r}") from None
        long = {v: k for k, v in cls._SHORT.items()}
        hints = {}
        for p in parts[1:]:
            k, _, v = p.partition("=")
            if long.get(k, k) not in cls.HINTS or not v.isdigit():
                raise ValueError(f"unknown hint {p!r} in {text!r}; hints: occ=N, ctas=N, nww=N")
            hints[long.get(k, k)] = int(v)
        for name, v in (("TILE_M", tm), ("TILE_N", tn)):
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        return cls(tm, tn, **hints)


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
    space: str = "arch"         # a tuned step's search space: "seed" or "arch" (per architecture)
    source: str = "seed"        # "seed" (NVIDIA's walkthrough), "book" (ours), "experiment"

    def flag_values(self) -> dict:
        unknown = set(self.flags) - set(FLAGS)
        if unknown:
            raise ValueError(f"step {self.name!r}: unknown flags {sorted(unknown)}")
        return {f: type(d)(self.flags.get(f, d)) for f, d in FLAG_DEFAULTS.items()}

    def config_for(self, arch: str | None) -> Config:
        """The one configuration an untuned step runs with on ``arch``."""
        return self.arch_configs.get(arch, self.config)

    def configs(self, arch: str | None) -> list[Config]:
        """The configurations this step may run with on ``arch``, the default first.

        An untuned step has one; a tuned step has its search space there (autotune measures
        them and caches the winner per shape; with FLASHATTN_AUTOTUNE=0 the first is used).
        """
        if not self.tuned:
            return [self.config_for(arch)]
        if self.space == "seed":
            return seed_space(arch)
        if self.space == "warp_groups" and arch in WARP_GROUP_SPACE:
            return list(WARP_GROUP_SPACE[arch])
        return list(SEARCH_SPACE.get(arch, SEARCH_SPACE["sm_80"]))


def seed_space(arch: str | None) -> list[Config]:
    """The seed walkthrough's search space: one list for every architecture but sm_120."""
    if arch in ("sm_120", "sm_121"):
        return [Config(64, 64, occupancy=2)]
    return [Config(64, 64, occupancy=2), Config(128, 128, occupancy=2),
            Config(256, 128, occupancy=1)]


# Chapter 10: a space per architecture, from what the compiler report and the H200 showed.
SEARCH_SPACE: dict[str, list[Config]] = {
    # Hopper: registers hold the fp32 accumulators; small M tiles and 2 programs/SM.
    "sm_90": [Config(64, 128, occupancy=2), Config(64, 64, occupancy=2),
              Config(128, 64, occupancy=2), Config(128, 128, occupancy=1),
              Config(128, 64, occupancy=1)],
    # Datacenter Blackwell: the seed's space (tensor-memory accumulators, large tiles pay).
    "sm_100": [Config(256, 128, occupancy=1), Config(128, 128, occupancy=2),
               Config(64, 64, occupancy=2), Config(256, 128, occupancy=2)],
    # Consumer Blackwell and Ampere: less shared memory, small tiles only. Not measured here:
    # ordered by the compiler's report (python -m flashattn compile --arch sm_120 / sm_80), the
    # configuration with the fewest spill bytes first (sm_120: 0 B; sm_80: 592 B; all sm_80
    # variants with fast math spill a little, as Ampere's mma.sync holds operands in registers).
    "sm_120": [Config(64, 64), Config(64, 64, occupancy=2), Config(64, 128, occupancy=1)],
    "sm_80": [Config(64, 128, occupancy=1), Config(128, 64, occupancy=1),
              Config(64, 64, occupancy=2)],
}
# Chapter 10: on Hopper, num_worker_warps=8 gives the compiler two consumer warp groups
# of 64 rows each (plus a producer group for the loads) for 128-row tiles, which then run
# without spilling. The space adds those configurations to arch_tuned's best; on other
# architectures it is arch_tuned's space unchanged.
WARP_GROUP_SPACE: dict[str, list[Config]] = {
    "sm_90": [Config(128, 128, occupancy=1, num_worker_warps=8),
              Config(64, 128, occupancy=2),
              Config(128, 64, occupancy=1, num_worker_warps=8),
              Config(128, 256, occupancy=1, num_worker_warps=8)],
}
SEARCH_SPACE["sm_103"] = SEARCH_SPACE["sm_100"]
SEARCH_SPACE["sm_121"] = SEARCH_SPACE["sm_120"]
SEARCH_SPACE["sm_89"] = SEARCH_SPACE["sm_86"] = SEARCH_SPACE["sm_80"]

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
         flags=dict(_SEED), config=Config(64, 64, occupancy=2), tuned=True, space="seed"),
    # --- Beyond the blog (chapter 10): each measured on the H200 against cuDNN in one run ---
    Step("arch_tuned", "A search space per architecture",
         "Autotune over tiles and hints chosen per architecture (Hopper: 64x128, 2 programs/SM).",
         flags=dict(_SEED), config=Config(64, 128, occupancy=2), tuned=True, source="book"),
    Step("warp_groups", "Two consumer warp groups",
         "Hopper: 128-row tiles shared by two warp groups (num_worker_warps=8), searched "
         "beside arch_tuned's tiles.",
         flags=dict(_SEED), config=Config(128, 128, occupancy=1, num_worker_warps=8),
         tuned=True, space="warp_groups", source="book"),
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
    Step("pipeline", "Softmax overlapped with the next product",
         "S of key tile j+1 issued before the softmax of tile j (FlashAttention-3's overlap).",
         flags=dict(_SEED, PIPELINE=True), config=_ON_HOPPER, source="experiment"),
]
EXPERIMENTS: dict[str, Step] = {s.name: s for s in _EXPERIMENT_LIST}

STEPS: dict[str, Step] = {s.name: s for s in _STEP_LIST}
STEP_NAMES: tuple[str, ...] = tuple(STEPS)
SEED_STEPS = tuple(s.name for s in _STEP_LIST if s.source == "seed")


# The fastest step measured on each architecture (chapter 10: on the
# H200 warp_groups' space holds arch_tuned's winner and the 128-row warp-group tiles that win at
# D=256). Architectures we have not measured get arch_tuned: its space there is the seed's or
# smaller, and warp_groups' space on them is arch_tuned's.
BEST_STEP: dict[str, str] = {"sm_90": "warp_groups"}
DEFAULT_BEST = "arch_tuned"


def best_step_name(arch: str | None) -> str:
    """The step ``step="best"`` runs on ``arch``."""
    return BEST_STEP.get(arch, DEFAULT_BEST)


def get_step(name: str) -> Step:
    """A step (or a chapter-10 experiment) by name."""
    if name in STEPS:
        return STEPS[name]
    if name in EXPERIMENTS:
        return EXPERIMENTS[name]
    raise ValueError(f"unknown step {name!r}; choose one of {', '.join(STEP_NAMES)}, "
                     f"'best', or an experiment: {', '.join(EXPERIMENTS)}")


def resolve_name(name: str, arch: str | None) -> Step:
    """A step by name, with "best" resolved for ``arch``."""
    return get_step(best_step_name(arch) if name == "best" else name)


def with_config(step: Step, config: Config) -> Step:
    """The same step pinned to another tile shape / hints (autotune candidates, bench variants)."""
    return replace(step, config=config, arch_configs={}, tuned=False)


assert all(n in STEPS for n in BEST_STEP.values()) and DEFAULT_BEST in STEPS
