"""The FP8 forward's host code: checks, the V^T layout, the launch of ``fmha_fp8_kernel``
(``kernels/fp8_fwd.py``), and its fp32 reference.

    from flashattn.fp8_quant import quantize_fp8
    q8, qd = quantize_fp8(q, num_kv_heads=k.shape[1])
    k8, kd = quantize_fp8(k)
    v8t, vd = quantize_fp8(v, v_transposed=True)
    o = attention_fp8(q8, k8, v8t, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                      v_transposed=True)

``flashattn.attention`` routes fp8 inputs here. The output is bf16 (``out_dtype=torch.float16``
for fp16). Q, K and V share one fp8 dtype (P is cast to it).
"""
from __future__ import annotations

import math

from .contract import check_kernel_device, check_rank, check_scale, check_shapes
from .dispatch import (attention_steps, device_arch, expect, interpreting, launch_kernel,
                       on_device)
from .fp8_quant import _dequant, _descale_tensor, _name
from .kernels import hinted
from .kernels.fp8_fwd_spec import FMHA_FP8, FP8_DTYPES, FP8_FAST_ACC, fp8_plan

__all__ = ["attention_fp8", "reference_fp8", "check_fp8_inputs", "launch_fp8"]

FP8_ARCHS_MIN = (8, 9)      # FP8 tensor cores: Ada and newer


def attention_fp8(q, k, v, *, q_descale=None, k_descale=None, v_descale=None,
                  causal: bool = False, scale: float | None = None, input_pos: int = 0,
                  out_dtype=None, v_transposed: bool = False, fast_acc: bool | None = None,
                  config=None):
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
            ``quantize_fp8(v, v_transposed=True)`` quantises V straight into that layout (no
            transpose pass in this call); a (B, Hkv, Nk, D) v is transposed in one pass here.
        fast_acc: ``ct.mma(use_fast_acc=)`` (default ``kernels.fp8_fwd_spec.FP8_FAST_ACC``).
        config: a ``flashattn.config.Config`` or its label ("128x64 occ=1 nww=8") to run
            instead of the arch's ``kernels.fp8_fwd_spec.FP8_CONFIGS`` entry.

    Returns:
        (B, Hq, Nq, D) tensor of ``out_dtype``. Not differentiable (an input requiring grad
        raises ValueError).
    """
    qd, kd, vd, out_dtype, fast_acc, config = check_fp8_inputs(
        q, k, v, q_descale, k_descale, v_descale, causal=causal, scale=scale,
        input_pos=input_pos, out_dtype=out_dtype, v_transposed=v_transposed,
        fast_acc=fast_acc, config=config)
    import torch
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    out = torch.empty((B, Hq, Nq, D), dtype=out_dtype, device=q.device)
    if out.numel() == 0:
        return out
    if v_transposed:
        v = v if v.stride(-1) == 1 else v.contiguous()
    else:
        # (B, Hkv, D, Nk): K-major for the FP8 MMA, rows padded to the TMA's 16-byte pitch.
        pitch = -(-Nk // 16) * 16
        vt = torch.empty((B, Hkv, D, pitch), dtype=v.dtype, device=v.device)[..., :Nk]
        vt.copy_(v.transpose(-1, -2))
        v = vt
    return launch_fp8(q, k, v, out, qd, kd, vd, causal=causal, scale=scale,
                      input_pos=input_pos, fast_acc=fast_acc, config=config, v_t=True)


def check_fp8_inputs(q, k, v, q_descale, k_descale, v_descale, *, causal, scale, input_pos,
                     out_dtype, v_transposed, fast_acc, config):
    """``attention_fp8``'s argument checks (TypeError/ValueError naming the problem); returns
    the descales as (B, Hkv) float32 tensors, the output dtype, fast_acc and the Config (None:
    the arch's)."""
    import torch
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    interp = interpreting(q.device)
    names = [_name(t.dtype) for t in (q, k, v)]
    if not all(n in FP8_DTYPES for n in names) or len(set(names)) != 1:
        raise TypeError(f"the FP8 forward takes q, k, v of one fp8 dtype (float8_e4m3fn or "
                        f"float8_e5m2; the MMA's operands share a dtype), got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}; quantise with "
                        "flashattn.fp8.quantize_fp8")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
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
    check_kernel_device(q, interp, "the FP8 kernels run", "flashattn.fp8.reference_fp8")
    _check_arch(q.device, interp)
    _check_grad(q, k, v)
    qd, kd, vd = (_descale_tensor(d, n, B, Hkv, q.device) for d, n in
                  ((q_descale, "q_descale"), (k_descale, "k_descale"), (v_descale, "v_descale")))
    return qd, kd, vd, out_dtype, fast_acc, config


def launch_fp8(q, k, v, out, qd, kd, vd, *, causal: bool, scale, input_pos: int, fast_acc: bool,
               config, v_t: bool):
    """Launch ``fmha_fp8_kernel`` on checked tensors into ``out``: v (B, Hkv, D, Nk) with
    ``v_t``, else (B, Hkv, Nk, D) (the compiler then transposes each tile on chip)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    q, k = (t if t.is_contiguous() else t.contiguous() for t in (q, k))
    if not v_t and not v.is_contiguous():
        v = v.contiguous()
    config, constants, grid = fp8_plan(device_arch(q.device), B=B, Hq=Hq, Nq=Nq, Nk=Nk,
                                       head_dim=D, causal=causal, v_transposed=v_t,
                                       fast_acc=fast_acc, config=config)
    kernel = hinted(FMHA_FP8.kernel(), config.hints())
    args = FMHA_FP8.args(dict(Q=q, K=k, V=v, Out=out, QDescale=qd, KDescale=kd, VDescale=vd),
                         dict(qk_scale=float(scale), input_pos=int(input_pos), num_heads=Hq,
                              group_size=Hq // Hkv), constants)
    steps = lambda: B * Hq * attention_steps(Nq, Nk, config.TILE_M, config.TILE_N,  # noqa: E731
                                             causal=causal, offset=input_pos)
    with on_device(q.device), expect(q.device, steps, "flashattn.fp8.attention_fp8"):
        launch_kernel(q.device, grid, kernel, args)
    return out


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


def _check_grad(*ts):
    import torch
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in ts):
        raise ValueError("the FP8 forward has no backward (FP8 training is out of scope): "
                         "call it under torch.no_grad() or on detached tensors, or train with "
                         "fp16/bf16 inputs")


def _check_arch(device, interp):
    """FP8 tensor cores: sm_89 and newer (the interpreter stands in for sm_90 by default)."""
    if interp or device.type != "cuda":
        return
    import torch
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) < FP8_ARCHS_MIN:
        raise ValueError(f"FP8 attention needs FP8 tensor cores (sm_89 or newer: Ada, Hopper, "
                         f"Blackwell); this GPU is sm_{cap[0]}{cap[1]}")
