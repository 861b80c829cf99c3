"""Named steps: a kernel's flags with its tile shape and launch hints per architecture, by name.

The library registers what ``attention`` ships: ``arch_tuned`` (a search space per
architecture) and, on Hopper, ``warp_groups`` (two consumer warp groups). Steps registered from
outside (``register_step``) run by name through ``api.run_step``.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from .config import Config
from .kernels.fmha_fwd_spec import FMHA_LATENCIES, FusedKernel, arch_space, warp_group_space

__all__ = ["Step", "register_step", "get_step", "registered", "resolve_name", "with_config",
           "best_step_name", "shipped_steps", "BEST_STEP", "DEFAULT_BEST"]


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    description: str            # one line: what this step changes
    kernel: str = "fmha"        # "fmha" (fused) or "naive" (three kernels)
    flags: dict = field(default_factory=lambda: dict(FMHA_LATENCIES))   # the kernel's flags
    config: Config = Config(64, 64)
    arch_configs: dict = field(default_factory=dict)   # arch -> Config, overrides `config`
    tuned: bool = False         # chooses its Config per shape by measurement (autotune)
    space: Callable[[str | None], list] | None = None  # a tuned step's search space per arch
    fused: FusedKernel | None = None  # another build of the fused forward (default: FMHA)

    def flag_values(self) -> dict:
        """The kernel's compile-time flags, by name (a copy)."""
        return dict(self.flags)

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
        return list((self.space or arch_space)(arch))


_REGISTRY: dict[str, Step] = {}


def register_step(step: Step) -> Step:
    """Make ``step`` runnable by name (``api.run_step(q, k, v, step.name)``); a step registered
    again under its name replaces the old one and moves to the end of the order."""
    if not isinstance(step, Step):
        raise TypeError(f"register_step takes a Step, got {type(step).__name__}")
    _REGISTRY.pop(step.name, None)
    _REGISTRY[step.name] = step
    return step


def registered() -> dict[str, Step]:
    """The registered steps by name, in registration order (a copy)."""
    return dict(_REGISTRY)


# What the public operators ship. Hopper runs warp_groups (its space holds
# arch_tuned's winner and the 128-row warp-group tiles that win at D=256); architectures we have
# not measured run arch_tuned, whose space there is the seed's or smaller.
register_step(Step(
    "arch_tuned", "A search space per architecture",
    "Autotune over tiles and hints chosen per architecture (Hopper: 64x128, 2 programs/SM).",
    config=Config(64, 128, occupancy=2), tuned=True, space=arch_space))
register_step(Step(
    "warp_groups", "Two consumer warp groups",
    "Hopper: 128-row tiles shared by two warp groups (num_worker_warps=8), searched "
    "beside arch_tuned's tiles.",
    config=Config(128, 128, occupancy=1, num_worker_warps=8), tuned=True,
    space=warp_group_space))
BEST_STEP: dict[str, str] = {"sm_90": "warp_groups"}
DEFAULT_BEST = "arch_tuned"


def best_step_name(arch: str | None) -> str:
    """The step ``step="best"`` runs on ``arch``."""
    return BEST_STEP.get(arch, DEFAULT_BEST)


def shipped_steps() -> list[str]:
    """The steps ``best`` resolves to on some architecture (what the library ships)."""
    return list(dict.fromkeys([DEFAULT_BEST, *BEST_STEP.values()]))


def get_step(name: str) -> Step:
    """A registered step by name."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    hint = ("" if set(_REGISTRY) - set(shipped_steps()) else
            "; the book's steps need the book: import flashbook first "
            "(flashbook.attention(..., step=NAME))")
    raise ValueError(f"unknown step {name!r}; choose one of {', '.join(_REGISTRY)}, "
                     f"'best'{hint}")


def resolve_name(name: str, arch: str | None) -> Step:
    """A step by name, with "best" resolved for ``arch``."""
    return get_step(best_step_name(arch) if name == "best" else name)


def with_config(step: Step, config: Config) -> Step:
    """The same step pinned to another tile shape / hints (autotune candidates, bench variants)."""
    return replace(step, config=config, arch_configs={}, tuned=False)
