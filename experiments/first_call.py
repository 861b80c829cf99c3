"""First-call latency per public operator, from a cold cuTile cache, then after precompile.

    python experiments/first_call.py [--ops attention,decode] [--how export|launch|both]
                                     [--head-dim 128] [--heads 32:8] [--seq 2048] [--batch 2]
                                     [--processes 8] [--out first_call.json]

For each operator, every measurement runs in a fresh Python process (no in-memory kernel
cache) with its own empty ``CUDA_TILE_CACHE_DIR`` (no disk cache):

* cold: the first call (compilation included) and a second call of the same shape;
* for each ``--how``: ``flashattn.precompile([config], how=...)`` in one process (its wall
  time), then the first call in a fresh process sharing that cache directory.

Autotuning is off (``FLASHATTN_AUTOTUNE=0``) so that the first call measures compilation, not
a configuration search. Prints a table; ``--out`` writes the rows as JSON. Needs a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

OPS = ("attention", "attention_backward", "attention_varlen", "attention_varlen_backward",
       "decode", "flash_attn_func", "flash_attn_with_kvcache")


def config_of(op, a):
    hq, hkv = (int(x) for x in a.heads.split(":"))
    c = dict(op=op, head_dim=a.head_dim, heads=(hq, hkv), causal=True, dtype=a.dtype)
    if op == "flash_attn_func":
        c["window_size"] = (a.window, 0)
    return c


def child_call(op, a):
    """Time the operator's first and second call at the measured shape (in this process)."""
    import torch
    from flashattn import precompiler
    c = precompiler._check(config_of(op, a))
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        precompiler._calls(c, a.seq, a.batch, "cuda")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return dict(first_s=times[0], second_s=times[1])


def child_precompile(op, a, how):
    import flashattn
    t0 = time.perf_counter()
    rows = flashattn.precompile([config_of(op, a)], how=how, processes=a.processes)
    return dict(precompile_s=time.perf_counter() - t0, kernels=len(rows),
                errors=[r["error"] for r in rows if r["error"]])


def run_child(args, cache_dir, env_extra=None):
    env = dict(os.environ, CUDA_TILE_CACHE_DIR=cache_dir, FLASHATTN_AUTOTUNE="0",
               **(env_extra or {}))
    p = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True,
                       text=True, timeout=590)
    if p.returncode:
        return dict(error=(p.stderr or p.stdout).strip()[-400:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--how", default="both", choices=("export", "launch", "both"))
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", default="32:8")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--window", type=int, default=1024)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--out", default="")
    ap.add_argument("--child", default="")
    ap.add_argument("--child-op", default="")
    a = ap.parse_args(argv)
    if a.child == "call":
        print(json.dumps(child_call(a.child_op, a)))
        return 0
    if a.child in ("export", "launch"):
        print(json.dumps(child_precompile(a.child_op, a, a.child)))
        return 0
    shape = ["--head-dim", str(a.head_dim), "--heads", a.heads, "--dtype", a.dtype,
             "--seq", str(a.seq), "--batch", str(a.batch), "--window", str(a.window),
             "--processes", str(a.processes)]
    hows = ("export", "launch") if a.how == "both" else (a.how,)
    rows = []
    print(f"{'operator':28s} {'cold first (s)':>14s} {'second (s)':>10s} "
          + " ".join(f"{h + ' precompile (s)':>22s} {'then first (s)':>14s}" for h in hows),
          flush=True)
    for op in a.ops.split(","):
        row = dict(op=op, seq=a.seq, batch=a.batch, head_dim=a.head_dim, heads=a.heads)
        with tempfile.TemporaryDirectory() as d:
            row["cold"] = run_child(["--child", "call", "--child-op", op, *shape], d)
        for h in hows:
            with tempfile.TemporaryDirectory() as d:
                row[h] = run_child(["--child", h, "--child-op", op, *shape], d)
                row[h + "_then"] = run_child(["--child", "call", "--child-op", op, *shape], d)
        rows.append(row)

        def f(x, k):
            return f"{x[k]:.2f}" if k in x else "err"
        print(f"{op:28s} {f(row['cold'], 'first_s'):>14s} {f(row['cold'], 'second_s'):>10s} "
              + " ".join(f"{f(row[h], 'precompile_s'):>22s} {f(row[h + '_then'], 'first_s'):>14s}"
                         for h in hows), flush=True)
        for k, v in row.items():
            if isinstance(v, dict) and (v.get("error") or v.get("errors")):
                print(f"    {k}: {v.get('error') or v.get('errors')}", flush=True)
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
