"""FP8 decoding over an FP8 KV cache, and the fp8 names of the package in one place.

    import flashattn
    from flashattn.fp8 import quantize_fp8
    k_cache8, kd = quantize_fp8(k_cache); v_cache8, vd = quantize_fp8(v_cache)
    o = flashattn.decode(q, k_cache8, v_cache8, cache_seqlens, k_descale=kd, v_descale=vd)
    # V cached transposed, (B, Hkv, D, S): both decode products on FP8 tensor cores
    k8, v8t, kd, vd = flashattn.fp8.fp8_kv_cache(k, v, capacity=4096, margin=2.0)
    flashattn.fp8.append_kv_fp8(k8, v8t, k_new, v_new, lens, kd, vd, v_transposed=True)
    o = flashattn.decode(q, k8, v8t, lens + 1, k_descale=kd, v_descale=vd, v_transposed=True)

Quantisation is ``fp8_quant`` and the FP8 forward ``fp8_attention``; their names are
re-exported here.
"""
from __future__ import annotations

import math

from .dispatch import device_arch, expect, interpreting, launch_kernel, on_device
from .fp8_attention import _check_arch, _check_device, attention_fp8, reference_fp8
from .fp8_quant import (FP8_ARCHS, FP8_MAX, _descale_tensor, _name, dequantize_fp8,
                        hadamard_rotation, incoherent, is_fp8, quantize_fp8)
from .kernels import hinted
from .kernels.fp8_spec import DECODE_SPLIT_FP8, fp8_decode_constants, fp8_decode_hints

__all__ = ["quantize_fp8", "dequantize_fp8", "attention_fp8", "decode_fp8", "fp8_kv_cache",
           "append_kv_fp8", "decode_reference_fp8", "incoherent",
           "hadamard_rotation", "reference_fp8", "is_fp8", "FP8_MAX", "FP8_ARCHS"]


