"""E11: where does the sample-to-sample noise at large N come from? (LOG.md, E11)

In the rounds method at N >= 4K one sample (a ~50 ms batch) varies by 4-6 % (sd) from round to
round, uncorrelated between implementations of the same round and between consecutive rounds,
while at N = 1K (a ~1 ms batch) it varies by 1 %. Hypothesis: long batches run into the
GPU's power/clock management; shorter samples (one launch) vary less. This times the same
kernel twice (a control) and cuDNN, three ways, and reads the SM clock (NVML, read-only)
after every sample:

    batch   ~50 ms of back-to-back launches per sample (today's method)
    single  one launch per sample
    gap     one launch per sample after 20 ms of idle GPU

    python experiments/noise_probe.py OUT_DIR [ROUNDS]
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from flashattn.launch import launch
from flashbook.measure.bench import _inputs, library_fn, resolve_impl
from flashattn.timing import _capture, flush_l2

try:
    import pynvml
    pynvml.nvmlInit()
    _H = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
except Exception:   # no NVML: clocks read -1
    _H = None


def sm_clock() -> int:
    return pynvml.nvmlDeviceGetClockInfo(_H, pynvml.NVML_CLOCK_SM) if _H else -1


def power_w() -> float:
    return pynvml.nvmlDeviceGetPowerUsage(_H) / 1e3 if _H else -1.0


def main(out: Path, rounds: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    B, H, D = 4, 32, 128
    scale = 1 / math.sqrt(D)
    torch.set_grad_enabled(False)
    doc = dict(rounds=rounds, rows=[])
    for N in (4096, 8192, 16384):
        sets = [_inputs(B, H, H, N, D, torch.float16, dev, seed=N + 7919 * i) for i in range(3)]
        outs = [torch.empty_like(s[0]) for s in sets]
        step, cfg = resolve_impl("arch_tuned@64x128:occ=2", sets[0][0], sets[0][1], True)
        mine = [lambda t=t, o=o: launch(t[0], t[1], t[2], o, step, cfg, causal=True, scale=scale)
                for t, o in zip(sets, outs)]
        lib, ctx = library_fn("sdpa_cudnn", *sets[0], causal=True, scale=scale)
        fns = {"A": mine[0], "A#2": mine[0], "cudnn": lib}
        # estimate one launch
        est = {}
        for n, f in fns.items():
            with ctx() if n == "cudnn" else _null():
                f(); torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(3):
                    f()
                torch.cuda.synchronize()
                est[n] = (time.perf_counter() - t0) / 3 * 1e3
        inner_batch = max(1, min(10, round(50 / est["A"])))
        for mode in ("batch", "single", "gap"):
            inner = inner_batch if mode == "batch" else 1
            graphs = {}
            for n, f in fns.items():
                with ctx() if n == "cudnn" else _null():
                    graphs[n] = _capture(f, inner)
            samples = {n: [] for n in fns}
            clocks = {n: [] for n in fns}
            powers = {n: [] for n in fns}
            rng = random.Random(N)
            t_start = time.perf_counter()
            for _ in range(rounds):
                order = list(fns)
                rng.shuffle(order)
                for n in order:
                    flush_l2()
                    if mode == "gap":
                        torch.cuda.synchronize()
                        time.sleep(0.02)
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    graphs[n].replay()
                    e.record()
                    e.synchronize()
                    samples[n].append(s.elapsed_time(e) / inner)
                    clocks[n].append(sm_clock())
                    powers[n].append(power_w())
            wall = time.perf_counter() - t_start
            del graphs
            a, a2, c = (np.array(samples[k]) for k in ("A", "A#2", "cudnn"))
            row = dict(N=N, mode=mode, inner=inner, wall_s=wall, samples=samples, clocks=clocks,
                       powers=powers)
            doc["rows"].append(row)
            ck = np.array(clocks["A"], dtype=float)
            corr = float(np.corrcoef(a, ck)[0, 1]) if ck.std() > 0 else float("nan")
            print(f"N={N:5d} {mode:6s} inner={inner:2d} wall={wall:5.1f}s  "
                  f"A {np.median(a):.3f} ms sd {a.std() / np.median(a) * 100:4.1f}%  "
                  f"gap {100 * (np.median(a2) / np.median(a) - 1):+5.2f}%  "
                  f"A/cudnn {np.median(c) / np.median(a):.3f}  "
                  f"clock {ck.min():.0f}-{ck.max():.0f} MHz corr(t,clk) {corr:+.2f}  "
                  f"power {np.median(powers['A']):.0f} W", flush=True)
        del sets, outs
        torch.cuda.empty_cache()
    (out / "noise_probe.json").write_text(json.dumps(doc))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 60)
