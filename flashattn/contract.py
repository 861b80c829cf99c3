"""The input contract of every attention entry point, in one place.

A leaf module: it imports nothing from the package, so the kernels' launch code, the CPU
references, the benchmarks and the command line all check inputs with the same rules.

    check_shapes(q.shape, k.shape, v.shape, causal=..., scale=..., input_pos=...)
    check_tensors(q, k, v, causal=..., scale=..., input_pos=...)   # + dtype and device

CPU tensors pass the device rule only with ``interpret=True``: the caller says whether the CPU
interpreter runs them (``flashattn.dispatch.interpreting``; this module imports nothing from the
package, so it does not ask itself). Refused, the message names the opt-in (``INTERPRET_HINT``).
"""
from __future__ import annotations

import math

DTYPES = ("float16", "bfloat16")            # what the kernels take
DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}
MAX_HEAD_DIM = 256
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


def check_head_dim(D) -> int:
    """``D`` as an int if it is a head dim the kernels take (1 .. ``MAX_HEAD_DIM``); TypeError
    for a non-integer, ValueError otherwise. The rule of every entry point, the command line's
    ``--head-dim`` included (``head_dim_arg``)."""
    if isinstance(D, bool) or not _is_int(D):
        raise TypeError(f"head dim must be an int, got {type(D).__name__}")
    if D < 1 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {D}")
    return int(D)


def head_dim_arg(text: str) -> int:
    """``type=`` of a ``--head-dim`` option: ``check_head_dim`` of the integer ``text``, so a
    command refuses (argparse's error, exit status 2) what the API refuses."""
    import argparse
    try:
        return check_head_dim(int(text))
    except ValueError as e:
        msg = str(e) if str(e).startswith("head dim") else f"takes an integer, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _check_head_dim(D: int, Dk: int, kv: str) -> None:
    """q's head dim D equals the keys' Dk (``kv`` names them in the message), within 1..256."""
    if Dk != D:
        raise ValueError(f"head dim differs: q has {D}, {kv} have {Dk}")
    if D < 1 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {D}")


def _check_groups(Hq: int, Hkv: int, kv_heads: str) -> None:
    """Hq a positive multiple of Hkv (``kv_heads`` names the latter in the message)."""
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(f"query heads ({Hq}) must be a positive multiple of {kv_heads} "
                         f"({Hkv}) for grouped-query attention")


