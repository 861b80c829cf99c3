"""The forward's worst error per shipped mod and case, against PyTorch's flex_attention run
eagerly on CPU in the inputs' dtype and against the fp64 reference (issue 23's table), over the
grid of tests/test_flex.py (causal or not x MHA/GQA/MQA x ragged Nq != Nk x fp16/bf16).

    PYTHONPATH=. python experiments/flex_errors.py       # ~2 min on 2 cores, interpreter

Writes experiments/data/40-flex/errors.{md,json}.
"""
import collections
import json
import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import test_flex as T  # noqa: E402

OUT = ROOT / "experiments" / "data" / "40-flex"
SHAPES = [(37, 37, 4, 2), (20, 45, 2, 2), (45, 29, 4, 1)]


def main():
    warnings.simplefilter("ignore")
    worst = collections.defaultdict(lambda: dict(vs_flex=0.0, vs_fp64=0.0, torch_vs_fp64=0.0,
                                                 lse_vs_fp64=0.0, cases=0))
    for name in T.MODS:
        for causal in (True, False):
            for shape in SHAPES:
                for dtype in (torch.float16, torch.bfloat16):
                    Nq, Nk, Hq, Hkv = shape
                    case = f"{name}{causal}{shape}{dtype}"
                    q, k, v = T._qkv(case, 2, Hq, Hkv, Nq, Nk, 32, dtype)
                    score, mask = T._case(name, Hq, Nq, Nk, causal)
                    sinks = torch.linspace(-1.0, 2.0, Hq) if name == "sink" else None
                    block = (16, 32) if shape[0] != 45 else 32
                    out, lse, pt, ref, rlse = T._run_pair(q, k, v, score, mask, block=block,
                                                          sinks=sinks)
                    w = worst[(name, "causal" if causal else "full",
                               str(dtype).split(".")[-1])]
                    w["vs_flex"] = max(w["vs_flex"], (out.float() - pt.float()).abs().max().item())
                    w["vs_fp64"] = max(w["vs_fp64"], (out.double() - ref).abs().max().item())
                    w["torch_vs_fp64"] = max(w["torch_vs_fp64"],
                                             (pt.double() - ref).abs().max().item())
                    fin = torch.isfinite(rlse)
                    if fin.any():
                        w["lse_vs_fp64"] = max(w["lse_vs_fp64"], (lse.double()[fin] -
                                                                  rlse[fin]).abs().max().item())
                    w["cases"] += 1
    lines = ["Worst |error| over MHA/GQA/MQA x (37x37, 20x45, 45x29) x B=2, D=32 (interpreter)",
             "", "| mod | mask | dtype | ours vs torch flex (same dtype) | ours vs fp64 | "
             "torch flex vs fp64 | LSE vs fp64 |", "|---|---|---|---|---|---|---|"]
    for (name, c, dt), w in worst.items():
        lines.append(f"| {name} | {c} | {dt} | {w['vs_flex']:.2e} | {w['vs_fp64']:.2e} | "
                     f"{w['torch_vs_fp64']:.2e} | {w['lse_vs_fp64']:.1e} |")
    # The backward: dq, dk, dv (and dsinks) against the fp64 reference with autograd.
    import test_flex_backward as TB
    bw = collections.defaultdict(dict)
    for name in TB.MODS:
        for causal in (True, False):
            for shape in [(37, 37, 4, 2), (20, 45, 2, 1)]:
                for dtype in (torch.float16, torch.bfloat16):
                    case = f"bwd{name}{causal}{shape}{dtype}"
                    ours, ref, ref32, _ = TB._grads(case, name, causal, shape, dtype, (16, 32))
                    w = bw[(name, "causal" if causal else "full", str(dtype).split(".")[-1])]
                    for what, a, r, p in zip(("dq", "dk", "dv", "dsinks"), ours, ref, ref32):
                        pt = p.to(dtype) if what != "dsinks" else p
                        e = (a.double() - r).abs().max().item()
                        ept = (pt.double() - r).abs().max().item()
                        w[what] = max(w.get(what, 0.0), e)
                        w[what + "_torch"] = max(w.get(what + "_torch", 0.0), ept)
    lines += ["", "Backward: worst |error| vs fp64 (ours / the fp64 reference's gradient computed "
              "in fp32 and rounded to the dtype), GQA 4:2 37x37 and MQA 20x45, B=2, D=32", "",
              "| mod | mask | dtype | dq | dk | dv | dsinks |", "|---|---|---|---|---|---|---|"]
    for (name, c, dt), w in bw.items():
        cells = [f"{w[x]:.1e} / {w[x + '_torch']:.1e}" if x in w else "-"
                 for x in ("dq", "dk", "dv", "dsinks")]
        lines.append(f"| {name} | {c} | {dt} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "errors.md").write_text(table + "\n")
    (OUT / "errors.json").write_text(json.dumps(
        dict(forward={"|".join(k): v for k, v in worst.items()},
             backward={"|".join(k): v for k, v in bw.items()}), indent=1) + "\n")


if __name__ == "__main__":
    main()
