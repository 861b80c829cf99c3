"""Decoding with a KV cache: split-KV attention for a few new tokens per sequence, over a 16-bit or
an fp8 cache, contiguous or paged; and the fp8 cache's helpers.

    import flashattn
    out = flashattn.decode(q, k_cache, v_cache, cache_seqlens)                  # contiguous
    out = flashattn.decode(q, k_cache, v_cache, cache_seqlens, block_table=bt)  # paged cache
    # an fp8 cache, V transposed (both products on FP8 tensor cores):
    k8, v8t, kd, vd = flashattn.decoding.fp8_kv_cache(k, v, capacity=4096, v_transposed=True)
    flashattn.decoding.append_kv_fp8(k8, v8t, k_new, v_new, lens, kd, vd, v_transposed=True)
    out = flashattn.decode(q, k8, v8t, lens + 1, k_descale=kd, v_descale=vd, v_transposed=True)

Two launches: the split kernel (one program per row block x split x (batch, kv head), partial
outputs and log-sum-exps in fp32 scratch) and a combine (the exact LSE merge, the output in q's
dtype); one launch when the plan picks one split: the split kernel writes the output
(``FINAL``). ``kernels/decode.py`` has the algorithm, ``kernels/decode_spec.decode_plan`` the
pure plan, ``reference/decode.py`` the CPU reference; this module validates, allocates and
launches.

CUDA graphs: lengths and page ids are read by the kernels from the device tensors, so a captured
call replays correctly after ``cache_seqlens`` (or ``block_table``) change in place, as long as
the split count was fixed at capture: pass ``num_splits`` (or let it default from the cache
capacity, which does not change), and keep the host checks off (``check_values`` defaults to
off for CUDA tensors).
"""
from __future__ import annotations

import math

from .contract import check_decode, check_decode_tensors, check_optional_int, check_out
from .dispatch import expect, launch_kernel, on_device, target_of
from .kernels import DECODE_COMBINE, DECODE_COMBINE_ROW, hinted
from .kernels.decode_spec import (DECODE_FP8_DTYPES, decode_plan, decode_split_spec,
                                  decode_steps)

__all__ = ["decode", "decode_plan", "launch_decode", "fp8_kv_cache", "append_kv_fp8"]


