"""A dense fp64 reference of flex attention with autograd (PyTorch's flex_attention has no
backward on CPU): the mods' torch functions on broadcast index tensors, the sink as an extra
key of value 0."""
import math

import torch


def flex_reference(q, k, v, score=None, mask=None, scale=None, sinks=None):
    """(out, lse) in q's dtype of computation (use fp64 inputs that require grad)."""
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    rep = Hq // Hkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    b = torch.arange(B).view(B, 1, 1, 1)
    h = torch.arange(Hq).view(1, Hq, 1, 1)
    qi = torch.arange(Nq).view(1, 1, Nq, 1)
    ki = torch.arange(Nk).view(1, 1, 1, Nk)
    if score is not None:
        s = score(s, b, h, qi, ki)
    if mask is not None:
        s = s.masked_fill(~mask(b, h, qi, ki).expand(B, Hq, Nq, Nk), -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks.to(s.dtype).view(1, Hq, 1, 1).expand(B, Hq, Nq, 1)], -1)
        v = torch.cat([v, torch.zeros_like(v[:, :, :1])], 2)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return p @ v, lse
