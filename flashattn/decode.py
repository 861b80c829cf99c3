"""Decoding with a KV cache: split-KV attention for a few new tokens per sequence (issue 12).

    out = decode(q, k_cache, v_cache, cache_seqlens)                      # contiguous cache
    out = decode(q, k_cache, v_cache, cache_seqlens, block_table=table)   # paged cache

Two launches: ``decode_split_kernel`` (one program per row block x split x (batch, kv head),
partial outputs and log-sum-exps in fp32 scratch) and ``decode_combine_kernel`` (the exact LSE
merge, the output in q's dtype). See ``flashattn/kernels/decode.py`` for the algorithm and
``flashattn.reference.decode`` for its CPU reference.

Not exported from ``flashattn`` yet: it becomes public once its GPU tests
(``tests/test_decode_gpu.py``) have passed on a GPU.

CUDA graphs: lengths and page ids are read by the kernels from the device tensors, so a captured
call replays correctly after ``cache_seqlens`` (or ``block_table``) change in place, as long as
the split count was fixed at capture: pass ``num_splits`` (or let it default from the cache
capacity, which does not change), and keep the host checks off (``check_values`` defaults to
off for CUDA tensors).
"""
from __future__ import annotations

import functools
import math

from .contract import check_decode_tensors
from .kernels import (DECODE_COMBINE, DECODE_SPLIT, decode_combine_constants,
                      decode_combine_grid, decode_num_splits, decode_partial_shapes,
                      decode_split_constants, decode_split_grid)

__all__ = ["decode", "decode_plan"]


@functools.lru_cache(maxsize=None)
def _device_info(index: int) -> tuple[str, int]:
    """("sm_90", SM count) of a CUDA device, looked up once (host time per decode step counts)."""
    import torch
    props = torch.cuda.get_device_properties(index)
    return f"sm_{props.major}{props.minor}", props.multi_processor_count


def decode_plan(dims, *, num_splits=None, max_seqlen=None, sm_count: int, arch=None) -> dict:
    """The launch plan of a decode call (pure: no GPU): constants, grids, split count, scratch
    shapes. ``dims``: a ``contract.DecodeDims``."""
    rows = (dims.Hq // dims.Hkv) * dims.Nq
    page = dims.page_size if dims.paged else None
    split_c = decode_split_constants(rows=rows, head_dim=dims.D, page_size=page, arch=arch)
    comb_c = decode_combine_constants(split_tile_m=split_c["TILE_M"], head_dim=dims.D)
    if num_splits is None:
        bound = dims.capacity if max_seqlen is None else min(int(max_seqlen), dims.capacity)
        num_splits = decode_num_splits(B=dims.B, Hkv=dims.Hkv, rows=rows, max_seqlen=bound,
                                       head_dim=dims.D, sm_count=sm_count, page_size=page,
                                       arch=arch)
    if isinstance(num_splits, bool) or int(num_splits) != num_splits or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer, got {num_splits!r}")
    num_splits = int(num_splits)
    if num_splits > 65535:
        raise ValueError(f"num_splits must be at most 65535 (a grid axis), got {num_splits}")
    if dims.B * dims.Hkv > 65535:
        raise ValueError(f"B x Hkv = {dims.B * dims.Hkv} exceeds 65535 (a grid axis): decode "
                         "the batch in parts")
    opart_shape, lse_shape = decode_partial_shapes(num_splits=num_splits, B=dims.B,
                                                   Hkv=dims.Hkv, rows=rows,
                                                   tile_m=split_c["TILE_M"], head_dim=dims.D)
    return dict(rows=rows, num_splits=num_splits, split_constants=split_c,
                combine_constants=comb_c,
                split_grid=decode_split_grid(B=dims.B, Hkv=dims.Hkv, rows=rows,
                                             tile_m=split_c["TILE_M"], num_splits=num_splits),
                combine_grid=decode_combine_grid(B=dims.B, Hkv=dims.Hkv, rows=rows,
                                                 tile_m=comb_c["TILE_M"]),
                opart_shape=opart_shape, lse_shape=lse_shape)


def decode(q, k_cache, v_cache, cache_seqlens, *, block_table=None, scale=None,
           num_splits=None, max_seqlen=None, check_values=None, out=None):
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

    Returns:
        (B, Hq, Nq, D) in q's dtype. Query row i sits at position ``cache_seqlens[b] - Nq + i``
        and attends to keys ``0 ..`` that position; a row that sees no key gets 0 (as
        FlashAttention).

    Raises:
        TypeError, ValueError: as ``flashattn.contract.check_decode_tensors``.
    """
    import cuda.tile as ct
    import torch
    dims = check_decode_tensors(q, k_cache, v_cache, cache_seqlens, block_table, scale=scale,
                                check_values=check_values)
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
    arch, sm_count = _device_info(q.device.index if q.device.index is not None
                                  else torch.cuda.current_device())
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
    opart = torch.empty(plan["opart_shape"], dtype=torch.float32, device=q.device)
    lse = torch.empty(plan["lse_shape"], dtype=torch.float32, device=q.device)
    stream = torch.cuda.current_stream(q.device)
    ct.launch(stream, plan["split_grid"], DECODE_SPLIT.kernel(),
              DECODE_SPLIT.args(dict(Q=q_rows, K=k_cache, V=v_cache, BlockTable=table,
                                     SeqLens=seqlens, Opart=opart, Lse=lse),
                                dict(qk_scale=scale, num_q=Nq), plan["split_constants"]))
    ct.launch(stream, plan["combine_grid"], DECODE_COMBINE.kernel(),
              DECODE_COMBINE.args(dict(Opart=opart, Lse=lse, Out=out_rows), {},
                                  plan["combine_constants"]))
    return out
