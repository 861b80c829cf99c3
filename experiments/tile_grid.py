"""Compile the fused kernel for a grid of tile shapes on Hopper and Blackwell (chapter 5).

    python experiments/tile_grid.py [--out results/compile/tiles.json]

For every (TILE_M, TILE_N) in {64, 128, 256} x {64, 128}, the steps ``baseline`` (exact math) and
``fast_math`` are compiled ahead of time for sm_90 (H100/H200) and sm_100 (B200) with
``flashattn.aot.compile_step(step, arch, config=Config(TILE_M, TILE_N))``, on the seed's workload
(D=128, fp16, causal), and the compiler's report (registers, stack bytes, shared memory, SASS
opcode counts) is written as JSON. No GPU is needed: the result depends on the kernel source,
cuda-tile, tileiras and the target architecture, not on the machine that compiled it, hence
results/compile/ rather than results/<gpu>/.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from flashattn.aot import compile_step
from flashattn.steps import Config

TILE_MS = (64, 128, 256)
TILE_NS = (64, 128)
STEPS = ("baseline", "fast_math")
ARCHS = ("sm_90", "sm_100")


def meta(argv) -> dict:
    import cuda.tile as ct
    try:
        tileiras = version("nvidia-cuda-tileiras")
    except PackageNotFoundError:
        tileiras = "unknown"
    return dict(cuda_tile=ct.__version__, tileiras=tileiras, python=platform.python_version(),
                date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                command=" ".join(["python experiments/tile_grid.py", *argv]),
                steps=list(STEPS), archs=list(ARCHS), tile_m=list(TILE_MS), tile_n=list(TILE_NS),
                head_dim=128, causal=True, even_k=True, dtype="float16", hints="none")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results/compile/tiles.json")
    a = p.parse_args(argv)
    rows = []
    for arch in ARCHS:
        for step in STEPS:
            for tm in TILE_MS:
                for tn in TILE_NS:
                    for rep in compile_step(step, arch, config=Config(tm, tn)):
                        d = rep.as_dict()
                        d.update(TILE_M=tm, TILE_N=tn)
                        rows.append(d)
                        print(f"{arch} {step:<9} {tm}x{tn}: REG {rep.registers} STACK "
                              f"{rep.stack_bytes} ({rep.compile_s:.1f} s)"
                              + (f" ERROR {rep.error}" if rep.error else ""), file=sys.stderr)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(meta=meta(argv), kernels=rows), indent=1) + "\n")
    tmp.replace(out)
    print(f"wrote {len(rows)} reports to {out}", file=sys.stderr)
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
