"""Command line: ``python -m flashattn COMMAND``, COMMAND one of ``COMMANDS`` (compile, info).
The book's commands (steps, bench, profile, record, ...) are ``python -m flashbook COMMAND``."""
from __future__ import annotations

import argparse
import sys

# name -> (module, one line, an example)
COMMANDS = {
    "compile": ("flashattn.aot", "compile steps ahead of time (no GPU) and report registers, "
                "spills and SASS", "python -m flashattn compile --arch sm_90 --step warp_groups"),
    "info": ("flashattn.env", "what this machine has: GPU, cuTile, tileiras, torch",
             "python -m flashattn info"),
}
PROG = "python -m flashattn"
DESCRIPTION = "FlashAttention in cuTile: compile the kernels ahead of time, describe the machine."


def build_parser(commands: dict = COMMANDS, prog: str = PROG,
                 description: str = DESCRIPTION) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=description,
        epilog=f"'{prog} COMMAND --help' gives a command's options.\n\nexamples:\n"
               + "\n".join(f"  {ex}" for _, _, ex in commands.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_, example) in commands.items():
        # Each command parses its own options (its module's main), so --help reaches it.
        sp = sub.add_parser(name, help=help_, add_help=False, description=help_,
                            epilog=f"example: {example}")
        sp.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None, commands: dict = COMMANDS, prog: str = PROG,
         description: str = DESCRIPTION) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = build_parser(commands, prog, description)
    if not argv or argv[0] in ("-h", "--help"):
        p.print_help()
        return 0
    if argv[0] not in commands:
        print(f"unknown command {argv[0]!r}; one of: {', '.join(commands)}", file=sys.stderr)
        return 2
    a = p.parse_args(argv[:1])
    rest = argv[1:]
    import importlib
    mod = importlib.import_module(commands[a.command][0])
    return int(mod.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
