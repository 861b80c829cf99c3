"""FP8 attention (chapter 14): quantisation, the FP8 forward and decoding over an FP8 KV cache.

    import flashattn
    from flashattn.fp8 import quantize_fp8
    q8, qd = quantize_fp8(q, num_kv_heads=k.shape[1])       # descales per (batch, kv head)
    k8, kd = quantize_fp8(k)
    v8, vd = quantize_fp8(v)
    o = flashattn.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    # V quantised straight into (B, Hkv, D, N), the layout Hopper's FP8 P V reads: the forward
    # then skips its transpose pass (a pass of its own over V: chapter 14)
    v8t, vd = quantize_fp8(v, transpose_v=True)
    o = flashattn.fp8.attention_fp8(q8, k8, v8t, causal=True, q_descale=qd, k_descale=kd,
                                    v_descale=vd, v_transposed=True)

    k_cache8, kd = quantize_fp8(k_cache); v_cache8, vd = quantize_fp8(v_cache)
    o = flashattn.decode(q, k_cache8, v_cache8, cache_seqlens, k_descale=kd, v_descale=vd)
    # fp8 KV caches (V transposed or not): flashattn.decoding.fp8_kv_cache, append_kv_fp8

Descales follow FlashAttention-3's interface: ``x ~= x_fp8.float() * descale[b, kv_head]``,
shape (B, Hkv) float32 (a Python float or a 0-d tensor is broadcast). The forward returns bf16
(``out_dtype=torch.float16`` for fp16). Both e4m3 (``torch.float8_e4m3fn``: 3 mantissa bits,
range 448) and e5m2 (``torch.float8_e5m2``: 2 mantissa bits, range 57344) run: cuTile's
``mma`` takes either (two operands of one dtype, fp32 accumulation) and Hopper's and
Blackwell's FP8 tensor cores have both. Q, K and V share one fp8 dtype (P is cast to it).

``incoherent(q, k, seed=...)`` is FlashAttention-3's incoherent processing: Q and K multiplied
by one random orthogonal matrix (a Hadamard matrix with random signs, over the head dim), which
leaves Q K^T unchanged and spreads an outlier feature over every coordinate before quantising.
"""
from __future__ import annotations

import math

from .contract import check_kernel_device, check_rank, check_scale, check_shapes
from .dispatch import (device_arch, expect, interpreting, launch_kernel, on_device,
                       attention_steps)
from .kernels import hinted
from .kernels.fp8_spec import FMHA_FP8, FP8_DTYPES, fp8_config, fp8_constants, fp8_grid

__all__ = ["quantize_fp8", "dequantize_fp8", "attention_fp8", "incoherent",
           "hadamard_rotation", "reference_fp8", "is_fp8", "FP8_MAX", "FP8_ARCHS",
           "V_TRANSPOSE_MODES"]

FP8_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0}
# FP8 tensor cores: Ada (sm_89), Hopper (sm_90), Blackwell (sm_100, sm_103, sm_120, ...).
FP8_ARCHS_MIN = (8, 9)
FP8_ARCHS = ("sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121")
V_TRANSPOSE_MODES = ("host", "kernel")


def _name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def is_fp8(t) -> bool:
    """A torch tensor of float8_e4m3fn or float8_e5m2."""
    return _name(getattr(t, "dtype", "")) in FP8_DTYPES


