"""What autograd keeps for the backward, the five products and their FLOPs (CPU only)."""
from __future__ import annotations

import numpy as np

# --- what autograd keeps for the backward --------------------------------------------------------
def saved_tensors(fn, *args, **kwargs):
    """(output of ``fn(*args, **kwargs)``, [(shape, dtype, bytes)]) of the tensors autograd saves
    for the backward, each storage counted once (a tensor saved twice, or a view of a saved one,
    adds nothing). Tensors on the ``meta`` device count their nominal size."""
    import torch
    seen = {}

    def pack(t):
        if t.device.type == "meta":
            key, n = ("meta", id(t)), t.numel() * t.element_size()
        else:
            st = t.untyped_storage()
            key, n = (t.device.type, st.data_ptr()), st.nbytes()
        seen.setdefault(key, (tuple(t.shape), str(t.dtype).replace("torch.", ""), n))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    return out, list(seen.values())


def saved_bytes(fn, *args, **kwargs) -> int:
    """Bytes of the distinct tensors autograd saves for the backward of ``fn(*args)``."""
    return sum(n for _, _, n in saved_tensors(fn, *args, **kwargs)[1])


def qkv(B, H, N, D, *, device="cpu", dtype="float16", seed=0):
    """q, k, v (B, H, N, D) that require grad: random on the CPU, empty on ``meta``."""
    import torch
    dt = getattr(torch, dtype)
    if device == "meta":
        return [torch.empty(B, H, N, D, dtype=dt, device="meta", requires_grad=True)
                for _ in range(3)]
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g, dtype=torch.float32).to(dt).requires_grad_()
            for _ in range(3)]


def math_attention(q, k, v, causal=True):
    """PyTorch's math SDPA backend (the unfused reference: it materialises P)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def saved_by_n(seqlens, *, B=1, H=2, D=64, causal=True):
    """DataFrame (N, math, flashattn): bytes saved for the backward by PyTorch's math attention
    (run on the CPU, fp16) and by flashattn's operator (traced on ``meta``), per N."""
    import pandas as pd
    import flashattn
    rows = []
    for n in seqlens:
        math_b = saved_bytes(math_attention, *qkv(B, H, n, D), causal=causal)
        ours = saved_bytes(lambda q, k, v: flashattn.attention(q, k, v, causal=causal),
                           *qkv(B, H, n, D, device="meta"))
        rows.append({"N": n, "math": math_b, "flashattn": ours})
    return pd.DataFrame(rows)


def fit_n2_n(ns, nbytes):
    """(a, b): the least-squares fit of ``nbytes = a N² + b N`` (bytes per (batch, head))."""
    ns = np.asarray(ns, dtype=float)
    A = np.stack([ns ** 2, ns], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.asarray(nbytes, dtype=float), rcond=None)
    return float(a), float(b)


def flashattn_saved_formula(B, H, N, D, elem_bytes=2) -> int:
    """q, k, v, out (B, H, N, D) in the input dtype and the LSE (B, H, N) in fp32."""
    return 4 * B * H * N * D * elem_bytes + 4 * B * H * N


# --- the five products -----------------------------------------------------------------------------
def products_table(N="N", D="D"):
    """The matrix products of one (batch, head) backward: formula, shapes, which kernel
    computes it, and its multiply-adds in units of N²·D (the forward has two)."""
    import pandas as pd
    rows = [
        ("S = Q Kᵀ (recomputed)", f"({N}, {D}) · ({D}, {N}) → ({N}, {N})", "bwd_dkdv, bwd_dq"),
        ("dV = Pᵀ dO", f"({N}, {N}) · ({N}, {D}) → ({N}, {D})", "bwd_dkdv"),
        ("dP = dO Vᵀ", f"({N}, {D}) · ({D}, {N}) → ({N}, {N})", "bwd_dkdv, bwd_dq"),
        ("dK = scale · dSᵀ Q", f"({N}, {N}) · ({N}, {D}) → ({N}, {D})", "bwd_dkdv"),
        ("dQ = scale · dS K", f"({N}, {N}) · ({N}, {D}) → ({N}, {D})", "bwd_dq"),
    ]
    return pd.DataFrame(rows, columns=["product", "shapes", "kernel"],
                        index=pd.RangeIndex(1, 6, name="#"))




def flops_ratio() -> float:
    """The backward's FLOPs over the forward's, by the benchmark's convention (5 products of
    N²·D against 2: 2.5)."""
    from ...measure.bench_bwd import backward_flops
    return backward_flops(1, 1, 1024, 128, False) / backward_flops(1, 1, 1024, 128, False, "fwd")
