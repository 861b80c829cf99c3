"""The input contract of every attention entry point, in one place.

A leaf module: it imports nothing from the package, so the kernels' launch code, the CPU
references, the benchmarks and the command line all check inputs with the same rules.

One helper per rule (a tensor, its rank, dtype, device; head dim, GQA ratio, scale, lengths),
each raising a TypeError or ValueError that names the argument; the three families compose
them:

    check_shapes(q.shape, k.shape, v.shape, causal=..., scale=..., input_pos=...)   # dense
    check_tensors(q, k, v, causal=..., scale=..., input_pos=...)   # + dtype and device
    check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table)   # a KV cache
    check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=..., ...)  # packed

A public call runs its family's check once, at its entry; the launch code behind it trusts
what it is given.

Why one module of this size: it is the package's one validation leaf (every entry point's rules,
imported by the launch code, the references and the tools alike); split by family, the shared
per-argument helpers would need a module of their own that every part imports.

CPU tensors pass the device rule only with ``interpret=True``: the caller says whether the CPU
interpreter runs them (``flashattn.dispatch.interpreting``; this module imports nothing from the
package, so it does not ask itself). Refused, the message names the opt-in (``INTERPRET_HINT``).
"""
from __future__ import annotations

import math
import numbers
from typing import NamedTuple

DTYPES = ("float16", "bfloat16")            # what the kernels take
DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}
MAX_HEAD_DIM = 256
MAX_DECODE_QUERIES = 16     # new tokens per sequence for the decode path (more: attention())
DECODE_PAGE_MULTIPLE = 16   # tokens per page: a multiple of the smallest K/V tile
# How to run the real kernels on CPU tensors (flashattn.interpret), named by every device error.
INTERPRET_HINT = ("or run the kernels themselves in flashattn's CPU interpreter: set "
                  "FLASHATTN_INTERPRET=1 or call inside `with flashattn.interpret.enabled():`")


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def tile_d_for(head_dim: int) -> int:
    """Head dims are padded to a power of two of at least 16 (the MMA's K granularity)."""
    return max(16, next_pow2(head_dim))


def dtype_name(dtype) -> str:
    """"float16" for torch.float16, "float16", "fp16"; ValueError for anything the kernels do not take."""
    name = str(dtype).replace("torch.", "")
    name = {v: k for k, v in DTYPE_SHORT.items()}.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return name


def parse_gqa(gqa, heads: int | None = None) -> tuple[int, int] | None:
    """"32:8", "32x8" or (32, 8) -> (32, 8). None or "" -> (heads, heads), or None without heads."""
    if gqa is None or gqa == "":
        return None if heads is None else (int(heads), int(heads))
    if isinstance(gqa, str):
        parts = gqa.replace("x", ":").split(":")
        if len(parts) != 2:
            raise ValueError(f"GQA takes HQ:HKV such as 32:8, got {gqa!r}")
        gqa = tuple(parts)
    try:
        hq, hkv = (int(x) for x in gqa)
    except (TypeError, ValueError):
        raise ValueError(f"GQA takes two integers HQ:HKV such as 32:8, got {gqa!r}") from None
    if hq < 1 or hkv < 1 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a positive multiple of key/value heads "
                         f"({hkv})")
    return hq, hkv


def head_dim_arg(text: str) -> int:
    """``type=`` of a ``--head-dim`` option: ``check_head_dim`` of the integer ``text``, so a
    command refuses (argparse's error, exit status 2) what the API refuses."""
    import argparse
    try:
        return check_head_dim(int(text))
    except ValueError as e:
        msg = str(e) if str(e).startswith("head dim") else f"takes an integer, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


# --- the rules, one helper each ------------------------------------------------------------------
def _is_int(x) -> bool:
    """An int, a NumPy integer or torch.compile's symbolic int (a SymInt: this module does not
    import torch, so it goes by the name), never a bool."""
    if isinstance(x, bool):
        return False
    return isinstance(x, numbers.Integral) or type(x).__name__ == "SymInt"


