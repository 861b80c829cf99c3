"""Markdown tables of the recorded dataset for the issues' closing notes (CPU only):

    python experiments/note_tables.py [control|ladder|targets|forward|backward|decode|all]

control: the control's gap (best vs best#2, paired by round) at every N of every workload;
ladder:  the Hopper ladder (step x N x causal: TFLOPS with its 95 % interval, ratio to cuDNN);
targets: best against cuDNN with its interval and the fraction of the H200's dense fp16 peak;
forward: arch_tuned, warp_groups and best per workload and N (issue 10): TFLOPS, % of peak,
         x cuDNN, x FA2 (SDPA's flash back end) and x FlexAttention, each paired by round;
backward: the backward alone and forward + backward (issue 11), ours against cuDNN and FA2;
decode:   decode latency, bandwidth and fraction of HBM peak per shape (issue 12), and varlen.
"""
from __future__ import annotations

import sys
from pathlib import Path

from flashbook.data import results
from flashbook.data.schema import read_json
from flashbook.hardware import PEAK_TFLOPS
from flashattn.stats import gap
from flashbook.steps import HOPPER_LADDER



def _rows(r, workload):
    b = r.bench[r.bench["workload"] == workload]
    return {(x["impl"], int(x["Nq"])): x for x in b.to_dict("records")}


def _tf_ci(row):
    """TFLOPS at the ends of the time's 95 % interval (slowest first)."""
    t = row["tflops"] * row["median_ms"]
    return t / row["ci_hi_ms"], t / row["ci_lo_ms"]


def _ok(row) -> bool:
    return row is not None and not isinstance(row.get("error"), str)


def control(r) -> str:
    out = ["| workload | N | best (ms) | best#2 (ms) | gap | 95 % interval of the gap |",
           "|---|---|---|---|---|---|"]
    for w in r.workloads:
        rows = _rows(r, w)
        for (impl, n), a in sorted(rows.items(), key=lambda t: t[0][1]):
            if impl != "best" or ("best#2", n) not in rows:
                continue
            b = rows[("best#2", n)]
            g, lo, hi = gap(a["samples_ms"], b["samples_ms"])
            out.append(f"| {w} | {n} | {a['median_ms']:.4f} | {b['median_ms']:.4f} | "
                       f"{100 * g:+.2f} % | [{100 * lo:+.2f}, {100 * hi:+.2f}] % |")
    return "\n".join(out)


def ladder(r) -> str:
    out = ["| rung | causal | N | TFLOPS [95 % CI] | × cuDNN [95 % CI] |", "|---|---|---|---|---|"]
    for w, causal in (("fp16-causal-d128", "yes"), ("fp16-full-d128", "no")):
        rows = _rows(r, w)
        for impl, _ in HOPPER_LADDER:
            for n in sorted({k[1] for k in rows}):
                x = rows.get((impl, n))
                if not _ok(x):
                    continue
                lo, hi = _tf_ci(x)
                out.append(f"| `{impl}` | {causal} | {n} | {x['tflops']:.1f} [{lo:.1f}, {hi:.1f}] | "
                           f"{x['ratio_cudnn']:.3f} [{x['ratio_cudnn_lo']:.3f}, "
                           f"{x['ratio_cudnn_hi']:.3f}] |")
    return "\n".join(out)


def targets(r) -> str:
    out = ["| workload | N | config | TFLOPS | % of peak | × cuDNN [95 % CI] | target | met |",
           "|---|---|---|---|---|---|---|---|"]
    for w in r.workloads:
        rows = _rows(r, w)
        for n in sorted({k[1] for k in rows}):
            x = rows.get(("best", n))
            if not _ok(x):
                continue
            main = w in ("fp16-causal-d128", "fp16-full-d128")
            target = 1.10 if (main and n == 16384) else 1.0
            if main or n == 8192:
                met = "yes" if x["ratio_cudnn_lo"] >= target else (
                    "no" if x["ratio_cudnn_hi"] < target else "within the interval")
                miss = "" if met == "yes" else f" ({100 * (x['ratio_cudnn'] / target - 1):+.1f} %)"
                out.append(f"| {w} | {n} | {x['config']} | {x['tflops']:.1f} | "
                           f"{100 * x['tflops'] / PEAK_TFLOPS:.1f} | {x['ratio_cudnn']:.3f} "
                           f"[{x['ratio_cudnn_lo']:.3f}, {x['ratio_cudnn_hi']:.3f}] | "
                           f"≥ {target:.2f} | {met}{miss} |")
    return "\n".join(out)


