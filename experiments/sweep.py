"""An experiment run (chapter 10): the benchmark on chosen variants, written under
experiments/data/RUN/ as bench documents, one per workload.

    python experiments/sweep.py 06-worker-warps --causal both --seqlens 1024,4096,16384 \
        --steps arch_tuned,arch_tuned#2,arch_tuned@128x128:occ=1:nww=8 --baselines cudnn,flash

This is ``python -m flashbook bench`` (``flashbook.measure.bench.run_bench``) run once per causal
setting: every option after RUN, --causal, --prewarm and --force is the benchmark's own (steps,
variants ``STEP@TMxTN:occ=N:ctas=N:nww=N``, control copies ``STEP#2``, --seqlens, --dtype,
--gqa, --method, ...), so an experiment gets the same inputs, correctness check, timing method
and file format (``flashbook.data.schema``, results/README.md) as the recorded dataset.
``flashbook.data.results.load("h200").experiment(RUN)`` reads the run back. Record the
hypothesis and prediction in experiments/LOG.md before running.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
CAUSAL = {"yes": (True,), "no": (False,), "both": (True, False)}


def parse_args(argv: list[str]):
    """(sweep options, run_bench keyword arguments); SystemExit on a bad command line."""
    from flashbook.measure import bench
    p = argparse.ArgumentParser(
        prog="python experiments/sweep.py", description=__doc__.splitlines()[0],
        epilog="Other options are python -m flashbook bench's (see its --help).")
    p.add_argument("run", help="name of the run: its folder under --data (e.g. 06-worker-warps)")
    p.add_argument("--causal", choices=sorted(CAUSAL), default="both",
                   help="causal masking: yes, no, or both (one document each; default both)")
    p.add_argument("--prewarm", type=int, default=0, metavar="PROCS",
                   help="compile every variant in PROCS processes first (FLASHATTN_PREWARM)")
    p.add_argument("--data", default=str(DATA), help="where runs live (default %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite the documents of a run")
    a, rest = p.parse_known_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", a.run):
        p.error(f"a run name is letters, digits, '.', '_' and '-', got {a.run!r}")
    for opt in ("--no-causal", "--out", "--json"):
        if any(x == opt or x.startswith(opt + "=") for x in rest):
            p.error(f"{opt} is not a sweep option: use --causal yes|no|both; the run is written "
                    f"to {a.data}/RUN/<workload>.json")
    kw = bench.parse_args(rest)
    for k in ("_json", "_out", "causal"):
        kw.pop(k)
    return a, kw


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from flashbook.data.schema import format_table, write_json
    from flashbook.measure import bench
    a, kw = parse_args(argv)
    out = Path(a.data) / a.run
    old = sorted(out.glob("*.json")) if out.is_dir() else []
    if old and not a.force:
        print(f"error: {out} already holds a run ({', '.join(f.name for f in old)}); "
              "experiment data are records: choose a new name, or --force", file=sys.stderr)
        return 2
    command = " ".join(["python experiments/sweep.py", *argv])
    for causal in CAUSAL[a.causal]:
        try:
            doc = bench.run_bench(**kw, causal=causal, command=command,
                                  prewarm_procs=a.prewarm)
        except RuntimeError as e:                 # no GPU: run_bench says so
            print(f"error: {e}", file=sys.stderr)
            return 1
        path = write_json(out / f"{doc['meta']['workload']['name']}.json", doc)
        print(format_table(doc))
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
