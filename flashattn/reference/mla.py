"""Multi-head latent attention from its definition, in float64 on the CPU.

Two forms that must agree:

* ``mla_decode_reference``: the absorbed form FlashMLA computes: queries already multiplied
  into the latent space, attention over the paged latent cache with V = its first ``head_dim_v``
  columns. Returns FlashMLA's ``(out (B, Sq, Hq, Dv), lse (B, Hq, Sq))``.
* ``mla_unabsorbed_reference``: the model's form: per-head keys ``[W_UK[h] c ; k_rope]`` and
  values ``W_UV[h] c`` expanded from the latent ``c``, plain attention per head.
  ``absorb`` maps its inputs to the absorbed form (``q_lat[h] = W_UK[h]^T q_nope[h]``,
  ``o[h] = W_UV[h] o_lat[h]``).
"""
from __future__ import annotations

import math

import torch

__all__ = ["mla_decode_reference", "mla_unabsorbed_reference", "absorb", "gather_pages"]


def gather_pages(kv_cache, block_table, b: int, n: int):
    """The first ``n`` cached tokens of sequence ``b``: (n, Hkv, D) from a paged cache."""
    page = kv_cache.shape[1]
    idx = torch.arange(n)
    pages = block_table[b, idx // page].long()
    return kv_cache[pages, idx % page]


def _attend(q, k, v, scale, q_pos, causal):
    """q (Sq, H, Dk), k (N, Dk) or (N, H, Dk), v likewise -> (out (Sq, H, Dv), lse (H, Sq))."""
    if k.dim() == 2:
        s = torch.einsum("thd,nd->htn", q, k)
    else:
        s = torch.einsum("thd,nhd->htn", q, k)
    s = s * scale
    n = k.shape[0]
    if causal:
        visible = torch.arange(n)[None, :] <= q_pos[:, None]        # (Sq, N)
        s = s.masked_fill(~visible[None], -math.inf)
    lse = torch.logsumexp(s, dim=-1)                                 # (H, Sq)
    safe = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    p = torch.exp(s - safe[..., None])
    p = torch.where(torch.isinf(lse)[..., None], torch.zeros_like(p), p)
    out = torch.einsum("htn,nd->thd", p, v) if v.dim() == 2 else torch.einsum("htn,nhd->thd", p, v)
    return out, torch.where(torch.isinf(lse), torch.full_like(lse, math.inf), lse)


def mla_decode_reference(q, kv_cache, block_table, cache_seqlens, head_dim_v: int,
                         softmax_scale: float | None = None, causal: bool = False,
                         descale=None):
    """Absorbed MLA decoding, float64. q (B, Sq, Hq, D); kv_cache (num_pages, page, Hkv, D)
    (any float dtype, FP8 too); descale: None, a float, or (B,) per-sequence factors of an FP8
    cache. A query with no visible key gets output 0 and LSE +inf (FlashMLA's convention)."""
    B, Sq, Hq, D = q.shape
    Hkv = kv_cache.shape[2]
    G = Hq // Hkv
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.zeros(B, Sq, Hq, head_dim_v, dtype=torch.float64)
    lse = torch.zeros(B, Hq, Sq, dtype=torch.float64)
    for b in range(B):
        n = int(cache_seqlens[b])
        kv = gather_pages(kv_cache.cpu(), block_table.cpu(), b, n).double()   # (n, Hkv, D)
        if descale is not None:
            d = float(descale) if not torch.is_tensor(descale) or descale.dim() == 0 else float(descale[b])
            kv = kv * d
        q_pos = torch.arange(Sq) + (n - Sq)
        for h in range(Hkv):
            qh = q[b, :, h * G:(h + 1) * G].double().cpu()                 # (Sq, G, D)
            o, l = _attend(qh, kv[:, h], kv[:, h, :head_dim_v], scale, q_pos, causal)
            out[b, :, h * G:(h + 1) * G] = o
            lse[b, h * G:(h + 1) * G] = l
    return out, lse


def absorb(q_nope, q_rope, w_uk, w_uv):
    """The absorbed query ``[W_UK[h]^T q_nope[h] ; q_rope[h]]`` (B, Sq, H, D_lat + D_rope) and
    the map of a latent output back to a head's value space: ``o -> W_UV[h] o``.
    q_nope (B, Sq, H, D_nope); q_rope (B, Sq, H, D_rope); w_uk (H, D_nope, D_lat);
    w_uv (H, D_v, D_lat)."""
    q_lat = torch.einsum("bthn,hnl->bthl", q_nope.double(), w_uk.double())
    q = torch.cat([q_lat, q_rope.double()], dim=-1)

    def up(o_lat):                                                   # (B, Sq, H, D_lat)
        return torch.einsum("bthl,hvl->bthv", o_lat.double(), w_uv.double())
    return q, up


def mla_unabsorbed_reference(q_nope, q_rope, latent, k_rope, w_uk, w_uv, cache_seqlens,
                             softmax_scale: float, causal: bool = False):
    """Plain attention on the expanded keys and values, float64. latent (B, N, D_lat) and
    k_rope (B, N, D_rope) per sequence (the first ``cache_seqlens[b]`` rows used); returns
    (out (B, Sq, H, D_v), lse (B, H, Sq))."""
    B, Sq, H, _ = q_nope.shape
    out = torch.zeros(B, Sq, H, w_uv.shape[1], dtype=torch.float64)
    lse = torch.zeros(B, H, Sq, dtype=torch.float64)
    for b in range(B):
        n = int(cache_seqlens[b])
        c = latent[b, :n].double()
        k = torch.cat([torch.einsum("nl,hdl->nhd", c, w_uk.double()),
                       k_rope[b, :n].double()[:, None].expand(n, H, -1)], dim=-1)
        v = torch.einsum("nl,hvl->nhv", c, w_uv.double())
        q = torch.cat([q_nope[b].double(), q_rope[b].double()], dim=-1)   # (Sq, H, D)
        out[b], lse[b] = _attend(q, k, v, softmax_scale, torch.arange(Sq) + (n - Sq), causal)
    return out, lse
