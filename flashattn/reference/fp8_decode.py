"""The FP8-MMA decode's arithmetic (``flashattn/kernels/fp8_decode.py``, chapter 14) replayed
in torch: q and P rounded to fp8 as the kernel rounds them, tile by tile, split by split. The
kernel's answer up to fp32 rounding (and, on a GPU, the FP8 MMA's fast accumulation); the
exact attention of the dequantised caches is ``flashattn.fp8.decode_reference_fp8``."""
import math

import torch

__all__ = ["emulate_decode_fp8mma"]


def emulate_decode_fp8mma(q, k8, v8t, lens, kd, vd, *, tile_n, num_splits, block_table=None,
                          scale=None, p_shift=8):
    """The FP8-MMA decode kernel's arithmetic in torch (fp32, on the CPU), one (sequence, kv
    head) at a time: q rounded to the cache's fp8 per row (amax at 448), S = q8 k8^T, the
    online softmax over ``tile_n``-key tiles of each of ``num_splits`` runs with
    P = 2^(s - m + p_shift) rounded to fp8 before P V, the runs merged by their LSE.
    q (B, Hq, Nq, D); k8 (B, Hkv, S, D), v8t (B, Hkv, D, S) (paged: (num_pages, Hkv, ...)
    with ``block_table``); lens (B,); descales (B, Hkv). Returns fp32 (B, Hq, Nq, D). Slots
    past a length must be finite in v8t (the kernel zeroes them; so does this)."""
    q, k8, v8t, lens = q.cpu(), k8.cpu(), v8t.cpu(), lens.cpu()
    kd, vd = torch.as_tensor(kd).cpu(), torch.as_tensor(vd).cpu()
    block_table = None if block_table is None else block_table.cpu()
    B, Hq, Nq, D = q.shape
    Hkv = k8.shape[1]
    G = Hq // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.zeros(B, Hq, Nq, D)
    inv_log2 = 1.0 / math.log(2)
    for b in range(B):
        n = int(lens[b])
        if block_table is None:
            kb = k8[b].float()                                       # (Hkv, S, D)
            vb = v8t[b].float().transpose(-1, -2)
        else:
            pages = block_table[b].long()
            kb = torch.cat([k8[p].float() for p in pages], dim=1)
            vb = torch.cat([v8t[p].float().transpose(-1, -2) for p in pages], dim=1)
        n_tiles = -(-n // tile_n)
        per = -(-n_tiles // num_splits) if n_tiles else 0
        for h in range(Hkv):
            qf = q[b, h * G:(h + 1) * G].float().reshape(G * Nq, D)  # rows g * Nq + i
            amax = qf.abs().amax(-1, keepdim=True)
            amax = torch.where(amax > 0, amax, torch.ones_like(amax))
            q8 = (qf * (448.0 / amax)).to(k8.dtype).float()
            rs = (amax * (1.0 / 448.0)) * (scale * inv_log2 * float(kd[b, h]))
            pos = n - Nq + torch.arange(G * Nq) % Nq                 # each row's position
            parts = []
            for sp in range(num_splits):
                t0 = min(sp * per, n_tiles)
                t1 = min(t0 + per, n_tiles)
                m = torch.full((G * Nq, 1), -math.inf)
                l = torch.zeros(G * Nq, 1)
                acc = torch.zeros(G * Nq, D)
                for t in range(t0, t1):
                    j = torch.arange(t * tile_n, (t + 1) * tile_n)
                    jj = j.clamp(max=kb.shape[1] - 1)
                    s = q8 @ kb[h, jj].T
                    s = torch.where(j[None, :] <= pos[:, None], s, -math.inf)
                    m_new = torch.maximum(m, s.amax(-1, keepdim=True) * rs)
                    m_use = torch.where(m_new == -math.inf, torch.zeros_like(m_new), m_new)
                    p = torch.exp2(s * rs - (m_use - p_shift))
                    alpha = torch.exp2(m - m_use)
                    l = l * alpha + p.sum(-1, keepdim=True)
                    vt = torch.where((j < n)[:, None], vb[h, jj], torch.zeros(()))
                    acc = acc * alpha + p.to(k8.dtype).float() @ vt
                    m = m_new
                has = l > 0
                ls = torch.where(has, l, torch.ones_like(l))
                o = acc / ls * float(vd[b, h])
                lse = torch.where(has, m + torch.log2(ls) - p_shift,
                                  torch.full_like(m, -math.inf))
                parts.append((o, lse))
            if num_splits == 1:
                o = parts[0][0]
            else:
                lses = torch.stack([p[1] for p in parts])            # (splits, R, 1)
                mx = lses.amax(0)
                mx = torch.where(mx == -math.inf, torch.zeros_like(mx), mx)
                w = torch.exp2(lses - mx)
                tot = w.sum(0)
                o = sum(w[i] * parts[i][0] for i in range(num_splits))
                o = o / torch.where(tot > 0, tot, torch.ones_like(tot))
            out[b, h * G:(h + 1) * G] = o.reshape(G, Nq, D)
    return out
