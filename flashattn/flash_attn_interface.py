"""flash-attn's functions, by their names and signatures, on this package's kernels.

    from flashattn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
    out = flash_attn_func(q, k, v, causal=True)                  # q (B, N, H, D), as flash-attn
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)  # (total, H, D)
    out = flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=lens,
                                  block_table=table, rotary_cos=cos, rotary_sin=sin, causal=True)

flash-attn's conventions, not this package's: tensors are (batch, seqlen, nheads, headdim)
(``flashattn.attention`` takes (B, H, N, D)), and causal and local masks are aligned to the
bottom-right corner of the score matrix: query row ``i`` of ``seqlen_q`` sits at position
``i + seqlen_k - seqlen_q`` and sees keys ``position - window_size[0] .. position +
window_size[1]`` (``causal`` sets the right side to 0); a row that sees no key is 0, and its
LSE +inf, as flash-attn 2 writes it.

Where each call runs (the first that computes it exactly):

* no window, softcap or ALiBi: the square kernels (``flashattn.attention``, its LSE through
  ``autograd.attention_forward``) with ``input_pos = seqlen_k - seqlen_q``; a causal call with
  more queries than keys runs the rows that see a key and writes 0 for the others;
* a window, ``softcap`` or ``alibi_slopes``: the flex kernels, with a window mask and an ALiBi
  score that read their offsets from small tensors (one compiled kernel whatever the lengths
  and window sizes) and ``mods.softcap``;
* varlen: ``attention_varlen`` (one launch); with a window, softcap, ALiBi, the LSE or a block
  table, one call of the above per sequence (a host read of the offsets; paged keys gathered);
* KV cache: the new keys (rotated if asked) are written into the cache in place, then the
  split-KV ``flashattn.decode`` for causal rows without window, softcap, ALiBi or LSE (1 to 16
  queries per sequence), else one dense call per sequence over its cache prefix;
* fp8 q, k, v with FlashAttention-3's ``q_descale``/``k_descale``/``v_descale``: the FP8 forward
  (output bf16). V given with its sequence dimension contiguous (FlashAttention-3's convention:
  ``vt.permute(0, 3, 1, 2)`` of a (B, Hkv, D, N) buffer such as ``quantize_fp8(v,
  v_transposed=True)`` returns) goes to the kernel without a transpose pass.

Dropout is not implemented (``dropout_p > 0`` raises NotImplementedError), nor ``cache_leftpad``,
FlashAttention-3's ``qv``, ``attention_chunk`` and ``seqused_q/k``. ``deterministic`` is accepted:
the backward is deterministic already. Differentiable as the paths above (the fp8 forward and
the KV-cache call are not). ``return_attn_probs=True`` returns flash-attn 2's triple ``(out,
softmax_lse, None)``: no probabilities without dropout.

Why one module of this size: it mirrors flash-attn's own interface file, three entry points (and
the packed forms) sharing the argument checks, the bottom-right window alignment and the
per-sequence fallback; a reader comparing the two finds each function where flash-attn has it.
"""
from __future__ import annotations

import math

from .contract import (check_flag, check_int32, check_kernel_device,
                       check_scale)
from .dispatch import interpreting

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_with_kvcache", "apply_rotary_emb"]

LAYOUT = " (batch, seqlen, nheads, headdim), flash-attn's layout"
PACKED = " (total_tokens, nheads, headdim), flash-attn's packed layout"
LAYOUT_HINT = ("flash-attn's layout is (batch, seqlen, nheads, headdim); tensors in (batch, "
               "nheads, seqlen, headdim) go to flashattn.attention, or .transpose(1, 2) them")
_FP8 = ("float8_e4m3fn", "float8_e5m2")
_NO_KEY_LSE = math.inf      # flash-attn 2's LSE of a row that sees no key


# --- argument checks ---------------------------------------------------------------------------
def _dtype(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _check_dropout(dropout_p):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"flashattn has no attention dropout (dropout_p={dropout_p}); pass dropout_p=0.0 "
            "(flash-attn's own advice for evaluation) or use flash-attn for training with it")


