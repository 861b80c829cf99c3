"""E14: the backward's tile configurations on the GPU, against cuDNN's backward in the same rounds.

    python experiments/bwd_sweep.py --out experiments/data/20-bwd-sweep/sweep.json

``kernels.BWD_CONFIGS`` was chosen from the compiler's report alone (no spills), never timed.
This times the backward alone (``attention_backward`` from a fixed out and LSE, as
``bench --backward``'s pass ``bwd``) for a few (bwd_dkdv, bwd_dq) configurations, one kernel
varied at a time from the current one, plus the atomics variant and cuDNN's backward, with
``timing.time_rounds`` (idle-start, random order per round). B=4, H=32, D=128, fp16. Writes one
JSON document: per (N, causal) the median ms and the paired ratio to cuDNN with its 95 %
interval. The verdict goes in experiments/LOG.md (E14).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (label, {kernel: Config string}): the current configuration first.
VARIANTS = [
    ("current", {}),
    ("dkdv 128x128 nww=8", {"bwd_dkdv": "128x128 nww=8"}),
    ("dkdv 64x64 nww=8", {"bwd_dkdv": "64x64 nww=8"}),
    ("dkdv 128x64 nww=8", {"bwd_dkdv": "128x64 nww=8"}),
    ("dkdv 64x128", {"bwd_dkdv": "64x128"}),
    ("dq 128x128 nww=8", {"bwd_dq": "128x128 nww=8"}),
    ("dq 64x128 nww=8", {"bwd_dq": "64x128 nww=8"}),
    ("dq 64x64 nww=8", {"bwd_dq": "64x64 nww=8"}),
    ("atomic", "atomic"),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--rounds", type=int, default=20)
    a = p.parse_args(argv)
    import torch

    from flashattn.autograd import attention_forward
    from flashattn.stats import ratio_ci
    from flashattn.env import metadata
    from flashattn.launch_bwd import attention_backward
    from flashattn import timing
    from flashbook.measure.harness import estimate_ms
    from flashbook.measure.workload import SAMPLE_MS
    from flashattn.config import Config
    B, H, D = 4, 32, 128
    scale = 1 / math.sqrt(D)
    doc = {"meta": metadata("python experiments/bwd_sweep.py " + " ".join(argv or sys.argv[1:])),
           "workload": dict(B=B, H=H, D=D, dtype="float16"), "runs": []}
    t_all = time.perf_counter()
    for N in (int(n) for n in a.seqlens.split(",")):
        for causal in (True, False):
            sets = []
            for i in range(3):
                g = torch.Generator(device="cuda").manual_seed(N + 31 * i)
                q, k, v, do = (torch.randn(B, H, N, D, generator=g, device="cuda",
                                           dtype=torch.float16) for _ in range(4))
                with torch.no_grad():
                    out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
                sets.append((q, k, v, do, out, lse))
            fns, ref = {}, None
            for label, var in VARIANTS:
                cfgs = None if var == "atomic" else \
                    {kname: Config.parse(c) for kname, c in var.items()}
                fs = []
                for q, k, v, do, out, lse in sets:
                    grads = tuple(torch.empty_like(t) for t in (q, k, v))
                    fs.append(lambda q=q, k=k, v=v, do=do, out=out, lse=lse, grads=grads,
                              cfgs=cfgs, det=var != "atomic":
                              attention_backward(q, k, v, out, do, lse, causal=causal,
                                                 scale=scale, grads=grads, configs=cfgs,
                                                 deterministic=det))
                try:
                    got = fs[0]()
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = [t.float() for t in got]
                    err = max((g.float() - r).abs().max().item() for g, r in zip(got, ref))
                    fns[label] = (fs, err)
                except Exception as e:   # a configuration that does not compile is a row
                    doc["runs"].append(dict(N=N, causal=causal, variant=label,
                                            error=f"{type(e).__name__}: {e}"[:300]))
                    print(N, causal, label, "ERROR", e, flush=True)
            # cuDNN's backward from its own forward, exactly as bench --backward times it
            from flashbook.measure.bench_bwd import _make_fns
            lib_sets = [tuple(t.detach().requires_grad_(i < 3) for i, t in
                              enumerate((q, k, v, do))) for q, k, v, do, _, _ in sets]
            cud, ctx, _ = _make_fns("sdpa_cudnn", "bwd", lib_sets, causal=causal, scale=scale,
                                    fwd_step="best")
            it = [0]

            def cudnn_call(cud=cud, ctx=ctx):
                it[0] += 1
                with ctx():
                    return cud[it[0] % len(cud)]()
            calls = {"sdpa_cudnn": cudnn_call}
            for label, (fs, _) in fns.items():
                calls[label] = (lambda fs=fs, c=[0]: (c.__setitem__(0, c[0] + 1),
                                                      fs[c[0] % len(fs)]())[1])
            est = estimate_ms(calls)
            inner = {n: max(1, min(10, round(SAMPLE_MS / max(e, 1e-3)))) for n, e in est.items()}
            inner = {n: min(inner.values()) for n in inner}      # one batch length for all
            res = timing.time_rounds(calls, rounds=a.rounds, inner=inner)
            c = res["sdpa_cudnn"]
            for name, t in res.items():
                r, lo, hi = ratio_ci(c.samples, t.samples)
                row = dict(N=N, causal=causal, variant=name, median_ms=t.median_ms, ratio_cudnn=r,
                           ratio_lo=lo, ratio_hi=hi,
                           max_abs_diff_vs_current=fns[name][1] if name in fns else None)
                doc["runs"].append(row)
                print(f"N={N} causal={causal} {name:22s} {t.median_ms:8.3f} ms  "
                      f"x cuDNN {r:.3f} [{lo:.3f}, {hi:.3f}]", flush=True)
    doc["meta"]["seconds"] = round(time.perf_counter() - t_all, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
