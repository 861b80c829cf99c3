"""Compile the fused kernel for a grid of tile shapes on Hopper and Blackwell (chapter 5).

    python experiments/tile_grid.py [--out results/h200/compile/tiles.json]

For every (TILE_M, TILE_N) in {64, 128, 256} x {64, 128}, the steps ``baseline`` (exact math) and
``fast_math`` are compiled ahead of time for sm_90 (H100/H200) and sm_100 (B200) with
``flashattn.aot.compile_step(step, arch, config=Config(TILE_M, TILE_N))``, on the seed's workload
(D=128, fp16, causal), and the compiler's report (registers, stack bytes, shared memory, SASS
opcode counts) is written as JSON. No GPU is needed: the result depends on the kernel source,
cuda-tile, tileiras and the target architecture, not on the machine that compiled it. It lives
with the dataset's other compile reports (``results/<gpu>/compile/``, the same toolchain), where
``flashbook.data.results.load("h200").tile_grid`` reads it (results/README.md).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from flashbook.data.results import TILE_GRID_FILE, results_root

TILE_MS = (64, 128, 256)
TILE_NS = (64, 128)
STEPS = ("baseline", "fast_math")
ARCHS = ("sm_90", "sm_100")
DEFAULT_OUT = results_root() / "h200" / "compile" / TILE_GRID_FILE


def meta(argv, steps=STEPS, archs=ARCHS, tile_ms=TILE_MS, tile_ns=TILE_NS) -> dict:
    import cuda.tile as ct
    try:
        tileiras = version("nvidia-cuda-tileiras")
    except PackageNotFoundError:
        tileiras = "unknown"
    return dict(cuda_tile=ct.__version__, tileiras=tileiras, python=platform.python_version(),
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                command=" ".join(["python experiments/tile_grid.py", *argv]),
                steps=list(steps), archs=list(archs), tile_m=list(tile_ms), tile_n=list(tile_ns),
                head_dim=128, causal=True, even_k=True, dtype="float16", hints="none")


def compile_grid(steps=STEPS, archs=ARCHS, tile_ms=TILE_MS, tile_ns=TILE_NS,
                 log=sys.stderr) -> list[dict]:
    """One compile report per (arch, step, TILE_M, TILE_N, kernel), as dicts with TILE_M/TILE_N."""
    from flashattn.aot import compile_step
    from flashattn.config import Config
    rows = []
    for arch in archs:
        for step in steps:
            for tm in tile_ms:
                for tn in tile_ns:
                    for rep in compile_step(step, arch, config=Config(tm, tn)):
                        d = rep.as_dict()
                        d.update(TILE_M=tm, TILE_N=tn)
                        rows.append(d)
                        print(f"{arch} {step:<9} {tm}x{tn}: REG {rep.registers} STACK "
                              f"{rep.stack_bytes} ({rep.compile_s:.1f} s)"
                              + (f" ERROR {rep.error}" if rep.error else ""), file=log)
    return rows


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    from flashbook.data.schema import write_json
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help="default %(default)s")
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--archs", default=",".join(ARCHS))
    p.add_argument("--tile-m", default=",".join(map(str, TILE_MS)))
    p.add_argument("--tile-n", default=",".join(map(str, TILE_NS)))
    a = p.parse_args(argv)
    grid = dict(steps=tuple(a.steps.split(",")), archs=tuple(a.archs.split(",")),
                tile_ms=_ints(a.tile_m), tile_ns=_ints(a.tile_n))
    rows = compile_grid(**grid)
    out = write_json(Path(a.out), dict(meta=meta(argv, **grid), kernels=rows))
    print(f"wrote {len(rows)} reports to {out}", file=sys.stderr)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