def _dtype_str(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _device_type(t) -> str:
    dev = getattr(t, "device", "cpu")
    return getattr(dev, "type", str(dev))


def check_flag(name: str, x) -> bool:
    """``x`` as a bool; TypeError naming ``name`` for anything but a bool or an int (a tensor,
    a string: ``"no"`` would otherwise be true)."""
    if type(x).__module__.startswith("torch") or not isinstance(x, (bool, int)):
        raise TypeError(f"{name} must be a bool, got {type(x).__name__}")
    return bool(x)


def check_causal(causal) -> bool:
    """``causal`` as a bool; TypeError for anything but a bool or an int (a tensor, a string)."""
    return check_flag("causal", causal)


def check_int(name: str, x, *, minimum: int | None = None) -> int:
    """``x`` as an int (TypeError naming ``name``), at least ``minimum`` if given (ValueError)."""
    if not _is_int(x):
        raise TypeError(f"{name} must be an int, got {type(x).__name__}")
    if minimum is not None and x < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {x}")
    return int(x)


def check_optional_int(name: str, x, *, minimum: int = 0):
    """``x``: None, or an int of at least ``minimum`` (TypeError, ValueError naming ``name``)."""
    if x is None:
        return None
    if not _is_int(x):
        raise TypeError(f"{name} must be an int or None, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {x}")
    return int(x)


def check_scale(scale, *, positive: bool = True) -> None:
    """None, or a finite float; positive unless told otherwise. The kernels scale after the
    row max (one multiply per row): that is only the max of the scaled scores for a
    positive scale, so every kernel contract asks for one (the references take any)."""
    if scale is None:
        return
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float, got {type(scale).__name__}")
    if not math.isfinite(scale) or (positive and scale <= 0):
        raise ValueError(f"scale must be {'a finite positive number' if positive else 'finite'}"
                         f", got {scale}")


def check_out(out):
    """``out``: None or a torch.Tensor (its shape, dtype and device: the caller's rule)."""
    import torch
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    return out


def check_torch_tensors(**tensors) -> None:
    """Each named argument a torch.Tensor (None allowed for ``block_table`` only)."""
    import torch
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) and not (name == "block_table" and t is None):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def check_arrays(**arrays) -> None:
    """Each named argument array-like: a torch tensor or a NumPy array (a shape and a dtype)."""
    for name, t in arrays.items():
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(t).__name__}")


def check_rank(name: str, shape, ndim: int, layout: str = "") -> None:
    """``shape`` has ``ndim`` dimensions; ``layout`` names them in the message."""
    if len(shape) != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions{layout}, got shape {tuple(shape)}")


def check_same_shape(a: str, b: str, a_shape, b_shape) -> None:
    if tuple(a_shape) != tuple(b_shape):
        raise ValueError(f"{a} and {b} must have the same shape, got {tuple(a_shape)} and "
                         f"{tuple(b_shape)}")


def check_kernel_dtype(name: str, t, kernels: str, hint: str) -> None:
    """``t`` float16 or bfloat16, what the kernels take; ``kernels`` says whose rule it is
    ("the decode kernels take"), ``hint`` what to do instead."""
    if _dtype_str(t) not in DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; {kernels} float16 or bfloat16 ({hint})")


def check_floating(**arrays) -> None:
    """Each named array of floating-point numbers (the references take float32 and float64)."""
    for name, t in arrays.items():
        if not _dtype_str(t).startswith(("float", "bfloat")):
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}")


def check_one_dtype(**arrays) -> None:
    """The named arrays share one dtype (the MMA's operands do)."""
    if len({_dtype_str(t) for t in arrays.values()}) > 1:
        raise TypeError(f"{', '.join(arrays)} must share one dtype, got "
                        f"{', '.join(str(t.dtype) for t in arrays.values())}")


