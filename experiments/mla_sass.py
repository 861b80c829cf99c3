"""The MLA decode kernels compiled ahead of time (no GPU): registers, stack, shared memory, MMA
instructions per architecture and configuration, to plan the 512-wide accumulator against the
register file. python experiments/mla_sass.py [OUT.json] [--quick]"""
import json
import re
import sys
from collections import Counter

from flashattn.aot import compile_spec
from flashattn.kernels.mla_decode_spec import MLA_COMBINE, MLA_HINTS, MLA_SPLIT, MLA_SPLIT_FP8

MMA = re.compile(r"\b(HGMMA|QGMMA|HMMA|UTC\w*MMA)[.\w]*")


def cases(quick=False):
    base = dict(TILE_N=64, D_LAT=512, D_ROPE=64, CAUSAL=True, FP8=False, FINAL=False)
    hint_sets = {"sm_90": [{}, dict(occupancy=1), dict(occupancy=1, num_worker_warps=8)],
                 "sm_100": [{}], "sm_120": [{}]}
    for arch, hs in hint_sets.items():
        for tile_m in ((64,) if quick else (64, 32, 16)):
            for hints in (hs if tile_m == 64 else [MLA_HINTS.get(arch, {})]):
                yield arch, MLA_SPLIT, dict(base, TILE_M=tile_m), hints, "bfloat16"
        yield arch, MLA_SPLIT_FP8, dict(base, TILE_M=64, FP8=True), MLA_HINTS.get(arch, {}), "bfloat16"
        yield arch, MLA_COMBINE, dict(TILE_M=8, D_LAT=512), {}, "bfloat16"


def main(argv):
    quick = "--quick" in argv
    out = [a for a in argv if not a.startswith("--")]
    rows = []
    for arch, spec, c, hints, dtype in cases(quick):
        rep = compile_spec(spec, arch, c, hints=hints, dtype=dtype, keep_sass=True)
        mma = Counter(m.group(1) for m in MMA.finditer(getattr(rep, "sass_text", "") or ""))
        row = dict(arch=arch, kernel=spec.name, tile_m=c.get("TILE_M"), hints=hints,
                   registers=rep.registers, stack=rep.stack_bytes, shared=rep.shared_bytes,
                   mma=dict(mma), sass_lines=rep.sass_lines, error=rep.error,
                   compile_s=round(rep.compile_s or 0, 1))
        rows.append(row)
        print(f"{arch:7} {spec.name:22} M={row['tile_m']!s:3} {str(hints):42} reg={rep.registers} "
              f"stack={rep.stack_bytes} smem={rep.shared_bytes} mma={dict(mma)} "
              f"{rep.error or ''}", flush=True)
    if out:
        with open(out[0], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
