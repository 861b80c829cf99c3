"""Multi-head latent attention decoding with FlashMLA's interface.

    import flashattn
    meta, splits = flashattn.get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)
    out, lse = flashattn.flash_mla_with_kvcache(q, kv_cache, block_table, cache_seqlens, 512,
                                                meta, splits, causal=True)

q (B, Sq, Hq, 576) bf16/fp16; kv_cache (num_pages, page_size, Hkv, 576) of q's dtype, or
float8_e4m3fn with ``descale=`` (a float or (B,) float32 per sequence); block_table
(B, max_pages) int32; cache_seqlens (B,) int32. Returns out (B, Sq, Hq, head_dim_v) in q's
dtype and lse (B, Hq, Sq) float32 (natural log; +inf for a query that sees no key, whose
output is 0). The kernels are ``flashattn/kernels/mla_decode.py``.

The metadata is this package's own: ``tile_scheduler_metadata`` an int32 CPU tensor holding
the split count chosen for the GPU and the longest sequence, ``num_splits`` FlashMLA's (B + 1,)
int32 cumulative split counts on cache_seqlens' device.
"""
from __future__ import annotations

import math

from .contract import check_kernel_device, check_rank, check_torch_tensors
from .dispatch import device_arch, device_sm_count, expect, interpreting, launch_kernel
from .kernels.mla_decode_spec import (MLA_COMBINE, MLA_HINTS, MLA_SPLIT, MLA_SPLIT_FP8, MlaDims,
                                      mla_num_splits, mla_plan, mla_steps)
from .kernels.spec import hinted

__all__ = ["get_mla_metadata", "flash_mla_with_kvcache"]

_DTYPES = ("float16", "bfloat16")
_FP8 = ("float8_e4m3fn",)


def _dt(t) -> str:
    return str(getattr(t, "dtype", "")).replace("torch.", "")


def _require(ok: bool, msg: str, exc=ValueError):
    if not ok:
        raise exc(msg)


def _tensor(name, t, *, ndim, dtypes, device=None):
    """The contract's per-argument rules (a tensor, its rank, one device), and the dtypes this
    entry point takes (an FP8 cache among them, which the dense rules do not have)."""
    check_torch_tensors(**{name: t})
    check_rank(name, t.shape, ndim)
    _require(_dt(t) in dtypes, f"{name} must be {' or '.join(dtypes)}, got {_dt(t)}", TypeError)
    if device is not None:
        _require(t.device == device, f"{name} is on {t.device}, q on {device}: put them on one "
                 "device")


def get_mla_metadata(cache_seqlens, num_heads_per_head_k: int, num_heads_k: int):
    """The split plan of a decode step, as FlashMLA's ``get_mla_metadata``.

    cache_seqlens (B,) int32; num_heads_per_head_k: ``Sq * Hq // Hkv`` (query rows per cache
    head); num_heads_k: Hkv. Reads the longest length on the host (one synchronisation; call
    it once per step, not per layer). Returns ``(tile_scheduler_metadata, num_splits)``.
    """
    import torch
    _tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=("int32",))
    for name, v in (("num_heads_per_head_k", num_heads_per_head_k),
                    ("num_heads_k", num_heads_k)):
        _require(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                 f"{name} must be a positive int, got {v!r}", TypeError)
    _device_ok(cache_seqlens)
    B = cache_seqlens.shape[0]
    _require(B >= 1, "cache_seqlens is empty: no sequence to decode")
    max_len = int(cache_seqlens.max().item())
    _require(int(cache_seqlens.min().item()) >= 0, "cache_seqlens must be >= 0")
    sm_count = device_sm_count(cache_seqlens.device)
    # FlashMLA's pages are 64 tokens; a call with smaller pages splits the same runs finer.
    splits = mla_num_splits(B=B, Hkv=num_heads_k, rows=num_heads_per_head_k,
                            max_seqlen=max_len, page_size=64, sm_count=sm_count,
                            arch=device_arch(cache_seqlens.device))
    meta = torch.tensor([[splits, num_heads_per_head_k, num_heads_k, max_len]],
                        dtype=torch.int32)
    cum = torch.arange(B + 1, dtype=torch.int32, device=cache_seqlens.device) * splits
    return meta, cum


def _device_ok(t):
    check_kernel_device(t, interpreting(t.device), "the MLA kernels run",
                        "flashattn.reference.mla.mla_decode_reference")