def check_int32(name: str, t, why: str) -> None:
    """Offsets and tables are int32, as the serving engines and FlashAttention keep them."""
    if _dtype_str(t) != "int32":
        raise TypeError(f"{name} must be int32 ({why}), got {t.dtype}; convert with "
                        ".to(torch.int32)")


def check_one_device(**arrays) -> None:
    """The named arrays on one device (a NumPy array counts as the CPU)."""
    devices = {name: str(getattr(t, "device", "cpu")) for name, t in arrays.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{', '.join(arrays)} must be on one device, got {devices}")


def check_kernel_device(t, interpret: bool, kernels: str, reference: str) -> None:
    """A CUDA tensor, or a CPU one when the interpreter runs it (``interpret``). ``kernels``
    names the kernels and their verb ("the decode kernels run"), ``reference`` the CPU way."""
    if not (t.device.type == "cuda" or (bool(interpret) and t.device.type == "cpu")):
        raise ValueError(f"{kernels} on a CUDA GPU; the tensors are on {t.device}. On a CPU "
                         f"use {reference}, " + INTERPRET_HINT)


def check_head_dim(D) -> int:
    """``D`` as an int if it is a head dim the kernels take (1 .. ``MAX_HEAD_DIM``); TypeError
    for a non-integer, ValueError otherwise. The rule of every entry point, the command line's
    ``--head-dim`` included (``head_dim_arg``)."""
    if not _is_int(D):
        raise TypeError(f"head dim must be an int, got {type(D).__name__}")
    if D < 1 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {D}")
    return int(D)


def check_head_dims(D: int, Dk: int, kv: str) -> None:
    """q's head dim D equals the keys' Dk (``kv`` names them in the message), within 1..256."""
    if Dk != D:
        raise ValueError(f"head dim differs: q has {D}, {kv} have {Dk}")
    if D < 1 or D > MAX_HEAD_DIM:          # no int check: shapes may be symbolic (compile)
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {D}")


def check_groups(Hq: int, Hkv: int, kv_heads: str = "key/value heads") -> None:
    """Hq a positive multiple of Hkv: query head h reads key/value head h // (Hq // Hkv).
    ``kv_heads`` names the latter in the message."""
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a positive multiple of {kv_heads} "
                         f"({Hkv}) for grouped-query attention")


def _capturing() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:       # pragma: no cover - no CUDA build of torch
        return False


def check_host_read(what: str, on_cpu: bool, names: str) -> None:
    """Reading ``names`` on the host is not allowed inside CUDA-graph capture."""
    if not on_cpu and _capturing():
        raise ValueError(f"check_values=True reads {names} on the host, which CUDA-graph "
                         f"capture does not allow; pass check_values=False (the kernel clamps "
                         f"bad {what} and writes NaN for their sequences)")


def is_meta(*tensors) -> bool:
    """All of ``tensors`` on PyTorch's ``meta`` device (shapes, no data)."""
    return all(_device_type(t) == "meta" for t in tensors)


# --- dense: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D) --------------------------------------------
DENSE_LAYOUT = " (B, H, N, D)"