def check_shapes(q_shape, k_shape, v_shape, *, causal: bool, scale, input_pos) -> None:
    """Raise ValueError (TypeError for a bad argument type): q (B, Hq, Nq, D), k and v
    (B, Hkv, Nk, D), Hq % Hkv == 0, 1 <= D <= 256, finite scale, 0 <= input_pos <= Nk - Nq."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape {tuple(s)}")
    B, Hq, Nq, D = q_shape
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k_shape)} and "
                         f"{tuple(v_shape)}")
    Bk, Hkv, Nk, Dk = k_shape
    if Bk != B:
        raise ValueError(f"batch size differs: q has {B}, k and v have {Bk}")
    _check_head_dim(D, Dk, "k and v")
    if Hkv == 0 and Hq != 0:
        raise ValueError(f"k and v have 0 heads but q has {Hq}")
    if Hkv and Hq % Hkv != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv}) "
                         "for grouped-query attention")
    if Nk == 0 and B * Hq * Nq > 0:
        raise ValueError("k and v have sequence length 0: softmax over no keys is undefined")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
    if isinstance(input_pos, bool) or not _is_int(input_pos):
        raise TypeError(f"input_pos must be an int, got {type(input_pos).__name__}")
    if input_pos < 0 or input_pos > max(0, Nk - Nq):
        raise ValueError(f"input_pos must be in [0, max(0, Nk - Nq)] = [0, {max(0, Nk - Nq)}] "
                         f"(query row i sits at position input_pos + i), got {input_pos}")
    if input_pos and not causal:
        raise ValueError("input_pos only has a meaning with causal=True")


def _is_int(x) -> bool:
    if isinstance(x, int):
        return True
    try:                        # NumPy integers, without importing NumPy here
        import numbers
        return isinstance(x, numbers.Integral)
    except ImportError:         # pragma: no cover
        return False


def check_flag(name: str, x) -> bool:
    """``x`` as a bool; TypeError naming ``name`` for anything but a bool or an int (a tensor,
    a string: ``"no"`` would otherwise be true)."""
    if type(x).__module__.startswith("torch") or not isinstance(x, (bool, int)):
        raise TypeError(f"{name} must be a bool, got {type(x).__name__}")
    return bool(x)


def check_causal(causal) -> bool:
    """``causal`` as a bool; TypeError for anything but a bool or an int (a tensor, a string)."""
    return check_flag("causal", causal)


def check_optional_int(name: str, x, *, minimum: int = 0):
    """``x``: None, or an int of at least ``minimum`` (TypeError, ValueError naming ``name``)."""
    if x is None:
        return None
    if isinstance(x, bool) or not _is_int(x):
        raise TypeError(f"{name} must be an int or None, got {type(x).__name__}")
    if x < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {x}")
    return int(x)


def check_out(out):
    """``out``: None or a torch.Tensor (its shape, dtype and device: the caller's rule)."""
    import torch
    if out is not None and not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    return out


def _on_kernel_device(t, interpret: bool) -> bool:
    """A CUDA tensor, or a CPU one when the interpreter runs it (``interpret``)."""
    return t.device.type == "cuda" or (bool(interpret) and t.device.type == "cpu")


def check_tensors(q, k, v, *, causal: bool, scale, input_pos, interpret: bool = False) -> None:
    """The GPU kernels' contract: ``check_shapes`` plus torch CUDA tensors (CPU ones with
    ``interpret``) of one float16 or bfloat16 dtype on one device, and a positive scale. Raises
    TypeError/ValueError naming the problem."""
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    check_tensor_meta(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not _on_kernel_device(q, interpret):
        raise ValueError(f"flashattn kernels run on a CUDA GPU; the tensors are on {q.device}. "
                         "On a CPU use flashattn.reference.attention(q, k, v, causal=...), "
                         + INTERPRET_HINT)


def check_tensor_meta(q, k, v, *, causal: bool, scale, input_pos) -> None:
    """The part of ``check_tensors`` that needs no device: ranks, one float16/bfloat16 dtype,
    ``check_shapes``, a positive scale (what a fake or meta tensor can be checked for)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape "
                             f"{tuple(t.shape)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if str(t.dtype).replace("torch.", "") not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; flashattn kernels take float16 or "
                            "bfloat16 (cast with .half() or .bfloat16(); for float32 use "
                            "flashattn.reference.attention)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal=causal, scale=scale,
                 input_pos=input_pos)
    if scale is not None and scale <= 0:
        # The kernels scale after the row max (one multiply per row, chapter 3): that is
        # only the max of the scaled scores for a positive scale.
        raise ValueError(f"scale must be a finite positive number, got {scale}")


# --- decoding with a KV cache (flashattn.decode, issue 12) ---------------------------------------
from typing import NamedTuple  # noqa: E402  (appended section)

MAX_DECODE_QUERIES = 16     # new tokens per sequence for the decode path (more: attention())
DECODE_PAGE_MULTIPLE = 16   # tokens per page: a multiple of the smallest K/V tile


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


def _dtype_str(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _device_type(t) -> str:
    dev = getattr(t, "device", "cpu")
    return getattr(dev, "type", str(dev))


def check_decode_shapes(q_shape, k_shape, v_shape, seqlens_shape, table_shape=None, *,
                        scale=None) -> DecodeDims:
    """Raise ValueError (TypeError for a bad scale): the shapes of a decode call.

    q (B, Hq, Nq, D) with 1 <= Nq <= 16; k_cache and v_cache of one shape, (B, Hkv, S, D)
    without a block table or (num_pages, Hkv, page_size, D) with one, page_size a multiple of
    16; block_table (B, max_pages); cache_seqlens (B,); Hq % Hkv == 0; 1 <= D <= 256.
    """
    for name, s in (("q", q_shape), ("k_cache", k_shape), ("v_cache", v_shape)):
        if len(s) != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(s)}")
    B, Hq, Nq, D = (int(x) for x in q_shape)
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k_cache and v_cache must have the same shape, got {tuple(k_shape)} "
                         f"and {tuple(v_shape)}")
    P, Hkv, S, Dk = (int(x) for x in k_shape)
    paged = table_shape is not None
    if B < 1:
        raise ValueError(f"q must hold at least one sequence, got batch size {B}")
    if not 1 <= Nq <= MAX_DECODE_QUERIES:
        raise ValueError(f"decode takes 1 to {MAX_DECODE_QUERIES} new tokens per sequence "
                         f"(q's third dimension), got {Nq}; for a longer chunk use "
                         "flashattn.attention(q, k, v, causal=True, input_pos=...)")
    _check_head_dim(D, Dk, "k_cache and v_cache")
    _check_groups(Hq, Hkv, "the cache's key/value heads")
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
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float, got {type(scale).__name__}")
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite positive number, got {scale}")
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
    arrays = (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
              ("cache_seqlens", cache_seqlens)) + (
        (("block_table", block_table),) if block_table is not None else ())
    for name, t in arrays:
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(t).__name__}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not _dtype_str(t).startswith(("float", "bfloat")):
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}")
    if not (_dtype_str(q) == _dtype_str(k_cache) == _dtype_str(v_cache)):
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, "
                        f"{k_cache.dtype}, {v_cache.dtype}")
    for name, t in arrays[3:]:
        if _dtype_str(t) != "int32":
            raise TypeError(f"{name} must be int32 (as serving engines keep it), got {t.dtype}; "
                            "convert with .to(torch.int32)")
    devices = {name: str(getattr(t, "device", "cpu")) for name, t in arrays}
    if len(set(devices.values())) > 1:
        raise ValueError("q, k_cache, v_cache, cache_seqlens" +
                         (", block_table" if block_table is not None else "") +
                         f" must be on one device, got {devices}")
    dims = check_decode_shapes(tuple(q.shape), tuple(k_cache.shape), tuple(v_cache.shape),
                               tuple(cache_seqlens.shape),
                               None if block_table is None else tuple(block_table.shape),
                               scale=scale)
    on_cpu = _device_type(cache_seqlens) == "cpu"
    if check_values is None:
        check_values = on_cpu
    check_values = check_flag("check_values", check_values)
    if check_values:
        if not on_cpu and _capturing():
            raise ValueError("check_values=True reads cache_seqlens and block_table on the "
                             "host, which CUDA-graph capture does not allow; pass "
                             "check_values=False (the kernel clamps bad values and writes "
                             "NaN for their sequences)")
        check_decode_values(cache_seqlens, block_table, dims, num_pages=int(k_cache.shape[0]))
    return dims


def _capturing() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())
    except Exception:       # pragma: no cover - no CUDA build of torch
        return False


def check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table=None, *, scale=None,
                         check_values=None, interpret: bool = False) -> DecodeDims:
    """The decode kernels' contract: ``check_decode`` plus torch CUDA tensors (CPU ones with
    ``interpret``), q and the caches float16 or bfloat16, and the caches' last dimension
    contiguous (a cache is never copied)."""
    import torch
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("cache_seqlens", cache_seqlens), ("block_table", block_table)):
        if not isinstance(t, torch.Tensor) and not (name == "block_table" and t is None):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if _dtype_str(t) not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the decode kernels take float16 or "
                            "bfloat16 (for float32 use flashattn.reference.decode_attention)")
    dims = check_decode(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                        check_values=check_values)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (head dim), "
                             f"got strides {tuple(t.stride())}")
    if not _on_kernel_device(q, interpret):
        raise ValueError(f"the decode kernels run on a CUDA GPU; the tensors are on "
                         f"{q.device}. On a CPU use flashattn.reference.decode_attention, "
                         + INTERPRET_HINT)
    return dims


# --- packed variable-length prefill (flashattn.varlen, issue 12) -------------------------------
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
        if len(s) != 3:
            raise ValueError(f"{name} must have 3 dimensions (total_tokens, heads, head_dim) "
                             f"for packed sequences, got shape {tuple(s)}")
    total_q, Hq, D = (int(x) for x in q_shape)
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k_shape)} and "
                         f"{tuple(v_shape)}")
    total_k, Hkv, Dk = (int(x) for x in k_shape)
    _check_head_dim(D, Dk, "k and v")
    _check_groups(Hq, Hkv, "key/value heads")
    for name, s in (("cu_seqlens_q", cu_q_shape), ("cu_seqlens_k", cu_k_shape)):
        if len(s) != 1 or int(s[0]) < 2:
            raise ValueError(f"{name} must have shape (B + 1,) with B >= 1 sequences (offsets "
                             f"0, len_0, len_0 + len_1, ...), got shape {tuple(s)}")
    if int(cu_q_shape[0]) != int(cu_k_shape[0]):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of "
                         f"sequences, got shapes {tuple(cu_q_shape)} and {tuple(cu_k_shape)}")
    for name, x in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(x, bool) or not _is_int(x):
            raise TypeError(f"{name} must be an int, got {type(x).__name__}")
        if x < 0:
            raise ValueError(f"{name} must be >= 0, got {x}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float, got {type(scale).__name__}")
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite positive number, got {scale}")
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
    arrays = (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
              ("cu_seqlens_k", cu_seqlens_k))
    for name, t in arrays:
        if not (hasattr(t, "shape") and hasattr(t, "dtype")):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(t).__name__}")
    for name, t in arrays[:3]:
        if not _dtype_str(t).startswith(("float", "bfloat")):
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}")
    if not (_dtype_str(q) == _dtype_str(k) == _dtype_str(v)):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    for name, t in arrays[3:]:
        if _dtype_str(t) != "int32":
            raise TypeError(f"{name} must be int32 (as FlashAttention's varlen interface "
                            f"takes it), got {t.dtype}; convert with .to(torch.int32)")
    devices = {name: str(getattr(t, "device", "cpu")) for name, t in arrays}
    if len(set(devices.values())) > 1:
        raise ValueError(f"q, k, v, cu_seqlens_q, cu_seqlens_k must be on one device, got "
                         f"{devices}")
    dims = check_varlen_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape),
                               tuple(cu_seqlens_q.shape), tuple(cu_seqlens_k.shape),
                               max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                               scale=scale)
    if check_values:
        if _device_type(cu_seqlens_q) != "cpu" and _capturing():
            raise ValueError("check_values=True reads cu_seqlens on the host, which CUDA-graph "
                             "capture does not allow; pass check_values=False (the kernel "
                             "clamps bad offsets and writes NaN for their sequences)")
        check_varlen_values(cu_seqlens_q, cu_seqlens_k, dims, max_seqlen_q=max_seqlen_q,
                            max_seqlen_k=max_seqlen_k)
    return dims


def is_meta(*tensors) -> bool:
    """All of ``tensors`` on PyTorch's ``meta`` device (shapes, no data)."""
    return all(_device_type(t) == "meta" for t in tensors)


def check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, *, max_seqlen_q, max_seqlen_k,
                         causal=False, scale=None, check_values=True,
                         interpret: bool = False) -> VarlenDims:
    """The varlen kernel's contract: ``check_varlen`` plus torch CUDA tensors (CPU ones with
    ``interpret``), q, k, v float16 or bfloat16.

    Meta tensors (all five on ``meta``, as a model built there passes them) are checked for
    everything but their values, which they do not have: ``check_values`` is ignored for them,
    as the dense operator's fake implementation checks shapes only."""
    import torch
    for name, t in (("q", q), ("k", k), ("v", v), ("cu_seqlens_q", cu_seqlens_q),
                    ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    meta = is_meta(q, k, v, cu_seqlens_q, cu_seqlens_k)
    check_values = check_flag("check_values", check_values)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if _dtype_str(t) not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; the varlen kernel takes float16 or "
                            "bfloat16 (for float32 use flashattn.reference.varlen_attention)")
    dims = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
                        check_values=check_values and not meta)
    if not meta and not _on_kernel_device(q, interpret):
        raise ValueError(f"the varlen kernel runs on a CUDA GPU; the tensors are on {q.device}. "
                         "On a CPU use flashattn.reference.varlen_attention, " + INTERPRET_HINT)
    return dims