def _check_window(window_size) -> tuple[int, int]:
    """(left, right) ints, -1 for unbounded; any pair of integers (0-d integer tensors too, as
    ``torch.randint(0, n, (2,))`` gives in flash-attn's tests)."""
    import operator
    try:
        pair = tuple(window_size)
        if len(pair) != 2 or any(isinstance(w, bool) for w in pair):
            raise TypeError
        left, right = (operator.index(w) for w in pair)
    except TypeError:
        raise TypeError(f"window_size must be a (left, right) pair of ints (-1: unbounded), got "
                        f"{window_size!r}") from None
    return (left if left >= 0 else -1), (right if right >= 0 else -1)


def _fa_window(left, right, causal, seqlen_k):
    """A window as the kernels take it: a left side as wide as ``seqlen_k`` (the call's key
    length, or its max_seqlen_k / cache capacity) is unbounded, exactly (no row's position
    reaches it); causal closes the right. The right side is kept as given: flash-attn's
    documented window (row i sees keys up to ``i + seqlen_k - seqlen_q + right``) bounds rows
    when seqlen_q > seqlen_k even for ``right >= seqlen_k``."""
    if left >= seqlen_k:
        left = -1
    return left, (0 if causal else right)


def _check_softcap(softcap) -> float:
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or \
            not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    return float(softcap)


def _check_tensors(names, tensors, rank, layout, *, fp8_ok=False):
    """torch tensors of ``rank``, one dtype the kernels take (fp8 with ``fp8_ok``), one device
    the kernels run on."""
    import torch
    for n, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{n} must be a torch.Tensor, got {type(t).__name__}")
    for n, t in zip(names, tensors):
        if t.dim() != rank:
            raise ValueError(f"{n} must have {rank} dimensions{layout}, got shape "
                             f"{tuple(t.shape)}")
    dts = {_dtype(t) for t in tensors}
    allowed = ("float16", "bfloat16") + (_FP8 if fp8_ok else ())
    for n, t in zip(names, tensors):
        if _dtype(t) not in allowed:
            raise TypeError(f"{n} has dtype {t.dtype}; flashattn's kernels take float16 or "
                            f"bfloat16{' (or fp8 with descales)' if fp8_ok else ''}: cast with "
                            ".half() or .bfloat16()")
    if len(dts) > 1:
        raise TypeError(f"{', '.join(names)} must share one dtype, got "
                        f"{', '.join(str(t.dtype) for t in tensors)}")
    devs = {str(t.device) for t in tensors}
    if len(devs) > 1:
        raise ValueError(f"{', '.join(names)} must be on one device, got "
                         f"{', '.join(str(t.device) for t in tensors)}")
    q = tensors[0]
    check_kernel_device(q, interpreting(q.device), "flashattn kernels run",
                        "flashattn.reference.attention on (B, H, N, D) tensors")


def _check_cache(q, names, caches, layout):
    """A KV cache's two tensors (named ``names``): ``_check_tensors`` of rank 4 in ``layout``,
    q's dtype and device, one shape."""
    a, b = names
    k, v = caches
    _check_tensors(names, caches, 4, layout)
    if k.dtype != q.dtype or k.device != q.device:
        raise TypeError(f"{a} and {b} must have q's dtype and device ({q.dtype} on "
                        f"{q.device}), got {k.dtype} on {k.device}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"{a} and {b} must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")


def _check_heads(Hq, Hkv, D, Dk, what):
    if Dk != D:
        raise ValueError(f"head dim differs: q has {D}, {what} have {Dk} ({LAYOUT_HINT})")
    if not 1 <= D <= 256:
        raise ValueError(f"head dim must be between 1 and 256, got {D}")
    if Hkv < 1 or Hq < 1 or Hq % Hkv:
        raise ValueError(f"q has {Hq} heads and {what} {Hkv}: the query heads must be a positive "
                         f"multiple of the key/value heads. {LAYOUT_HINT}")


def _check_slopes(alibi_slopes, B, Hq, device):
    """flash-attn's (nheads,) or (batch, nheads) float32 slopes as a (B, Hq) tensor, or None."""
    import torch
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a float32 tensor, got "
                        f"{type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32 (as flash-attn's), got {alibi_slopes.dtype}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device}, q on {device}")
    if tuple(alibi_slopes.shape) == (Hq,):
        return alibi_slopes.view(1, Hq).expand(B, Hq).contiguous()
    if tuple(alibi_slopes.shape) == (B, Hq):
        return alibi_slopes.contiguous()
    raise ValueError(f"alibi_slopes must have shape (nheads,) = ({Hq},) or (batch, nheads) = "
                     f"({B}, {Hq}), got {tuple(alibi_slopes.shape)}")