def check_shapes(q_shape, k_shape, v_shape, *, causal: bool, scale, input_pos) -> None:
    """Raise ValueError (TypeError for a bad argument type): q (B, Hq, Nq, D), k and v
    (B, Hkv, Nk, D), Hq % Hkv == 0, 1 <= D <= 256, finite scale, 0 <= input_pos <= Nk - Nq."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        check_rank(name, s, 4, DENSE_LAYOUT)
    B, Hq, Nq, D = q_shape
    check_same_shape("k", "v", k_shape, v_shape)
    Bk, Hkv, Nk, Dk = k_shape
    if Bk != B:
        raise ValueError(f"batch size differs: q has {B}, k and v have {Bk}")
    check_head_dims(D, Dk, "k and v")
    if Hkv == 0 and Hq != 0:
        raise ValueError(f"k and v have 0 heads but q has {Hq}")
    if Hq and Hkv:              # no head at all is allowed: an empty output
        check_groups(Hq, Hkv)
    if Nk == 0 and B * Hq * Nq > 0:
        raise ValueError("k and v have sequence length 0: softmax over no keys is undefined")
    check_scale(scale, positive=False)
    if not _is_int(input_pos):
        raise TypeError(f"input_pos must be an int, got {type(input_pos).__name__}")
    if input_pos < 0 or input_pos > max(0, Nk - Nq):
        raise ValueError(f"input_pos must be in [0, max(0, Nk - Nq)] = [0, {max(0, Nk - Nq)}] "
                         f"(query row i sits at position input_pos + i), got {input_pos}")
    if input_pos and not causal:
        raise ValueError("input_pos only has a meaning with causal=True")


DENSE_KERNELS = "flashattn kernels take"
DENSE_DTYPE_HINT = ("cast with .half() or .bfloat16(); for float32 use "
                    "flashattn.reference.attention")


def check_tensor_meta(q, k, v, *, causal: bool, scale, input_pos) -> None:
    """The part of ``check_tensors`` that needs no device: ranks, one float16/bfloat16 dtype,
    ``check_shapes``, a positive scale (what a fake or meta tensor can be checked for)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t.shape, 4, DENSE_LAYOUT)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_kernel_dtype(name, t, DENSE_KERNELS, DENSE_DTYPE_HINT)
    check_one_dtype(q=q, k=k, v=v)
    check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal=causal, scale=scale,
                 input_pos=input_pos)
    check_scale(scale)


