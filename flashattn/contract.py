"""The input contract of every attention entry point, in one place.

A leaf module: it imports nothing from the package, so the kernels' launch code, the CPU
references, the benchmarks and the command line all check inputs with the same rules.

    check_shapes(q.shape, k.shape, v.shape, causal=..., scale=..., input_pos=...)
    check_tensors(q, k, v, causal=..., scale=..., input_pos=...)   # + dtype and device
"""
from __future__ import annotations

import math

DTYPES = ("float16", "bfloat16")            # what the kernels take
DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}
MAX_HEAD_DIM = 256


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
    if Dk != D:
        raise ValueError(f"head dim differs: q has {D}, k and v have {Dk}")
    if D < 1 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {D}")
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


def check_causal(causal) -> bool:
    """``causal`` as a bool; TypeError for anything but a bool or an int (a tensor, a string)."""
    if type(causal).__module__.startswith("torch") or not isinstance(causal, (bool, int)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return bool(causal)


def check_tensors(q, k, v, *, causal: bool, scale, input_pos) -> None:
    """The GPU kernels' contract: ``check_shapes`` plus torch CUDA tensors of one float16 or
    bfloat16 dtype on one device, and a positive scale. Raises TypeError/ValueError naming the
    problem."""
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type != "cuda":
        raise ValueError(f"flashattn kernels run on a CUDA GPU; the tensors are on {q.device}. "
                         "On a CPU use flashattn.reference.attention(q, k, v, causal=...)")
