"""FP8 tensors: quantisation with one descale per (batch, kv head), incoherent processing, and
the descale checks every FP8 entry point shares.

    from flashattn.fp8_quant import quantize_fp8
    q8, qd = quantize_fp8(q, num_kv_heads=k.shape[1])       # descales per (batch, kv head)
    v8t, vd = quantize_fp8(v, v_transposed=True)            # V^T, the layout FP8 P V reads

Descales follow FlashAttention-3's interface: ``x ~= x_fp8.float() * descale[b, kv_head]``,
shape (B, Hkv) float32 (a Python float or a 0-d tensor is broadcast). e4m3
(``torch.float8_e4m3fn``: 3 mantissa bits, range 448) and e5m2 (``torch.float8_e5m2``: 2
mantissa bits, range 57344) both run.

``incoherent(q, k, seed=...)`` is FlashAttention-3's incoherent processing: Q and K multiplied
by one random orthogonal matrix (a Hadamard matrix with random signs, over the head dim), which
leaves Q K^T unchanged and spreads an outlier feature over every coordinate before quantising.
"""
from __future__ import annotations

import math


__all__ = ["quantize_fp8", "dequantize_fp8", "incoherent", "hadamard_rotation", "is_fp8",
           "FP8_MAX", "FP8_ARCHS"]

# The largest finite value of each fp8 dtype the quantiser writes (its keys: the dtypes).
FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
# FP8 tensor cores: Ada (sm_89), Hopper (sm_90), Blackwell (sm_100, sm_103, sm_120, ...).
FP8_ARCHS = ("sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121")


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def is_fp8(t) -> bool:
    """A torch tensor of float8_e4m3fn or float8_e5m2."""
    return _name(getattr(t, "dtype", "")) in FP8_MAX