def check_tensors(q, k, v, *, causal: bool, scale, input_pos, interpret: bool = False) -> None:
    """The dense kernels' contract: ``check_shapes`` plus torch CUDA tensors (CPU ones with
    ``interpret``) of one float16 or bfloat16 dtype on one device, and a positive scale. Raises
    TypeError/ValueError naming the problem."""
    check_torch_tensors(q=q, k=k, v=v)
    check_tensor_meta(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    check_kernel_device(q, interpret, "flashattn kernels run",
                        "flashattn.reference.attention(q, k, v, causal=...)")


# --- decode: a few new tokens over a KV cache ----------------------------------------------------
class DecodeDims(NamedTuple):
    """What ``check_decode`` found. page_size is None for a contiguous cache; capacity is the
    most keys a sequence can hold (S, or max_pages x page_size)."""
    B: int
    Hq: int
    Hkv: int
    Nq: int
    D: int
    paged: bool
    page_size: int | None
    capacity: int


def check_decode_shapes(q_shape, k_shape, v_shape, seqlens_shape, table_shape=None, *,
                        scale=None) -> DecodeDims:
    """Raise ValueError (TypeError for a bad scale): the shapes of a decode call.

    q (B, Hq, Nq, D) with 1 <= Nq <= 16; k_cache and v_cache of one shape, (B, Hkv, S, D)
    without a block table or (num_pages, Hkv, page_size, D) with one, page_size a multiple of
    16; block_table (B, max_pages); cache_seqlens (B,); Hq % Hkv == 0; 1 <= D <= 256.
    """
    for name, s in (("q", q_shape), ("k_cache", k_shape), ("v_cache", v_shape)):
        check_rank(name, s, 4)
    B, Hq, Nq, D = (int(x) for x in q_shape)
    check_same_shape("k_cache", "v_cache", k_shape, v_shape)
    P, Hkv, S, Dk = (int(x) for x in k_shape)
    paged = table_shape is not None
    if B < 1:
        raise ValueError(f"q must hold at least one sequence, got batch size {B}")
    if not 1 <= Nq <= MAX_DECODE_QUERIES:
        raise ValueError(f"decode takes 1 to {MAX_DECODE_QUERIES} new tokens per sequence "
                         f"(q's third dimension), got {Nq}; for a longer chunk use "
                         "flashattn.attention(q, k, v, causal=True, input_pos=...)")
    check_head_dims(D, Dk, "k_cache and v_cache")
    check_groups(Hq, Hkv, "the cache's key/value heads")
    if tuple(seqlens_shape) != (B,):
        raise ValueError(f"cache_seqlens must have shape (B,) = ({B},), got "
                         f"{tuple(seqlens_shape)}")
    if S < 1:
        raise ValueError(f"the cache holds no token per {'page' if paged else 'sequence'} "
                         f"(shape {tuple(k_shape)})")
    if paged:
        if len(table_shape) != 2 or int(table_shape[0]) != B:
            raise ValueError(f"block_table must have shape (B, max_pages) with B = {B}, got "
                             f"{tuple(table_shape)}")
        if int(table_shape[1]) < 1:
            raise ValueError("block_table has no column: each sequence needs at least one page")
        if S % DECODE_PAGE_MULTIPLE:
            raise ValueError(f"page_size (k_cache.shape[2] of a paged cache) must be a multiple "
                             f"of {DECODE_PAGE_MULTIPLE}, got {S}")
        if P < 1:
            raise ValueError("the paged cache has no page")
        capacity = int(table_shape[1]) * S
    else:
        if P != B:
            raise ValueError(f"a contiguous cache (B, Hkv, S, D) needs one row per sequence: "
                             f"q has batch size {B}, k_cache {P} (a paged cache needs "
                             "block_table)")
        capacity = S
    check_scale(scale)
    return DecodeDims(B, Hq, Hkv, Nq, D, paged, S if paged else None, capacity)


def check_decode_values(cache_seqlens, block_table, dims: DecodeDims, *,
                        num_pages: int | None = None) -> None:
    """Raise ValueError unless every length is in [0, capacity] and every page a sequence uses
    (slots ``0 .. cdiv(len, page_size) - 1`` of its row) is in [0, num_pages).

    Reads the values on the host: a device tensor is copied (a synchronisation), so this is not
    allowed inside CUDA-graph capture (see ``check_decode``).
    """
    import numpy as np

    def host(t):
        return np.asarray(t.detach().cpu() if hasattr(t, "detach") else t).astype(np.int64)
    lens = host(cache_seqlens).reshape(-1)
    bad = np.flatnonzero((lens < 0) | (lens > dims.capacity))
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"cache_seqlens[{b}] = {int(lens[b])} is outside [0, {dims.capacity}] "
                         f"(the cache holds at most {dims.capacity} tokens per sequence"
                         + (f": {dims.capacity // dims.page_size} pages of {dims.page_size}"
                            if dims.paged else "") + f"); {bad.size} such sequence(s)")
    if not dims.paged:
        return
    table = host(block_table)
    used = -(-lens // dims.page_size)                                 # pages per sequence
    in_use = np.arange(table.shape[1])[None, :] < used[:, None]       # (B, max_pages)
    out = in_use & ((table < 0) | (table >= num_pages))
    if out.any():
        b, p = (int(x) for x in np.argwhere(out)[0])
        raise ValueError(f"block_table[{b}, {p}] = {int(table[b, p])} is not a page of the "
                         f"cache (0 .. {num_pages - 1}); sequence {b} uses slots 0 .. "
                         f"{int(used[b]) - 1} for its {int(lens[b])} tokens")


def check_decode(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                 check_values=None) -> DecodeDims:
    """The inputs of a decode call (torch tensors or NumPy arrays); returns ``DecodeDims``.

    Raises TypeError for a wrong type or dtype (q and the caches floating point and of one
    dtype; cache_seqlens and block_table int32), ValueError for shapes
    (``check_decode_shapes``), tensors on different devices, and values
    (``check_decode_values``).

    Values (lengths past the cache, page ids out of range) are checked on the host when
    ``check_values`` is True, or when it is None (the default) and the tables are on the CPU.
    Device tables are not read by default: that would synchronise every decode step, and
    under CUDA-graph capture reading a device tensor is not allowed at all (``check_values=True``
    while capturing raises ValueError). What then guards them is the kernel: it clamps every
    length and page id for addressing, so nothing out of bounds is read, and writes NaN for a
    sequence whose length or pages were invalid.
    """
    arrays = dict(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens)
    tables = dict(cache_seqlens=cache_seqlens)
    if block_table is not None:
        arrays["block_table"] = tables["block_table"] = block_table
    check_arrays(**arrays)
    check_floating(q=q, k_cache=k_cache, v_cache=v_cache)
    check_one_dtype(q=q, k_cache=k_cache, v_cache=v_cache)
    for name, t in tables.items():
        check_int32(name, t, "as serving engines keep it")
    check_one_device(**arrays)
    dims = check_decode_shapes(tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape),
                               tuple(cache_seqlens.shape),
                               None if block_table is None else tuple(block_table.shape),
                               scale=scale)
    on_cpu = _device_type(cache_seqlens) == "cpu"
    if check_values is None:
        check_values = on_cpu
    if check_flag("check_values", check_values):
        check_host_read("values", on_cpu, "cache_seqlens and block_table")
        check_decode_values(cache_seqlens, block_table, dims, num_pages=int(k_cache.shape[0]))
    return dims