def _check_scalars(softmax_scale, causal, deterministic, return_attn_probs,
                   name="return_attn_probs"):
    check_scale(softmax_scale)
    check_flag("causal", causal)
    check_flag("deterministic", deterministic)
    check_flag(name, return_attn_probs)


# --- one dense call on (B, H, N, D) views ------------------------------------------------------
def _attend(q, k, v, *, causal, scale, left, right, cap, slopes, want_lse):
    """Attention of (B, Hq, Nq, D) q over (B, Hkv, Nk, D) k, v with flash-attn's bottom-right
    alignment: (out (B, Hq, Nq, D), lse (B, Hq, Nq) or None). Checked inputs."""
    import torch
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    if causal:
        right = 0
    offset = Nk - Nq
    if Nq == 0 or Hq == 0 or B == 0:
        out = q.new_zeros((B, Hq, Nq, D))
        return out, (q.new_zeros((B, Hq, Nq), dtype=torch.float32) if want_lse else None)
    if Nk == 0:
        out = q.new_zeros((B, Hq, Nq, D))
        lse = torch.full((B, Hq, Nq), _NO_KEY_LSE, dtype=torch.float32, device=q.device)
        return out, (lse if want_lse else None)
    if left < 0 and cap == 0.0 and slopes is None and (right < 0 or (right == 0 and causal)):
        return _dense(q, k, v, causal=causal, scale=scale, offset=offset, want_lse=want_lse)
    return _flex(q, k, v, scale=scale, left=left, right=right, offset=offset, cap=cap,
                 slopes=slopes, want_lse=want_lse)


def _dense(q, k, v, *, causal, scale, offset, want_lse):
    import torch
    from .api import attention
    from .autograd import attention_forward
    Nq = q.shape[2]
    if causal and offset < 0:
        # More queries than keys: the first -offset rows see no key (0, LSE +inf); the others
        # are the square causal case.
        skip = -offset
        out, lse = _dense(q[:, :, skip:], k, v, causal=True, scale=scale, offset=0,
                          want_lse=want_lse)
        out = torch.cat([out.new_zeros(out.shape[:2] + (skip, out.shape[3])), out], dim=2)
        if want_lse:
            lse = torch.cat([torch.full(lse.shape[:2] + (skip,), _NO_KEY_LSE, dtype=lse.dtype,
                                        device=lse.device), lse], dim=2)
        return out, lse
    input_pos = offset if causal else 0
    if want_lse:
        return attention_forward(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
    return attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos), None


def _flex(q, k, v, *, scale, left, right, offset, cap, slopes, want_lse):
    import torch
    from . import mods
    from . import flash_attn_mods as fm
    from .flex import DEFAULT_CONFIG, FLEX_CONFIGS, flex_attention
    from .dispatch import device_arch
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    dev = q.device
    bm = None
    if (left, right) != (-1, -1):
        mask = fm.window_mask(left, right, offset, dev)
        cfg = FLEX_CONFIGS.get(device_arch(dev), DEFAULT_CONFIG)
        from .flex import cached_block_mask
        bm = cached_block_mask(mask, Nq, Nk, dev, (cfg.TILE_M, cfg.TILE_N))
    score = None
    if slopes is not None:
        pos = torch.tensor([offset], dtype=torch.int32, device=dev)
        tensors = (("slopes", slopes), ("pos", pos))
        if cap:
            tile, grad, fn = fm.softcap_alibi(cap)
            score = mods.ScoreMod(f"softcap_alibi({cap:g})", tile, fn, tensors,
                                  params=dict(cap=cap), grad=grad)
        else:
            score = mods.ScoreMod("flash_attn_alibi", fm.alibi_tile, fm.alibi_torch, tensors,
                                  additive=True)
    elif cap:
        score = mods.softcap(cap)
    res = flex_attention(q, k, v, score_mod=score, block_mask=bm, scale=scale,
                         enable_gqa=Hq != k.shape[1], return_lse=want_lse)
    if not want_lse:
        return res, None
    out, lse = res
    return out, torch.where(torch.isneginf(lse), torch.full_like(lse, _NO_KEY_LSE), lse)