def quantize_fp8(x, *, num_kv_heads: int | None = None, dtype=None, margin: float = 1.0,
                 v_transposed: bool = False):
    """Quantise ``x`` (B, H, N, D) to fp8 with one scale per (batch, kv head).

    Args:
        x: (B, H, N, D) floating-point tensor (fp16, bf16, fp32).
        num_kv_heads: group the H heads into this many groups of ``H // num_kv_heads``
            consecutive heads sharing a scale (the query heads of one GQA group share the
            kernel's q descale); default H (K and V).
        dtype: ``torch.float8_e4m3fn`` (default) or ``torch.float8_e5m2``.
        margin: the largest |x| of a group maps to ``FP8_MAX / margin`` (>= 1).
        v_transposed: for V: x_fp8 as (B, H, D, N), the layout the FP8 forward's P V reads,
            written by this pass (the forward then needs no transpose of its own); a view of
            a buffer whose rows are padded to 16 bytes for the TMA.

    Returns:
        (x_fp8, descale): x_fp8 of ``dtype``, x's shape ((B, H, D, N) with ``v_transposed``);
        descale (B, num_kv_heads) float32 with ``x ~= x_fp8.float() * descale[b, h // G]``
        (with ``v_transposed``: ``x ~= x_fp8.transpose(-1, -2).float() * descale``). A group
        of zeros gets descale 1.
    """
    import torch
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"x must have 4 dimensions (B, H, N, D), got shape {tuple(x.shape)}")
    if not x.is_floating_point() or is_fp8(x):
        raise TypeError(f"x must be fp16, bf16 or fp32 to quantise, got {x.dtype}")
    dtype = torch.float8_e4m3fn if dtype is None else dtype
    if _name(dtype) not in FP8_MAX:
        raise ValueError(f"dtype must be {' or '.join('torch.' + n for n in FP8_MAX)}, "
                         f"got {dtype}")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin >= 1):
        raise ValueError(f"margin must be a finite number >= 1, got {margin!r}")
    B, H, N, D = x.shape
    hkv = H if num_kv_heads is None else int(num_kv_heads)
    if hkv < 1 or H % hkv:
        raise ValueError(f"num_kv_heads = {num_kv_heads} must divide the {H} heads of x")
    xf = x.float()
    if not torch.isfinite(xf).all():
        raise ValueError("x holds NaN or infinity: fp8 scales need finite values")
    amax = xf.abs().reshape(B, hkv, -1).amax(dim=-1)                # (B, hkv)
    fmax = FP8_MAX[_name(dtype)] / margin
    descale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax)).float()
    per_head = descale.repeat_interleave(H // hkv, dim=1)[:, :, None, None]  # (B, H, 1, 1)
    scaled = (xf / per_head).clamp(-FP8_MAX[_name(dtype)], FP8_MAX[_name(dtype)])
    if not v_transposed:
        return scaled.to(dtype), descale
    # The transpose fused into the cast: one strided copy writes fp8 V^T into rows padded to
    # 16 bytes (as attention_fp8's own transpose pass does), no fp8 (N, D) copy in between.
    pitch = -(-N // 16) * 16
    x8 = torch.empty((B, H, D, pitch), dtype=dtype, device=x.device)[..., :N]
    x8.copy_(scaled.transpose(-1, -2))
    return x8, descale


def dequantize_fp8(x8, descale):
    """``x8.float() * descale`` per (batch, group of heads): the fp32 values an fp8 kernel
    computes with. descale (B, Hkv) with H % Hkv == 0 (or a float / 0-d tensor)."""
    import torch
    d = _descale_tensor(descale, "descale", x8.shape[0], None, x8.device, allow_any_heads=True)
    B, H = x8.shape[:2]
    if d.shape[1] != 1 and H % d.shape[1]:
        raise ValueError(f"descale has {d.shape[1]} heads, which do not divide x's {H}")
    d = d.repeat_interleave(H // d.shape[1], dim=1) if d.shape[1] != H else d
    return x8.float() * d.to(torch.float32)[:, :, None, None]


def hadamard_rotation(D: int, *, seed: int = 0, dtype=None, device=None):
    """A (D, D) random orthogonal matrix: Sylvester's Hadamard matrix with random column signs,
    over sqrt(D) (D a power of two). ``x @ R`` spreads each coordinate of x over all D."""
    import torch
    if D < 1 or D & (D - 1):
        raise ValueError(f"incoherent processing needs a power-of-two head dim, got {D}")
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < D:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    g = torch.Generator().manual_seed(int(seed))
    signs = torch.randint(0, 2, (D,), generator=g).double() * 2 - 1
    r = (h * signs[None, :]) / math.sqrt(D)
    return r.to(dtype=dtype or torch.float32, device=device)


def incoherent(q, k, *, seed: int = 0):
    """(q @ R, k @ R) for one random orthogonal R (``hadamard_rotation``): Q K^T is unchanged
    (R R^T = I), and outlier features are spread before quantising. V is left alone."""
    r = hadamard_rotation(q.shape[-1], seed=seed, device=q.device)
    return ((q.float() @ r).to(q.dtype), (k.float() @ r).to(k.dtype))


def _dequant(x8, descale, Hkv):
    import torch
    d = _descale_tensor(descale, "descale", x8.shape[0], Hkv, x8.device)
    G = x8.shape[1] // Hkv
    return x8.float() * d.repeat_interleave(G, dim=1).to(torch.float32)[:, :, None, None]


def _descale_tensor(d, name, B, Hkv, device, *, allow_any_heads=False):
    """A descale as a (B, Hkv) float32 tensor on ``device``: a (B, Hkv) tensor as given, a
    Python float or 0-d tensor broadcast. TypeError/ValueError naming ``name`` otherwise."""
    import torch
    if d is None:
        raise ValueError(f"{name} is missing: fp8 inputs need q_descale, k_descale and "
                         "v_descale (flashattn.fp8.quantize_fp8 returns them)")
    if isinstance(d, bool) or not isinstance(d, (int, float, torch.Tensor)):
        raise TypeError(f"{name} must be a float32 tensor of shape (B, Hkv) or a float, got "
                        f"{type(d).__name__}")
    if not isinstance(d, torch.Tensor):
        if not (math.isfinite(d) and d > 0):
            raise ValueError(f"{name} must be a finite positive number, got {d}")
        h = 1 if Hkv is None else Hkv
        return torch.full((B, h), float(d), dtype=torch.float32, device=device)
    if d.dtype != torch.float32:
        raise TypeError(f"{name} must be float32 (as FlashAttention-3's descales), got {d.dtype}")
    if d.device != device:
        raise ValueError(f"{name} is on {d.device}, the inputs on {device}")
    if d.ndim == 0:
        h = 1 if Hkv is None else Hkv
        return d.reshape(1, 1).expand(B, h).contiguous()
    if d.ndim != 2 or d.shape[0] != B or (not allow_any_heads and d.shape[1] != Hkv):
        want = f"(B, Hkv) = ({B}, {Hkv})" if Hkv is not None else f"({B}, heads)"
        raise ValueError(f"{name} must have shape {want}: one descale per (batch, kv head), "
                         f"got {tuple(d.shape)}")
    if d.device.type == "cpu" and not (torch.isfinite(d).all() and (d > 0).all()):
        raise ValueError(f"{name} must hold finite positive numbers")
    return d.contiguous()
