"""Issue 21 item 3: the SASS of every shipped kernel at its shipped configuration, to compare
before/after moving the kernel math into ``flashattn/kernels/common.py`` (no GPU: tileiras and
cuobjdump). python experiments/common_sass.py OUT.json [sm_90|sm_100|''] [KERNEL[,KERNEL]]; compare two runs with
python experiments/common_sass.py --diff BEFORE.json AFTER.json."""
import collections, hashlib, json, re, sys

OPC = re.compile(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def histogram(text):
    c = collections.Counter()
    for ln in text.splitlines():
        m = OPC.match(ln)
        if m:
            c[m.group(1)] += 1
    return dict(sorted(c.items()))


def cases(only=None):
    from flashattn import kernels as K
    from flashbook.steps import get_step, best_step_name
    D = 128
    for arch in ("sm_90", "sm_100"):
        if only and arch != only:
            continue
        s = get_step(best_step_name(arch))
        cfg = s.configs(arch)[0]
        for causal in (True, False):
            c = K.fmha_constants(s, cfg, head_dim=D, causal=causal, even_k=True)
            yield arch, "fmha", f"{cfg.label()} causal={causal}", K.FMHA, c, cfg.hints()
        if arch != "sm_90":
            continue
        cfg = s.configs(arch)[0]
        c = K.fmha_constants(s, cfg, head_dim=D, causal=True, even_k=False, write_lse=True)
        yield arch, "fmha", f"{cfg.label()} causal=True ragged lse", K.FMHA, c, cfg.hints()
        bc = K.bwd_configs(arch, D)
        for name in ("bwd_dkdv", "bwd_dq"):
            for causal in (True, False):
                c = K.bwd_constants(name, bc[name], head_dim=D, causal=causal, even_k=True)
                yield arch, name, f"{bc[name].label()} causal={causal}", K.BWD[name], c, bc[name].hints()
        c = K.bwd_constants("bwd_dq", bc["bwd_dq"], head_dim=D, causal=True, even_k=False)
        yield arch, "bwd_dq", f"{bc['bwd_dq'].label()} causal=True ragged", K.BWD["bwd_dq"], c, bc["bwd_dq"].hints()
        for page in (None, 64):
            c = K.decode_split_constants(rows=8, head_dim=D, page_size=page, arch=arch)
            yield arch, "decode_split", f"rows=8 page={page}", K.DECODE_SPLIT, c, {}
        c = K.decode_combine_constants(split_tile_m=16, head_dim=D)
        yield arch, "decode_combine", "tile_m=16", K.DECODE_COMBINE, c, {}
        c = K.decode_combine_row_constants(head_dim=D, num_splits=64)
        yield arch, "decode_combine_row", "splits=64", K.DECODE_COMBINE_ROW, c, {}
        vc = K.varlen_config(arch, D)
        for causal in (True, False):
            for qt in (1, 4):
                c = K.varlen_constants(vc, head_dim=D, causal=causal, q_tiles=qt)
                yield arch, "varlen_fwd", f"{vc.label()} causal={causal} q_tiles={qt}", K.VARLEN_FWD, c, vc.hints()


def extra_cases(only=None):
    """The flex forward/backward (a mask mod, a score mod) and the FP8 forward and decode split,
    sm_90, D=128: (arch, name, label, compile) with compile() -> a KernelReport with sass_text."""
    if only and only != "sm_90":
        return
    arch = "sm_90"
    from flashattn import aot, flex, mods
    from flashbook.compile_fp8 import compile_cases, compile_report
    for label, kw in (("causal mask", dict(mask=mods.causal())),
                      ("softcap score", dict(score=mods.softcap(30.0), block_size=None)),
                      ("softcap+causal ragged lse", dict(score=mods.softcap(30.0),
                                                         mask=mods.causal(), Nk=8000,
                                                         write_lse=True))):
        yield arch, "flex", label, lambda kw=kw: flex.compile_flex(arch, keep_sass=True, **kw)
    for label, kw in (("causal mask", dict(mask=mods.causal())),
                      ("softcap score", dict(score=mods.softcap(30.0), block_size=None))):
        for i, name in enumerate(("flex_dq", "flex_dkdv")):
            yield arch, name, label, lambda kw=kw, i=i: _with_sass(
                lambda: flex.compile_flex_bwd(arch, **kw)[i], i)
    for case in compile_cases(archs=(arch,), quick=True):
        if case["kernel"] == "fmha_fp8" and not (case["v_t"] and case["fp8"] == "float8_e4m3fn"
                                                 and case.get("fast_acc")):
            continue
        if case["kernel"] == "decode_split_fp8" and case["final"]:
            continue
        label = (f"causal={case['causal']}" if case["kernel"] == "fmha_fp8"
                 else f"rows=4 page={case['page']}")
        yield arch, case["kernel"], label, lambda case=case: _fp8(case)


_SASS = []


def _with_sass(fn, i):
    """compile_flex_bwd keeps no SASS text: catch the i-th cubin analysis of the call."""
    from flashattn import aot
    orig = aot.analyze_cubin
    _SASS.clear()

    def keep(path):
        a = orig(path)
        _SASS.append(a["sass_text"])
        return a
    aot.analyze_cubin = keep
    try:
        r = fn()
    finally:
        aot.analyze_cubin = orig
    r.sass_text = _SASS[i] if len(_SASS) > i else ""
    return r


def _fp8(case):
    from flashattn import aot
    orig = aot.compile_spec
    got = []

    def keep(*a, **kw):
        kw["use_cache"] = False
        r = orig(*a, **kw)
        got.append(r)
        return r
    aot.compile_spec = keep
    try:
        from flashbook.compile_fp8 import compile_report
        compile_report([case])
    finally:
        aot.compile_spec = orig
    return got[0]


def sass_row(arch, name, label, r):
    """One compiled kernel's row (``aot.KernelReport`` r): registers, stack, shared memory, SASS
    lines, the opcode histogram and a hash of the SASS text; printed as it comes."""
    text = "\n".join(x for x in getattr(r, "sass_text", "").splitlines() if "Function :" not in x)
    row = dict(arch=arch, kernel=name, case=label, err=r.error[:200], reg=r.registers,
               stack=r.stack_bytes, shared=r.shared_bytes, lines=r.sass_lines,
               hist=histogram(text), sha=hashlib.sha256(text.encode()).hexdigest()[:16],
               compile_s=round(r.compile_s, 1))
    print(json.dumps({k: row[k] for k in ("arch", "kernel", "case", "reg", "stack", "shared",
                                          "lines", "sha", "compile_s", "err")}), flush=True)
    return row


def run(out, only=None, kernel=None):
    from flashattn.aot import compile_spec
    rows = []
    todo = [(arch, name, label, lambda spec=spec, arch=arch, c=c, hints=hints, label=label:
             compile_spec(spec, arch, c, hints=hints, label=label, keep_sass=True, use_cache=False))
            for arch, name, label, spec, c, hints in cases(only)]
    for arch, name, label, fn in todo + list(extra_cases(only)):
        if kernel and name not in kernel.split(","):
            continue
        rows.append(sass_row(arch, name, label, fn()))
        json.dump(rows, open(out, "w"), indent=1)


def diff(a, b):
    A = {(r["arch"], r["kernel"], r["case"]): r for r in json.load(open(a))}
    B = {(r["arch"], r["kernel"], r["case"]): r for r in json.load(open(b))}
    print("| arch | kernel | case | reg | stack | shared | SASS lines | opcode histogram | SASS text |")
    print("|---|---|---|---|---|---|---|---|---|")
    for k in A:
        if k not in B:
            continue
        x, y = A[k], B[k]
        f = lambda n: f"{x[n]}" if x[n] == y[n] else f"{x[n]} -> {y[n]}"
        h = "same" if x["hist"] == y["hist"] else "; ".join(
            f"{o} {x['hist'].get(o, 0)}->{y['hist'].get(o, 0)}" for o in sorted(set(x["hist"]) | set(y["hist"]))
            if x["hist"].get(o, 0) != y["hist"].get(o, 0))
        t = "identical" if x["sha"] == y["sha"] else "differs"
        print(f"| {k[0]} | {k[1]} | {k[2]} | {f('reg')} | {f('stack')} | {f('shared')} | {f('lines')} | {h} | {t} |")


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1], *(a or None for a in sys.argv[2:4]))
