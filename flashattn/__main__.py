"""Command line: ``python -m flashattn COMMAND``, COMMAND one of ``COMMANDS`` (steps, compile,
bench, decode-bench, profile, record, info, nbrun)."""
from __future__ import annotations

import argparse
import sys

# name -> (module, one line, an example)
COMMANDS = {
    "steps": ("flashattn.steps", "list the steps of the book and the experiments",
              "python -m flashattn steps"),
    "compile": ("flashattn.aot", "compile steps ahead of time (no GPU) and report registers, "
                "spills and SASS", "python -m flashattn compile --arch sm_90 --step baseline"),
    "bench": ("flashattn.measure.bench", "time steps and library baselines on this GPU",
              "python -m flashattn bench --steps baseline,best --seqlens 4096 --baselines cudnn"),
    "decode-bench": ("flashattn.measure.bench_decode", "time decode steps (split-KV, paged) "
                     "and packed varlen prefill against PyTorch: latency, bandwidth, host "
                     "overhead", "python -m flashattn decode-bench --out "
                     "results/h200/decode/decode.json"),
    "profile": ("flashattn.measure.ncu", "run Nsight Compute on one launch of a step",
                "python -m flashattn profile --step baseline --seqlen 4096"),
    "record": ("flashattn.measure.record", "record benchmarks, profiles and compile reports "
               "under results/<gpu>", "python -m flashattn record --out results/h200 --part bench"),
    "info": ("flashattn.env", "what this machine has: GPU, cuTile, tileiras, torch",
             "python -m flashattn info"),
    "nbrun": ("flashattn.nbrun", "run a chapter notebook without Jupyter (for a bare GPU host)",
              "python -m flashattn nbrun notebooks/03_first_kernel.ipynb out.ipynb"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m flashattn",
        description="FlashAttention in cuTile: the book's kernels, benchmarks and tools.",
        epilog="'python -m flashattn COMMAND --help' gives a command's options.\n\nexamples:\n"
               + "\n".join(f"  {ex}" for _, _, ex in COMMANDS.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_, example) in COMMANDS.items():
        # Each command parses its own options (its module's main), so --help reaches it.
        sp = sub.add_parser(name, help=help_, add_help=False, description=help_,
                            epilog=f"example: {example}")
        sp.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        p.print_help()
        return 0
    if argv[0] not in COMMANDS:
        print(f"unknown command {argv[0]!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    a = p.parse_args(argv[:1])
    rest = argv[1:]
    import importlib
    mod = importlib.import_module(COMMANDS[a.command][0])
    return int(mod.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
