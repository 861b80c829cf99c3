"""The book's views of the steps (``flashattn.steps`` holds the steps as data, the library's
configurations): the Hopper ladder of chapters 6-8, each step's predecessor for the diffs, and
``python -m flashbook steps``.
"""
from __future__ import annotations

from flashattn.steps import EXPERIMENTS, STEP_NAMES, STEPS, get_step

__all__ = ["HOPPER_LADDER", "previous_step", "describe", "main"]


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
