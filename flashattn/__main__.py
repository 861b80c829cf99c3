"""Command line: ``python -m flashattn {steps,compile,bench,profile,record,info}``."""
from __future__ import annotations

import sys

COMMANDS = {
    "steps": "list the steps of the book",
    "compile": "compile steps ahead of time (no GPU) and report registers, spills and SASS",
    "bench": "time steps and library baselines on this GPU",
    "profile": "run Nsight Compute on one launch of a step",
    "record": "record benchmarks, profiles and compile reports under results/<gpu>",
    "info": "what this machine has: GPU, cuTile, tileiras, torch",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m flashattn COMMAND [options]\n\ncommands:")
        for k, v in COMMANDS.items():
            print(f"  {k:<8} {v}")
        print("\n'python -m flashattn COMMAND --help' for a command's options")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "steps":
        from .steps import describe
        print(describe())
        return 0
    if cmd == "compile":
        from .aot import main as run
    elif cmd == "bench":
        from .bench import main as run
    elif cmd == "profile":
        from .profile import main as run
    elif cmd == "record":
        from .record import main as run
    elif cmd == "info":
        from .env import main as run
    else:
        print(f"unknown command {cmd!r}; one of: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
