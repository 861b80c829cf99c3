"""A snapshot of the shipped flex kernels' SASS (tileiras + cuobjdump, no GPU): registers, stack
(spills), shared memory, instruction and opcode counts per kernel, for sm_90, sm_100 and sm_120;
and the table of what differs between two snapshots (issue 35: a refactor's SASS before/after).

    PYTHONPATH=. python experiments/flex_sass_snapshot.py save /tmp/flex_sass_before.json
    PYTHONPATH=. python experiments/flex_sass_snapshot.py diff BEFORE.json AFTER.json

The kernels: the forward without a block mask, with one and no mask function, with each shipped
mask, with each shipped score function (and causal), with sinks; the backward's dQ and dK/dV
(the default pair) for no mod, causal, document, softcap + causal, ALiBi + causal. D = 128,
fp16, BlockMask 128 x 128, N = 8K, as experiments/flex_sass.py.
"""
import collections
import json
import re
import sys

import torch

from flashattn import mods
from flashattn.flex import compile_flex, compile_flex_bwd

N = 8192
ARCHS = ("sm_90", "sm_100", "sm_120")


def opcodes(sass: str) -> dict:
    c = collections.Counter()
    for ln in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln)
        if m:
            c[m.group(2).split(".")[0]] += 1
    return dict(c)


def cases():
    ids = torch.arange(N, dtype=torch.int32) // 1024
    c = mods.causal()
    fwd = {
        "identity": dict(block_size=None),
        "blocks(no mask)": dict(),
        "causal": dict(mask=c),
        "sliding_window(1024)": dict(mask=mods.sliding_window(1024)),
        "prefix_lm(1024)": dict(mask=mods.prefix_lm(1024)),
        "document": dict(mask=mods.document(ids)),
        "softcap(30)": dict(block_size=None, score=mods.softcap(30.0)),
        "softcap(30)+causal": dict(score=mods.softcap(30.0), mask=c),
        "alibi+causal": dict(score=mods.alibi(mods.alibi_slopes(32)), mask=c),
        "relative_bias": dict(block_size=None, score=mods.relative_bias(torch.zeros(32, 2 * N - 1))),
        "sinks+causal": dict(mask=c, sinks=True, write_lse=True),
    }
    bwd = {
        "identity": dict(block_size=None),
        "causal": dict(mask=c),
        "document": dict(mask=mods.document(ids)),
        "softcap(30)+causal": dict(score=mods.softcap(30.0), mask=c),
        "alibi+causal": dict(score=mods.alibi(mods.alibi_slopes(32)), mask=c),
    }
    return fwd, bwd


def row(r):
    ops = opcodes(r.sass_text) if getattr(r, "sass_text", None) else dict(r.sass)
    return dict(registers=r.registers, stack=r.stack_bytes, shared=r.shared_bytes,
                instructions=r.sass_lines, spills=ops.get("LDL", 0) + ops.get("STL", 0),
                ops=ops, config=r.config, error=r.error[:300])


def save(path, archs):
    fwd, bwd = cases()
    res = {}
    for arch in archs:
        for name, kw in fwd.items():
            res[f"{arch} fwd {name}"] = row(compile_flex(arch, Nk=N, keep_sass=True, **kw))
            print(arch, "fwd", name, res[f"{arch} fwd {name}"]["registers"], flush=True)
        for name, kw in bwd.items():
            reps = compile_flex_bwd(arch, Nk=N, keep_sass=True, **kw)
            for kname, r in zip(("dq", "dkdv"), reps):
                res[f"{arch} bwd-{kname} {name}"] = row(r)
                print(arch, kname, name, r.registers, r.config, flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


def diff(before_path, after_path):
    b, a = json.load(open(before_path)), json.load(open(after_path))
    print("| kernel | config | REG | stack | shared | spills (LDL+STL) | instructions | opcodes "
          "that differ |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(set(b) | set(a)):
        x, y = b.get(key), a.get(key)
        if x is None or y is None:
            print(f"| {key} | only {'after' if x is None else 'before'} | | | | | | |")
            continue
        ops = {k: y["ops"].get(k, 0) - x["ops"].get(k, 0)
               for k in set(x["ops"]) | set(y["ops"])}
        ops = {k: v for k, v in ops.items() if v}

        def f(n):
            return str(x[n]) if x[n] == y[n] else f"{x[n]} -> {y[n]}"
        cfg = x["config"] if x["config"] == y["config"] else f"{x['config']} -> {y['config']}"
        print(f"| {key} | {cfg} | {f('registers')} | {f('stack')} | {f('shared')} | "
              f"{f('spills')} | {f('instructions')} | "
              f"{', '.join(f'{k} {v:+d}' for k, v in sorted(ops.items())) or 'same'} |")


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2], sys.argv[3:] or ARCHS)
    else:
        diff(sys.argv[2], sys.argv[3])