# --- decoding over an FP8 KV cache -------------------------------------------------------------
def decode_fp8(q, k_cache, v_cache, cache_seqlens, *, k_descale=None, v_descale=None,
               block_table=None, scale=None, num_splits=None, max_seqlen=None,
               check_values=None, out=None, v_transposed: bool = False):
    """``flashattn.decode`` over fp8 (e4m3 or e5m2) K/V caches with (B, Hkv) descales;
    ``flashattn.decode`` routes fp8 caches here. q fp16/bf16; the rest as ``decode``.

    Args:
        v_transposed: the V cache is stored transposed, (B, Hkv, D, S), or paged
            (num_pages, Hkv, D, page_size) (K stays (B, Hkv, S, D) / (num_pages, Hkv,
            page_size, D)). Both products then run on FP8 tensor cores straight from the
            cache's bytes (``kernels/fp8_decode.py``): the query rows are rounded to fp8 in
            the kernel (one scale per row), P is cast to fp8 as in the FP8 forward. Make such a
            cache with ``fp8_kv_cache`` (or ``quantize_fp8(v, v_transposed=True)``) and write
            new tokens with ``append_kv_fp8``. False (default): V as K, the tiles widened to
            q's dtype on chip and multiplied in fp16 (q kept in fp16: a smaller error, more
            time: chapter 14 compares them).

    k_descale folds into the softmax scale and v_descale into each split's output. CUDA-graph
    capturable as ``decode`` (descales are device tensors read by the kernel).
    """
    import torch
    from .contract import check_decode, check_optional_int, check_out
    from .dispatch import device_sm_count
    from .kernels import DECODE_COMBINE, DECODE_COMBINE_ROW, DECODE_SPLIT_HINTS
    from .kernels.decode_spec import decode_steps
    from .kernels.fp8_decode_spec import DECODE_FP8MMA, fp8_decode_plan
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if _name(q.dtype) not in ("float16", "bfloat16"):
        raise TypeError(f"q has dtype {q.dtype}; decoding over an fp8 cache takes float16 or "
                        "bfloat16 queries")
    if not (is_fp8(k_cache) and is_fp8(v_cache)) or k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share one fp8 dtype (float8_e4m3fn or "
                        f"float8_e5m2), got {k_cache.dtype} and {v_cache.dtype}")
    interp = interpreting(getattr(q, "device", None))
    if v_transposed:
        _check_v_transposed(k_cache, v_cache, block_table)
    # The shape, table and length rules of decode, checked on a stand-in query of the caches'
    # dtype (no copy: an uninitialised tensor of q's shape) and V in K's layout (a view).
    q_like = torch.empty(q.shape, dtype=k_cache.dtype, device=q.device)
    v_sd = v_cache.transpose(-1, -2) if v_transposed else v_cache
    dims = check_decode(q_like, k_cache, v_sd, cache_seqlens, block_table, scale=scale,
                        check_values=check_values)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            what = ("the key axis (V transposed)" if name == "v_cache" and v_transposed
                    else "the head dim")
            raise ValueError(f"{name} must be contiguous in its last dimension ({what}), "
                             f"got strides {tuple(t.stride())}")
    _check_device(q, interp, "the decode kernels")
    _check_arch(q.device, interp)
    if dims.D % 16:
        raise ValueError(f"an fp8 cache needs a head dim that is a multiple of 16 (16-byte "
                         f"rows), got D = {dims.D}")
    check_optional_int("max_seqlen", max_seqlen, minimum=0)
    check_out(out)
    B, Hq, Nq, D = q.shape
    Hkv = dims.Hkv
    kd = _descale_tensor(k_descale, "k_descale", B, Hkv, q.device)
    vd = _descale_tensor(v_descale, "v_descale", B, Hkv, q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if out is None:
        out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    elif (tuple(out.shape) != (B, Hq, Nq, D) or out.dtype != q.dtype or out.device != q.device
          or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {(B, Hq, Nq, D)} tensor of {q.dtype} on "
                         f"{q.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    arch, sm_count = device_arch(q.device), device_sm_count(q.device)
    # The fp16 plan's splits, key tile and combine; the fp8 kernel's own row tile, grid and
    # scratch (kernels/fp8_decode_spec.py).
    plan = fp8_decode_plan(dims, v_transposed=v_transposed, num_splits=num_splits,
                           max_seqlen=max_seqlen, sm_count=sm_count, arch=arch)
    rows = plan["rows"]
    if v_transposed:
        spec, split_consts = DECODE_FP8MMA, plan["split_constants"]
        split_grid = plan["split_grid"]
        opart_shape, lse_shape = plan["opart_shape"], plan["lse_shape"]
        kernel = hinted(spec.kernel(), plan["hints"])
    else:
        from .kernels import decode_partial_shapes, decode_split_grid
        spec = DECODE_SPLIT_FP8
        # 64 rows on sm_90/sm_100 (kernels/fp8_spec.py FP8_DECODE_WIDE_TILE_M).
        split_consts = fp8_decode_constants(dict(plan["split_constants"], FUSED=False,
                                                 PDL=False), arch)
        split_grid = decode_split_grid(B=B, Hkv=Hkv, rows=rows, tile_m=split_consts["TILE_M"],
                                       num_splits=plan["num_splits"])
        opart_shape, lse_shape = decode_partial_shapes(
            num_splits=plan["num_splits"], B=B, Hkv=Hkv, rows=rows,
            tile_m=split_consts["TILE_M"], head_dim=D)
        kernel = hinted(spec.kernel(),
                        fp8_decode_hints(split_consts, arch, DECODE_SPLIT_HINTS.get(arch, {})))
    q_rows = q.contiguous().view(B, Hkv, rows, D)
    out_rows = out.view(B, Hkv, rows, D)
    if block_table is None:
        table = torch.empty((1, 1), dtype=torch.int32, device=q.device)
    else:
        table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    seqlens = cache_seqlens if cache_seqlens.stride(-1) == 1 else cache_seqlens.contiguous()
    final = plan["combine"] is None
    opart = torch.empty((1, 1, 1, 1) if final else opart_shape, dtype=torch.float32,
                        device=q.device)
    lse = torch.empty((1, 1, 1) if final else lse_shape, dtype=torch.float32,
                      device=q.device)
    arrays = dict(Q=q_rows, K=k_cache, V=v_cache, BlockTable=table, SeqLens=seqlens,
                  KDescale=kd, VDescale=vd, Opart=opart, Lse=lse, Out=out_rows)
    if not v_transposed:
        arrays["Counter"] = torch.empty((1, 1), dtype=torch.int32, device=q.device)  # unused
    with on_device(q.device), expect(q.device,
                                     lambda: decode_steps(plan, seqlens, dims),
                                     "flashattn.decode (fp8 cache)"):
        launch_kernel(q.device, split_grid, kernel,
                      spec.args(arrays, dict(qk_scale=scale, num_q=Nq), split_consts))
        if plan["combine"] in ("row", "block"):
            cspec = DECODE_COMBINE_ROW if plan["combine"] == "row" else DECODE_COMBINE
            launch_kernel(q.device, plan["combine_grid"], cspec.kernel(),
                          cspec.args(dict(Opart=opart, Lse=lse, Out=out_rows), {},
                                     plan["combine_constants"]))
    return out


def _check_v_transposed(k_cache, v_cache, block_table):
    """A transposed V cache is K's shape with its last two dimensions swapped: ValueError
    naming both layouts otherwise (a V cache in K's layout passed with v_transposed=True is
    the likely mistake)."""
    ks, vs = tuple(k_cache.shape), tuple(v_cache.shape)
    if len(ks) != 4 or len(vs) != 4:
        return                                   # check_decode names the rank
    want = ks[:2] + (ks[3], ks[2])
    if vs != want:
        lay = ("(num_pages, Hkv, D, page_size)" if block_table is not None
               else "(B, Hkv, D, S)")
        hint = (" (that is K's layout: pass v_transposed=False, or make the cache with "
                "flashattn.fp8.fp8_kv_cache)" if vs == ks and ks[2] != ks[3] else "")
        raise ValueError(f"v_transposed=True takes v_cache as {lay} = {want} for k_cache "
                         f"{ks}, got {vs}{hint}")


def decode_reference_fp8(q, k_cache8, v_cache8, cache_seqlens, k_descale, v_descale, *,
                         block_table=None, scale=None, v_transposed: bool = False):
    """fp32 decode attention of the dequantised caches (the widening kernel's exact answer;
    the FP8-MMA kernel's too, up to q and P rounded to fp8). Descales per (batch, kv head): for
    a paged cache each sequence's pages are dequantised with its own row of the descales.
    ``v_transposed``: v_cache8 is (B, Hkv, D, S) (paged: (num_pages, Hkv, D, page_size))."""
    import torch
    from .reference.decode import decode_attention
    if v_transposed:
        v_cache8 = v_cache8.transpose(-1, -2)
    B = q.shape[0]
    Hkv = k_cache8.shape[1]
    kd = _descale_tensor(k_descale, "k_descale", B, Hkv, q.device).cpu()
    vd = _descale_tensor(v_descale, "v_descale", B, Hkv, q.device).cpu()
    outs = []
    for b in range(B):
        # Contiguous: sequence b's own cache; paged: the page pool, in sequence b's descales.
        kb = k_cache8 if block_table is not None else k_cache8[b:b + 1]
        vb = v_cache8 if block_table is not None else v_cache8[b:b + 1]
        kc = kb.float().cpu() * kd[b][None, :, None, None]
        vc = vb.float().cpu() * vd[b][None, :, None, None]
        bt = None if block_table is None else block_table[b:b + 1].cpu()
        outs.append(decode_attention(q[b:b + 1].float().cpu(), kc, vc,
                                     cache_seqlens[b:b + 1].cpu(), bt, scale=scale))
    return torch.cat(outs)


# --- fp8 KV caches: made from a prefill, appended to ------------------------------------------
def fp8_kv_cache(k, v, *, capacity: int | None = None, dtype=None, margin: float = 1.0,
                 v_transposed: bool = True):
    """An fp8 KV cache from a prefill's K and V, in the layout ``decode`` reads.

    Args:
        k, v: (B, Hkv, S, D) fp16/bf16/fp32: the keys and values of the first S tokens.
        capacity: the cache's length (>= S; default S rounded up to 16); slots past S are
            zero until ``append_kv_fp8`` writes them.
        dtype: ``torch.float8_e4m3fn`` (default) or ``torch.float8_e5m2``.
        margin: the prefill's largest |value| per (batch, kv head) maps to ``FP8_MAX /
            margin``: headroom for later tokens, which ``append_kv_fp8`` quantises with the
            same descales (values beyond the range saturate).
        v_transposed: V stored (B, Hkv, D, capacity), the layout the FP8-MMA decode reads
            (``decode(..., v_transposed=True)``); False: (B, Hkv, capacity, D) as K.

    Returns:
        (k_cache8, v_cache8, k_descale, v_descale): the caches (capacity a multiple of 16
        keeps the transposed V's rows 16-byte aligned for the TMA) and (B, Hkv) float32
        descales.
    """
    import torch
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if k.ndim != 4 or tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"k and v must both be (B, Hkv, S, D), got {tuple(k.shape)} and "
                         f"{tuple(v.shape)}")
    B, Hkv, S, D = k.shape
    cap = -(-S // 16) * 16 if capacity is None else capacity
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < max(S, 1):
        raise ValueError(f"capacity must be an int >= the prefill's {S} tokens (and >= 1), "
                         f"got {capacity!r}")
    k8, kd = quantize_fp8(k, dtype=dtype, margin=margin)
    v8, vd = quantize_fp8(v, dtype=dtype, margin=margin)
    kc = torch.zeros((B, Hkv, cap, D), dtype=k8.dtype, device=k.device)
    kc.view(torch.uint8)[:, :, :S] = k8.view(torch.uint8)
    if v_transposed:
        vc = torch.zeros((B, Hkv, D, cap), dtype=v8.dtype, device=v.device)
        vc.view(torch.uint8)[..., :S] = v8.view(torch.uint8).transpose(-1, -2)
    else:
        vc = torch.zeros((B, Hkv, cap, D), dtype=v8.dtype, device=v.device)
        vc.view(torch.uint8)[:, :, :S] = v8.view(torch.uint8)
    return kc, vc, kd, vd


def append_kv_fp8(k_cache8, v_cache8, k_new, v_new, cache_seqlens, k_descale, v_descale, *,
                  block_table=None, v_transposed: bool = False):
    """Write new tokens' keys and values into fp8 caches, quantised with the caches' descales.

    Args:
        k_cache8, v_cache8: the caches as ``decode`` reads them (contiguous or paged; V
            transposed with ``v_transposed``), updated in place.
        k_new, v_new: (B, Hkv, Nq, D) fp16/bf16/fp32: the new tokens of each sequence.
        cache_seqlens: (B,) int32: each sequence's length before the new tokens; token i of
            sequence b goes to position ``cache_seqlens[b] + i``. Decode afterwards with
            ``cache_seqlens + Nq``. Read on the host (a synchronisation for a GPU tensor).
        k_descale, v_descale: (B, Hkv) float32 (the cache's, e.g. from ``fp8_kv_cache``):
            ``x / descale``, saturated at the fp8 range, is what is stored.
        block_table: (B, max_pages) int32 for a paged cache.
    """
    import torch
    for name, t in (("k_cache8", k_cache8), ("v_cache8", v_cache8), ("k_new", k_new),
                    ("v_new", v_new), ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if not (is_fp8(k_cache8) and k_cache8.dtype == v_cache8.dtype):
        raise TypeError(f"k_cache8 and v_cache8 must share one fp8 dtype, got "
                        f"{k_cache8.dtype} and {v_cache8.dtype}")
    if not k_new.is_floating_point() or is_fp8(k_new) or tuple(v_new.shape) != tuple(k_new.shape):
        raise ValueError(f"k_new and v_new must be (B, Hkv, Nq, D) fp16/bf16/fp32 of one shape, "
                         f"got {tuple(k_new.shape)} {k_new.dtype} and {tuple(v_new.shape)}")
    if cache_seqlens.dtype != torch.int32:
        raise TypeError(f"cache_seqlens must be int32, got {cache_seqlens.dtype}")
    if k_new.ndim != 4 or k_cache8.ndim != 4:
        raise ValueError(f"k_new and the caches must have 4 dimensions, got "
                         f"{tuple(k_new.shape)} and {tuple(k_cache8.shape)}")
    B, Hkv, Nq, D = k_new.shape
    ks = tuple(k_cache8.shape)
    want_v = ks[:2] + (ks[3], ks[2]) if v_transposed else ks
    if tuple(v_cache8.shape) != want_v:
        raise ValueError(f"v_cache8 must be {want_v} for k_cache8 {ks} with "
                         f"v_transposed={v_transposed}, got {tuple(v_cache8.shape)}")
    if ks[1] != Hkv or ks[3] != D or tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"k_new {tuple(k_new.shape)} does not fit k_cache8 {ks} (heads, head "
                         f"dim) or cache_seqlens {tuple(cache_seqlens.shape)} (B,)")
    if block_table is None and ks[0] != B:
        raise ValueError(f"a contiguous cache holds B = {B} sequences, got {ks[0]}")
    dt = k_cache8.dtype
    fmax = FP8_MAX[_name(dt)]
    kd = _descale_tensor(k_descale, "k_descale", B, Hkv, k_new.device)[:, :, None, None]
    vd = _descale_tensor(v_descale, "v_descale", B, Hkv, k_new.device)[:, :, None, None]
    k8 = (k_new.float() / kd).clamp(-fmax, fmax).to(dt).view(torch.uint8)   # (B, Hkv, Nq, D)
    v8 = (v_new.float() / vd).clamp(-fmax, fmax).to(dt).view(torch.uint8)
    lens = cache_seqlens.to(device="cpu", dtype=torch.int64)
    pos = lens[:, None] + torch.arange(Nq)[None, :]                   # (B, Nq)
    if block_table is None:
        cap = ks[2]
        bad = (lens < 0) | (pos[:, -1] >= cap) if Nq else lens < 0
        if bool(bad.any()):
            raise ValueError(f"appending {Nq} tokens past the cache's {cap} slots (or a "
                             f"negative length): cache_seqlens {lens.tolist()}")
        page = torch.arange(B)[:, None].expand(B, Nq)
        slot = pos
    else:
        ps = ks[2]
        table = block_table.cpu().long()
        if bool((lens < 0).any()) or bool((pos // ps >= table.shape[1]).any()):
            raise ValueError(f"appending {Nq} tokens past the block table's "
                             f"{table.shape[1]} pages of {ps}: cache_seqlens {lens.tolist()}")
        page = table.gather(1, pos // ps)
        if bool(((page < 0) | (page >= ks[0])).any()):
            raise ValueError(f"block_table names pages outside [0, {ks[0]}) for the new tokens")
        slot = pos % ps
    page, slot = page.to(k_cache8.device), slot.to(k_cache8.device)
    # Advanced indices around a slice: the result's axes are (B, Nq, Hkv, D).
    k_cache8.view(torch.uint8)[page, :, slot, :] = k8.permute(0, 2, 1, 3)
    if v_transposed:
        v_cache8.view(torch.uint8)[page, :, :, slot] = v8.permute(0, 2, 1, 3)
    else:
        v_cache8.view(torch.uint8)[page, :, slot, :] = v8.permute(0, 2, 1, 3)
