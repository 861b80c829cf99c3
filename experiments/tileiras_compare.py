"""E13: does tileiras 13.5 compile the forward differently from 13.4? (compile only, no GPU)

Run with the Python of an environment that has the tileiras version to test, e.g.

    python experiments/tileiras_compare.py experiments/data/19-tileiras/13.4.92.json
    /tmp/venv135/bin/python experiments/tileiras_compare.py experiments/data/19-tileiras/13.5.37.json
    python experiments/tileiras_compare.py --diff experiments/data/19-tileiras/*.json

Compiles the Hopper configurations that matter (``arch_tuned``'s 64x128 occupancy=2 and
``warp_groups``' 128-row tiles with two consumer warp groups, D=128 causal and non-causal,
D=256 causal) for sm_90 and sm_100, without the compile cache, and records the static report
(registers, stack, spills, SASS instruction counts). ``--diff`` prints what changed.
"""
from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

from flashattn.aot import compile_step
from flashattn.config import Config

CASES = (
    # (step, config, head_dim, causal)
    ("arch_tuned", "64x128:occ=2", 128, True),
    ("arch_tuned", "64x128:occ=2", 128, False),
    ("warp_groups", "128x128:occ=1:nww=8", 128, True),
    ("warp_groups", "128x128:occ=1:nww=8", 128, False),
    ("warp_groups", "128x256:occ=1:nww=8", 128, False),
    ("warp_groups", "128x128:occ=1:nww=8", 256, True),
    ("arch_tuned", "64x128:occ=2", 256, True),
)
ARCHS = ("sm_90", "sm_100")
FIELDS = ("registers", "stack_bytes", "shared_bytes", "sass_lines", "HGMMA", "UTCHMMA",
          "MUFU.EX2", "MUFU.RCP", "FFMA", "FMUL", "BAR", "UTMALDG", "LDL", "STL")


def record(out: Path) -> None:
    rows = []
    for step, cfg, d, causal in CASES:
        for arch in ARCHS:
            rep = compile_step(step, arch, config=Config.parse(cfg), head_dim=d, causal=causal,
                               use_cache=False)[0]
            rd = rep.as_dict()
            row = dict(step=step, config=cfg, head_dim=d, causal=causal, arch=arch,
                       error=rep.error, registers=rd["registers"], stack_bytes=rd["stack_bytes"],
                       shared_bytes=rd["shared_bytes"], sass_lines=rd["sass_lines"],
                       cubin_bytes=rd["cubin_bytes"], **rd["sass"])
            rows.append(row)
            print(f"{step:12s} {cfg:22s} D={d:3d} {'causal' if causal else 'full  '} {arch}: "
                  + ("ERROR " + str(rep.error)[:80] if rep.error else
                     " ".join(f"{k}={row.get(k)}" for k in FIELDS if k in row)), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(tileiras=version("nvidia-cuda-tileiras"),
                                   cuda_tile=version("cuda-tile"), rows=rows), indent=1))


def diff(paths: list[str]) -> None:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    key = lambda r: (r["step"], r["config"], r["head_dim"], r["causal"], r["arch"])  # noqa: E731
    a, b = ({key(r): r for r in d["rows"]} for d in docs[:2])
    print(f"{docs[0]['tileiras']} -> {docs[1]['tileiras']}")
    for k in a:
        ra, rb = a[k], b.get(k, {})
        changed = {f: (ra.get(f), rb.get(f)) for f in set(ra) | set(rb)
                   if f != "error" and ra.get(f) != rb.get(f)
                   and not isinstance(ra.get(f), (dict, list))}
        print(" ".join(map(str, k)), ":", changed or "same")


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(sys.argv[2:])
    else:
        record(Path(sys.argv[1]))
