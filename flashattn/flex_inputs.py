"""What PyTorch's ``flex_attention`` accepts and the flex kernels do not take as such, brought to
their form on the host (``flashattn.flex_attention`` calls ``adapt`` first):

* the empty ``BlockMask`` PyTorch builds for ``block_mask=None`` (``_create_empty_block_mask``:
  one block of 2^30 that covers everything, ``seq_lengths=(1, 1)``): no block mask;
* K and V with batch 1 beside a query of batch B (PyTorch broadcasts them): expanded over B
  (autograd sums their gradients back);
* a value head dim Dv different from the query's D (MLA prefill: 192 / 128): the narrower side
  zero-padded to the wider (Q and K padded leave the scores unchanged; V padded adds output
  columns that are cut off), the default scale kept at 1/sqrt(D). It costs the padded width's
  work: a kernel with two head dims would not.

Gradients flow through the expansion, the padding and the cut, so the backward is exact.
"""
from __future__ import annotations

from .value_dim import differs, pad_heads

__all__ = ["adapt", "is_empty_block_mask"]

# PyTorch's _LARGE_SPARSE_BLOCK_SIZE: the block of its empty mask
_LARGE_BLOCK = 1 << 30


def is_empty_block_mask(bm) -> bool:
    """Whether ``bm`` is PyTorch's stand-in for no block mask (``_create_empty_block_mask``)."""
    from torch.nn.attention.flex_attention import BlockMask, noop_mask
    if not isinstance(bm, BlockMask) or tuple(bm.seq_lengths) != (1, 1):
        return False
    bs = bm.BLOCK_SIZE
    qb, kb = (bs, bs) if isinstance(bs, int) else tuple(bs)
    if qb < _LARGE_BLOCK or kb < _LARGE_BLOCK or bm.mask_mod is not noop_mask:
        return False
    num, idx = bm.kv_num_blocks, bm.kv_indices
    return (tuple(num.shape[2:]) == (1,) and tuple(idx.shape[2:]) == (1, 1) and
            bool((num == 1).all()) and bool((idx == 0).all()) and
            (bm.full_kv_num_blocks is None or not bool(bm.full_kv_num_blocks.any())))


def adapt(query, key, value, block_mask, scale):
    """(query, key, value, block_mask, scale, dv): the inputs in the kernels' form; ``dv``: the
    output's width to keep (None: all of it). Inputs that are not 4-D tensors pass unchanged
    (the caller's checks name what is wrong)."""
    import torch
    if block_mask is not None and is_empty_block_mask(block_mask):
        block_mask = None
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value)):
        return query, key, value, block_mask, scale, None
    B = query.shape[0]
    if B > 1 and key.shape[0] == 1 and value.shape[0] == 1:
        key = key.expand(B, -1, -1, -1)
        value = value.expand(B, -1, -1, -1)
    dv = None
    if differs(query, key, value) and key.shape[:3] == value.shape[:3]:
        query, key, value, scale, width = pad_heads(query, key, value, scale)
        dv = width if width < query.shape[-1] else None     # padded V: keep its own columns
    return query, key, value, block_mask, scale, dv
