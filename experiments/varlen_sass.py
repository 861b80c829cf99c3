"""E17: what the packed varlen kernel does that the square kernel does not, read from the SASS
(CPU only: tileiras and cuobjdump, no GPU).

    python experiments/varlen_sass.py --out experiments/data/25-varlen-sass/sass.json

Compiles ``varlen_fwd_kernel`` (its Hopper configuration, 128x128 ``nww=8``, causal, D=128,
fp16) and the fused kernel of step ``warp_groups`` with the same tile and hints for sm_90, and
writes the opcode histogram of each and the instructions only the varlen kernel has. The
question (E16): packed varlen ran at 0.76x the padded square kernel on 32 sequences of 1K and
0.94x on 8 of 4K: a per-program cost? Each program views its sequence with ``Array.slice`` at a
run-time offset; a TMA load needs a tensor map (descriptor) for that view.
"""
from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# The instructions of an in-kernel tensor-map update: the 128-byte descriptor written to shared
# memory (STS.128), published to global memory (ATOMG.EXCH), the TMA unit's cached copy
# invalidated (UTMACCTL.IV) and the command queue flushed (UTMACMDFLUSH).
DESCRIPTOR_OPS = ("STS", "ATOMG", "UTMACCTL", "UTMACMDFLUSH")


def opcodes(sass: str) -> collections.Counter:
    """Opcode (without modifiers or predicate) of every instruction line of a cuobjdump SASS."""
    c = collections.Counter()
    for ln in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", ln)
        if m:
            c[m.group(1)] += 1
    return c


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    from flashattn.aot import compile_spec
    from flashattn.env import metadata
    from flashattn.kernels import FMHA, VARLEN_FWD, fmha_constants, varlen_config, varlen_constants
    from flashbook.steps import get_step
    cfg = varlen_config("sm_90", 128)
    reports = {
        "varlen": compile_spec(VARLEN_FWD, "sm_90", varlen_constants(cfg, head_dim=128,
                                                                     causal=True),
                               hints=cfg.hints(), keep_sass=True, use_cache=False),
        "fmha": compile_spec(FMHA, "sm_90", fmha_constants(get_step("warp_groups"), cfg,
                                                           head_dim=128, causal=True,
                                                           even_k=True),
                             hints=cfg.hints(), keep_sass=True, use_cache=False),
    }
    doc = dict(meta=metadata("python experiments/varlen_sass.py " + " ".join(argv or sys.argv[1:])),
               config=cfg.label(), kernels={})
    for name, r in reports.items():
        if r.error:
            print(f"{name}: {r.error}", file=sys.stderr)
            return 1
        ops = opcodes(r.sass_text)
        doc["kernels"][name] = dict(registers=r.registers, shared_bytes=r.shared_bytes,
                                    sass_lines=r.sass_lines, opcodes=dict(sorted(ops.items())),
                                    descriptor_ops={k: ops.get(k, 0) for k in DESCRIPTOR_OPS})
    v, f = (doc["kernels"][k]["opcodes"] for k in ("varlen", "fmha"))
    doc["only_varlen"] = {k: v[k] - f.get(k, 0) for k in v if v[k] > f.get(k, 0)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    for k in ("varlen", "fmha"):
        d = doc["kernels"][k]
        print(f"{k:7s} {d['sass_lines']} SASS lines, descriptor ops {d['descriptor_ops']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
