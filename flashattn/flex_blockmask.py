"""PyTorch's BlockMask as the flex kernels take it: checked against the call's shapes and
device (``check_block_mask``), built once per mask and shape for ``attention(window_size=)``
(``cached_block_mask``), and the work it lists (``visited_steps``)."""
from __future__ import annotations

__all__ = ["check_block_mask", "cached_block_mask", "visited_steps"]

_BLOCK_MASKS: dict = {}
_BLOCK_MASK_CACHE = 32


def _is_noop(fn) -> bool:
    from torch.nn.attention.flex_attention import noop_mask
    return fn is noop_mask


def check_block_mask(bm, *, B, Hq, Nq, Nk, device):
    """The BlockMask's tensors, checked: (kv_num, kv_idx, full_num, full_idx, (QB, KB), mod)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask
    if not isinstance(bm, BlockMask):
        raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask (from "
                        f"create_block_mask), got {type(bm).__name__}")
    if tuple(bm.seq_lengths) != (Nq, Nk):
        raise ValueError(f"block_mask was built for (Q_LEN, KV_LEN) = {tuple(bm.seq_lengths)}, "
                         f"but the query has {Nq} rows and the key {Nk}: build it with "
                         f"create_block_mask(mask_mod, B, H, {Nq}, {Nk})")
    bs = bm.BLOCK_SIZE
    qb, kb = (bs, bs) if isinstance(bs, int) else tuple(int(x) for x in bs)
    n_qb, n_kb = -(-Nq // qb), -(-Nk // kb)
    num, idx = bm.kv_num_blocks, bm.kv_indices
    tensors = [("kv_num_blocks", num), ("kv_indices", idx)]
    if (bm.full_kv_num_blocks is None) != (bm.full_kv_indices is None):
        raise ValueError("block_mask: full_kv_num_blocks and full_kv_indices must both be given "
                         "or both be None")
    if bm.full_kv_num_blocks is not None:
        tensors += [("full_kv_num_blocks", bm.full_kv_num_blocks),
                    ("full_kv_indices", bm.full_kv_indices)]
    for name, t in tensors:
        if t.device != device:
            raise ValueError(f"block_mask.{name} is on {t.device} but the query on {device}: "
                             f"create the BlockMask with device={str(device)!r} (or .to() it)")
        if t.dtype != torch.int32:
            raise TypeError(f"block_mask.{name} must be int32, got {t.dtype}")
        rank = 3 if "num" in name else 4
        if t.dim() != rank:
            raise ValueError(f"block_mask.{name} must have {rank} dimensions (B, H, Q_BLOCKS"
                             f"{', KV_BLOCKS' if rank == 4 else ''}), got shape {tuple(t.shape)}")
        if t.shape[0] not in (1, B) or t.shape[1] not in (1, Hq) or t.shape[2] != n_qb:
            raise ValueError(f"block_mask.{name} has shape {tuple(t.shape)}: expected (1 or B="
                             f"{B}, 1 or Hq={Hq}, {n_qb} query blocks of {qb}"
                             f"{', ...' if rank == 4 else ''})")
    if num.shape[:2] != idx.shape[:2] or (bm.full_kv_num_blocks is not None and (
            bm.full_kv_num_blocks.shape[:2] != num.shape[:2] or
            bm.full_kv_indices.shape[:2] != num.shape[:2])):
        raise ValueError("block_mask: its tensors disagree on the (B, H) axes")
    if device.type == "cpu" and not torch.compiler.is_compiling():
        # Values (a synchronisation on a GPU, so checked where it is free): every listed block
        # index within the key blocks, counts within the index lists.
        for nname, iname, n, i in (("kv_num_blocks", "kv_indices", num, idx),
                                   ("full_kv_num_blocks", "full_kv_indices",
                                    bm.full_kv_num_blocks, bm.full_kv_indices)):
            if n is None:
                continue
            if int(n.min()) < 0 or int(n.max()) > i.shape[-1]:
                raise ValueError(f"block_mask.{nname} must lie in [0, {i.shape[-1]}]")
            used = torch.arange(i.shape[-1]) < n[..., None]
            if used.any() and (int(i[used].min()) < 0 or int(i[used].max()) >= n_kb):
                raise ValueError(f"block_mask.{iname} lists a key block outside [0, {n_kb})")
    mod = None if _is_noop(bm.mask_mod) else bm.mask_mod
    return tensors, (qb, kb), mod



def visited_steps(bm, B, Hq, Nq, Nk, c) -> int:
    """(query tile, key tile) steps a block-masked call runs (the interpreter's estimate)."""
    n = bm.kv_num_blocks.sum().item()
    if bm.full_kv_num_blocks is not None:
        n += bm.full_kv_num_blocks.sum().item()
    rep = (B // bm.kv_num_blocks.shape[0]) * (Hq // bm.kv_num_blocks.shape[1])
    return int(n * rep * c["Q_TILES_PER_BLOCK"] * c["KV_TILES_PER_BLOCK"])



def cached_block_mask(mask, Nq: int, Nk: int, device, block_size):
    """``create_block_mask(mask, None, None, Nq, Nk, device, BLOCK_SIZE)``, built once per mask
    tile function and shape (the host cost of a BlockMask is paid once per shape)."""
    from torch.nn.attention.flex_attention import create_block_mask
    key = (mask.tile, tuple(mask.params.items()), Nq, Nk, str(device), tuple(block_size))
    bm = _BLOCK_MASKS.get(key)
    if bm is None:
        bm = create_block_mask(mask, None, None, Nq, Nk, device=device,
                               BLOCK_SIZE=tuple(block_size))
        if len(_BLOCK_MASKS) >= _BLOCK_MASK_CACHE:
            _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
        _BLOCK_MASKS[key] = bm
    return bm
