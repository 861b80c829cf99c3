"""The chapter's code and live cells: kernel listings, the LSE merge on the CPU, one timed
decode step on a GPU."""
from __future__ import annotations

import numpy as np
import pandas as pd


def kernel_listing(name: str) -> str:
    """The source of one function of ``flashbook/ladder/decode.py`` (the library's kernel with
    the fused merge the chapter discusses) or of its tile helpers (``kernels/splitkv.py``),
    folded as it ships
    (``flashbook.source.shipped_listing``: read as text, no compiler needed)."""
    from ...source import shipped_listing
    try:
        return shipped_listing("flashbook.ladder.decode", name).rstrip("\n")
    except KeyError:          # a tile helper the kernels share (merge_splits, page_of, ...)
        return shipped_listing("flashattn.kernels.splitkv", name).rstrip("\n")


def merge_demo(seed: int = 0, length: int = 300, cuts=(128, 128)) -> dict:
    """The LSE merge on the CPU: one sequence, GQA 8:2, its keys cut at ``cuts`` (equal cuts:
    an empty split). Returns the partial LSEs, the merged and exact outputs and the error."""
    from flashattn.reference import decode as ref
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 1, 64))
    k, v = rng.standard_normal((2, 1, 2, length, 64))
    lens = np.array([length], np.int32)
    bounds = [0, *cuts, length]
    splits = [[(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]]
    o_parts, lse_parts = ref.split_partials(q, k, v, lens, splits=splits)
    merged, lse = ref.merge_partials(o_parts, lse_parts)
    exact, lse_exact = ref.decode_attention(q, k, v, lens, return_lse=True)
    return dict(splits=splits[0], lse_parts=lse_parts[:, 0, 0, 0], merged=merged, exact=exact,
                err=float(np.abs(merged - exact).max()),
                lse_err=float(np.abs(lse - lse_exact).max()))


def live_step(B: int = 8, Nk: int = 32768, Nq: int = 1, Hq: int = 32, Hkv: int = 8,
              D: int = 128, reps: int = 20) -> pd.DataFrame:
    """On a GPU: time one decode step of ``flashattn.decode`` and of PyTorch SDPA (flash) on the
    same cache (median of CUDA-event timings with L2 flushed), and the error against SDPA."""
    import torch
    import torch.nn.functional as F
    import flashattn
    from flashattn.timing import time_cuda
    from ...data.schema import kv_bytes
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16, generator=g)
    lens = torch.full((B,), Nk, dtype=torch.int32, device="cuda")
    ours = lambda: flashattn.decode(q, k, v, lens)              # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    err = (ours().float() - sdpa().float()).abs().max().item() if Nq == 1 else float("nan")
    rows = {}
    for name, fn in (("decode", ours), ("SDPA (default backend)", sdpa)):
        t = time_cuda(fn, reps=reps)
        rows[name] = {"µs": t.median_ms * 1e3,
                      "GB/s of K/V": kv_bytes(B, Hkv, Nk, D) / (t.median_ms * 1e-3) / 1e9}
    out = pd.DataFrame(rows).T.round(1)
    out.attrs["max_abs_err"] = err
    return out
