"""The flex backward's two kernels against the dense backward's, from the SASS (tileiras and
cuobjdump, no GPU): registers, local memory, shared memory, the MMAs and their shapes, the
barriers, and the instructions of the inner loop (the backward branch whose body holds the most
MMAs), at D = 128 fp16, BlockMask 128x128, N = 8K.

    PYTHONPATH=. python experiments/flex_bwd_sass.py [--arch sm_90 ...] [--out DIR]

Rows: the dense backward (kernels.BWD_CONFIGS, causal); the flex backward before (64x64, no
hints, both kernels) and with flex.FLEX_BWD_CONFIGS, for the causal mask (no score function)
and softcap(50) + causal. Writes DIR/sass.md and DIR/sass.json.
"""
import argparse
import collections
import json
import re
from pathlib import Path

from flashattn import kernels as K, mods
from flashattn.aot import compile_spec
from flashattn.flex import BWD_CONFIG
from flashbook.ladder.flex_variants import compile_bwd, mn_configs

OUT = Path(__file__).resolve().parent / "data" / "47-flex-bwd-sass"
LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Za-z0-9_.]*)([^;]*);")
MMA = ("HGMMA", "UTCHMMA", "HMMA")


def parse(sass: str):
    """[(address, opcode with modifiers, operands)] of a SASS listing (one function)."""
    return [(int(m.group(1), 16), m.group(3), m.group(4)) for m in map(LINE.match,
                                                                        sass.splitlines()) if m]


def metrics(sass: str) -> dict:
    ins = parse(sass)
    ops = collections.Counter(op.split(".")[0] for _, op, _ in ins)
    shapes = collections.Counter(re.sub(r"^(HGMMA|UTCHMMA|HMMA)\.", "", op).split(".")[0]
                                 for _, op, _ in ins if op.split(".")[0] in MMA)
    # loops: a BRA whose target lies before it; the inner loop: the smallest one holding MMAs
    best, loops = None, []
    for i, (addr, op, args) in enumerate(ins):
        m = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if not m or int(m.group(1), 16) >= addr:
            continue
        tgt = int(m.group(1), 16)
        body = [x for x in ins if tgt <= x[0] <= addr]
        n_mma = sum(x[1].split(".")[0] in MMA for x in body)
        if n_mma:
            loops.append(f"{len(body)}/{n_mma}")
            if best is None or len(body) < len(best[2]):
                best = (n_mma, -len(body), body)
    body = best[2] if best else []
    bops = collections.Counter(x[1].split(".")[0] for x in body)
    return dict(
        instructions=len(ins), mma=sum(ops[k] for k in MMA),
        mma_shapes=dict(shapes), local_ld_st=ops["LDL"] + ops["STL"],
        bar=ops["BAR"] + ops["SYNCS"], warpgroup_arrive=ops["WARPGROUP"],
        loops=" ".join(loops), loop_instructions=len(body), loop_ops=dict(bops), loop_mma=sum(bops[k] for k in MMA),
        loop_ldl_stl=bops["LDL"] + bops["STL"], loop_mufu=bops["MUFU"],
        loop_bar=bops["BAR"] + bops["SYNCS"],
        loop_ldg_ldgsts_utma=bops["LDG"] + bops["LDGSTS"] + bops["UTMALDG"] + bops["UBLKCP"],
        loop_wait=bops["WARPSYNC"] + bops["DEPBAR"] + bops["WARPGROUP"])


def row(label, rep):
    if rep.error:
        return dict(label=label, kernel=rep.kernel, config=rep.config, error=rep.error)
    return dict(label=label, kernel=rep.kernel, config=rep.config, registers=rep.registers,
                stack=rep.stack_bytes, shared=rep.shared_bytes,
                **metrics(rep.sass_text))


def dense(arch):
    bc = K.bwd_configs(arch, 128)
    out = []
    for name in ("bwd_dq", "bwd_dkdv"):
        c = K.bwd_constants(name, bc[name], head_dim=128, causal=True, even_k=True)
        rep = compile_spec(K.BWD[name], arch, c, hints=bc[name].hints(), label=bc[name].label(),
                           keep_sass=True)
        out.append(row("dense causal", rep))
    return out


def flex(arch, label, configs, variant="mn", **kw):
    return [row(label, r) for r in compile_bwd(arch, variant, configs=configs, keep_sass=True,
                                               **kw)]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", default=None)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--extra", action="append", default=[],
                   help="more flex configs to try: 'M1xN1[:nww]/M2xN2[:nww]' (dkdv/dq)")
    p.add_argument("--variant", action="append", default=[],
                   help="flashbook.ladder.flex_variants.VARIANTS to compile at their own tables")
    p.add_argument("--only-variants", action="store_true",
                   help="skip the dense rows and the before/table trials")
    a = p.parse_args(argv)
    from flashattn.flex import Config
    rows = []
    for arch in a.arch or ["sm_90"]:
        if not a.only_variants:
            rows += [dict(arch=arch, **r) for r in dense(arch)]
        trials = [] if a.only_variants else [("before 64x64", (BWD_CONFIG, BWD_CONFIG)),
                                            ("FLEX_BWD_CONFIGS_MN", mn_configs(arch, 128))]
        for e in a.extra:
            cs = []
            for part in e.split("/"):
                t, _, w = part.partition(":")
                m, n = map(int, t.split("x"))
                cs.append(Config(m, n, num_worker_warps=int(w) if w else None))
            trials.append((e, tuple(cs)))
        trials = [(label, cfgs, "mn") for label, cfgs in trials]
        trials += [(f"variant {v}", None, v) for v in a.variant]
        seen = set()
        for label, cfgs, variant in trials:
            if (cfgs, variant) in seen:
                continue
            seen.add((cfgs, variant))
            for wl, kw in (("causal", dict(mask=mods.causal())),
                           ("softcap50+causal", dict(score=mods.softcap(50.0),
                                                     mask=mods.causal()))):
                rows += [dict(arch=arch, **r) for r in flex(arch, f"flex {wl} {label}", cfgs,
                                                            variant=variant, **kw)]
                print(rows[-1].get("error", "") or f"{arch} {label} {wl} done", flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "sass.json").write_text(json.dumps(rows, indent=1))
    cols = ["arch", "label", "kernel", "config", "registers", "stack", "shared", "mma",
            "mma_shapes", "local_ld_st", "bar", "instructions", "loops", "loop_instructions", "loop_mma",
            "loop_ldl_stl", "loop_mufu", "loop_bar"]
    md = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        md.append("| " + " | ".join(str(r.get(c, r.get("error", "")[:60] if c == "registers"
                                                 else "")) for c in cols) + " |")
    (a.out / "sass.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
