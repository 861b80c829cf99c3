"""The public entry points: ``attention`` and the drop-in ``sdpa``.

Validate (``contract``), choose the step's configuration and launch (``launch``). When an input
requires grad, or under ``torch.compile``, through the differentiable operator of ``autograd``
(the forward with its LSE, then the backward kernels).
"""
from __future__ import annotations

import math

from .contract import check_causal, check_tensors
from .autotune import resolve
from .dispatch import interpreting, target_of
from .launch import launch
from .registry import get_step


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              input_pos: int = 0, window_size=None, softcap=None,
              q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
              v_transposed: bool = False):
    """Scaled dot-product attention with a cuTile FlashAttention kernel.

    Args:
        q: (B, Hq, Nq, D) float16 or bfloat16 CUDA tensor (or CPU, run by the interpreter,
            with ``FLASHATTN_INTERPRET=1`` or inside ``flashattn.interpret.enabled()``).
        k, v: (B, Hkv, Nk, D), same dtype and device; Hq % Hkv == 0 (GQA/MQA: query head h
            reads key/value head h // (Hq // Hkv)). Any strides (copied if not contiguous).
            v may have its own head dim Dv (the output is then (B, Hq, Nq, Dv)).
        causal: mask future keys. Query row i sits at absolute position input_pos + i and
            sees keys 0 .. input_pos + i::

                input_pos = 0, Nq = Nk = 4         input_pos = 2, Nq = 2, Nk = 4
                    k0 k1 k2 k3                        k0 k1 k2 k3
                q0   x  .  .  .                    q0   x  x  x  .
                q1   x  x  .  .                    q1   x  x  x  x
                q2   x  x  x  .
                q3   x  x  x  x

        scale: softmax scale, default 1/sqrt(D).
        input_pos: 0 (as scaled_dot_product_attention(is_causal=True)) up to Nk - Nq
            (a prefill appended to a KV cache of Nk - Nq tokens). Causal only.
        window_size: flash-attn's (left, right): row i (position input_pos + i) sees keys
            position - left .. position + right; -1 unbounded (default (-1, -1)).
        softcap: flash-attn's logit soft-capping, softcap * tanh(score / softcap) on the scaled
            score; 0 or None: off. With either, the call runs on the flex kernels
            (``flashattn.flex.attention_masked``), never the dense or decode path.

        q_descale, k_descale, v_descale, out_dtype: FP8. With float8_e4m3fn (or
            float8_e5m2) q, k, v the call runs the FP8 forward (``fp8_attention.attention_fp8``):
            the descales, (B, Hkv) float32 as FlashAttention-3's, are required
            (``flashattn.quantize_fp8`` makes them); the output is bf16, or ``out_dtype``
            (torch.float16). Not differentiable. Descales with fp16/bf16 inputs: ValueError.
        v_transposed: fp8 only: v is (B, Hkv, D, Nk), as ``quantize_fp8(v, v_transposed=True)``
            returns it; the FP8 forward then reads it without a transpose pass (the fast path).

    The fastest kernel known for this GPU runs; a decode step (1 to ``DECODE_PATH_MAX_NQ``
    query rows over at least ``DECODE_PATH_MIN_NK`` keys) runs on the split-KV kernels of
    ``flashattn.decode``, faster there.

    Returns:
        (B, Hq, Nq, D) tensor, dtype of q. Differentiable: when q, k or v requires grad (or
        under torch.compile) the call goes through ``flashattn.autograd`` (the torch.library
        operator ``flashattn::attention_fwd``), whose backward runs the backward kernels
        (dq, dk, dv; dk and dv summed over each GQA group); the naive step has no backward.

    Raises:
        TypeError, ValueError: bad shapes, dtypes, devices, or arguments (the message says
            which). NotImplementedError never; D up to 256 and any lengths >= 1 are supported.
    """
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if _fp8_call(q, k, v, q_descale, k_descale, v_descale, out_dtype):
        if window_size is not None or softcap is not None:
            raise ValueError("window_size and softcap are not supported with fp8 inputs (the FP8 "
                             "kernel has no mask or score function); pass fp16/bf16 tensors")
        from .fp8_attention import attention_fp8
        return attention_fp8(q, k, v, q_descale=q_descale, k_descale=k_descale,
                             v_descale=v_descale, causal=causal, scale=scale,
                             input_pos=input_pos, out_dtype=out_dtype,
                             v_transposed=v_transposed)
    if v_transposed:
        raise ValueError("v_transposed=True applies to fp8 inputs only (the FP8 forward's V^T "
                         f"layout); q, k, v are {getattr(q, 'dtype', None)}")
    from .value_dim import differs, pad_heads
    if differs(q, k, v):
        # A value head dim other than the query's: zero-padded to one head dim, sliced back.
        q, k, v, scale, dv = pad_heads(q, k, v, scale)
        return attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                         window_size=window_size, softcap=softcap)[..., :dv].contiguous()
    if window_size is not None or softcap is not None:
        from .flex import attention_masked          # never a path that drops them
        out = attention_masked(q, k, v, causal=check_causal(causal), scale=scale,
                               input_pos=input_pos, step="best", window_size=window_size,
                               softcap=softcap)
        if out is not None:
            return out
    return run_step(q, k, v, "best", causal=causal, scale=scale, input_pos=input_pos)


