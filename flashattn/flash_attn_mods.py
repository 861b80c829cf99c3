"""The flex mods behind ``flash_attn_interface``: flash-attn's window mask and ALiBi score, each
reading its offset and window sizes from a small int32 tensor (a kernel argument), so one
compiled kernel serves every sequence length and window size.

    window_tile(b, h, q_idx, kv_idx, win)     win = [offset, left, -right]
    alibi_tile(score, b, h, q_idx, kv_idx, slopes, pos)    slopes (B, Hq) fp32, pos = [offset]

Row ``q_idx`` sits at position ``q_idx + offset`` (``offset = seqlen_k - seqlen_q``: flash-attn's
bottom-right alignment). Each has its torch twin (``*_torch``) for ``create_block_mask``.
"""
from __future__ import annotations

import functools

from .interpret import install_shim

install_shim()                     # where cuda-tile is not installed, the interpreter's stand-in
import cuda.tile as ct             # noqa: E402  (the tile functions below are cuTile code)

__all__ = ["window_tile", "window_torch", "window_mask", "alibi_tile", "alibi_torch",
           "softcap_alibi"]


def window_tile(b, h, q_idx, kv_idx, win):
    d = (q_idx + ct.gather(win, (0,))) - kv_idx
    return (d <= ct.gather(win, (1,))) & (d >= ct.gather(win, (2,)))


def window_torch(b, h, q_idx, kv_idx, win):
    d = (q_idx + win[0]) - kv_idx
    return (d <= win[1]) & (d >= win[2])


def window_mask(left: int, right: int, offset: int, device):
    """A ``MaskMod``: row ``q_idx`` at position ``q_idx + offset`` sees keys ``position - left
    .. position + right`` (-1: unbounded on that side); the values are in its tensor, so every
    window shares one tile function (one kernel); ``params`` keeps them for the block mask's
    cache key."""
    import torch
    from .mods import MaskMod
    big = 1 << 30
    win = torch.tensor([offset, left if left >= 0 else big, -right if right >= 0 else -big],
                       dtype=torch.int32, device=device)
    return MaskMod(f"window({left},{right},{offset})", window_tile, window_torch,
                   (("win", win),), params=dict(left=left, right=right, offset=offset))


def alibi_tile(score, b, h, q_idx, kv_idx, slopes, pos):
    # flash-attn's ALiBi: -slope * |i + seqlen_k - seqlen_q - j|.
    d = (q_idx + ct.gather(pos, (0,))) - kv_idx
    return score - ct.gather(slopes, (b, h)) * ct.abs(d).astype(ct.float32)


def alibi_torch(score, b, h, q_idx, kv_idx, slopes, pos):
    return score - slopes[b, h] * ((q_idx + pos[0]) - kv_idx).abs()


@functools.lru_cache(maxsize=None)
def softcap_alibi(cap: float):
    """(tile, derivative, torch) of softcap then ALiBi (flash-attn's order) as one score."""
    inv = 1.0 / cap

    def softcap_alibi_score(score, b, h, q_idx, kv_idx, slopes, pos):
        d = (q_idx + ct.gather(pos, (0,))) - kv_idx
        capped = ct.tanh(score * inv) * cap
        return capped - ct.gather(slopes, (b, h)) * ct.abs(d).astype(ct.float32)

    def softcap_alibi_grad(score, b, h, q_idx, kv_idx, slopes, pos):
        t = ct.tanh(score * inv)
        return 1.0 - t * t

    def softcap_alibi_torch(score, b, h, q_idx, kv_idx, slopes, pos):
        import torch
        return torch.tanh(score * inv) * cap - slopes[b, h] * ((q_idx + pos[0]) - kv_idx).abs()
    return softcap_alibi_score, softcap_alibi_grad, softcap_alibi_torch
