"""Attention whose values have another head dim than its queries and keys (DeepSeek's
unabsorbed MLA prefill: Q K^T over 192 = 128 + 64 rotary dims, P V over 128), on kernels that
take one head dim.

The narrower side is padded with zero columns: zero columns of Q and K add nothing to a score,
zero columns of V give zero output columns, which are sliced off. Exact, backward too: the
sliced-off output columns receive a zero gradient, so dP = dO V^T is unchanged, and the padding's
own gradients are dropped by the pad. The default scale stays 1/sqrt(query head dim).
"""
from __future__ import annotations

__all__ = ["differs", "pad_heads"]


def differs(q, k, v) -> bool:
    """True for tensors of one rank whose keys match the queries' head dim and values do not."""
    import torch
    return (all(isinstance(t, torch.Tensor) for t in (q, k, v)) and q.dim() == k.dim() == v.dim()
            and q.dim() >= 3 and q.shape[-1] == k.shape[-1] != v.shape[-1])


def pad_heads(q, k, v, scale):
    """(q, k, v, scale, dv): the narrower side zero-padded to the wider head dim, the scale
    made explicit (default 1/sqrt(q's head dim)), and v's head dim to slice the output to."""
    import torch.nn.functional as F
    d, dv = q.shape[-1], v.shape[-1]
    if scale is None:
        scale = d ** -0.5
    if dv < d:
        v = F.pad(v, (0, d - dv))
    else:
        q, k = F.pad(q, (0, dv - d)), F.pad(k, (0, dv - d))
    return q, k, v, scale, dv
