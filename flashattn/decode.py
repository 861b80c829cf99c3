"""Decoding with a KV cache: split-KV attention for a few new tokens per sequence (chapter 12).

    import flashattn
    out = flashattn.decode(q, k_cache, v_cache, cache_seqlens)                  # contiguous
    out = flashattn.decode(q, k_cache, v_cache, cache_seqlens, block_table=bt)  # paged cache

    # q (B, Hq, Nq, D) fp16/bf16, 1 <= Nq <= 16: the new tokens, already written to the cache;
    # cache_seqlens (B,) int32 on the GPU: each sequence's length, new tokens included.
    # Paged: k_cache, v_cache (num_pages, Hkv, page_size, D), block_table (B, max_pages) int32.
    # Under a CUDA graph: fix num_splits (or max_seqlen), update cache_seqlens/bt in place.

Two launches: ``decode_split_kernel`` (one program per row block x split x (batch, kv head),
partial outputs and log-sum-exps in fp32 scratch) and ``decode_combine_kernel`` (the exact LSE
merge, the output in q's dtype); one launch when the split rule picks one split (large batches
fill the GPU without splitting): the split kernel writes the output (``FINAL``). See
``flashattn/kernels/decode.py`` for the algorithm and ``flashattn.reference.decode`` for its CPU
reference.

``flashattn.decode`` is this function; the module is ``sys.modules["flashattn.decode"]``
(``importlib.import_module("flashattn.decode")``). The launch plan (tiles, splits, grids) is the
pure ``kernels.decode_spec.decode_plan``; this module validates, allocates and launches.

CUDA graphs: lengths and page ids are read by the kernels from the device tensors, so a captured
call replays correctly after ``cache_seqlens`` (or ``block_table``) change in place, as long as
the split count was fixed at capture: pass ``num_splits`` (or let it default from the cache
capacity, which does not change), and keep the host checks off (``check_values`` defaults to
off for CUDA tensors).

When ``flashattn.attention(step="best")`` is a decode step it routes here
(``flashattn.api.prefer_decode``, chapter 12).
"""
from __future__ import annotations

import math

from .contract import check_decode_tensors, check_optional_int, check_out
from .dispatch import device_arch, device_sm_count, expect, interpreting, launch_kernel
from .kernels import DECODE_COMBINE, DECODE_COMBINE_ROW, DECODE_SPLIT, DECODE_SPLIT_HINTS, hinted
from .kernels.decode_spec import decode_plan, decode_steps

__all__ = ["decode", "decode_plan", "launch_decode"]


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
        k_descale, v_descale: for fp8 caches (float8_e4m3fn or float8_e5m2, chapter 14): (B, Hkv)
            float32 descales (``flashattn.fp8.quantize_fp8``), required; the caches are read as
            fp8 (``flashattn.fp8.decode_fp8``). Given with fp16/bf16 caches: ValueError.
        v_transposed: fp8 caches only: v_cache stored (B, Hkv, D, S), paged (num_pages, Hkv,
            D, page_size), and both products run on FP8 tensor cores
            (``flashattn.fp8.fp8_kv_cache`` makes such a cache; chapter 14).

    Returns:
        (B, Hq, Nq, D) in q's dtype. Query row i sits at position ``cache_seqlens[b] - Nq + i``
        and attends to keys ``0 ..`` that position; a row that sees no key gets 0 (as
        FlashAttention).

    Raises:
        TypeError, ValueError: as ``flashattn.contract.check_decode_tensors``.
    """
    if any(str(getattr(t, "dtype", "")).replace("torch.", "") in ("float8_e4m3fn", "float8_e5m2")
           for t in (k_cache, v_cache)):
        from .fp8 import decode_fp8          # an fp8 KV cache (chapter 14)
        return decode_fp8(q, k_cache, v_cache, cache_seqlens, k_descale=k_descale,
                          v_descale=v_descale, block_table=block_table, scale=scale,
                          num_splits=num_splits, max_seqlen=max_seqlen,
                          check_values=check_values, out=out, v_transposed=v_transposed)
    if v_transposed is not False:
        raise ValueError("v_transposed=True applies to fp8 caches only (the FP8-MMA decode); "
                         f"the caches are {getattr(k_cache, 'dtype', None)}")
    if k_descale is not None or v_descale is not None:
        raise ValueError("k_descale and v_descale apply to fp8 caches only; the caches are "
                         f"{getattr(k_cache, 'dtype', None)} (quantise with "
                         "flashattn.fp8.quantize_fp8)")
    interp = interpreting(getattr(q, "device", None))
    dims = check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                                check_values=check_values, interpret=interp)
    check_optional_int("max_seqlen", max_seqlen, minimum=0)   # num_splits: decode_plan
    check_out(out)
    return launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, dims, scale=scale,
                         num_splits=num_splits, max_seqlen=max_seqlen, out=out)


def launch_decode(q, k_cache, v_cache, cache_seqlens, block_table, dims, *, scale=None,
                  num_splits=None, max_seqlen=None, out=None):
    """``decode`` on inputs its contract has passed (``dims``: what it found): the plan and
    the launches, no check of the tensors again."""
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
    arch, sm_count = device_arch(q.device), device_sm_count(q.device)   # interpreted: its GPU
    plan = decode_plan(dims, num_splits=num_splits, max_seqlen=max_seqlen, sm_count=sm_count,
                       arch=arch)
    rows = plan["rows"]
    # The query heads of one GQA group, packed as rows: (B, Hq, Nq, D) -> (B, Hkv, G*Nq, D).
    q_rows = q.contiguous().view(B, Hkv, rows, D)
    out_rows = out.view(B, Hkv, rows, D)
    if block_table is None:
        # Never read (PAGED=False): a placeholder for the kernel's BlockTable parameter.
        table = torch.empty((1, 1), dtype=torch.int32, device=q.device)
    else:
        table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    seqlens = cache_seqlens if cache_seqlens.stride(-1) == 1 else cache_seqlens.contiguous()
    final = plan["combine"] is None
    # FINAL (one split): the split kernel writes out itself; Opart and Lse are never touched.
    opart = torch.empty((1, 1, 1, 1) if final else plan["opart_shape"], dtype=torch.float32,
                        device=q.device)
    lse = torch.empty((1, 1, 1) if final else plan["lse_shape"], dtype=torch.float32,
                      device=q.device)
    split_kernel = hinted(DECODE_SPLIT.kernel(), DECODE_SPLIT_HINTS.get(arch, {}))
    with expect(q.device, lambda: decode_steps(plan, seqlens, dims), "flashattn.decode"):
        launch_kernel(q.device, plan["split_grid"], split_kernel,
                      DECODE_SPLIT.args(dict(Q=q_rows, K=k_cache, V=v_cache, BlockTable=table,
                                             SeqLens=seqlens, Opart=opart, Lse=lse,
                                             Out=out_rows),
                                        dict(qk_scale=scale, num_q=Nq),
                                        plan["split_constants"]))
        if plan["combine"] in ("row", "block"):
            spec = DECODE_COMBINE_ROW if plan["combine"] == "row" else DECODE_COMBINE
            launch_kernel(q.device, plan["combine_grid"], spec.kernel(),
                          spec.args(dict(Opart=opart, Lse=lse, Out=out_rows), {},
                                    plan["combine_constants"]))
    return out