# --- flash_attn_func ---------------------------------------------------------------------------
def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, q_descale=None, k_descale=None, v_descale=None):
    """flash-attn's ``flash_attn_func``.

    Args:
        q: (batch, seqlen_q, nheads, headdim) float16 or bfloat16 (or fp8 with descales);
            k, v: (batch, seqlen_k, nheads_k, headdim), nheads % nheads_k == 0 (MQA/GQA).
        dropout_p: must be 0.0 (NotImplementedError otherwise).
        softmax_scale: default 1 / sqrt(headdim).
        causal: bottom-right aligned causal mask.
        window_size: (left, right): query i (at position i + seqlen_k - seqlen_q) sees keys
            position - left .. position + right; -1 unbounded.
        softcap: > 0: ``softcap * tanh(score / softcap)`` on the scaled scores.
        alibi_slopes: (nheads,) or (batch, nheads) float32: ``-slope * |i + seqlen_k -
            seqlen_q - j|`` added to the (soft-capped) score.
        deterministic: accepted (the backward is deterministic).
        return_attn_probs: return ``(out, softmax_lse, None)``; softmax_lse (batch, nheads,
            seqlen_q) float32, natural log, +inf for a row with no key.
        q_descale, k_descale, v_descale: FlashAttention-3's (batch, nheads_k) float32 descales
            for fp8 q, k, v (keyword-only here: flash-attn 2's positional order is kept). V
            whose seqlen dimension is contiguous runs the FP8 forward without a transpose.

    Returns:
        out (batch, seqlen_q, nheads, headdim) in q's dtype (bf16 for fp8 inputs), or the
        triple with ``return_attn_probs``.
    """
    _check_dropout(dropout_p)
    _check_scalars(softmax_scale, causal, deterministic, return_attn_probs)
    left, right = _check_window(window_size)
    cap = _check_softcap(softcap)
    fp8 = any(_dtype(t) in _FP8 for t in (q, k, v) if hasattr(t, "dtype"))
    _check_tensors(("q", "k", "v"), (q, k, v), 4, LAYOUT, fp8_ok=fp8)
    B, Nq, Hq, D = q.shape
    Bk, Nk, Hkv, Dk = k.shape
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and "
                         f"{tuple(v.shape)} ({LAYOUT_HINT})")
    if Bk != B:
        raise ValueError(f"batch size differs: q has {B}, k and v have {Bk}")
    _check_heads(Hq, Hkv, D, Dk, "k and v")
    slopes = _check_slopes(alibi_slopes, B, Hq, q.device)
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))      # views (B, H, N, D)
    left, right = _fa_window(left, right, bool(causal), Nk)
    if fp8:
        if cap or slopes is not None or left >= 0 or (right >= 0 and not causal):
            raise ValueError("fp8 inputs run the FP8 forward, which has no window, softcap or "
                             "ALiBi; pass fp16/bf16 tensors for those")
        if return_attn_probs:
            raise ValueError("the FP8 forward returns no LSE (return_attn_probs=True)")
        import torch
        from .fp8_attention import attention_fp8
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(D)
        skip = max(0, Nq - Nk) if causal else 0     # rows that see no key: 0, as flash-attn
        v_t = vh.stride(-2) == 1 and vh.stride(-1) != 1        # V^T given: no transpose pass
        out = attention_fp8(qh[:, :, skip:], kh, vh.transpose(-1, -2) if v_t else vh,
                            q_descale=q_descale, k_descale=k_descale, v_descale=v_descale,
                            causal=bool(causal), scale=softmax_scale,
                            input_pos=max(0, Nk - Nq) if causal else 0, v_transposed=v_t)
        if skip:
            out = torch.cat([out.new_zeros((B, Hq, skip, D)), out], dim=2)
        return out.transpose(1, 2).contiguous()     # flash-attn's out is contiguous
    for n, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if d is not None:
            raise ValueError(f"{n} applies to fp8 inputs only; q, k, v are {q.dtype} (quantise "
                             "with flashattn.quantize_fp8)")
    out, lse = _attend(qh, kh, vh, causal=bool(causal), scale=softmax_scale, left=left,
                       right=right, cap=cap, slopes=slopes, want_lse=bool(return_attn_probs))
    out = out.transpose(1, 2).contiguous()          # flash-attn's out is contiguous
    return (out, lse, None) if return_attn_probs else out


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """flash-attn's ``flash_attn_kvpacked_func``: kv (batch, seqlen_k, 2, nheads_k, headdim);
    otherwise ``flash_attn_func``."""
    _check_packed("kv", kv, 2)
    return flash_attn_func(q, kv[:, :, 0], kv[:, :, 1], dropout_p, softmax_scale, causal,
                           window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """flash-attn's ``flash_attn_qkvpacked_func``: qkv (batch, seqlen, 3, nheads, headdim);
    otherwise ``flash_attn_func``."""
    _check_packed("qkv", qkv, 3)
    return flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], dropout_p, softmax_scale,
                           causal, window_size, softcap, alibi_slopes, deterministic,
                           return_attn_probs)