def run_step(q, k, v, step: str, *, causal: bool = False, scale: float | None = None,
             input_pos: int = 0):
    """fp16/bf16 attention with the registered step ``step`` ("best": what ``attention``
    ships, a decode step routed to the split-KV kernels). What ``attention`` runs, and how a
    step registered from outside the library (``registry.register_step``) runs by name."""
    import torch
    if not isinstance(step, str):
        raise TypeError(f"step must be a str ('best' or a step's name), got "
                        f"{type(step).__name__}")
    if _differentiable(q, k, v):
        from . import autograd
        return autograd.attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                                  step=step)
    target = target_of(getattr(q, "device", None))      # asked once, passed down
    causal = check_causal(causal)
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                  interpret=target.interpreting)
    if step != "best":
        get_step(step)  # unknown names fail before any work
    elif _decode_shaped(q, k, causal, input_pos):      # the contract has checked the device
        return launch_via_decode(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                                 target=target)
    B, Hq, Nq, D = q.shape
    out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    if out.numel() == 0:
        return out
    q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    s, config = resolve(step, q, k, causal, target)
    return launch(q, k, v, out, s, config, causal=causal, scale=float(scale),
                  input_pos=input_pos, target=target)


def _fp8_call(q, k, v, q_descale, k_descale, v_descale, out_dtype) -> bool:
    """An FP8 call: any of q, k, v in an fp8 dtype. Descales or out_dtype with no fp8 input
    raise ValueError (they would be silently ignored)."""
    fp8 = any(str(getattr(t, "dtype", "")).replace("torch.", "") in
              ("float8_e4m3fn", "float8_e5m2") for t in (q, k, v))
    if not fp8:
        given = [n for n, x in (("q_descale", q_descale), ("k_descale", k_descale),
                                ("v_descale", v_descale), ("out_dtype", out_dtype))
                 if x is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to fp8 inputs only; q, k, v are "
                             f"{getattr(q, 'dtype', None)}, {getattr(k, 'dtype', None)}, "
                             f"{getattr(v, 'dtype', None)} (quantise with "
                             "flashattn.fp8.quantize_fp8)")
    return fp8


def _differentiable(q, k, v) -> bool:
    """Through the autograd operator: under torch.compile, for meta tensors, or when grad mode is
    on and an input requires grad (``autograd``, and torch.library, load only then)."""
    import torch
    if torch.compiler.is_compiling():
        return True
    if all(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in (q, k, v)):
        return True                    # shapes only: the operator's meta implementation
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in (q, k, v))


