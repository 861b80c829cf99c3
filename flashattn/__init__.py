"""FlashAttention in NVIDIA cuTile Python: the kernels, references and tools behind the book.

    import flashattn
    o = flashattn.attention(q, k, v, causal=True)            # fastest known step on this GPU
    o = flashattn.attention(q, k, v, causal=True, step="baseline")
    flashattn.STEPS                                           # the steps of the book, in order
"""
from .api import attention, sdpa
from .steps import (ARCHS, EXPERIMENTS, FLAGS, SEED_STEPS, STEP_NAMES, STEPS, Config, Step,
                    get_step)

__version__ = "0.1.0"
__all__ = ["attention", "sdpa", "STEPS", "STEP_NAMES", "SEED_STEPS", "Step", "Config",
           "get_step", "EXPERIMENTS", "ARCHS", "FLAGS", "__version__"]

# Submodules load on first use (flashattn.reference, flashattn.plots, ...): importing
# flashattn stays cheap, and `import flashattn; flashattn.source.step_diff(...)` works.
_SUBMODULES = ("aot", "api", "autotune", "bench", "book", "env", "kernels", "plots", "profile",
               "record", "reference", "results", "source", "steps", "timing")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
