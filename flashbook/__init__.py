"""The book's support code, beside the library ``flashattn``: the steps of the ladder, the
chapters' helpers and figures, the benchmarks, timing and Nsight Compute, the recorded data's
readers, ``nbrun``. It imports ``flashattn``; ``flashattn`` never imports it.

    import flashbook
    flashbook.STEPS                                  # the steps of the book, in order
    o = flashbook.attention(q, k, v, causal=True, step="baseline")   # any step of the book
    from flashbook import chapter                    # what the notebooks share
    python -m flashbook COMMAND                      # steps, bench, decode-bench, profile, record, nbrun

The package, by layer (each imports only from the layers above it, and from flashattn):

    steps                         the steps of the book, registered with flashattn.registry
    ladder/                       the ladder kernel: every step's flag (the library ships it folded)
    impls, source                 the registry of implementations; a step's kernel source folded
    data/                         the recorded dataset: schema and reader (CPU only)
    measure/                      bench, Nsight Compute, recording
    chapter/                      what the notebooks share: setup, glue, figures
    nbrun                         run a notebook without Jupyter
"""
from .steps import (ARCHS, EXPERIMENTS, FLAGS, SEED_STEPS, STEP_NAMES, STEPS, Config, Step,
                    get_step)  # registers the book's steps with flashattn.registry

from . import ladder  # noqa: F401  (the ladder kernel: the book steps off the shipped flags run it)



def attention(q, k, v, *, causal: bool = False, scale: float | None = None, input_pos: int = 0,
              step: str = "best"):
    """Attention with one step of the book (a name of ``STEPS`` or ``EXPERIMENTS``, or "best"):
    steps off the shipped flags run the ladder kernel (``flashbook.ladder``), the others the
    library's kernel. The library's ``flashattn.api.run_step`` validates, resolves and launches."""
    from flashattn.api import run_step
    return run_step(q, k, v, step, causal=causal, scale=scale, input_pos=input_pos)


__all__ = ["attention", "STEPS", "STEP_NAMES", "SEED_STEPS", "Step", "Config", "get_step", "EXPERIMENTS",
           "ARCHS", "FLAGS"]

# Submodules load on first use: importing flashbook stays cheap (no pandas, no matplotlib).
_SUBMODULES = ("chapter", "data", "impls", "measure", "nbrun", "source")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
