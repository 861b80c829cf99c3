"""E9: does the rounds method hold a control within 2 %? (chapter 3; issue: precise measurements)

Runs ``flashbook.measure.bench.run_bench`` on the default workload (B=4, H=32, D=128, fp16)
with a control (the same kernel timed twice as two implementations) beside cuDNN and
FlashAttention-2, for each timing method, causal and not, and prints the control's gap and the
ratio to cuDNN with its 95 % interval. Writes each bench document to OUT/.

    python experiments/method_study.py --out $OUT/method [--seqlens 1024,...] [--methods rounds,interleaved]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flashbook.data.schema import write_json
from flashattn.stats import gap, ratio_ci


def control_table(doc: dict, a: str, b: str) -> list[dict]:
    """Per N: the control's gap (|a/b - 1| with its interval) and each impl's ratio to cuDNN."""
    rows = doc["rows"]
    by = {(r["impl"], r["Nq"]): r for r in rows if not r.get("error")}
    out = []
    for n in sorted({r["Nq"] for r in rows}):
        ra, rb = by.get((a, n)), by.get((b, n))
        line = dict(N=n)
        if ra and rb and ra.get("samples_ms") and rb.get("samples_ms"):
            g, lo, hi = gap(ra["samples_ms"], rb["samples_ms"])
            line.update(control_gap=g, control_lo=lo, control_hi=hi)
        elif ra and rb:
            line.update(control_gap=abs(ra["median_ms"] / rb["median_ms"] - 1))
        for (impl, nn), r in by.items():
            if nn == n:
                line[impl] = (r.get("ratio_cudnn"), r.get("ratio_cudnn_lo"), r.get("ratio_cudnn_hi"),
                              r.get("tflops"), r.get("host_ms"), r.get("median_ms"))
        out.append(line)
    return out


def main(argv=None) -> int:
    from flashbook.measure.bench import run_bench
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--seqlens", default="1024,2048,4096,8192,16384")
    p.add_argument("--methods", default="rounds,interleaved")
    p.add_argument("--steps", default="arch_tuned,arch_tuned#2")
    p.add_argument("--causal", default="1,0")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--inner", type=int, default=10)
    a = p.parse_args(argv)
    steps = a.steps.split(",")
    out = Path(a.out)
    for causal in (bool(int(c)) for c in a.causal.split(",")):
        for method in a.methods.split(","):
            doc = run_bench(steps, [int(x) for x in a.seqlens.split(",")], causal=causal,
                            baselines=["cudnn", "flash"], method=method, rounds=a.rounds,
                            inner=a.inner, progress=False,
                            command="python " + " ".join(sys.argv))
            name = f"{'causal' if causal else 'full'}-{method}"
            write_json(out / f"{name}.json", doc)
            print(f"== {name}: control {steps[0]} vs {steps[1]}")
            for line in control_table(doc, steps[0], steps[1]):
                ctrl = (f"gap {line.get('control_gap', float('nan')):.2%}"
                        + (f" [{line['control_lo']:+.2%}, {line['control_hi']:+.2%}]"
                           if "control_lo" in line else ""))
                ratios = "  ".join(
                    f"{k}={v[0]:.3f}" + (f"[{v[1]:.3f},{v[2]:.3f}]" if v[1] is not None else "")
                    + (f" host={1e3 * v[4]:.0f}us" if v[4] else "")
                    for k, v in line.items() if isinstance(v, tuple) and v[0] is not None)
                print(f"  N={line['N']:<6} {ctrl}  {ratios}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