# --- quantisation ------------------------------------------------------------------------------
def quantize_fp8(x, *, num_kv_heads: int | None = None, dtype=None, margin: float = 1.0,
                 transpose_v: bool = False, v_transposed: bool = False):
    """Quantise ``x`` (B, H, N, D) to fp8 with one scale per (batch, kv head).

    Args:
        x: (B, H, N, D) floating-point tensor (fp16, bf16, fp32).
        num_kv_heads: group the H heads into this many groups of ``H // num_kv_heads``
            consecutive heads sharing a scale (the query heads of one GQA group share the
            kernel's q descale); default H (K and V).
        dtype: ``torch.float8_e4m3fn`` (default) or ``torch.float8_e5m2``.
        margin: the largest |x| of a group maps to ``FP8_MAX / margin`` (>= 1).
        transpose_v, v_transposed: one switch under two names (the latter is
            ``attention(v_transposed=)``'s). For V: return x_fp8 transposed, (B, H, D, N), the
            layout the FP8 forward's P V product reads (``attention_fp8(..., v_transposed=True)``), written
            by this quantising pass itself: a caller who quantises V anyway gets V^T without
            the forward's separate transpose pass (chapter 14 measures it). The result is a view of the first N columns of a (B, H, D, N16)
            buffer, N16 = N rounded up to 16 (16-byte row pitches for the TMA).

    Returns:
        (x_fp8, descale): x_fp8 of ``dtype``, x's shape ((B, H, D, N) with ``transpose_v``);
        descale (B, num_kv_heads) float32 with ``x ~= x_fp8.float() * descale[b, h // G]``
        (with ``transpose_v``: ``x ~= x_fp8.transpose(-1, -2).float() * descale``). A group
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
    if _name(dtype) not in FP8_DTYPES:
        raise ValueError(f"dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}")
    if not isinstance(transpose_v, bool) or not isinstance(v_transposed, bool):
        raise TypeError("transpose_v and v_transposed must be bools")
    transpose_v = transpose_v or v_transposed       # v_transposed: attention()'s keyword
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
    if not transpose_v:
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


def reference_fp8(q8, k8, v8, q_descale, k_descale, v_descale, *, causal=False, scale=None,
                  input_pos=0, v_transposed=False):
    """fp32 attention of the dequantised inputs: what the FP8 kernel computes, exactly."""
    from .reference import attention
    Hkv = k8.shape[1]
    if v_transposed:
        v8 = v8.transpose(-1, -2)
    q = _dequant(q8, q_descale, Hkv)
    k = _dequant(k8, k_descale, Hkv)
    v = _dequant(v8, v_descale, Hkv)
    return attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos)


def _dequant(x8, descale, Hkv):
    import torch
    d = _descale_tensor(descale, "descale", x8.shape[0], Hkv, x8.device)
    G = x8.shape[1] // Hkv
    return x8.float() * d.repeat_interleave(G, dim=1).to(torch.float32)[:, :, None, None]


# --- argument checks ---------------------------------------------------------------------------
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


def _check_grad(*ts):
    import torch
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in ts):
        raise ValueError("the FP8 forward has no backward (FP8 training is out of scope): "
                         "call it under torch.no_grad() or on detached tensors, or train with "
                         "fp16/bf16 inputs")


def _check_device(t, interp, what):
    check_kernel_device(t, interp, f"{what} run", "flashattn.fp8.reference_fp8")


def _check_arch(device, interp):
    """FP8 tensor cores: sm_89 and newer (the interpreter stands in for sm_90 by default)."""
    if interp or device.type != "cuda":
        return
    import torch
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < FP8_ARCHS_MIN:
        raise ValueError(f"FP8 attention needs FP8 tensor cores (sm_89 or newer: Ada, Hopper, "
                         f"Blackwell); this GPU is sm_{cap[0]}{cap[1]}")


# --- the FP8 forward ---------------------------------------------------------------------------
def attention_fp8(q, k, v, *, q_descale=None, k_descale=None, v_descale=None,
                  causal: bool = False, scale: float | None = None, input_pos: int = 0,
                  out_dtype=None, v_transposed: bool = False, v_transpose: str = "host",
                  fast_acc: bool | None = None, config=None):
    """Attention of fp8 Q, K, V with per-(batch, kv head) descales (``flashattn.attention``
    routes fp8 inputs here).

    Args:
        q: (B, Hq, Nq, D) float8_e4m3fn or float8_e5m2; k: (B, Hkv, Nk, D) of the same dtype;
            v: (B, Hkv, Nk, D), or (B, Hkv, D, Nk) with ``v_transposed=True``. D a multiple of
            16 (fp8 rows of 16-byte multiples for the TMA), at most 256.
        q_descale, k_descale, v_descale: (B, Hkv) float32 (or floats): the dequantised input
            is ``x8.float() * descale[b, kv_head]``; q's are per (batch, kv head) as in
            FlashAttention-3 (every query head of a GQA group shares one).
        causal, scale, input_pos: as ``flashattn.attention``.
        out_dtype: torch.bfloat16 (default) or torch.float16.
        v_transposed: v is already (B, Hkv, D, Nk) (the layout Hopper's FP8 MMA reads); its
            last dimension contiguous, its row pitch best a multiple of 16 bytes (TMA).
            ``quantize_fp8(v, transpose_v=True)`` quantises V straight into that layout (no
            transpose pass in this call).
        v_transpose: for a (B, Hkv, Nk, D) v: "host" (one transpose pass, then the kernel
            reads V K-major) or "kernel" (the kernel reads (Nk, D) tiles; the compiler
            transposes them on chip).
        fast_acc: ``ct.mma(use_fast_acc=)`` (default ``kernels.fp8_spec.FP8_FAST_ACC``).
        config: a ``flashattn.config.Config`` or its label ("128x64 occ=1 nww=8") to run instead of the
            arch's ``kernels.fp8_spec.FP8_CONFIGS`` entry (``FP8_ALT_CONFIGS`` lists the
            spill-free alternatives the benchmark times); default None: the table's.

    Returns:
        (B, Hq, Nq, D) tensor of ``out_dtype``. Not differentiable (an input requiring grad
        raises ValueError).
    """
    import torch
    from .kernels.fp8_spec import FP8_FAST_ACC
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    names = [_name(t.dtype) for t in (q, k, v)]
    if not all(n in FP8_DTYPES for n in names) or len(set(names)) != 1:
        raise TypeError(f"the FP8 forward takes q, k, v of one fp8 dtype (float8_e4m3fn or "
                        f"float8_e5m2; the MMA's operands share a dtype), got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}; quantise with "
                        "flashattn.fp8.quantize_fp8")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if v_transpose not in V_TRANSPOSE_MODES:
        raise ValueError(f"v_transpose must be one of {V_TRANSPOSE_MODES}, got {v_transpose!r}")
    if fast_acc is None:
        fast_acc = FP8_FAST_ACC
    if not isinstance(fast_acc, bool):
        raise TypeError(f"fast_acc must be a bool, got {type(fast_acc).__name__}")
    if config is not None:
        from .config import Config
        if isinstance(config, str):
            config = Config.parse(config)
        if not isinstance(config, Config):
            raise TypeError(f"config must be a flashattn.config.Config or its label such as "
                            f"'128x64 occ=1 nww=8', got {type(config).__name__}")
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rank(name, t.shape, 4)
    v_shape = tuple(v.shape)
    if v_transposed:
        v_shape = v_shape[:2] + (v_shape[3], v_shape[2])
    check_shapes(tuple(q.shape), tuple(k.shape), v_shape, causal=causal, scale=scale,
                 input_pos=input_pos)
    check_scale(scale)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if D % 16:
        raise ValueError(f"the FP8 forward needs a head dim that is a multiple of 16 (rows of "
                         f"16-byte multiples for the tensor-memory loads), got D = {D}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    interp = interpreting(q.device)
    _check_device(q, interp, "the FP8 kernels")
    _check_arch(q.device, interp)
    _check_grad(q, k, v)
    qd, kd, vd = (_descale_tensor(d, n, B, Hkv, q.device) for d, n in
                  ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale")))
    out = torch.empty((B, Hq, Nq, D), dtype=out_dtype, device=q.device)
    if out.numel() == 0:
        return out
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    q, k = (t if t.is_contiguous() else t.contiguous() for t in (q, k))
    if v_transposed:
        v_t = True
        v = v if v.stride(-1) == 1 else v.contiguous()
    elif v_transpose == "host":
        # (B, Hkv, D, Nk): K-major for the FP8 MMA. Rows padded to 16 bytes (the tensor-memory
        # loads need 16-byte row pitches): a view of the first Nk columns.
        pitch = -(-Nk // 16) * 16
        vt = torch.empty((B, Hkv, D, pitch), dtype=v.dtype, device=v.device)[..., :Nk]
        vt.copy_(v.transpose(-1, -2))
        v, v_t = vt, True
    else:
        v_t = False
        v = v if v.is_contiguous() else v.contiguous()
    arch = device_arch(q.device)
    config = fp8_config(arch, D) if config is None else config
    constants = fp8_constants(config, head_dim=D, causal=causal,
                              even_k=Nk % config.TILE_N == 0, v_transposed=v_t,
                              fast_acc=fast_acc)
    grid = fp8_grid(config, B=B, Hq=Hq, Nq=Nq)
    kernel = hinted(FMHA_FP8.kernel(), config.hints())
    args = FMHA_FP8.args(dict(Q=q, K=k, V=v, Out=out, QDescale=qd, KDescale=kd, VDescale=vd),
                         dict(qk_scale=float(scale), input_pos=int(input_pos), num_heads=Hq,
                              group_size=Hq // Hkv), constants)
    steps = lambda: B * Hq * attention_steps(Nq, Nk, config.TILE_M, config.TILE_N,  # noqa: E731
                                             causal=causal, offset=input_pos)
    with on_device(q.device), expect(q.device, steps, "flashattn.fp8.attention_fp8"):
        launch_kernel(q.device, grid, kernel, args)
    return out


# --- the compiler's report (ahead of time, no GPU) ---------------------------------------------
# FP8 tensor-core instructions in SASS: QGMMA (Hopper's warpgroup MMA on fp8 operands, the FP8
# form of HGMMA: "QGMMA.64x128x32.F32.E4M3.E4M3"), UTCQMMA (Blackwell's tensor-memory MMA on
# fp8), QMMA (the warp-level mma.sync on fp8, sm_89/sm_120). F2FP...E4M3: the casts of P.
FP8_SASS = {"QGMMA": r"\bQGMMA\b", "UTCQMMA": r"\bUTC\w*QMMA\b", "QMMA": r"\bQMMA\b",
            "HGMMA": r"\bHGMMA\b", "UTCHMMA": r"\bUTC\w*HMMA\b", "HMMA": r"\bHMMA\b",
            "F2FP.E4M3": r"\bF2FP\.\w*\.?E4M3", "F2FP.E5M2": r"\bF2FP\.\w*\.?E5M2",
            "PRMT": r"\bPRMT\b", "STSM": r"\bSTSM\b", "LDSM": r"\bLDSM\b",
            "MUFU.EX2": r"\bMUFU\.EX2\b", "LDL": r"\bLDL\b", "STL": r"\bSTL\b",
            "UTMALDG": r"\bUTMALDG\b", "LDS.U8": r"\bLDS\.U8\b", "LDS.U16": r"\bLDS\.U16\b",
            "LDS.128": r"\bLDS\.128\b", "STS.128": r"\bSTS\.128\b"}


def compile_cases(*, archs=("sm_90", "sm_100", "sm_120"), head_dims=(64, 128, 256),
                  quick: bool = False) -> list[dict]:
    """The FP8 kernels' variants the compile report covers: the forward for every arch, head
    dim, causal or not, V transposed (K-major, ``V_T``) or not; e5m2 and the accumulation
    without fast_acc on sm_90 at D=128; the fp8-cache decode split kernel (contiguous and
    paged, one split FINAL or not) at D=128, paged at the other head dims; the FP8-MMA decode
    (V transposed) contiguous and paged at every head dim, FINAL too at D=128. ``quick``: D=128
    only."""
    from .kernels.decode_spec import decode_kernel_constants
    cases = []
    dims = (128,) if quick else head_dims
    for arch in archs:
        for d in dims:
            cfg = fp8_config(arch, d)
            for causal in (True, False):
                for vt in (True, False):
                    if d != 128 and not vt:
                        continue
                    cases.append(dict(kernel="fmha_fp8", arch=arch, D=d, causal=causal,
                                      v_t=vt, fp8="float8_e4m3fn", fast_acc=True,
                                      config=cfg))
        if arch == "sm_90":
            cfg = fp8_config(arch, 128)
            cases.append(dict(kernel="fmha_fp8", arch=arch, D=128, causal=True, v_t=True,
                              fp8="float8_e5m2", fast_acc=True, config=cfg))
            cases.append(dict(kernel="fmha_fp8", arch=arch, D=128, causal=True, v_t=True,
                              fp8="float8_e4m3fn", fast_acc=False, config=cfg))
        for d in dims:
            for page in (None, 64):
                for final in (False, True):
                    if d != 128 and (final or page is None):
                        continue
                    c = decode_kernel_constants(rows=4, head_dim=d, page_size=page, arch=arch,
                                                final=final, cache="float8_e4m3fn")
                    cases.append(dict(kernel="decode_split_fp8", arch=arch, D=d, page=page,
                                      final=final, rows=4, fp8="float8_e4m3fn",
                                      constants=c))
        # The FP8-MMA decode (V transposed): every head dim contiguous and paged, FINAL or
        # not at D=128.
        for d in dims:
            for page in (None, 64):
                for final in (False, True):
                    if d != 128 and final:
                        continue
                    c = decode_kernel_constants(rows=4, head_dim=d, page_size=page, arch=arch,
                                                final=final, cache="float8_e4m3fn",
                                                v_transposed=True)
                    cases.append(dict(kernel="decode_fp8mma", arch=arch, D=d, page=page,
                                      final=final, rows=4, fp8="float8_e4m3fn",
                                      constants=c))
    return cases


def compile_report(cases=None, **kw) -> list[dict]:
    """Compile each case (``compile_cases``) with ``aot.compile_spec`` (tileiras, no GPU) and
    read its cubin: registers, stack (spill) bytes, shared memory, SASS counts (``FP8_SASS``).
    One dict per case: the case's fields plus ``label``, ``registers``, ``stack_bytes``,
    ``shared_bytes``, ``sass_lines``, ``sass`` and ``error``."""
    import re
    from .aot import compile_spec
    from .kernels.decode_spec import decode_hints, decode_split_spec
    from .kernels.fp8_spec import with_fp8
    out = []
    for case in (compile_cases(**kw) if cases is None else cases):
        arch = case["arch"]
        if case["kernel"] == "fmha_fp8":
            cfg = case["config"]
            spec = with_fp8(FMHA_FP8, case["fp8"])
            consts = fp8_constants(cfg, head_dim=case["D"], causal=case["causal"],
                                   even_k=True, v_transposed=case["v_t"],
                                   fast_acc=case["fast_acc"])
            hints = cfg.hints()
            label = (f"fwd {case['fp8'].split('_')[1]} D={case['D']} "
                     f"{'causal' if case['causal'] else 'full'} "
                     f"{'V^T' if case['v_t'] else 'V'} {cfg.label()}"
                     + ("" if case["fast_acc"] else " exact-acc"))
        else:
            spec = decode_split_spec(case["fp8"])
            consts = case["constants"]
            hints = decode_hints(consts, arch)
            kind = "decode-mma" if case["kernel"] == "decode_fp8mma" else "decode"
            label = (f"{kind} {case['fp8'].split('_')[1]} D={case['D']} "
                     f"{'page=' + str(case['page']) if case['page'] else 'contiguous'}"
                     f"{' final' if case['final'] else ''} "
                     f"{consts['TILE_M']}x{consts['TILE_N']}")
        r = compile_spec(spec, arch, consts, hints=hints, dtype="bfloat16", align=16,
                         label=label, step=spec.name, keep_sass=True)
        text = getattr(r, "sass_text", "")
        instr = [ln for ln in text.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
        sass = {k: sum(1 for ln in instr if re.search(p, ln)) for k, p in FP8_SASS.items()}
        mma_forms = sorted({m for ln in instr
                            for m in re.findall(r"\b(?:QGMMA|UTC\w*QMMA|QMMA|HGMMA|UTC\w*HMMA|"
                                                r"HMMA)[\w.]*", ln)})
        row = {k: v for k, v in case.items() if k not in ("config", "constants")}
        row.update(label=label, registers=r.registers, stack_bytes=r.stack_bytes,
                   shared_bytes=r.shared_bytes, sass_lines=r.sass_lines, sass=sass,
                   mma_forms=mma_forms, error=r.error, compile_s=round(r.compile_s, 1))
        out.append(row)
    return out


def format_compile_report(rows) -> str:
    """A plain-text table of ``compile_report``'s rows."""
    head = (f"{'arch':7}{'kernel':50}{'regs':>5}{'stack':>6}{'smem':>8}{'sass':>6}"
            f"{'QGMMA':>6}{'UTCQ':>5}{'QMMA':>5}{'HGMMA':>6}{'HMMA':>5}{'F2FP8':>6}{'PRMT':>5}"
            f"{'STSM':>5}{'EX2':>5}{'LDS8':>5}{'LDS16':>6}{'LDS128':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["error"]:
            lines.append(f"{r['arch']:7}{r['label']:50} ERROR {r['error'][:80]}")
            continue
        s = r["sass"]
        lines.append(f"{r['arch']:7}{r['label']:50}{r['registers']:>5}{r['stack_bytes']:>6}"
                     f"{r['shared_bytes']:>8}{r['sass_lines']:>6}{s['QGMMA']:>6}"
                     f"{s['UTCQMMA']:>5}{s['QMMA']:>5}{s['HGMMA']:>6}{s['HMMA']:>5}"
                     f"{s['F2FP.E4M3'] + s['F2FP.E5M2']:>6}{s['PRMT']:>5}{s['STSM']:>5}"
                     f"{s['MUFU.EX2']:>5}{s['LDS.U8']:>5}{s['LDS.U16']:>6}{s['LDS.128']:>7}")
    return "\n".join(lines)
