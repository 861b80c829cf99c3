"""E28: a dynamic persistent grid for the forward: one program per SM slot, each taking its next
(query tile, head) from an atomic counter, against the hardware's own launch order.

    python experiments/dynamic_grid.py --out experiments/data/39-dynamic-grid/dynamic.json

E7 (the `persistent` experiment) dealt work items round-robin to a fixed grid and lost to the
hardware's launch order. Here the order is the hardware's (or longest-first over all heads), but
the hand-out is dynamic: a program that finishes early takes the next item, as the hardware
does with new programs, without a program's launch and teardown between items. The kernel lives
here, not in the library: it imports the library's tile body (``attend_query_tile``; cuTile
inlines a helper from another module) and adds only the loop.

Variants (all at arch_tuned's Hopper tile, 64x128 with two programs per SM, the seed's flags):
``dynamic`` (head-major order: the query tiles of one head together, longest first: what the
hardware does with the `remap` grid), ``dynamic_prefetch`` (the next item fetched before the
current one is computed, so the atomic's latency hides behind the tile), ``dynamic_lpt``
(longest tiles of every head first: chapter 8's greedy order, at the cost of K/V locality in
L2). Baseline: the library's ``arch_tuned`` at the same configuration, twice (the control), and
E7's static persistent grid.

Prediction (before timing): within the control at 4K-16K (a program's launch costs far less
than one of its tiles: tens of microseconds at 16K causal), perhaps ~1 % at 1K where the tiles
are short; ``dynamic_lpt`` slower at 16K (every head's K/V live in L2 at once).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cuda.tile as ct  # noqa: E402

from flashbook.ladder.fmha import INV_LOG_2, attend_query_tile  # noqa: E402
from flashattn.kernels.spec import Array, KernelSpec  # noqa: E402

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]


@ct.kernel
def fmha_dynamic_kernel(Q, K, V, Out, Lse, Counter,
                        qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                        num_m_blocks: int,
                        TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                        CAUSAL: ConstBool, EVEN_K: ConstBool, FAST_MATH: ConstBool,
                        SPLIT_LOOP: ConstBool, LAZY_RESCALE: ConstBool, EXP_POLY: ConstInt,
                        UNCHECKED_KV: ConstBool, K_LAT: ConstInt, V_LAT: ConstInt,
                        WRITE_LSE: ConstBool, PREFETCH: ConstBool, LPT: ConstBool):
    """The forward over work items t = 0 .. total-1 handed out by ``Counter[0]`` (int32, 2
    elements, zero at launch; the last program to finish sets both back to 0). Item t is query
    tile ``tile`` of (batch, head) ``bh``: head-major (``bh = t // num_m_blocks``), or with LPT
    tile-major (``bh = t % BH``); causal tiles longest first."""
    qk_scale = qk_scale * INV_LOG_2
    bh_count = Q.shape[0] * num_heads
    total = num_m_blocks * bh_count
    t = ct.atomic_add(Counter, 0, 1)
    while t < total:
        if PREFETCH:
            nxt = ct.atomic_add(Counter, 0, 1)
        if LPT:
            bh = t % bh_count
            tile = t // bh_count
        else:
            bh = t // num_m_blocks
            tile = t % num_m_blocks
        if CAUSAL:
            tile = num_m_blocks - 1 - tile
        attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, tile, bh // num_heads,
                          bh % num_heads, (bh % num_heads) // group_size, TILE_M, TILE_N,
                          TILE_D, CAUSAL, EVEN_K, FAST_MATH, SPLIT_LOOP, LAZY_RESCALE,
                          EXP_POLY, UNCHECKED_KV, K_LAT, V_LAT, WRITE_LSE, False)
        if PREFETCH:
            t = nxt
        else:
            t = ct.atomic_add(Counter, 0, 1)
    # Every program has taken its last (failed) item before it counts itself done; the last
    # one to count sees every fetch and resets the counter for the next launch in the stream.
    done = ct.atomic_add(Counter, 1, 1)
    if done == ct.num_blocks(0) - 1:
        ct.atomic_xchg(Counter, 0, 0)
        ct.atomic_xchg(Counter, 1, 0)


DYNAMIC = KernelSpec(
    "fmha_dynamic", "experiments.dynamic_grid", "fmha_dynamic_kernel",
    arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4),
            Array("Lse", 3, "float32"), Array("Counter", 1, "int32")),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int), ("num_m_blocks", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "FAST_MATH", "SPLIT_LOOP",
               "LAZY_RESCALE", "EXP_POLY", "UNCHECKED_KV", "K_LAT", "V_LAT", "WRITE_LSE",
               "PREFETCH", "LPT"))

VARIANTS = {"dynamic": dict(PREFETCH=False, LPT=False),
            "dynamic_prefetch": dict(PREFETCH=True, LPT=False),
            "dynamic_lpt": dict(PREFETCH=True, LPT=True)}


def constants(config, *, head_dim: int, causal: bool, even_k: bool, **variant) -> dict:
    """The dynamic kernel's constants: arch_tuned's flags at ``config``, plus the variant's."""
    from flashattn.kernels import fmha_constants
    from flashbook.steps import get_step
    step = get_step("arch_tuned")
    c = dict(step.flag_values(), **fmha_constants(step, config, head_dim=head_dim,
                                                  causal=causal, even_k=even_k))
    return {n: c[n] for n in DYNAMIC.constants if n in c} | variant


_COUNTERS: dict = {}


def counter(device):
    """The (2,) int32 counter of ``device``, zeroed once (self-resetting after each launch)."""
    import torch
    key = str(device)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(2, dtype=torch.int32, device=device)
    return _COUNTERS[key]


def attention_dynamic(q, k, v, *, causal: bool, config, programs: int, variant="dynamic",
                      out=None):
    """Forward attention through the dynamic grid of ``programs`` programs (validated contiguous
    (B, H, N, D) tensors, GQA allowed); runs on CPU tensors in the interpreter."""
    import torch

    from flashattn.dispatch import launch_kernel
    from flashattn.kernels import hinted
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((1, 1, 1), dtype=torch.float32, device=q.device)
    args = DYNAMIC.args(
        dict(Q=q, K=k, V=v, Out=out, Lse=lse, Counter=counter(q.device)),
        dict(qk_scale=1 / math.sqrt(D), input_pos=0, num_heads=Hq, group_size=Hq // Hkv,
             num_m_blocks=-(-Nq // config.TILE_M)),
        constants(config, head_dim=D, causal=causal, even_k=Nk % config.TILE_N == 0,
                  **VARIANTS[variant]))
    launch_kernel(q.device, (programs, 1, 1), hinted(DYNAMIC.kernel(), config.hints()), args,
                  stream="current")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seqlens", default="1024,4096,16384")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("error: experiments/dynamic_grid.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from flashattn.stats import ratio_ci
    from flashattn.env import metadata
    from flashattn.launch import launch
    from flashattn import timing
    from flashbook.measure.harness import estimate_ms
    from flashbook.measure.libraries import library_fn
    from flashbook.measure.workload import SAMPLE_MS
    from flashbook.steps import Config, get_step
    B, H, D = 4, 32, 128
    cfg = Config(64, 128, occupancy=2)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    t0 = time.perf_counter()
    for N in (int(n) for n in a.seqlens.split(",")):
        for causal in (True, False):
            g = torch.Generator(device="cuda").manual_seed(N + causal)
            q, k, v = (torch.randn(B, H, N, D, generator=g, device="cuda",
                                   dtype=torch.float16) for _ in range(3))
            outs = {}

            def step(name, out):
                return lambda: launch(q, k, v, out, get_step(name), cfg, causal=causal,
                                      scale=1 / math.sqrt(D))
            calls = {}
            for name in ("arch_tuned", "arch_tuned#2", "persistent"):
                outs[name] = torch.empty_like(q)
                calls[name] = step(name.split("#")[0], outs[name])
            for var in VARIANTS:
                outs[var] = torch.empty_like(q)
                calls[var] = (lambda var=var: attention_dynamic(
                    q, k, v, causal=causal, config=cfg, programs=sms * 2, variant=var,
                    out=outs[var]))
            fn, ctx = library_fn("sdpa_cudnn", q, k, v, causal=causal, scale=1 / math.sqrt(D))

            def cudnn(fn=fn, ctx=ctx):
                with ctx():
                    return fn()
            calls["sdpa_cudnn"] = cudnn
            for name, c in calls.items():
                c()
            torch.cuda.synchronize()
            want = outs["arch_tuned"]
            same = {n: bool(torch.equal(o, want)) for n, o in outs.items()}
            est = estimate_ms(calls)
            inner = max(1, min(10, round(SAMPLE_MS / max(min(est.values()), 1e-3))))
            res = timing.time_rounds(calls, rounds=a.rounds, inner=inner)
            flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
            for name, t in res.items():
                r, lo, hi = ratio_ci(res["arch_tuned"].samples, t.samples)
                rc, _, _ = ratio_ci(res["sdpa_cudnn"].samples, t.samples)
                rows.append(dict(N=N, causal=causal, impl=name, median_ms=t.median_ms,
                                 tflops=flops / (t.median_ms * 1e-3) / 1e12,
                                 speedup=r, speedup_lo=lo, speedup_hi=hi,
                                 ratio_cudnn=rc,
                                 equal_to_arch_tuned=same.get(name)))
                print(f"N={N:6d} causal={causal!s:5s} {name:17s} {t.median_ms:8.3f} ms  "
                      f"x arch_tuned {r:.3f} [{lo:.3f}, {hi:.3f}]  equal={same.get(name)}",
                      flush=True)
    meta = metadata("python experiments/dynamic_grid.py " + " ".join(argv or sys.argv[1:]))
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
