"""Issue 35 (item 8): the SASS of the shipped forward, backward, varlen and FP8 forward kernels
on sm_90, sm_100 and sm_120, to compare a refactor's before and after (no GPU: tileiras and
cuobjdump). Runs against whichever flashattn is on PYTHONPATH, old layout or new.
python experiments/library_sass.py OUT.json; python experiments/library_sass.py --diff A.json B.json"""
import json, sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common_sass import diff, sass_row  # noqa: E402

ARCHS = ("sm_90", "sm_100", "sm_120")


def _fp8_spec_module():
    try:
        from flashattn.kernels import fp8_fwd_spec as m    # the split layout
    except ImportError:
        from flashattn.kernels import fp8_spec as m        # one module, before issue 35
    return m


def cases():
    from flashattn import kernels as K
    from flashattn.registry import best_step_name, get_step
    f8 = _fp8_spec_module()
    D = 128
    for arch in ARCHS:
        s = get_step(best_step_name(arch))
        cfg = s.configs(arch)[0]
        for causal in (True, False):
            c = K.fmha_constants(s, cfg, head_dim=D, causal=causal, even_k=True)
            yield arch, "fmha", f"{cfg.label()} causal={causal}", K.FMHA, c, cfg.hints(), "float16"
        bc = K.bwd_configs(arch, D)
        for name in ("bwd_preprocess", "bwd_dkdv", "bwd_dq"):
            c = K.bwd_constants(name, bc[name], head_dim=D, causal=True, even_k=True)
            yield arch, name, f"{bc[name].label()} causal=True", K.BWD[name], c, bc[name].hints(), "float16"
        vc = K.varlen_config(arch, D)
        for qt in (1, 4):
            c = K.varlen_constants(vc, head_dim=D, causal=True, q_tiles=qt)
            yield arch, "varlen_fwd", f"{vc.label()} causal=True q_tiles={qt}", K.VARLEN_FWD, c, vc.hints(), "float16"
        fc = f8.fp8_config(arch, D)
        for causal in (True, False):
            for vt in (True, False):
                c = f8.fp8_constants(fc, head_dim=D, causal=causal, even_k=True,
                                     v_transposed=vt, fast_acc=True)
                yield (arch, "fmha_fp8", f"{fc.label()} causal={causal} v_t={vt}",
                       f8.with_fp8(f8.FMHA_FP8, "float8_e4m3fn"), c, fc.hints(), "bfloat16")


def run(out, only=None):
    from flashattn.aot import compile_spec
    rows = []
    for arch, name, label, spec, c, hints, dtype in cases():
        if only and name not in only.split(","):
            continue
        r = compile_spec(spec, arch, c, hints=hints, dtype=dtype, align=16 if dtype == "bfloat16" else 8,
                         label=label, keep_sass=True, use_cache=False)
        rows.append(sass_row(arch, name, label, r))
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--diff":
        diff(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[1], *(sys.argv[2:3] or [None]))
