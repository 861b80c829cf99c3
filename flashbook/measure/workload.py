"""What the benchmarks share: the seed's workload, the length of one sample, and the command-line
options of a workload with their checks.

``bench`` (forward), ``bench --backward`` (``bench_bwd``) and ``decode-bench`` each build their
own parser from these pieces, so an option means the same in all three, and ends the same way
(``require_gpu``, ``emit``). A leaf of ``measure/`` (it imports ``contract`` and
``data.schema`` only), so no benchmark module imports another for its defaults.
"""
from __future__ import annotations

from flashattn.contract import DTYPE_SHORT, head_dim_arg, parse_gqa

# The seed's workload: B=4, H=32, D=128, fp16, causal, N from 1K to 16K.
DEFAULT_SEQLENS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_BATCH, DEFAULT_HEADS, DEFAULT_HEAD_DIM = 4, 32, 128
SAMPLE_MS = 5.0     # method rounds: target length of one sample (a batch of launches)

__all__ = ["DEFAULT_SEQLENS", "DEFAULT_BATCH", "DEFAULT_HEADS", "DEFAULT_HEAD_DIM", "SAMPLE_MS",
           "csv", "add_workload_args", "add_output_args", "check_seqlens", "check_baselines",
           "check_gqa", "check_names", "baseline_list", "require_gpu", "emit"]


def csv(s: str) -> list[str]:
    """"a, b,,c" -> ["a", "b", "c"]."""
    return [x.strip() for x in s.split(",") if x.strip()]


def add_workload_args(p, *, baselines, default_baselines=None) -> None:
    """--seqlens --causal --dtype --gqa --head-dim --batch --heads --baselines on parser ``p``;
    ``baselines``: the names --baselines accepts (default: all of them)."""
    import argparse
    default_baselines = baselines if default_baselines is None else default_baselines
    p.add_argument("--seqlens", default=",".join(map(str, DEFAULT_SEQLENS)),
                   help="comma-separated sequence lengths (default %(default)s)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal masking (default: on)")
    p.add_argument("--dtype", choices=list(DTYPE_SHORT), default="float16")
    p.add_argument("--gqa", default=None, metavar="HQ:HKV",
                   help="grouped-query attention, e.g. 32:8 (overrides --heads)")
    p.add_argument("--head-dim", type=head_dim_arg, default=DEFAULT_HEAD_DIM)
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    p.add_argument("--heads", type=int, default=DEFAULT_HEADS)
    p.add_argument("--baselines", default=",".join(default_baselines),
                   help="comma-separated of %s, or 'none' (default: %s)"
                        % (",".join(baselines), ",".join(default_baselines) or "none"))


def add_output_args(p) -> None:
    """--json --out --quiet on parser ``p``."""
    p.add_argument("--json", action="store_true", help="print the JSON document to stdout")
    p.add_argument("--out", help="write the JSON document to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def check_seqlens(p, text: str) -> list[int]:
    """Positive integers from ``--seqlens``; ``p.error`` (SystemExit) otherwise."""
    try:
        seqlens = [int(x) for x in csv(text)]
    except ValueError:
        p.error(f"--seqlens takes comma-separated integers, got {text!r}")
    if not seqlens or min(seqlens) < 1:
        p.error("--seqlens needs at least one positive length")
    return seqlens


def check_baselines(p, text: str, allowed, what: str = "baseline") -> list[str]:
    """The names of ``--baselines`` ('none' or '' for none), each in ``allowed``."""
    names = [] if text.strip() in ("none", "") else csv(text)
    for b in names:
        if b not in allowed:
            p.error(f"unknown {what} {b!r}; choose from {', '.join(allowed)} or none")
    return names


def check_names(p, names, check) -> list[str]:
    """``names``, each passed through ``check`` (a ValueError from it becomes a parser error)."""
    for n in names:
        try:
            check(n)
        except ValueError as e:
            p.error(str(e))
    return list(names)


def baseline_list(baselines, allowed, default, what: str = "baseline") -> list[str]:
    """A run function's ``baselines`` argument as a list: None -> ``default``; a string is
    comma-separated ('none' or '' for none); ValueError for a name not in ``allowed``."""
    if baselines is None:
        baselines = list(default)
    elif isinstance(baselines, str):
        baselines = [] if baselines in ("", "none") else baselines.split(",")
    for b in baselines:
        if b not in allowed:
            raise ValueError(f"unknown {what} {b!r}; choose from {', '.join(allowed)}")
    return list(baselines)


def check_gqa(p, text):
    """``--gqa HQ:HKV`` as ``contract.parse_gqa`` reads it (None when absent)."""
    try:
        return parse_gqa(text)
    except ValueError as e:
        p.error(str(e))


def require_gpu(prog: str, hint: str = "") -> bool:
    """True on a machine with a CUDA GPU; otherwise say so on stderr (naming ``prog``, with
    ``hint``) and return False, for the command to exit 1."""
    import sys

    import torch
    if torch.cuda.is_available():
        return True
    print(f"error: {prog} needs a CUDA GPU; this machine has none"
          + (f" ({hint})" if hint else ""), file=sys.stderr)
    return False


def emit(doc: dict, *, out: str | None, as_json: bool, table) -> None:
    """Write ``doc`` to ``out`` (if given), then print it as JSON or as ``table(doc)``."""
    import sys

    from ..data.schema import dumps, write_json
    if out:
        write_json(out, doc)
        print(f"wrote {out}", file=sys.stderr)
    print(dumps(doc) if as_json else table(doc))