def _check_packed(name, t, n):
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 5 or t.shape[2] != n:
        raise ValueError(f"{name} must be (batch, seqlen, {n}, nheads, headdim), got shape "
                         f"{tuple(t.shape)}")


# --- flash_attn_varlen_func --------------------------------------------------------------------
def _offsets(cu, name, B1, total, device):
    import torch
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    check_int32(name, cu, "flash-attn's offsets")
    if cu.dim() != 1 or (B1 is not None and cu.shape[0] != B1) or cu.shape[0] < 1:
        raise ValueError(f"{name} must have shape (batch + 1,)"
                         f"{f' = ({B1},)' if B1 is not None else ''}, got {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device}, q on {device}")
    vals = cu.tolist()                  # a host read: the per-sequence paths need the lengths
    if vals[0] != 0 or any(b < a for a, b in zip(vals, vals[1:])) or (
            total is not None and vals[-1] != total):
        raise ValueError(f"{name} must start at 0, never decrease and end at the packed "
                         f"length{f' {total}' if total is not None else ''}, got {vals}")
    return vals


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """flash-attn's ``flash_attn_varlen_func``: sequences packed without padding.

    Args:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), or with
            ``block_table`` paged caches (num_blocks, page_block_size, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: (batch + 1,) int32 cumulative lengths (with
            ``block_table``, cu_seqlens_k[b + 1] - cu_seqlens_k[b] is sequence b's key count).
        max_seqlen_q, max_seqlen_k: the longest lengths (ints).
        The rest as ``flash_attn_func``; causal and windows bottom-right per sequence.

    Returns:
        out (total_q, nheads, headdim), or ``(out, softmax_lse, None)`` with
        ``return_attn_probs``: softmax_lse (nheads, total_q) float32, as flash-attn 2.
    """
    import torch
    _check_dropout(dropout_p)
    _check_scalars(softmax_scale, causal, deterministic, return_attn_probs)
    left, right = _check_window(window_size)
    cap = _check_softcap(softcap)
    paged = block_table is not None
    if paged:
        _check_tensors(("q",), (q,), 3, PACKED)
    else:
        _check_tensors(("q", "k", "v"), (q, k, v), 3, PACKED)
    for n, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise TypeError(f"{n} must be a non-negative int, got {m!r}")
    total_q, Hq, D = q.shape
    if paged:
        _check_cache(q, ("k", "v"), (k, v), " (num_blocks, page_block_size, nheads_k, "
                     "headdim)")
        _, page, Hkv, Dk = k.shape
        total_k = None
    else:
        if tuple(v.shape[:2]) != tuple(k.shape[:2]):
            raise ValueError(f"k and v must have the same tokens and heads, got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        total_k, Hkv, Dk = k.shape
    _check_heads(Hq, Hkv, D, Dk, "k and v")
    cq = _offsets(cu_seqlens_q, "cu_seqlens_q", None, total_q, q.device)
    B = len(cq) - 1
    ck = _offsets(cu_seqlens_k, "cu_seqlens_k", B + 1, total_k, q.device)
    lq = [b - a for a, b in zip(cq, cq[1:])]
    lk = [b - a for a, b in zip(ck, ck[1:])]
    if max(lq, default=0) > max_seqlen_q or max(lk, default=0) > max_seqlen_k:
        raise ValueError(f"a sequence is longer than max_seqlen_q = {max_seqlen_q} or "
                         f"max_seqlen_k = {max_seqlen_k} (lengths {lq} and {lk})")
    slopes = _check_slopes(alibi_slopes, B, Hq, q.device)
    left, right = _fa_window(left, right, bool(causal), max_seqlen_k)
    if paged:
        check_int32("block_table", block_table, "flash-attn's page table")
        if block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table must be (batch, max_blocks) = ({B}, ...), got "
                             f"{tuple(block_table.shape)}")
    plain = (left < 0 and right in ((-1, 0) if causal else (-1,)) and not cap
             and slopes is None and not paged)
    if v.shape[-1] != Dk and not (plain and not return_attn_probs):
        raise ValueError(f"a value head dim other than the query's ({v.shape[-1]} vs {D}) is "
                         "supported without window, softcap, ALiBi, block_table or "
                         "return_attn_probs")
    if plain and not return_attn_probs:
        from .varlen import attention_varlen
        out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal=bool(causal), scale=softmax_scale)
        return out
    outs, lses = [], []
    table = block_table.tolist() if paged else None
    for b in range(B):
        qs = q[cq[b]:cq[b + 1]]
        if paged:
            n_pages = -(-lk[b] // page)
            pages = torch.tensor(table[b][:n_pages], dtype=torch.long, device=k.device)
            ks = k[pages].reshape(-1, Hkv, D)[:lk[b]]
            vs = v[pages].reshape(-1, Hkv, D)[:lk[b]]
        else:
            ks, vs = k[ck[b]:ck[b + 1]], v[ck[b]:ck[b + 1]]
        o, lse = _attend(qs.transpose(0, 1)[None], ks.transpose(0, 1)[None],
                         vs.transpose(0, 1)[None], causal=bool(causal), scale=softmax_scale,
                         left=left, right=right, cap=cap,
                         slopes=None if slopes is None else slopes[b:b + 1],
                         want_lse=bool(return_attn_probs))
        outs.append(o[0].transpose(0, 1))
        if return_attn_probs:
            lses.append(lse[0])
    out = torch.cat(outs, dim=0) if outs else q.new_zeros(q.shape)
    if not return_attn_probs:
        return out
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros((Hq, 0), dtype=torch.float32)
    return out, lse, None


# --- rotary embeddings -------------------------------------------------------------------------
def apply_rotary_emb(x, cos, sin, positions, *, interleaved: bool = False):
    """Rotary embedding of ``x`` (B, N, H, D) at ``positions`` (B, N) with tables ``cos``,
    ``sin`` (seqlen_ro, rotary_dim / 2), on the first rotary_dim dims: interleaved pairs
    (0, 1), (2, 3), ... (GPT-J) or the two halves (GPT-NeoX), as flash-attn's. fp32 math,
    x's dtype out."""
    import torch
    rd = 2 * cos.shape[1]
    c = cos[positions].float()[:, :, None, :]        # (B, N, 1, rd/2)
    s = sin[positions].float()[:, :, None, :]
    xr = x[..., :rd].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :rd // 2], xr[..., rd // 2:]
        rot = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)
    return torch.cat([rot.to(x.dtype), x[..., rd:]], dim=-1)


