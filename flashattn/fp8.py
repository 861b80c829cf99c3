"""The package's FP8 names in one place: quantisation (``fp8_quant``), the FP8 forward
(``fp8_attention``) and the FP8 KV cache (``decoding``).

    import flashattn
    q8, qd = flashattn.quantize_fp8(q, num_kv_heads=k.shape[1])   # descales per (batch, kv head)
    k8, kd = flashattn.quantize_fp8(k)
    v8t, vd = flashattn.quantize_fp8(v, v_transposed=True)         # V as (B, Hkv, D, N)
    o = flashattn.attention(q8, k8, v8t, causal=True, q_descale=qd, k_descale=kd, v_descale=vd,
                            v_transposed=True)
    # an fp8 KV cache with V stored transposed: both decode products on FP8 tensor cores
    k8, v8t, kd, vd = flashattn.fp8.fp8_kv_cache(k, v, capacity=4096, margin=2.0)
    o = flashattn.decode(q, k8, v8t, lens, k_descale=kd, v_descale=vd, v_transposed=True)
"""
from __future__ import annotations

from .decoding import append_kv_fp8, fp8_kv_cache
from .fp8_attention import attention_fp8, reference_fp8
from .fp8_quant import (FP8_ARCHS, FP8_MAX, dequantize_fp8, hadamard_rotation, incoherent,
                        is_fp8, quantize_fp8)

__all__ = ["quantize_fp8", "dequantize_fp8", "attention_fp8", "reference_fp8", "incoherent",
           "hadamard_rotation", "is_fp8", "FP8_MAX", "FP8_ARCHS", "fp8_kv_cache",
           "append_kv_fp8"]