def _check(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
           descale) -> MlaDims:
    import torch
    _tensor("q", q, ndim=4, dtypes=_DTYPES)
    dev = q.device
    _device_ok(q)
    _tensor("k_cache", k_cache, ndim=4, dtypes=(_dt(q),) + _FP8, device=dev)
    _tensor("block_table", block_table, ndim=2, dtypes=("int32",), device=dev)
    _tensor("cache_seqlens", cache_seqlens, ndim=1, dtypes=("int32",), device=dev)
    B, Sq, Hq, D = q.shape
    num_pages, page_size, Hkv, Dk = k_cache.shape
    _require(Dk == D, f"q's head dim {D} differs from k_cache's {Dk}")
    _require(isinstance(head_dim_v, int) and not isinstance(head_dim_v, bool),
             f"head_dim_v must be an int, got {head_dim_v!r}", TypeError)
    d_rope = D - head_dim_v
    _require(16 <= head_dim_v < D and head_dim_v & (head_dim_v - 1) == 0,
             f"head_dim_v must be a power of two >= 16 and below the head dim {D}, got "
             f"{head_dim_v}")
    _require(d_rope >= 16 and d_rope & (d_rope - 1) == 0 and head_dim_v % d_rope == 0,
             f"the rotary part (head dim {D} - head_dim_v {head_dim_v} = {d_rope}) must be a "
             "power of two >= 16 that divides head_dim_v (DeepSeek-V3: 576 = 512 + 64)")
    _require(B >= 1 and Sq >= 1 and Hq >= 1, f"q has an empty dimension: {tuple(q.shape)}")
    _require(Sq <= 16, f"at most 16 new tokens per sequence (q's dim 1), got {Sq}")
    _require(Hkv >= 1 and Hq % Hkv == 0, f"q's {Hq} heads are not a multiple of the cache's "
             f"{Hkv} heads")
    _require(page_size >= 16 and page_size % 16 == 0,
             f"page size (k_cache's dim 1) must be a positive multiple of 16, got {page_size}")
    _require(block_table.shape[0] == B, f"block_table has {block_table.shape[0]} rows, q has "
             f"batch {B}")
    _require(tuple(cache_seqlens.shape) == (B,), f"cache_seqlens must be ({B},), got "
             f"{tuple(cache_seqlens.shape)}")
    _require(k_cache.stride(-1) == 1, "k_cache's last dimension must be contiguous")
    _require(isinstance(causal, bool), f"causal must be a bool, got {causal!r}", TypeError)
    if softmax_scale is not None:
        _require(isinstance(softmax_scale, (int, float)) and not isinstance(softmax_scale, bool)
                 and math.isfinite(softmax_scale) and softmax_scale > 0,
                 f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    fp8 = _dt(k_cache) in _FP8
    if fp8:
        _require(descale is not None, "an FP8 k_cache needs descale= (a float or a (B,) "
                 "float32 tensor: the factor that maps the stored values back)")
        if torch.is_tensor(descale):
            _tensor("descale", descale, ndim=descale.dim(), dtypes=("float32",), device=dev)
            _require(descale.numel() in (1, B), f"descale must hold 1 or {B} values, got "
                     f"{tuple(descale.shape)}")
    else:
        _require(descale is None, f"descale applies to an FP8 k_cache only; k_cache is "
                 f"{_dt(k_cache)}")
    if dev.type != "cuda":        # the interpreter: values are on the host, check them
        bt, lens = block_table.cpu(), cache_seqlens.cpu()
        _require(bool((lens >= 0).all()) and bool((lens <= block_table.shape[1] * page_size).all()),
                 f"cache_seqlens must be in 0..{block_table.shape[1] * page_size} (the block "
                 f"table's capacity), got {lens.tolist()}")
        for b in range(B):
            used = bt[b, :-(-int(lens[b]) // page_size)]
            _require(bool(((used >= 0) & (used < num_pages)).all()),
                     f"block_table row {b} holds page ids outside 0..{num_pages - 1}: "
                     f"{used.tolist()}")
    return MlaDims(B=B, Sq=Sq, Hq=Hq, Hkv=Hkv, D=D, Dv=head_dim_v, page_size=page_size,
                   max_pages=block_table.shape[1], num_pages=num_pages)


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v: int,
                           tile_scheduler_metadata, num_splits, softmax_scale=None,
                           causal: bool = False, *, descale=None):
    """MLA decoding over a paged latent cache, as FlashMLA's ``flash_mla_with_kvcache``.

    The cache holds each token's latent vector (its first ``head_dim_v`` values, also V) and
    rotary part; every query head reads the same cache head. ``causal``: new token ``t`` of a
    sequence of length ``n`` sees keys ``0 .. n - Sq + t``. ``descale``: an FP8 cache's factor
    (a float, a 1-element tensor, or (B,) float32). Bad metadata, shapes, dtypes or devices
    raise TypeError/ValueError naming the problem; on a GPU, a length or page id out of range
    gives NaN for that sequence (checked on the host in the interpreter).
    """
    import torch
    dims = _check(q, k_cache, block_table, cache_seqlens, head_dim_v, softmax_scale, causal,
                  descale)
    _require(torch.is_tensor(tile_scheduler_metadata) and tile_scheduler_metadata.dim() == 2
             and tile_scheduler_metadata.shape[1] >= 1,
             "tile_scheduler_metadata must be the first value get_mla_metadata returned",
             TypeError)
    meta = tile_scheduler_metadata.cpu()
    splits = int(meta[0, 0])
    if meta.shape[1] >= 3:
        _require(int(meta[0, 1]) == dims.rows and int(meta[0, 2]) == dims.Hkv,
                 f"the metadata was made for {int(meta[0, 1])} rows per cache head and "
                 f"{int(meta[0, 2])} cache heads; this call has {dims.rows} and {dims.Hkv}: "
                 "call get_mla_metadata(cache_seqlens, s_q * h_q // h_kv, h_kv)")
    _require(torch.is_tensor(num_splits) and tuple(num_splits.shape) == (dims.B + 1,),
             f"num_splits must be the (B + 1,) tensor get_mla_metadata returned", TypeError)
    fp8 = _dt(k_cache) in _FP8
    B, Sq, Hq, D = q.shape
    Hkv, G, Dv = dims.Hkv, Hq // dims.Hkv, head_dim_v
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    dev = q.device
    arch = device_arch(dev)
    plan = mla_plan(dims, num_splits=splits, causal=causal, fp8=fp8, arch=arch)
    rows = dims.rows
    if Hkv == 1:                      # (B, Sq, Hq, D) is already (B, 1, Sq * Hq, D): no copy
        q_rows = q.contiguous().view(B, 1, rows, D)
    else:                             # row t * G + g of cache head h is head h * G + g
        q_rows = q.view(B, Sq, Hkv, G, D).permute(0, 2, 1, 3, 4).reshape(B, Hkv, rows, D)
    out_rows = torch.empty((B, Hkv, rows, Dv), dtype=q.dtype, device=dev)
    lse_rows = torch.empty((B, Hkv, rows), dtype=torch.float32, device=dev)
    if fp8:
        d = descale if torch.is_tensor(descale) else torch.tensor([float(descale)], device=dev)
        d = d.reshape(-1).to(torch.float32).expand(B).contiguous()
    else:
        d = torch.ones((1,), dtype=torch.float32, device=dev)      # never read (FP8=False)
    final = plan["combine_constants"] is None
    opart = torch.empty((1, 1, 1, 1) if final else plan["opart_shape"], dtype=torch.float32,
                        device=dev)
    lse = torch.empty((1, 1, 1) if final else plan["lse_shape"], dtype=torch.float32, device=dev)
    table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    spec = MLA_SPLIT_FP8 if fp8 else MLA_SPLIT
    split_kernel = hinted(spec.kernel(), MLA_HINTS.get(arch, {}))
    with expect(dev, lambda: mla_steps(plan, cache_seqlens.cpu(), dims),
                "flashattn.flash_mla_with_kvcache"):
        launch_kernel(dev, plan["split_grid"], split_kernel,
                      spec.args(dict(Q=q_rows, KV=k_cache, BlockTable=table,
                                     SeqLens=cache_seqlens.contiguous(), Descale=d,
                                     Opart=opart, Lse=lse, Out=out_rows, LseOut=lse_rows),
                                dict(qk_scale=scale, num_q=Sq), plan["split_constants"]))
        if not final:
            launch_kernel(dev, plan["combine_grid"], MLA_COMBINE.kernel(),
                          MLA_COMBINE.args(dict(Opart=opart, Lse=lse, Out=out_rows,
                                                LseOut=lse_rows), {},
                                           plan["combine_constants"]))
    # Rows back to FlashMLA's layouts: out (B, Sq, Hq, Dv), lse (B, Hq, Sq).
    out = out_rows.view(B, Hkv, Sq, G, Dv).permute(0, 2, 1, 3, 4).reshape(B, Sq, Hq, Dv)
    lse_out = lse_rows.view(B, Hkv, Sq, G).permute(0, 1, 3, 2).reshape(B, Hq, Sq)
    return out, lse_out
