"""The online softmax, in base e, one element or one block at a time (NumPy)."""
from __future__ import annotations

import math

import numpy as np


def softmax(x, axis: int = -1) -> np.ndarray:
    """Safe softmax: subtracting the max keeps every exponent <= 0, so nothing overflows."""
    x = np.asarray(x)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def online_softmax_trace(x) -> list[tuple[float, float]]:
    """(m, d) after each element of a 1-D x: running max and running sum of exp(x - m).

    d_{j+1} = d_j * exp(m_j - m_{j+1}) + exp(x_{j+1} - m_{j+1}): when the max grows, the old
    sum is rescaled to the new max, so one pass suffices (Milakov & Gimelshein, 2018).
    """
    m, d, trace = -math.inf, 0.0, []
    for xj in np.asarray(x, dtype=np.float64).ravel():
        m_new = max(m, float(xj))
        if m_new == -math.inf:
            trace.append((m, d))        # only -inf so far: nothing to add, and -inf - -inf is NaN
            continue
        d = d * math.exp(m - m_new) + math.exp(xj - m_new)
        m = m_new
        trace.append((m, d))
    return trace


def online_softmax_streaming(x) -> np.ndarray:
    """Softmax of a 1-D x, (N,) -> (N,): one pass for (m, d), one for the probabilities."""
    x = np.asarray(x)
    m, d = online_softmax_trace(x)[-1]
    return (np.exp(x.astype(np.float64) - m) / d).astype(np.result_type(x.dtype, np.float32))


def blockwise_trace(x, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Running (m, l) after each block of ``block`` elements of the last axis.

    x: (..., N). Returns m, l of shape (..., cdiv(N, block)); the last block may be shorter.
    """
    x = np.asarray(x, dtype=np.float64)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    m = np.full(x.shape[:-1] + (1,), -np.inf)                         # (..., 1)
    l = np.zeros(x.shape[:-1] + (1,))                                 # (..., 1)
    ms, ls = [], []
    for start in range(0, x.shape[-1], block):
        xb = x[..., start:start + block]                              # (..., block)
        m_new = np.maximum(m, xb.max(axis=-1, keepdims=True))         # (..., 1)
        l = l * np.exp(m - m_new) + np.exp(xb - m_new).sum(axis=-1, keepdims=True)
        m = m_new
        ms.append(m[..., 0])
        ls.append(l[..., 0])
    return np.stack(ms, axis=-1), np.stack(ls, axis=-1)


def online_softmax_blockwise(x, block: int) -> np.ndarray:
    """Softmax over the last axis of x (..., N), reading ``block`` elements at a time."""
    x = np.asarray(x)
    m, l = blockwise_trace(x, block)
    p = np.exp(x.astype(np.float64) - m[..., -1:]) / l[..., -1:]      # (..., N)
    return p.astype(np.result_type(x.dtype, np.float32))


def online_softmax_attention(q, k, v, block: int, *, scale: float | None = None) -> np.ndarray:
    """FlashAttention's loop for one head, in base e, without masking.

    q: (Nq, D); k, v: (Nk, D). Keys are read ``block`` at a time; the running max m, sum l and
    unnormalised output acc are rescaled by alpha = exp(m_old - m_new) when m grows.
    Returns (Nq, D).
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    m = np.full((q.shape[0], 1), -np.inf)                             # (Nq, 1)
    l = np.zeros((q.shape[0], 1))                                     # (Nq, 1)
    acc = np.zeros((q.shape[0], v.shape[1]))                          # (Nq, D)
    for start in range(0, k.shape[0], block):
        s = q @ k[start:start + block].T * scale                      # (Nq, block)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))          # (Nq, 1)
        p = np.exp(s - m_new)                                         # (Nq, block)
        alpha = np.exp(m - m_new)                                     # (Nq, 1)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + p @ v[start:start + block]                # (Nq, D)
        m = m_new
    return acc / l
