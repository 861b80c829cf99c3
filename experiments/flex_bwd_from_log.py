"""Rebuild results/h200/flex/flex_bench_backward_first.json from the first run's printed rows.

The flex backward run (`python -m flashbook record --part flex-backward`, session of
2026-12-02) was stopped by its command's `timeout 400` during the first bfloat16 workload, before
the benchmark wrote its JSON (it writes once, at the end; it now writes after every row). Every
row it finished was printed (results/h200/flex/flex_bench_backward_first.log): the medians and the
TFLOPS over visited blocks. This rebuilds the dataset from those lines, with the metadata of the
forward run recorded on the same machine minutes before, and says so in ``meta.source``. The
rows carry no confidence intervals and no agreement check (not printed). That run used the
64 x 64 tiles without hints; the full re-run on the per-arch tiles is flex_bench_backward.json
(fp16) and flex_bench_backward_bf16.json, written by the bench itself.

    python experiments/flex_bwd_from_log.py
"""
import json
import lzma
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLEX = ROOT / "results" / "h200" / "flex"
ROW = re.compile(r"^(fwd|bwd)\s+(\w+)\s+(\S+) N=\s*(\d+) blocks (\d+)/(\d+): (.*)$")
IMPL = re.compile(r"([\w.#]+) ([\d.]+) ms \((\d+) TF\)")


def parse(text: str, B=4, H=32, D=128, blk=128) -> list[dict]:
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        pas, dtype, name, N, blocks, dense, rest = m.groups()
        flops = 4.0 * B * H * D * int(blocks) * blk * blk * (2.5 if pas == "bwd" else 1.0)
        impls = {n: dict(median_ms=float(ms), tflops_visited=flops / (float(ms) * 1e-3) / 1e12)
                 for n, ms, _ in IMPL.findall(rest)}
        row = dict(workload=name, N=int(N), B=B, H=H, D=D, dtype=dtype, blocks=int(blocks),
                   dense_blocks=int(dense), visited_flops=flops, impls=impls, errors={},
                   **{"pass": pas})
        if "torch.flex" in impls and "flashattn.flex" in impls:
            row["speedup_vs_torch_flex"] = (impls["torch.flex"]["median_ms"]
                                            / impls["flashattn.flex"]["median_ms"])
        rows.append(row)
    return rows


def main():
    text = (FLEX / "flex_bench_backward_first.log").read_text()
    fwd_meta = json.loads(lzma.open(FLEX / "flex_bench.json.xz").read())["meta"]
    meta = {k: v for k, v in fwd_meta.items() if k not in ("skipped", "wall_s", "passes",
                                                             "dtypes", "command")}
    meta.update(command="python -m flashbook record --part flex-backward --out $OUT/r "
                        "(under `timeout 400`)",
                passes=["bwd"], dtypes=["float16", "bfloat16"],
                skipped=["bfloat16 after its first workload (the command's time limit)"],
                source="rebuilt from the run's printed rows by experiments/flex_bwd_from_log.py:"
                       " medians only, no intervals or agreement checks; machine metadata from "
                       "the forward run (flex_bench.json) recorded minutes before on the same "
                       "machine")
    rows = parse(text)
    out = FLEX / "flex_bench_backward_first.json.xz"
    with lzma.open(out, "wt") as f:
        f.write(json.dumps(dict(meta=meta, rows=rows), indent=1) + "\n")
    print(f"wrote {out}: {len(rows)} rows")


if __name__ == "__main__":
    main()