def decode(q, k_cache, v_cache, cache_seqlens, *, block_table=None, scale=None,
           num_splits=None, max_seqlen=None, check_values=None, out=None, k_descale=None,
           v_descale=None, v_transposed=False):
    """Attention of a few new tokens per sequence over a KV cache, split across the cache.

    Args:
        q: (B, Hq, Nq, D) float16 or bfloat16, 1 <= Nq <= 16: the new tokens, whose keys and
            values are already the last Nq entries of each sequence's cache.
        k_cache, v_cache: contiguous (B, Hkv, S, D), or paged (num_pages, Hkv, page_size, D)
            with ``block_table``; q's dtype; the last dimension contiguous. Hq % Hkv == 0.
            (A cache kept as (num_pages, page_size, Hkv, D), as vLLM and FlashAttention do,
            can be passed as ``cache.transpose(1, 2)``: no copy.)
        cache_seqlens: (B,) int32 on q's device: sequence b's keys are its first
            ``cache_seqlens[b]`` cache entries (0 allowed).
        block_table: (B, max_pages) int32: slot p of sequence b is page ``block_table[b, p]``;
            page_size a multiple of 16. None: contiguous cache.
        scale: softmax scale, default 1/sqrt(D).
        num_splits: how many programs share one sequence's cache; default
            ``kernels.decode_num_splits`` for this GPU and the cache capacity (or
            ``max_seqlen``). Fix it for a CUDA graph.
        max_seqlen: an upper bound on ``cache_seqlens`` the caller knows (only shapes the
            default split count; lengths above it are still correct).
        check_values: read the lengths and page ids on the host and raise ValueError for a
            length past the cache or a page out of range (a synchronisation; not allowed under
            CUDA-graph capture). Default: off for CUDA tensors, where the kernel clamps bad
            values for addressing and writes NaN for the affected sequences.
        out: optional (B, Hq, Nq, D) contiguous output tensor of q's dtype.
        k_descale, v_descale: for fp8 caches (float8_e4m3fn or float8_e5m2): (B, Hkv)
            float32 descales (``flashattn.quantize_fp8``), required: k_descale folds into the
            softmax scale, v_descale into each split's output. Given with fp16/bf16 caches:
            ValueError. fp8 caches need a head dim that is a multiple of 16.
        v_transposed: fp8 caches only: v_cache stored (B, Hkv, D, S), paged (num_pages, Hkv,
            D, page_size), and both products run on FP8 tensor cores (q rounded to fp8 per
            row, P to fp8 scaled by 2^8); ``fp8_kv_cache`` makes such a cache. False: V in K's
            layout, the tiles widened to q's dtype on chip (q kept in fp16: a smaller error).

    Returns:
        (B, Hq, Nq, D) in q's dtype. Query row i sits at position ``cache_seqlens[b] - Nq + i``
        and attends to keys ``0 ..`` that position; a row that sees no key gets 0 (as
        FlashAttention).

    Raises:
        TypeError, ValueError: as ``flashattn.contract.check_decode_tensors``.
    """
    target = target_of(getattr(q, "device", None))      # asked once, passed down
    if any(_dtype_name(t) in DECODE_FP8_DTYPES for t in (k_cache, v_cache)):
        dims, k_descale, v_descale = _check_fp8_cache(q, k_cache, v_cache, cache_seqlens,
                                                      block_table, scale, check_values,
                                                      k_descale, v_descale, v_transposed,
                                                      target.interpreting)
    else:
        if v_transposed is not False:
            raise ValueError("v_transposed=True applies to fp8 caches only (the FP8-MMA "
                             f"decode); the caches are {getattr(k_cache, 'dtype', None)}")
        if k_descale is not None or v_descale is not None:
            raise ValueError("k_descale and v_descale apply to fp8 caches only; the caches are "
                             f"{getattr(k_cache, 'dtype', None)} (quantise with "
                             "flashattn.quantize_fp8)")
        dims = check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table,
                                    scale=scale, check_values=check_values,
                                    interpret=target.interpreting)
    check_optional_int("max_seqlen", max_seqlen, minimum=0)   # num_splits: decode_plan
    check_out(out)
    return launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, dims, target,
                         scale=scale, num_splits=num_splits, max_seqlen=max_seqlen, out=out,
                         k_descale=k_descale, v_descale=v_descale, v_transposed=v_transposed)


def _dtype_name(t) -> str:
    return str(getattr(t, "dtype", "")).replace("torch.", "")


def _check_fp8_cache(q, k_cache, v_cache, cache_seqlens, block_table, scale, check_values,
                     k_descale, v_descale, v_transposed, interp):
    """``decode``'s checks for fp8 caches: (dims, k_descale, v_descale as (B, Hkv) float32).
    ``interp``: whether the interpreter runs q's device."""
    import torch
    from .fp8_attention import _check_arch
    from .fp8_quant import _descale_tensor
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                    ("cache_seqlens", cache_seqlens)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not isinstance(v_transposed, bool):
        raise TypeError(f"v_transposed must be a bool, got {type(v_transposed).__name__}")
    if _dtype_name(q) not in ("float16", "bfloat16"):
        raise TypeError(f"q has dtype {q.dtype}; decoding over an fp8 cache takes float16 or "
                        "bfloat16 queries")
    if _dtype_name(k_cache) not in DECODE_FP8_DTYPES or k_cache.dtype != v_cache.dtype:
        raise TypeError(f"k_cache and v_cache must share one fp8 dtype "
                        f"({' or '.join(DECODE_FP8_DTYPES)}), got {k_cache.dtype} and "
                        f"{v_cache.dtype}")
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
    from .contract import check_kernel_device
    check_kernel_device(q, interp, "the decode kernels run", "flashattn.reference.decode")
    _check_arch(q.device, interp)
    if dims.D % 16:
        raise ValueError(f"an fp8 cache needs a head dim that is a multiple of 16 (16-byte "
                         f"rows), got D = {dims.D}")
    B, Hkv = q.shape[0], dims.Hkv
    return (dims, _descale_tensor(k_descale, "k_descale", B, Hkv, q.device),
            _descale_tensor(v_descale, "v_descale", B, Hkv, q.device))


def launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, dims, target, *,
                  scale=None, num_splits=None, max_seqlen=None, out=None, k_descale=None,
                  v_descale=None, v_transposed=False):
    """``decode`` on inputs its contract has passed (``dims``: what it found; ``target``: the
    ``dispatch.Target`` of q's device; fp8 caches: the descales as (B, Hkv) float32 tensors):
    the plan and the launches, no check again."""
    import torch
    B, Hq, Nq, D = q.shape
    Hkv = dims.Hkv
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if out is None:
        out = torch.empty((B, Hq, Nq, D), dtype=q.dtype, device=q.device)
    elif (tuple(out.shape) != (B, Hq, Nq, D) or out.dtype != q.dtype or out.device != q.device
          or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous {(B, Hq, Nq, D)} tensor of {q.dtype} on "
                         f"{q.device}, got {tuple(out.shape)} {out.dtype} on {out.device}")
    cache = _dtype_name(k_cache)
    plan = decode_plan(dims, cache=cache, v_transposed=v_transposed, num_splits=num_splits,
                       max_seqlen=max_seqlen, sm_count=target.sm_count,
                       arch=target.arch)                   # interpreted: the GPU it stands in for
    rows = plan["rows"]
    # The query heads of one GQA group, packed as rows: (B, Hq, Nq, D) -> (B, Hkv, G*Nq, D).
    q_rows = q.contiguous().view(B, Hkv, rows, D)
    out_rows = out.view(B, Hkv, rows, D)

    def placeholder(*shape, dtype=torch.float32):
        return torch.empty(shape, dtype=dtype, device=q.device)       # never read

    if block_table is None:
        table = placeholder(1, 1, dtype=torch.int32)                  # PAGED=False
    else:
        table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    seqlens = cache_seqlens if cache_seqlens.stride(-1) == 1 else cache_seqlens.contiguous()
    final = plan["combine"] is None
    # FINAL (one split): the split kernel writes out itself; Opart and Lse are never touched.
    opart = placeholder(1, 1, 1, 1) if final else placeholder(*plan["opart_shape"])
    lse = placeholder(1, 1, 1) if final else placeholder(*plan["lse_shape"])
    fp8 = plan["split_constants"]["KV_FP8"]
    spec = decode_split_spec(cache if fp8 else None)
    arrays = dict(Q=q_rows, K=k_cache, V=v_cache, BlockTable=table, SeqLens=seqlens,
                  KDescale=k_descale if fp8 else placeholder(1, 1),
                  VDescale=v_descale if fp8 else placeholder(1, 1),
                  Opart=opart, Lse=lse, Out=out_rows)
    launches = [(plan["split_grid"], hinted(spec.kernel(), plan["hints"]),
                 spec.args(arrays, dict(qk_scale=scale, num_q=Nq), plan["split_constants"]))]
    if plan["combine"] in ("row", "block"):
        cspec = DECODE_COMBINE_ROW if plan["combine"] == "row" else DECODE_COMBINE
        launches.append((plan["combine_grid"], cspec.kernel(),
                         cspec.args(dict(Opart=opart, Lse=lse, Out=out_rows), {},
                                    plan["combine_constants"])))
    steps = lambda: decode_steps(plan, seqlens, dims)       # noqa: E731 (interpreted only)
    with on_device(target), expect(target, steps, "flashattn.decode"):
        for grid, kernel, args in launches:
            launch_kernel(target, grid, kernel, args)
    return out


# --- fp8 KV caches: made from a prefill, appended to ------------------------------------------
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
                "flashattn.decoding.fp8_kv_cache)" if vs == ks and ks[2] != ks[3] else "")
        raise ValueError(f"v_transposed=True takes v_cache as {lay} = {want} for k_cache "
                         f"{ks}, got {vs}{hint}")



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
    from .fp8_quant import quantize_fp8
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
    from .fp8_quant import FP8_MAX, _descale_tensor, is_fp8
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
    fmax = FP8_MAX[_dtype_name(k_cache8)]
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
