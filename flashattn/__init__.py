"""FlashAttention in NVIDIA cuTile Python: the kernels, references and tools behind the book.

    import flashattn
    o = flashattn.attention(q, k, v, causal=True)            # fastest known step on this GPU
    o = flashattn.attention(q, k, v, causal=True, step="baseline")
    o = flashattn.decode(q_new, k_cache, v_cache, cache_seqlens)   # a decode step (chapter 12)
    o = flashattn.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len)  # packed
    flashattn.STEPS                                           # the steps of the book, in order
    with flashattn.interpret.enabled():                       # or FLASHATTN_INTERPRET=1: CPU
        o = flashattn.attention(q_cpu, k_cpu, v_cpu)          # tensors, the real kernels

The package, by layer (each imports only from the layers above it):

    contract, steps, env          input rules; the steps as data; the machine
    impls, kernels/               the registry of implementations; the cuTile kernels and specs
    dispatch, interpret/          where a launch runs: the GPU, or the CPU interpreter (opt-in)
    launch, autotune, aot         launching a step; choosing its tiles; compiling ahead of time
    api                           attention, sdpa
    reference/                    exact attention, the online softmax, a CPU emulation
    measure/, data/               timing, bench, Nsight Compute, recording; the dataset's reader
    chapter/                      what the notebooks share: setup, glue, figures
"""
from .api import attention, sdpa
from .decode import decode  # the function; the module is sys.modules["flashattn.decode"]
from .varlen import attention_varlen, attention_varlen_backward
from .fp8 import quantize_fp8  # issue 24: fp8 inputs and caches with their descales
from .steps import (ARCHS, EXPERIMENTS, FLAGS, SEED_STEPS, STEP_NAMES, STEPS, Config, Step,
                    get_step)

__version__ = "0.1.0"
__all__ = ["attention", "sdpa", "decode", "attention_varlen", "attention_varlen_backward",
           "quantize_fp8",
           "STEPS", "STEP_NAMES", "SEED_STEPS", "Step", "Config", "get_step", "EXPERIMENTS",
           "ARCHS", "FLAGS", "__version__"]

# Submodules load on first use (flashattn.reference, flashattn.chapter, ...): importing
# flashattn stays cheap, and `import flashattn; flashattn.reference.attention(...)` works.
_SUBMODULES = ("aot", "api", "autograd", "autotune", "chapter", "contract", "data", "dispatch",
               "env", "impls", "interpret", "kernels", "launch", "measure", "reference", "steps",
               "fp8")


def __getattr__(name):
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
