"""FlashAttention in NVIDIA cuTile Python: the kernels, their public operators, the input
contract, the references and the interpreter.

    import flashattn
    o = flashattn.attention(q, k, v, causal=True)            # fastest known kernel on this GPU
    o = flashattn.decode(q_new, k_cache, v_cache, cache_seqlens)   # a decode step
    o = flashattn.attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len)  # packed
    with flashattn.interpret.enabled():                       # or FLASHATTN_INTERPRET=1: CPU
        o = flashattn.attention(q_cpu, k_cpu, v_cpu)          # tensors, the real kernels

The book's support code (the steps of the ladder, benchmarks, Nsight Compute, the recorded
data, the chapters' figures) is the package ``flashbook`` beside this one: it imports
``flashattn``, never the other way round.

The package, by layer (each imports only from the layers above it):

    config, contract, env         a tile shape and hints; input rules; the machine
    kernels/                      the cuTile kernels, each with its spec, table and pure plan
    registry                      named steps: what step="best" ships; the book registers its own
    dispatch, interpret/          where a launch runs: the GPU, or the CPU interpreter (opt-in)
    stats, timing                 intervals; GPU timing (the autotuner's)
    launch, autotune, aot         launching a configuration; choosing its tiles; compiling ahead of time
    api                           attention, sdpa
    reference/                    exact attention, the online softmax, a CPU emulation
"""
from .api import attention, sdpa
from .decoding import decode
from .varlen import attention_varlen, attention_varlen_backward
from .flex import flex_attention  # FlexAttention on the cuTile kernel (flashattn.mods)
from .fp8_quant import quantize_fp8  # fp8 inputs and caches with their descales
from .flash_attn_interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .mla import flash_mla_with_kvcache, get_mla_metadata  # MLA decoding, FlashMLA's calls
from .precompiler import precompile  # compile configurations ahead of the first call

__version__ = "0.1.0"
__all__ = ["attention", "sdpa", "decode", "attention_varlen", "attention_varlen_backward",
           "flex_attention", "and_masks", "or_masks", "quantize_fp8", "flash_attn_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache", "get_mla_metadata",
           "flash_mla_with_kvcache", "precompile", "__version__"]

# Submodules load on first use (flashattn.reference, flashattn.kernels, ...): importing
# flashattn stays cheap, and `import flashattn; flashattn.reference.attention(...)` works.
_SUBMODULES = ("aot", "api", "autograd", "autotune", "config", "contract", "decoding",
               "dispatch", "env", "flash_attn_interface", "flash_attn_mods", "flex", "flex_aot",
               "flex_blockmask", "flex_build", "flex_inputs", "flex_launch", "flex_op", "fp8",
               "fp8_attention", "fp8_quant", "integrations", "interpret", "kernels", "launch",
               "launch_bwd", "mla", "mods", "modtrace", "precompiler", "reference", "registry",
               "stats", "timing", "value_dim", "varlen", "varlen_op")


def __getattr__(name):
    if name in ("and_masks", "or_masks"):      # masks composed, as PyTorch's (flashattn.mods)
        from . import mods
        return getattr(mods, name)
    if name in _SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
