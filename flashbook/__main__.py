"""Command line of the book: ``python -m flashbook COMMAND``, COMMAND one of ``COMMANDS``
(steps, compile, bench, decode-bench, profile, record, nbrun). The library's own commands
(compile, info) are ``python -m flashattn COMMAND``; the book's compile is the library's with the
ladder kernel registered, so it compiles every step."""
from __future__ import annotations

import sys

from flashattn import __main__ as _cli

# name -> (module, one line, an example)
COMMANDS = {
    "steps": ("flashbook.steps", "list the steps of the book and the experiments",
              "python -m flashbook steps"),
    "compile": ("flashbook.compile", "compile any step of the book, the ladder's included, ahead of "
                "time (no GPU) and report registers, spills and SASS",
                "python -m flashbook compile --arch sm_90 --step baseline"),
    "bench": ("flashbook.measure.bench", "time steps and library baselines on this GPU",
              "python -m flashbook bench --steps baseline,best --seqlens 4096 --baselines cudnn"),
    "decode-bench": ("flashbook.measure.bench_decode", "time decode steps (split-KV, paged) "
                     "and packed varlen prefill against PyTorch: latency, bandwidth, host "
                     "overhead", "python -m flashbook decode-bench --out "
                     "results/h200/decode/decode.json"),
    "profile": ("flashbook.measure.ncu", "run Nsight Compute on one launch of a step",
                "python -m flashbook profile --step baseline --seqlen 4096"),
    "record": ("flashbook.measure.record", "record benchmarks, profiles and compile reports "
               "under results/<gpu>", "python -m flashbook record --out results/h200 --part bench"),
    "nbrun": ("flashbook.nbrun", "run a chapter notebook without Jupyter (for a bare GPU host)",
              "python -m flashbook nbrun notebooks/03_first_kernel.ipynb out.ipynb"),
}
PROG = "python -m flashbook"
DESCRIPTION = "The book beside FlashAttention in cuTile: its steps, benchmarks and tools."


def build_parser():
    return _cli.build_parser(COMMANDS, PROG, DESCRIPTION)


def main(argv: list[str] | None = None) -> int:
    return _cli.main(argv, COMMANDS, PROG, DESCRIPTION)


if __name__ == "__main__":
    sys.exit(main())