# --- flash_attn_with_kvcache -------------------------------------------------------------------
def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """flash-attn's ``flash_attn_with_kvcache``: append new keys to a cache in place, attend.

    Args:
        q: (batch, seqlen_q, nheads, headdim).
        k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k, headdim), or paged with
            ``block_table``: (num_blocks, page_block_size, nheads_k, headdim), page_block_size a
            multiple of 16. Updated in place when k, v are given.
        k, v: optional (batch, seqlen_new, nheads_k, headdim): written at positions
            ``cache_seqlens[b] ..`` of sequence b (rotated by rotary_cos/sin first).
        rotary_cos, rotary_sin: optional (seqlen_ro, rotary_dim / 2) tables; q is rotated at
            positions cache_seqlens[b] + i when causal or local, else at cache_seqlens[b]; the
            new keys at cache_seqlens[b] + j. ``rotary_interleaved``: GPT-J pairs (default) or
            GPT-NeoX halves.
        cache_seqlens: int or (batch,) int32: the cache lengths before the append (not
            updated: the caller advances them, as with flash-attn). None: the full cache.
        cache_batch_idx: optional (batch,) int32: the cache row of each sequence (no
            block_table).
        cache_leftpad: not supported (NotImplementedError).
        block_table: optional (batch, max_blocks) int32.
        softmax_scale, causal, window_size, softcap, alibi_slopes: as ``flash_attn_func``, over
            the cache_seqlens[b] + seqlen_new keys of sequence b (bottom-right).
        num_splits: 0 (automatic) or the split count of the split-KV kernels.
        return_softmax_lse: also return softmax_lse (batch, nheads, seqlen_q) float32.

    Returns:
        out (batch, seqlen_q, nheads, headdim), or ``(out, softmax_lse)``.
    """
    import torch
    _check_scalars(softmax_scale, causal, False, return_softmax_lse, "return_softmax_lse")
    check_flag("rotary_interleaved", rotary_interleaved)
    left, right = _check_window(window_size)
    cap = _check_softcap(softcap)
    if cache_leftpad is not None:
        raise NotImplementedError("cache_leftpad is not supported by flashattn's KV-cache call; "
                                  "keep each sequence's cache starting at slot 0")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise TypeError(f"num_splits must be an int >= 0 (0: automatic), got {num_splits!r}")
    paged = block_table is not None
    cache_layout = (" (num_blocks, page_block_size, nheads_k, headdim)" if paged else
                    " (batch_cache, seqlen_cache, nheads_k, headdim), flash-attn's layout")
    _check_tensors(("q",), (q,), 4, LAYOUT)
    _check_cache(q, ("k_cache", "v_cache"), (k_cache, v_cache), cache_layout)
    B, Nq, Hq, D = q.shape
    P, S, Hkv, Dk = k_cache.shape
    _check_heads(Hq, Hkv, D, Dk, "k_cache and v_cache")
    if (k is None) != (v is None):
        raise ValueError("give both k and v (the new keys and values) or neither")
    n_new = 0
    if k is not None:
        _check_tensors(("k", "v"), (k, v), 4, LAYOUT)
        if k.dtype != q.dtype or k.device != q.device:
            raise TypeError(f"k and v must have q's dtype and device, got {k.dtype} on {k.device}")
        if tuple(v.shape) != tuple(k.shape) or k.shape[0] != B or k.shape[2] != Hkv or \
                k.shape[3] != D:
            raise ValueError(f"k and v must be (batch, seqlen_new, nheads_k, headdim) = ({B}, "
                             f"seqlen_new, {Hkv}, {D}), got {tuple(k.shape)} and "
                             f"{tuple(v.shape)}")
        n_new = k.shape[1]
    dev = q.device
    if paged:
        check_int32("block_table", block_table, "flash-attn's page table")
        if block_table.dim() != 2 or block_table.shape[0] != B or block_table.device != dev:
            raise ValueError(f"block_table must be (batch, max_blocks) = ({B}, ...) on {dev}, got "
                             f"{tuple(block_table.shape)} on {block_table.device}")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx and block_table exclude each other (a page table "
                             "already names each sequence's pages)")
        capacity = block_table.shape[1] * S
    else:
        capacity = S
    if cache_batch_idx is not None:
        if not isinstance(cache_batch_idx, torch.Tensor):
            raise TypeError(f"cache_batch_idx must be a tensor, got "
                            f"{type(cache_batch_idx).__name__}")
        check_int32("cache_batch_idx", cache_batch_idx, "flash-attn's cache rows")
        if tuple(cache_batch_idx.shape) != (B,) or cache_batch_idx.device != dev:
            raise ValueError(f"cache_batch_idx must be ({B},) on {dev}, got "
                             f"{tuple(cache_batch_idx.shape)} on {cache_batch_idx.device}")
        rows = cache_batch_idx.long()
    elif not paged:
        if P != B:
            raise ValueError(f"k_cache has {P} sequences but q {B} (pass cache_batch_idx or "
                             f"block_table). {LAYOUT_HINT}")
        rows = torch.arange(B, device=dev)
    if cache_seqlens is None:
        seqlens = torch.full((B,), capacity - n_new if k is not None else capacity,
                             dtype=torch.int32, device=dev)
    elif isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        seqlens = torch.full((B,), cache_seqlens, dtype=torch.int32, device=dev)
    elif isinstance(cache_seqlens, torch.Tensor):
        check_int32("cache_seqlens", cache_seqlens, "flash-attn's cache lengths")
        if tuple(cache_seqlens.shape) != (B,) or cache_seqlens.device != dev:
            raise ValueError(f"cache_seqlens must be ({B},) on {dev}, got "
                             f"{tuple(cache_seqlens.shape)} on {cache_seqlens.device}")
        seqlens = cache_seqlens
    else:
        raise TypeError(f"cache_seqlens must be an int or a (batch,) int32 tensor, got "
                        f"{type(cache_seqlens).__name__}")
    if dev.type == "cpu":       # values checked where it costs no synchronisation
        lo, hi = int(seqlens.min()), int(seqlens.max())
        if lo < 0 or hi + n_new > capacity:
            raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {capacity}] (the "
                             f"cache's capacity), got lengths {seqlens.tolist()} + {n_new}")
    rotary = rotary_cos is not None or rotary_sin is not None
    if rotary:
        if rotary_cos is None or rotary_sin is None:
            raise ValueError("give both rotary_cos and rotary_sin")
        for n, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.device != dev:
                raise ValueError(f"{n} must be a (seqlen_ro, rotary_dim / 2) tensor on {dev}")
        if tuple(rotary_sin.shape) != tuple(rotary_cos.shape) or not \
                0 < 2 * rotary_cos.shape[1] <= D:
            raise ValueError(f"rotary_cos and rotary_sin must share a shape (seqlen_ro, "
                             f"rotary_dim / 2) with rotary_dim <= headdim = {D}, got "
                             f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
    slopes = _check_slopes(alibi_slopes, B, Hq, dev)
    left, right = _fa_window(left, right, bool(causal), capacity)
    local = (left, right) != (-1, -1)
    base = seqlens.long()
    if rotary:
        ar = torch.arange(Nq, device=dev)
        qpos = base[:, None] + (ar if (causal or local) else 0 * ar)
        q = apply_rotary_emb(q, rotary_cos, rotary_sin, qpos, interleaved=rotary_interleaved)
    if k is not None:
        kpos = base[:, None] + torch.arange(n_new, device=dev)          # (B, n_new)
        if rotary:
            k = apply_rotary_emb(k, rotary_cos, rotary_sin, kpos, interleaved=rotary_interleaved)
        with torch.no_grad():
            if paged:
                page = block_table.long().gather(1, kpos // S)
                k_cache[page, kpos % S] = k
                v_cache[page, kpos % S] = v
            else:
                k_cache[rows[:, None], kpos] = k
                v_cache[rows[:, None], kpos] = v
    lens = (seqlens + n_new).to(torch.int32) if n_new else seqlens
    causal = bool(causal)
    simple = (left < 0 and not cap and slopes is None and not return_softmax_lse
              and (causal or Nq == 1) and 1 <= Nq <= 16 and cache_batch_idx is None
              and (not paged or S % 16 == 0))
    if simple:
        from .decoding import decode
        out = decode(q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2),
                     lens.contiguous(), block_table=block_table, scale=softmax_scale,
                     num_splits=num_splits or None)
        return out.transpose(1, 2).contiguous()     # flash-attn's out is contiguous
    # One dense call per sequence over its cache prefix (a host read of the lengths).
    outs, lses = [], []
    lengths = lens.tolist()
    table = block_table.tolist() if paged else None
    for b in range(B):
        n = lengths[b]
        if paged:
            pages = torch.tensor(table[b][:-(-n // S)], dtype=torch.long, device=dev)
            ks = k_cache[pages].reshape(-1, Hkv, D)[:n]
            vs = v_cache[pages].reshape(-1, Hkv, D)[:n]
        else:
            ks, vs = k_cache[rows[b], :n], v_cache[rows[b], :n]
        o, lse = _attend(q[b:b + 1].transpose(1, 2), ks.transpose(0, 1)[None],
                         vs.transpose(0, 1)[None], causal=causal, scale=softmax_scale,
                         left=left, right=right, cap=cap,
                         slopes=None if slopes is None else slopes[b:b + 1],
                         want_lse=bool(return_softmax_lse))
        outs.append(o.transpose(1, 2))             # torch.cat below: contiguous
        lses.append(lse)
    out = torch.cat(outs, dim=0)
    return (out, torch.cat(lses, dim=0)) if return_softmax_lse else out