def forward(r) -> str:
    """The Hopper steps after arch_tuned against the libraries recorded in the same run."""
    from flashattn.stats import ratio_ci
    out = ["| workload | N | step | config | TFLOPS | % of peak | × cuDNN [95 % CI] | "
           "× FA2 [95 % CI] | × Flex [95 % CI] |", "|---|---|---|---|---|---|---|---|---|"]

    def vs(rows, x, lib, n):
        y = rows.get((lib, n))
        if not _ok(y):
            return "–"
        v, lo, hi = ratio_ci(y["samples_ms"], x["samples_ms"])
        return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"

    for w in r.workloads:
        rows = _rows(r, w)
        for n in sorted({k[1] for k in rows}):
            for impl in ("arch_tuned", "warp_groups", "best"):
                x = rows.get((impl, n))
                if not _ok(x):
                    continue
                out.append(f"| {w} | {n} | {impl} | {x['config']} | {x['tflops']:.1f} | "
                           f"{100 * x['tflops'] / PEAK_TFLOPS:.1f} | "
                           f"{vs(rows, x, 'sdpa_cudnn', n)} | {vs(rows, x, 'sdpa_flash', n)} | "
                           f"{vs(rows, x, 'flex', n)} |")
    return "\n".join(out)


ROOT = Path(__file__).resolve().parents[1]


def _ci(x, key):
    return f"{x[key]:.3f} [{x[key + '_lo']:.3f}, {x[key + '_hi']:.3f}]"


def backward(r) -> str:
    """Every backward document: ours (and the libraries) per pass, N: TFLOPS, x cuDNN, x FA2."""
    out = ["| workload | pass | impl | N | TFLOPS | % of peak | × cuDNN [95 % CI] | "
           "× FA2 [95 % CI] |", "|---|---|---|---|---|---|---|---|"]
    # json_docs: NAME.json or NAME.json.xz (the recorded documents are committed compressed).
    for f in results.json_docs(ROOT / "results" / "h200" / "bench-backward"):
        doc = read_json(f)
        w = doc["meta"]["workload"]["name"]
        for x in doc["rows"]:
            if x.get("error") or x["pass"] == "fwd" or x["impl"] not in ("fmha_bwd",):
                continue
            out.append(f"| {w} | {x['pass']} | {x['impl']} | {x['Nq']} | {x['tflops']:.1f} | "
                       f"{100 * x['tflops'] / PEAK_TFLOPS:.1f} | {_ci(x, 'ratio_cudnn')} | "
                       f"{_ci(x, 'ratio_fa2')} |")
    return "\n".join(out)


def decode(r) -> str:
    """Decode rows (part decode) of ours and the fastest PyTorch row; varlen pairs."""
    doc = read_json(ROOT / "results" / "h200" / "decode" / "decode.json")
    out = ["| B | Nq | cache | impl | ms | GB/s | % of HBM peak | × fastest PyTorch |",
           "|---|---|---|---|---|---|---|---|"]
    for x in doc["rows"]:
        if x.get("error") or x.get("part") != "decode" or x["impl"] not in (
                "decode", "decode_paged64", "square_best"):
            continue
        out.append(f"| {x['B']} | {x['Nq']} | {x['Nk']} | {x['impl']} | {x['median_ms']:.4f} | "
                   f"{x['gbps']:.0f} | {100 * x['frac_peak']:.0f} | "
                   f"{x['ratio_best_torch']:.2f} |")
    cv = read_json(ROOT / "results" / "h200" / "decode" / "crossover-varlen.json")
    out += ["", "| mix | packed varlen (ms) | padded square (ms) | padded / packed |",
            "|---|---|---|---|"]
    pairs = {}
    for x in cv["rows"]:
        if x.get("part") == "varlen" and not x.get("error"):
            pairs.setdefault(x["config"].split(":")[0], {})[x["impl"]] = x["median_ms"]
    for mix, p in pairs.items():
        if {"varlen", "square_padded"} <= set(p):
            out.append(f"| {mix} | {p['varlen']:.3f} | {p['square_padded']:.3f} | "
                       f"{p['square_padded'] / p['varlen']:.2f} |")
    return "\n".join(out)


def main(argv):
    r = results.load("h200")
    what = argv[0] if argv else "all"
    for name, fn in (("control", control), ("ladder", ladder), ("targets", targets),
                     ("forward", forward),
                     ("backward", backward), ("decode", decode)):
        if what in (name, "all"):
            print(f"## {name}\n\n{fn(r)}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
