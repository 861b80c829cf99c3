"""E10: the rounds method against triton.testing.do_bench (chapter 3).

For arch_tuned's kernel and cuDNN at B=4 H=32 D=128 fp16 causal, times the same launches with
``flashattn.timing.time_rounds`` (CUDA-graph batches, random order, 3 input sets),
``triton.testing.do_bench`` (events around each call, L2 flushed, a time budget) and
``triton.testing.do_bench_cudagraph`` (a graph of calls, no flush), and prints the medians and
the ratio arch_tuned / cuDNN each method gives. Writes OUT/timing-crosscheck.json.

    python experiments/timing_crosscheck.py --out $OUT
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
from pathlib import Path

import torch


def main(argv=None) -> int:
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from flashattn.launch import launch
    from flashattn.timing import time_rounds
    from flashbook.steps import Config, get_step, with_config
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    a = p.parse_args(argv)
    cfg = Config(64, 128, occupancy=2)
    step = with_config(get_step("arch_tuned"), cfg)
    rows = []
    for N in (int(x) for x in a.seqlens.split(",")):
        sets = [tuple(torch.randn(4, 32, N, 128, device="cuda", dtype=torch.float16)
                      for _ in range(3)) for _ in range(3)]
        outs = [torch.empty_like(s[0]) for s in sets]
        ours = [lambda s=s, o=o: launch(*s, o, step, cfg, causal=True, scale=128 ** -0.5)
                for s, o in zip(sets, outs)]
        sdpa = torch.nn.functional.scaled_dot_product_attention
        lib = [lambda s=s: sdpa(*s, is_causal=True) for s in sets]

        def cycle(fns):
            it = itertools.cycle(fns)
            return lambda: next(it)()
        res = {}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            r = time_rounds({"arch_tuned": cycle(ours), "cudnn": cycle(lib)}, rounds=20, inner=5)
            res["rounds"] = {k: v.median_ms for k, v in r.items()}
            res["do_bench"] = {"arch_tuned": tt.do_bench(ours[0], return_mode="median"),
                               "cudnn": tt.do_bench(lib[0], return_mode="median")}
            res["do_bench_cudagraph"] = {
                "arch_tuned": tt.do_bench_cudagraph(ours[0], return_mode="median"),
                "cudnn": tt.do_bench_cudagraph(lib[0], return_mode="median")}
        for method, d in res.items():
            rows.append(dict(N=N, method=method, arch_tuned_ms=d["arch_tuned"],
                             cudnn_ms=d["cudnn"], ratio=d["cudnn"] / d["arch_tuned"]))
            print(f"N={N:<6} {method:<19} arch_tuned {d['arch_tuned']:.4f} ms  cuDNN "
                  f"{d['cudnn']:.4f} ms  ratio {d['cudnn'] / d['arch_tuned']:.3f}", flush=True)
        del sets, outs
        torch.cuda.empty_cache()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    from flashattn.env import metadata
    Path(a.out, "timing-crosscheck.json").write_text(json.dumps(
        dict(meta=metadata("python experiments/timing_crosscheck.py"), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