def check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                         check_values=None, interpret: bool = False) -> DecodeDims:
    """The decode kernels' contract: ``check_decode`` plus torch CUDA tensors (CPU ones with
    ``interpret``), q and the caches float16 or bfloat16, and the caches' last dimension
    contiguous (a cache is never copied)."""
    check_torch_tensors(q=q, k_cache=k_cache, v_cache=v_cache, cache_seqlens=cache_seqlens,
                        block_table=block_table)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_kernel_dtype(name, t, "the decode kernels take",
                           "for float32 use flashattn.reference.decode_attention")
    dims = check_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                        check_values=check_values)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (head dim), "
                             f"got strides {tuple(t.stride())}")
    check_kernel_device(q, interpret, "the decode kernels run",
                        "flashattn.reference.decode_attention")
    return dims


# --- varlen: sequences packed without padding ----------------------------------------------------
class VarlenDims(NamedTuple):
    """What ``check_varlen`` found: B sequences, their packed totals, heads and head dim."""
    B: int
    Hq: int
    Hkv: int
    D: int
    total_q: int
    total_k: int


def check_varlen_shapes(q_shape, k_shape, v_shape, cu_q_shape, cu_k_shape, *,
                        max_seqlen_q, max_seqlen_k, scale=None) -> VarlenDims:
    """Raise ValueError (TypeError for a bad scalar type): q (total_q, Hq, D), k and v
    (total_k, Hkv, D), Hq % Hkv == 0, 1 <= D <= 256, cu_seqlens_q and cu_seqlens_k (B + 1,)
    with B >= 1, max_seqlen_q/k non-negative ints, a finite positive scale."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        check_rank(name, s, 3, " (total_tokens, heads, head_dim) for packed sequences")
    total_q, Hq, D = (int(x) for x in q_shape)
    check_same_shape("k", "v", k_shape, v_shape)
    total_k, Hkv, Dk = (int(x) for x in k_shape)
    check_head_dims(D, Dk, "k and v")
    check_groups(Hq, Hkv)
    for name, s in (("cu_seqlens_q", cu_q_shape), ("cu_seqlens_k", cu_k_shape)):
        if len(s) != 1 or int(s[0]) < 2:
            raise ValueError(f"{name} must have shape (B + 1,) with B >= 1 sequences (offsets "
                             f"0, len_0, len_0 + len_1, ...), got shape {tuple(s)}")
    if int(cu_q_shape[0]) != int(cu_k_shape[0]):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of "
                         f"sequences, got shapes {tuple(cu_q_shape)} and {tuple(cu_k_shape)}")
    check_int("max_seqlen_q", max_seqlen_q, minimum=0)
    check_int("max_seqlen_k", max_seqlen_k, minimum=0)
    check_scale(scale)
    return VarlenDims(int(cu_q_shape[0]) - 1, Hq, Hkv, D, total_q, total_k)


def check_varlen_values(cu_seqlens_q, cu_seqlens_k, dims: VarlenDims, *, max_seqlen_q,
                        max_seqlen_k) -> None:
    """Raise ValueError unless each ``cu_seqlens`` starts at 0, never decreases and ends at its
    packed total, and no sequence is longer than ``max_seqlen_q`` / ``max_seqlen_k``.

    Reads the offsets on the host: a device tensor is copied (a synchronisation).
    """
    import numpy as np
    for name, cu, total, mx, t in (("cu_seqlens_q", cu_seqlens_q, dims.total_q, max_seqlen_q,
                                    "q"),
                                   ("cu_seqlens_k", cu_seqlens_k, dims.total_k, max_seqlen_k,
                                    "k")):
        c = np.asarray(cu.detach().cpu() if hasattr(cu, "detach") else cu).astype(np.int64)
        if c[0] != 0:
            raise ValueError(f"{name}[0] must be 0 (the first sequence starts at row 0), got "
                             f"{int(c[0])}")
        lens = np.diff(c)
        if (lens < 0).any():
            b = int(np.flatnonzero(lens < 0)[0])
            raise ValueError(f"{name} must be non-decreasing (cumulative lengths): "
                             f"{name}[{b + 1}] = {int(c[b + 1])} < {name}[{b}] = {int(c[b])}")
        if c[-1] != total:
            raise ValueError(f"{name}[-1] = {int(c[-1])} must equal the packed total of {t} "
                             f"({t}.shape[0] = {total})")
        if lens.size and lens.max() > mx:
            b = int(np.argmax(lens))
            raise ValueError(f"sequence {b} has {int(lens[b])} tokens in {t}, more than "
                             f"max_seqlen_{t} = {mx}")


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                 causal=False, scale=None, check_values=True) -> VarlenDims:
    """The inputs of a packed variable-length call (torch tensors or NumPy arrays).

    Raises TypeError for a wrong type or dtype (q, k, v floating point of one dtype;
    cu_seqlens int32, as FlashAttention's), ValueError for shapes (``check_varlen_shapes``),
    tensors on different devices, and, with ``check_values``, offsets
    (``check_varlen_values``: a synchronisation for device tensors).
    """
    check_causal(causal)
    check_values = check_flag("check_values", check_values)
    arrays = dict(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    check_arrays(**arrays)
    check_floating(q=q, k=k, v=v)
    check_one_dtype(q=q, k=k, v=v)
    for name in ("cu_seqlens_q", "cu_seqlens_k"):
        check_int32(name, arrays[name], "as FlashAttention's varlen interface takes it")
    check_one_device(**arrays)
    dims = check_varlen_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                               tuple(cu_seqlens_q.shape), tuple(cu_seqlens_k.shape),
                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                               scale=scale)
    if check_values:
        check_host_read("offsets", _device_type(cu_seqlens_q) == "cpu", "cu_seqlens")
        check_varlen_values(cu_seqlens_q, cu_seqlens_k, dims, max_seqlen_q=max_seqlen_q,
                            max_seqlen_k=max_seqlen_k)
    return dims


def check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                         causal=False, scale=None, check_values=True,
                         interpret: bool = False) -> VarlenDims:
    """The varlen kernel's contract: ``check_varlen`` plus torch CUDA tensors (CPU ones with
    ``interpret``), q, k, v float16 or bfloat16.

    Meta tensors (all five on ``meta``, as a model built there passes them) are checked for
    everything but their values, which they do not have: ``check_values`` is ignored for them,
    as the dense operator's fake implementation checks shapes only."""
    check_torch_tensors(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    meta = is_meta(q, k, v, cu_seqlens_q, cu_seqlens_k)
    check_values = check_flag("check_values", check_values)
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_kernel_dtype(name, t, "the varlen kernel takes",
                           "for float32 use flashattn.reference.varlen_attention")
    dims = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                        check_values=check_values and not meta)
    if not meta:
        check_kernel_device(q, interpret, "the varlen kernel runs",
                            "flashattn.reference.varlen_attention")
    return dims