def sdpa(query, key, value, attn_mask=None, dropout_p: float = 0.0, is_causal: bool = False,
         scale: float | None = None, enable_gqa: bool = False):
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention`` (4-D inputs).

    Differentiable as ``attention``. Raises NotImplementedError for what the kernels do not do
    (an attention mask tensor, dropout), and ValueError for different head counts without
    ``enable_gqa=True``, as PyTorch; TypeError for a query, key or value that is not a tensor.
    """
    import torch
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    # isinstance only (no check_flag): torch.compile traces this function with fullgraph=True.
    if isinstance(enable_gqa, torch.Tensor) or not isinstance(enable_gqa, (bool, int)):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if attn_mask is not None:
        raise NotImplementedError("flashattn.sdpa does not support attn_mask; use is_causal=True "
                                  "for causal masking or torch's scaled_dot_product_attention")
    if dropout_p != 0.0:
        raise NotImplementedError(f"flashattn.sdpa does not support dropout (dropout_p="
                                  f"{dropout_p}); train without attention dropout, or use torch's "
                                  "scaled_dot_product_attention")
    if query.ndim == 4 and key.ndim == 4:
        if query.shape[1] != key.shape[1] and not enable_gqa:
            raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                             "enable_gqa=True for grouped-query attention")
    return attention(query, key, value, causal=is_causal, scale=scale)


# A decode step goes to the split-KV kernels: the square kernel's grid leaves most SMs idle for
# a few query rows (measured crossover on the H200: from 1K keys, up to 4 rows).
DECODE_PATH_MAX_NQ = 4
DECODE_PATH_MIN_NK = 1024
DECODE_PATH_MAX_GRID = 65535  # B x Hkv: one grid axis of the split kernel


def prefer_decode(q, k, causal: bool, input_pos: int = 0) -> bool:
    """Whether ``attention`` should run the split-KV decode kernels instead of the square one:
    when they compute exactly its answer (causal, or one non-causal row that sees every key)
    on a decode step's shape (``Nq <= DECODE_PATH_MAX_NQ``, ``Nk >= DECODE_PATH_MIN_NK``,
    fp16/bf16 on a kernel device, ``B x Hkv`` within a grid axis). Reads shapes, dtypes and
    devices only; inputs ``attention`` would refuse give False."""
    device = getattr(q, "device", None)
    on_kernel_device = getattr(device, "type", None) == "cuda" or interpreting(device)
    return on_kernel_device and _decode_shaped(q, k, causal, input_pos)


def _decode_shaped(q, k, causal: bool, input_pos: int) -> bool:
    """``prefer_decode`` without its device rule (which the dense contract checks)."""
    try:
        B, Hq, Nq, D = (int(x) for x in q.shape)
        Bk, Hkv, Nk, Dk = (int(x) for x in k.shape)
    except (AttributeError, TypeError, ValueError):
        return False
    if str(q.dtype).replace("torch.", "") not in ("float16", "bfloat16"):
        return False
    if Bk != B or Dk != D or not 1 <= D <= 256:
        return False
    if Hkv < 1 or Hq % Hkv or B * Hkv > DECODE_PATH_MAX_GRID or B < 1:
        return False
    if not 1 <= Nq <= min(DECODE_PATH_MAX_NQ, 16) or Nk < max(DECODE_PATH_MIN_NK, 1):
        return False
    if causal:
        return 0 <= int(input_pos) <= Nk - Nq
    return Nq == 1 and not input_pos


def attention_via_decode(q, k, v, *, causal: bool = False, scale: float | None = None,
                         input_pos: int = 0, num_splits: int | None = None):
    """``attention(q, k, v, ...)`` computed by the split-KV decode kernels over the contiguous
    cache k, v, each sequence ``input_pos + Nq`` long when causal (``Nk`` otherwise), for the
    shapes ``prefer_decode`` accepts; ``num_splits`` as ``decode``. ValueError for a
    non-causal call with Nq > 1 (decode's rows are causal) or bad inputs."""
    target = target_of(getattr(q, "device", None))
    causal = check_causal(causal)
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                  interpret=target.interpreting)
    return launch_via_decode(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                             num_splits=num_splits, target=target)


def launch_via_decode(q, k, v, *, causal: bool, scale, input_pos: int, target,
                      num_splits=None):
    """``attention_via_decode`` on inputs ``contract.check_tensors`` has passed: the contiguous
    cache's dims follow from the shapes, and ``decoding.launch_decode`` runs it on ``target``
    (the ``dispatch.Target`` of q's device)."""
    import torch
    from .contract import check_decode_shapes
    from .decoding import launch_decode
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    if not causal and Nq != 1:
        raise ValueError(f"the decode path computes causal rows: non-causal attention with "
                         f"Nq = {Nq} > 1 query rows needs flashattn.attention's square kernel")
    length = int(input_pos) + Nq if causal else Nk
    if length > Nk:
        raise ValueError(f"the decode path needs the query rows inside the cache: causal with "
                         f"Nq = {Nq} > Nk = {Nk} keys needs flashattn.attention's square kernel")
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    seqlens = torch.full((B,), length, dtype=torch.int32, device=q.device)
    dims = check_decode_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), (B,))
    return launch_decode(q, k, v, seqlens, None, dims, target, scale=scale,
                         num_splits=num_splits, max_seqlen=length)
