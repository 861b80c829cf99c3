"""Experiment driver for chapter 10: time (step, config) variants against cuDNN in one run.

    python experiments/sweep.py --seqlens 4096,16384 --causal both \
        --variant remap@64x128o2 --variant pair@64x128o2 ... --json out.json

A variant is STEP or STEP@TMxTN[oOCC][cCTAS]. Every variant and the library baselines are
timed in the same process on the same inputs, interleaved per sequence length, so ratios
are comparable even on a shared, noisy GPU. Results are printed as TFLOPS and as ratios to
cuDNN, and written as JSON for experiments/LOG.md.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn.api import launch, resolve
from flashattn.steps import Config, get_step
from flashattn.timing import attention_flops, time_cuda, tflops


def parse_variant(v: str):
    """STEP[+FLAG|-FLAG|+FLAG=INT ...][@TMxTN[oOCC][cCTAS]] -> (Step, Config or None)."""
    from dataclasses import replace
    spec, _, cfg = v.partition("@")
    parts = re.split(r"(?=[+-])", spec)
    step = get_step(parts[0])
    flags = dict(step.flags)
    for p in parts[1:]:
        if "=" in p:
            k, val = p[1:].split("=")
            flags[k] = int(val)
        else:
            flags[p[1:]] = p[0] == "+"
    step = replace(step, flags=flags)
    step.flag_values()  # validates names
    if not cfg:
        return step, None
    m = re.fullmatch(r"(\d+)x(\d+)(?:o(\d+))?(?:c(\d+))?", cfg)
    if not m:
        raise SystemExit(f"bad variant {v!r}")
    tm, tn, occ, ctas = m.groups()
    return step, Config(int(tm), int(tn), int(occ) if occ else None, int(ctas) if ctas else None)


def _warm(args):
    """Compile one variant in a worker process (fills cuTile's disk cache for the parent)."""
    var, causal, n, b, h, hkv, d, dtype = args
    import torch
    dt = getattr(torch, dtype)
    q = torch.randn(b, h, n, d, device="cuda", dtype=dt)
    k = torch.randn(b, hkv, n, d, device="cuda", dtype=dt)
    step, cfg = parse_variant(var)
    if cfg is None:
        cfg = resolve(step.name, q, k, causal)[1]
    t0 = time.perf_counter()
    try:
        launch(q, k, k, torch.empty_like(q), step, cfg, causal=causal, scale=d ** -0.5)
        torch.cuda.synchronize()
        return f"warm {var} causal={causal}: {time.perf_counter() - t0:.1f} s"
    except Exception as e:
        return f"warm {var} causal={causal}: FAILED {type(e).__name__}: {e}"[:300]


def prewarm(variants, causals, n, b, h, hkv, d, dtype, procs):
    import multiprocessing as mp
    jobs = [(v, c, n, b, h, hkv, d, dtype) for v in variants for c in causals]
    with mp.get_context("spawn").Pool(procs) as pool:
        for line in pool.imap_unordered(_warm, jobs):
            print(line, file=sys.stderr, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--causal", choices=["yes", "no", "both"], default="both")
    p.add_argument("--variant", action="append", default=[])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=None)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--dtype", default="float16")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--libs", default="cudnn,flash")
    p.add_argument("--json")
    p.add_argument("--prewarm", type=int, default=0, help="compile variants in N processes first")
    a = p.parse_args()
    dt = getattr(torch, a.dtype)
    hkv = a.kv_heads or a.heads
    causals = {"yes": [True], "no": [False], "both": [False, True]}[a.causal]
    if a.prewarm:
        t0 = time.perf_counter()
        prewarm(a.variant, causals, min(int(x) for x in a.seqlens.split(",")), a.batch,
                a.heads, hkv, a.head_dim, a.dtype, a.prewarm)
        print(f"prewarm: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    rows = []
    for causal in causals:
        for n in [int(x) for x in a.seqlens.split(",")]:
            q = torch.randn(a.batch, a.heads, n, a.head_dim, device="cuda", dtype=dt)
            k = torch.randn(a.batch, hkv, n, a.head_dim, device="cuda", dtype=dt)
            v = torch.randn(a.batch, hkv, n, a.head_dim, device="cuda", dtype=dt)
            out = torch.empty_like(q)
            scale = a.head_dim ** -0.5
            flops = attention_flops(a.batch, a.heads, n, n, a.head_dim, causal)
            ref = None
            impls = []
            for lib in [x for x in a.libs.split(",") if x]:
                be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                      "efficient": SDPBackend.EFFICIENT_ATTENTION}[lib]

                def fn(be=be):
                    with sdpa_kernel(be):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                              enable_gqa=hkv != a.heads)
                impls.append((f"sdpa_{lib}", "", fn))
            for var in a.variant:
                step, cfg = parse_variant(var)
                if cfg is None:
                    step, cfg = step, resolve(step.name, q, k, causal)[1]

                def fn(step=step, cfg=cfg):
                    return launch(q, k, v, out, step, cfg, causal=causal, scale=scale)
                impls.append((var, cfg.label(), fn))
            for label, cfg_label, fn in impls:
                t0 = time.perf_counter()
                try:
                    o = fn()
                    torch.cuda.synchronize()
                    if ref is None and label.startswith("sdpa"):
                        ref = o.float()
                    err = (o.float() - ref).abs().max().item() if ref is not None else float("nan")
                    tm = time_cuda(fn, warmup=3, reps=a.reps)
                    row = dict(impl=label, config=cfg_label, N=n, causal=causal,
                               median_ms=tm.median_ms, spread=tm.spread,
                               tflops=tflops(flops, tm.median_ms), err_vs_lib=err, error="")
                except Exception as e:
                    row = dict(impl=label, config=cfg_label, N=n, causal=causal,
                               median_ms=math.nan, spread=math.nan, tflops=math.nan,
                               err_vs_lib=math.nan, error=f"{type(e).__name__}: {e}"[:300])
                rows.append(row)
                print(f"[{time.perf_counter() - t0:5.1f}s] {'causal' if causal else 'full  '} "
                      f"N={n:<6} {label:<28} {row['tflops']:7.1f} TFLOPS  err {row['err_vs_lib']:.2g}"
                      f" {row['error']}", file=sys.stderr, flush=True)
    # Ratios to cuDNN in the same run.
    for r in rows:
        c = [x for x in rows if x["impl"] == "sdpa_cudnn" and x["N"] == r["N"]
             and x["causal"] == r["causal"]]
        r["ratio_cudnn"] = r["tflops"] / c[0]["tflops"] if c and c[0]["tflops"] else math.nan
    print(f"{'impl':<28} {'causal':<6} " + " ".join(f"{n:>14}" for n in a.seqlens.split(",")))
    for causal in causals:
        for label in dict.fromkeys(r["impl"] for r in rows):
            cells = []
            for n in a.seqlens.split(","):
                r = [x for x in rows if x["impl"] == label and x["N"] == int(n)
                     and x["causal"] == causal]
                cells.append(f"{r[0]['tflops']:6.0f} ({r[0]['ratio_cudnn']:.2f}x)" if r else "")
            print(f"{label:<28} {str(causal):<6} " + " ".join(f"{c:>14}" for c in cells))
    if a.json:
        from flashattn.env import metadata
        with open(a.json, "w") as f:
            json.dump(dict(meta=metadata(" ".join(sys.argv)), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
