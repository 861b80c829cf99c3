"""The program Nsight Compute profiles: one warm-up and one measured launch per step (chapter 4).

    python -m flashbook.measure.target --step baseline,remap --seqlen 4096 \
        [--batch 4 --heads 32 --head-dim 128 --dtype float16 --causal/--no-causal --gqa 32:8]

For each step, in order: fresh random inputs, the step's configuration for them
(``flashattn.autotune.resolve``), one warm-up launch outside any NVTX range (JIT compilation, module
load, and an autotune search for tuned steps all happen here), ``torch.cuda.synchronize()``, then
exactly one launch inside the NVTX push/pop range ``step:NAME``, synchronized. ``ncu --nvtx
--nvtx-include "regex:step:.*/"`` then profiles only the kernels of the measured launches, and
each profiled kernel carries the name of its step in its NVTX state.

``--manifest FILE`` writes what ran, as JSON: per step, its configuration and how many kernels the
warm-up and the measured launch made (1 for fused steps, 3 per chunk for ``naive``), so a report
filtered by kernel name rather than NVTX can still be mapped back to steps by launch order.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from flashattn.contract import DTYPES, check_tensors
from flashattn.contract import head_dim_arg, parse_gqa
from ..impls import IMPLS


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The workload options shared by ``profile_target`` and ``python -m flashbook profile``."""
    p.add_argument("--seqlen", type=int, default=4096, help="Nq = Nk (default 4096)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=32, help="query heads (= kv heads unless --gqa)")
    p.add_argument("--head-dim", type=head_dim_arg, default=128)
    p.add_argument("--dtype", choices=list(DTYPES), default="float16")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--gqa", metavar="HQ:HKV", help="grouped-query heads, e.g. 32:8")


class _LaunchCounter:
    """Counts ``cuda.tile.launch`` calls (``launch`` looks the function up at call time)."""

    def __init__(self):
        self.n = 0
        self._orig = None

    def __enter__(self):
        import cuda.tile as ct
        self._orig = ct.launch

        def counted(*a, **kw):
            self.n += 1
            return self._orig(*a, **kw)
        ct.launch = counted
        return self

    def __exit__(self, *exc):
        import cuda.tile as ct
        ct.launch = self._orig
        return False


def nvtx_name(step: str) -> str:
    """The NVTX range of a step: ``step:NAME`` with ':' written '~' (ncu's CSV joins nested
    ranges with ':', and variants such as ``remap@64x128:occ=2`` contain one)."""
    return "step:" + step.replace(":", "~")


def nvtx_decode(name: str) -> str:
    return name.replace("~", ":")


# Targets beside the forward's steps: the backward (issue 11; ``seqlen`` is Nq = Nk) and the
# decode step (issue 12; ``seqlen`` is the cache length, one new token per sequence).
BACKWARD_TARGETS = ("backward", "backward_atomic", "sdpa_cudnn_backward", "sdpa_flash_backward")
DECODE_TARGETS = ("decode", "decode_paged64", "square_decode", "sdpa_flash_decode")
# Packed varlen prefill against the square kernel on the same sequences padded (``batch``
# sequences of ``seqlen`` tokens each, causal): where E16 found packed slower on equal lengths.
VARLEN_TARGETS = ("varlen", "varlen_square_padded")
# Chapters 13-14: the flex kernel on three workloads, torch.compile's flex on one, our dense
# causal kernel (the shipped step) and the FP8 forward, all causal at one N.
FLEX_FP8_TARGETS = ("flex_causal", "flex_window1k", "flex_softcap", "torch_flex_window1k",
                    "best", "fp8_forward")
EXTRA_TARGETS = (BACKWARD_TARGETS + DECODE_TARGETS + VARLEN_TARGETS
                 + tuple(t for t in FLEX_FP8_TARGETS if t != "best"))


def _flex_go(name, q, k, v):
    """One flex forward: ours (``flex_*``) or torch.compile's (``torch_flex_*``), causal."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from flashattn import mods
    from flashattn.flex import flex_attention
    N = q.shape[2]
    mask = mods.sliding_window(1024) if name.endswith("window1k") else mods.causal()
    score = mods.softcap(50.0).to(q.device) if name.endswith("softcap") else None
    bm = create_block_mask(mask.to(q.device), None, None, N, N, device=str(q.device),
                           BLOCK_SIZE=128)
    if name.startswith("torch_"):
        from torch.nn.attention.flex_attention import flex_attention as torch_flex
        compiled = torch.compile(torch_flex, dynamic=False)
        return lambda: compiled(q, k, v, score_mod=score, block_mask=bm)
    return lambda: flex_attention(q, k, v, score_mod=score, block_mask=bm)


def _fp8_go(q, k, v, *, causal):
    """The FP8 forward with V quantised into the transposed layout it reads (outside the
    profiled launch)."""
    from flashattn.fp8 import attention_fp8, quantize_fp8
    q8, qs = quantize_fp8(q, num_kv_heads=k.shape[1])
    k8, ks = quantize_fp8(k)
    v8, vs = quantize_fp8(v, v_transposed=True)
    return lambda: attention_fp8(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs,
                                 causal=causal, v_transposed=True)


def _varlen_go(name, *, seqlen, batch, heads, kv_heads, head_dim, dt):
    """One causal prefill of ``batch`` equal sequences, packed (``varlen``) or padded."""
    import torch
    dev = torch.device("cuda")
    scale = 1.0 / math.sqrt(head_dim)
    if name == "varlen":
        from flashattn.varlen import attention_varlen
        T = batch * seqlen
        q = torch.randn(T, heads, head_dim, device=dev, dtype=dt)
        k, v = (torch.randn(T, kv_heads, head_dim, device=dev, dtype=dt) for _ in range(2))
        cu = torch.arange(0, T + 1, seqlen, dtype=torch.int32, device=dev)
        return lambda: attention_varlen(q, k, v, cu, cu, seqlen, seqlen, causal=True,
                                        scale=scale, check_values=False)
    from flashattn.api import attention
    q = torch.randn(batch, heads, seqlen, head_dim, device=dev, dtype=dt)
    k, v = (torch.randn(batch, kv_heads, seqlen, head_dim, device=dev, dtype=dt)
            for _ in range(2))
    return lambda: attention(q, k, v, causal=True, scale=scale)


def _backward_go(name, q, k, v, *, causal, scale):
    """The backward of ``name`` alone, from a forward run here (not profiled)."""
    import torch
    dout = torch.randn_like(q)
    if name.startswith("sdpa_"):
        # The ATen backward op called on this thread: autograd would run it on its own device
        # thread, outside this thread's NVTX range, and ncu would profile nothing.
        aten = torch.ops.aten
        if "cudnn" in name:
            o, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_cudnn_attention(
                q, k, v, None, True, 0.0, causal, False, scale=scale)
            tries = [lambda b=b: aten._scaled_dot_product_cudnn_attention_backward(
                dout, q, k, v, o, lse, seed, off, b, cq, ck, mq, mk, 0.0, causal, scale=scale)
                for b in (None, torch.empty(0, device=q.device, dtype=q.dtype))]
        else:
            o, lse, cq, ck, mq, mk, seed, off, _ = aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, causal, False, scale=scale)
            tries = [lambda: aten._scaled_dot_product_flash_attention_backward(
                dout, q, k, v, o, lse, cq, ck, mq, mk, 0.0, causal, seed, off, scale=scale)]
        for i, go in enumerate(tries):     # the attn_bias argument's form varies by version
            try:
                go()
                torch.cuda.synchronize()
                return go
            except (RuntimeError, TypeError):
                if i == len(tries) - 1:
                    raise
    from flashattn.autograd import attention_forward
    from flashattn.launch_bwd import attention_backward
    with torch.no_grad():
        out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
    det = name == "backward"
    return lambda: attention_backward(q, k, v, out, dout, lse, causal=causal, scale=scale,
                                      deterministic=det)


def _decode_go(name, *, cache_len, batch, heads, kv_heads, head_dim, dt):
    """One decode step of ``name``: one new token per sequence over a full cache (the inputs of
    ``decode-bench``: ``bench_decode._decode_set``, pages of 64 shuffled)."""
    import torch

    from flashattn.decoding import decode
    from .bench_decode import _decode_set
    if cache_len % 64:
        raise ValueError(f"decode targets take a cache length that is a multiple of 64 (the "
                         f"page size), got {cache_len}")
    s = _decode_set(batch, heads, kv_heads, 1, cache_len, head_dim, dt, torch.device("cuda"),
                    seed=0, pages=(64,) if name == "decode_paged64" else ())
    q, k, v, lens = s["q"], s["k"], s["v"], s["lens"]
    if name == "decode":
        return lambda: decode(q, k, v, lens)
    if name == "decode_paged64":
        kp, vp, table = s["paged"][64]
        return lambda: decode(q, kp, vp, lens, block_table=table)
    if name == "square_decode":
        # The square kernel as decode-bench's square_best row launches it: step "best" resolved
        # once, launched with that configuration (attention(step="best") takes the decode path
        # for this shape, and attention(step=NAME) would search the configuration again).
        from flashattn.launch import launch
        from .bench import resolve_impl
        step, cfg = resolve_impl("best", q, k, True)
        out = torch.empty_like(q)
        return lambda: launch(q, k, v, out, step, cfg, causal=True,
                              scale=1.0 / math.sqrt(head_dim), input_pos=cache_len - 1)
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def go():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=kv_heads != heads)
    return go


def run_step(name: str, *, seqlen: int, batch: int, heads: int, kv_heads: int, head_dim: int,
             dtype: str, causal: bool, seed: int = 0) -> dict:
    """Warm up then launch step ``name`` once inside NVTX range ``step:NAME``; what ran."""
    import torch

    from flashattn.launch import launch
    from .bench import resolve_impl
    torch.manual_seed(seed)
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    scale = 1.0 / math.sqrt(head_dim)
    if name in VARLEN_TARGETS:
        go = _varlen_go(name, seqlen=seqlen, batch=batch, heads=heads, kv_heads=kv_heads,
                        head_dim=head_dim, dt=dt)
        return _measure(name, go, None, "")
    if name in DECODE_TARGETS:
        step, config = None, None
        go = _decode_go(name, cache_len=seqlen, batch=batch, heads=heads, kv_heads=kv_heads,
                        head_dim=head_dim, dt=dt)
        return _measure(name, go, None, "library" if name.startswith("sdpa") else "")
    q = torch.randn(batch, heads, seqlen, head_dim, device=dev, dtype=dt)       # (B, Hq, N, D)
    k = torch.randn(batch, kv_heads, seqlen, head_dim, device=dev, dtype=dt)    # (B, Hkv, N, D)
    v = torch.randn(batch, kv_heads, seqlen, head_dim, device=dev, dtype=dt)    # (B, Hkv, N, D)
    out = torch.empty_like(q)
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=0)
    if name in FLEX_FP8_TARGETS[:4]:
        return _measure(name, _flex_go(name, q, k, v), None,
                        "library" if name.startswith("torch") else "")
    if name == "fp8_forward":
        return _measure(name, _fp8_go(q, k, v, causal=causal), None, "")
    if name in BACKWARD_TARGETS:
        return _measure(name, _backward_go(name, q, k, v, causal=causal, scale=scale), None,
                        "library" if name.startswith("sdpa") else "")
    if name in IMPLS and IMPLS[name].kind == "library" and IMPLS[name].backend != "flex":
        # A library baseline (chapter 10 compares our kernel's profile with cuDNN's).
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, IMPLS[name].backend)

        def go():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                               enable_gqa=kv_heads != heads)
        step, config = None, None
    else:
        step, config = resolve_impl(name, q, k, causal)   # a step, "best" or STEP@CONFIG

        def go():
            launch(q, k, v, out, step, config, causal=causal, scale=scale)

    return _measure(name, go, step, config.label() if config else "library")


def _measure(name, go, step, label: str) -> dict:
    """One warm-up call of ``go`` outside NVTX, then one inside ``step:NAME``; what ran."""
    import torch
    with _LaunchCounter() as warm:          # outside any NVTX range: not profiled
        go()
    torch.cuda.synchronize()
    with _LaunchCounter() as measured:
        with torch.cuda.nvtx.range(nvtx_name(name)):
            go()
        torch.cuda.synchronize()
    return dict(step=name, resolved_step=step.name if step else name,
                config=label,
                warmup_launches=warm.n, launches=measured.n)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashbook.measure.target",
                                description="Launch steps once each inside NVTX ranges "
                                            "'step:NAME', for Nsight Compute.")
    p.add_argument("--step", required=True, help="comma-separated step names, in order")
    add_shape_args(p)
    p.add_argument("--manifest", help="write what ran (configs, launch counts) to this JSON file")
    a = p.parse_args(argv)
    steps = [s for s in a.step.split(",") if s]
    hq, hkv = parse_gqa(a.gqa, a.heads)
    ran = []
    for name in steps:
        info = run_step(name, seqlen=a.seqlen, batch=a.batch, heads=hq, kv_heads=hkv,
                        head_dim=a.head_dim, dtype=a.dtype, causal=a.causal)
        ran.append(info)
        print(f"profile_target: {name} ({info['config']}): {info['launches']} kernel launch(es) "
              "in range", file=sys.stderr)
    if a.manifest:
        with open(a.manifest, "w") as f:
            json.dump(dict(shape=dict(B=a.batch, Hq=hq, Hkv=hkv, N=a.seqlen, D=a.head_dim,
                                      dtype=a.dtype, causal=a.causal), steps=ran), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
