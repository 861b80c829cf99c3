"""Every shipped mod compiled ahead of time (tileiras, no GPU) for sm_90, sm_100 and sm_120, and
what it costs in the SASS (issue 23).

* The identity kernel (no score function, no mask, no block mask) against the dense fmha kernel
  at the same configuration (arch_tuned's flags, non-causal, D = 128, fp16): registers, shared
  memory, instruction counts.
* Each mod against its baseline: a score function (and the sink, and BLASST) against the
  identity kernel; a mask against the block-sparse kernel without a mask function (the same
  BlockMask loop, mask_mod = noop). The opcode deltas are per kernel; the loop body appears
  ``copies`` times in it (MMA count / the baseline's), so per tile = delta / copies.

    PYTHONPATH=. python experiments/flex_sass.py [--arch sm_90 ...]   # ~4 min on 2 cores

Writes experiments/data/40-flex/sass.md and sass.json.xz.
"""
import argparse
import collections
import json
import re
from pathlib import Path

import torch

from flashattn import mods
from flashattn.aot import compile_step
from flashattn.flex import FLEX_CONFIGS, compile_flex

OUT = Path(__file__).resolve().parent / "data" / "40-flex"
N = 8192


def opcodes(sass: str) -> collections.Counter:
    """Opcode histogram of a SASS listing (predicates and modifiers after the first dot kept
    as cuobjdump prints them, e.g. MUFU.EX2, FSETP.GT.AND)."""
    c = collections.Counter()
    for ln in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln)
        if m:
            c[m.group(2).split(".")[0] if not m.group(2).startswith("MUFU") else
              m.group(2)] += 1
    return c


def cases():
    ids = torch.arange(N, dtype=torch.int32) // 1024
    return {
        "score": {
            "softcap(30)": dict(score=mods.softcap(30.0)),
            "softcap(30, approx)": dict(score=mods.softcap(30.0, approx=True)),
            "alibi": dict(score=mods.alibi(mods.alibi_slopes(32))),
            "relative_bias": dict(score=mods.relative_bias(torch.zeros(32, 2 * N - 1))),
            "sink": dict(sinks=True),
            "blasst(T=8)": dict(blasst=8.0),
        },
        "mask": {
            "causal": dict(mask=mods.causal()),
            "sliding_window(1024)": dict(mask=mods.sliding_window(1024)),
            "sliding_window(512,512)": dict(mask=mods.sliding_window(512, 512)),
            "prefix_lm(1024)": dict(mask=mods.prefix_lm(1024)),
            "prefix_lm(tensor)": dict(mask=mods.prefix_lm(torch.zeros(4, dtype=torch.int32))),
            "document": dict(mask=mods.document(ids)),
            "document_causal": dict(mask=mods.document(ids, causal=True)),
        },
    }


def mma(r):
    return r.sass.get("HGMMA", 0) + r.sass.get("UTCHMMA", 0) + r.sass.get("HMMA", 0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", default=None)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    archs = a.arch or ["sm_90", "sm_100", "sm_120"]
    res, lines = {}, []
    for arch in archs:
        cfg = FLEX_CONFIGS[arch]
        dense = compile_step("arch_tuned", arch, config=cfg, causal=False, keep_sass=True)[0]
        ident = compile_flex(arch, block_size=None, Nk=N, keep_sass=True)
        blocks = compile_flex(arch, block_size=(128, 128), Nk=N, keep_sass=True)
        for r in (dense, ident, blocks):
            assert not r.error, r.error
        row = dict(config=cfg.label(), dense={}, identity={}, blocks={}, mods={})
        for name, r in (("dense", dense), ("identity", ident), ("blocks", blocks)):
            row[name] = dict(registers=r.registers, stack=r.stack_bytes, shared=r.shared_bytes,
                             sass_lines=r.sass_lines, mma=mma(r),
                             ops=dict(opcodes(r.sass_text)))
        d_ops = opcodes(ident.sass_text) - opcodes(dense.sass_text)
        d_ops2 = opcodes(dense.sass_text) - opcodes(ident.sass_text)
        lines += [f"## {arch} ({cfg.label()}, D=128, fp16)", "",
                  "| kernel | REG | STACK | SHARED | SASS lines | MMA |", "|---|---|---|---|---|---|"]
        for name in ("dense", "identity", "blocks"):
            x = row[name]
            lines.append(f"| {name} | {x['registers']} | {x['stack']} | {x['shared']} | "
                         f"{x['sass_lines']} | {x['mma']} |")
        lines += ["", f"identity - dense fmha opcodes: +{dict(d_ops)} -{dict(d_ops2)}", "",
                  "| mod | vs | REG | SASS lines (delta) | copies | delta per tile: opcodes |",
                  "|---|---|---|---|---|---|"]
        for kind, group in cases().items():
            for name, kw in group.items():
                if kind == "mask":
                    r = compile_flex(arch, block_size=(128, 128), Nk=N, keep_sass=True, **kw)
                    base = blocks
                else:
                    r = compile_flex(arch, block_size=None, Nk=N, keep_sass=True, **kw)
                    base = ident
                if r.error:
                    row["mods"][name] = dict(error=r.error)
                    lines.append(f"| {name} | - | compile error: {r.error[:200]} | | | |")
                    continue
                plus = opcodes(r.sass_text) - opcodes(base.sass_text)
                minus = opcodes(base.sass_text) - opcodes(r.sass_text)
                copies = max(1, mma(r) // max(1, mma(base)))
                per = {k: round(v / copies, 1) for k, v in plus.items()}
                per.update({k: -round(v / copies, 1) for k, v in minus.items()})
                row["mods"][name] = dict(registers=r.registers, stack=r.stack_bytes,
                                         shared=r.shared_bytes, sass_lines=r.sass_lines,
                                         base="blocks" if kind == "mask" else "identity",
                                         mma=mma(r), copies=copies, delta_per_copy=per)
                top = ", ".join(f"{k} {v:+g}" for k, v in sorted(per.items(),
                                                                  key=lambda kv: -abs(kv[1]))[:8])
                lines.append(f"| {name} | {'blocks' if kind == 'mask' else 'identity'} | "
                             f"{r.registers} | {r.sass_lines} ({r.sass_lines - base.sass_lines:+d}) "
                             f"| {copies} | {top} |")
        lines.append("")
        res[arch] = row
        print("\n".join(lines[-30:]), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sass.md").write_text("\n".join(lines) + "\n")
    import lzma                  # over 20 KB: committed xz-compressed (CONTRIBUTING)
    (a.out / "sass.json.xz").write_bytes(lzma.compress((json.dumps(res, indent=1) + "\n")
                                                       .encode(), preset=9))


if __name__ == "__main__":
    main()
