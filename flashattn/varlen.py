"""Packed variable-length prefill: attention over sequences packed without padding (issue 12).

    out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=True)

The interface of FlashAttention's ``flash_attn_varlen_func`` (forward only): sequence ``b`` is
rows ``cu_seqlens_q[b] .. cu_seqlens_q[b+1] - 1`` of q and rows ``cu_seqlens_k[b] ..
cu_seqlens_k[b+1] - 1`` of k and v. One launch of ``varlen_fwd_kernel``
(``flashattn/kernels/varlen.py``), one program per (query tile, sequence, head); its CPU
reference is ``flashattn.reference.varlen_attention``.

Not exported from ``flashattn`` yet: it becomes public once its GPU tests
(``tests/test_varlen_gpu.py``) have passed on a GPU. The backward pass is not implemented for
packed sequences (``flashattn.launch_bwd`` takes the padded layout).
"""
from __future__ import annotations

import functools
import math

from .contract import check_varlen_tensors
from .kernels import VARLEN_FWD, hinted, varlen_config, varlen_constants, varlen_grid

__all__ = ["attention_varlen", "varlen_plan"]


@functools.lru_cache(maxsize=None)
def _arch(index: int) -> str:
    import torch
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm_{major}{minor}"


def varlen_plan(dims, *, max_seqlen_q: int, causal: bool, arch=None, config=None) -> dict:
    """The launch plan (pure: no GPU): configuration, constants, grid. ``dims``: a
    ``contract.VarlenDims``; ``config``: a ``steps.Config`` to pin (default
    ``kernels.varlen_config(arch, D)``)."""
    config = config or varlen_config(arch, dims.D)
    grid = varlen_grid(config, B=dims.B, Hq=dims.Hq, max_seqlen_q=max_seqlen_q)
    if dims.B > 65535 or dims.Hq > 65535:
        raise ValueError(f"B = {dims.B} sequences and Hq = {dims.Hq} heads must each be at most "
                         "65535 (grid axes): split the batch")
    return dict(config=config, grid=grid,
                constants=varlen_constants(config, head_dim=dims.D, causal=causal))


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool = False, scale: float | None = None,
                     check_values: bool = True, config=None, out=None):
    """Attention of sequences packed without padding (FlashAttention's varlen forward).

    Args:
        q: (total_q, Hq, D) float16 or bfloat16 CUDA tensor: every sequence's queries, one
            after the other.
        k, v: (total_k, Hkv, D), q's dtype and device; Hq % Hkv == 0 (GQA/MQA: query head h
            reads key/value head h // (Hq // Hkv)). Any strides with a contiguous last
            dimension (others are copied).
        cu_seqlens_q, cu_seqlens_k: (B + 1,) int32 on q's device: 0, then the cumulative
            lengths; ``cu_seqlens_q[-1] == total_q``, ``cu_seqlens_k[-1] == total_k``. Empty
            sequences are allowed.
        max_seqlen_q, max_seqlen_k: the longest query and key lengths (the grid is sized by
            ``max_seqlen_q``; a sequence longer than either is an error).
        causal: query row ``i`` of a sequence with ``len_q`` queries and ``len_k`` keys sits at
            position ``len_k - len_q + i`` and sees keys ``0 ..`` that position (bottom-right,
            as FlashAttention 2.1 and later; ``len_q == len_k`` is the usual causal mask)::

                len_q = len_k = 3          len_q = 2, len_k = 4
                    k0 k1 k2                   k0 k1 k2 k3
                q0   x  .  .               q0   x  x  x  .
                q1   x  x  .               q1   x  x  x  x
                q2   x  x  x

        scale: softmax scale, default 1/sqrt(D).
        check_values: read the offsets on the host and raise ValueError for a bad one (a
            synchronisation). With False (e.g. under CUDA-graph capture) the kernel clamps
            offsets for addressing and writes NaN for a sequence whose offsets are out of
            range or decreasing, or that is longer than ``max_seqlen_q`` / ``max_seqlen_k``.
        config: a ``steps.Config`` (tiles and hints) to pin; default
            ``kernels.varlen_config(arch, D)``.
        out: optional (total_q, Hq, D) output tensor of q's dtype (its last dimension
            contiguous).

    Returns:
        (total_q, Hq, D) in q's dtype. A row that sees no key (an empty key sequence, or
        causal with ``len_q > len_k``) is 0, as FlashAttention's.

    Raises:
        TypeError, ValueError: as ``flashattn.contract.check_varlen_tensors``; bad offsets (with
            ``check_values``) name the offset and the rule it breaks.
    """
    import cuda.tile as ct
    import torch
    from .contract import check_causal
    causal = check_causal(causal)
    dims = check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                causal=causal, scale=scale, check_values=check_values)
    if out is None:
        out = torch.empty((dims.total_q, dims.Hq, dims.D), dtype=q.dtype, device=q.device)
    elif (tuple(out.shape) != tuple(q.shape) or out.dtype != q.dtype or out.device != q.device
          or out.stride(-1) != 1):
        raise ValueError(f"out must be a {tuple(q.shape)} tensor of {q.dtype} on {q.device} "
                         f"with a contiguous last dimension, got {tuple(out.shape)} "
                         f"{out.dtype} on {out.device}")
    if dims.total_q == 0:
        return out
    if dims.total_k == 0:
        return out.zero_()                        # no sequence has a key: every row is 0
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(dims.D)
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    plan = varlen_plan(dims, max_seqlen_q=max_seqlen_q, causal=causal, arch=_arch(index),
                       config=config)
    cu_q = cu_seqlens_q if cu_seqlens_q.stride(0) == 1 else cu_seqlens_q.contiguous()
    cu_k = cu_seqlens_k if cu_seqlens_k.stride(0) == 1 else cu_seqlens_k.contiguous()
    # Head-major views, no copy: (total, H, D) -> (H, total, D).
    args = VARLEN_FWD.args(
        dict(Q=q.permute(1, 0, 2), K=k.permute(1, 0, 2), V=v.permute(1, 0, 2),
             Out=out.permute(1, 0, 2), CuSeqlensQ=cu_q, CuSeqlensK=cu_k),
        dict(qk_scale=scale, group_size=dims.Hq // dims.Hkv, max_seqlen_q=max_seqlen_q,
             max_seqlen_k=max_seqlen_k),
        plan["constants"])
    with torch.cuda.device(q.device):
        ct.launch(torch.cuda.current_stream(q.device), plan["grid"],
                  hinted(VARLEN_FWD.kernel(), plan["config"].hints()), args)
    return out
