"""Issue 21: the SASS of the shipped decode and backward kernels before/after their off switches
(decode FUSED and PDL, backward PDL) moved to the book (flashbook/ladder/). No GPU: tileiras and
cuobjdump through flashattn.aot. python experiments/switch_sass.py OUT.json; compare two runs with
python experiments/common_sass.py --diff BEFORE.json AFTER.json."""
import hashlib, json, sys

from common_sass import histogram


def cases():
    from flashattn import kernels as K
    arch, D = "sm_90", 128
    for page in (None, 64):
        for final in (False, True):
            c = K.decode_split_constants(rows=8, head_dim=D, page_size=page, arch=arch, final=final)
            yield arch, "decode_split", f"rows=8 page={page} final={final}", K.DECODE_SPLIT, c, {}
    c = K.decode_combine_constants(split_tile_m=16, head_dim=D)
    yield arch, "decode_combine", "tile_m=16", K.DECODE_COMBINE, c, {}
    c = K.decode_combine_row_constants(head_dim=D, num_splits=64)
    yield arch, "decode_combine_row", "splits=64", K.DECODE_COMBINE_ROW, c, {}
    bc = K.bwd_configs(arch, D)
    c = K.bwd_constants("bwd_preprocess", bc["bwd_preprocess"], head_dim=D, causal=True, even_k=True)
    yield arch, "bwd_preprocess", "64", K.BWD["bwd_preprocess"], c, {}
    for name in ("bwd_dkdv", "bwd_dq"):
        for causal in (True, False):
            c = K.bwd_constants(name, bc[name], head_dim=D, causal=causal, even_k=True)
            yield arch, name, f"{bc[name].label()} causal={causal}", K.BWD[name], c, bc[name].hints()
    c = K.bwd_constants("bwd_dkdv_dq_atomic", bc["bwd_dkdv"], head_dim=D, causal=True, even_k=True)
    yield (arch, "bwd_dkdv_dq_atomic", f"{bc['bwd_dkdv'].label()} causal=True",
           K.BWD_ATOMIC["bwd_dkdv_dq_atomic"], c, bc["bwd_dkdv"].hints())


def run(out):
    from flashattn.aot import compile_spec
    rows = []
    for arch, name, label, spec, c, hints in cases():
        r = compile_spec(spec, arch, c, hints=hints, label=label, keep_sass=True, use_cache=False)
        text = "\n".join(x for x in getattr(r, "sass_text", "").splitlines() if "Function :" not in x)
        row = dict(arch=arch, kernel=name, case=label, err=r.error[:200], reg=r.registers,
                   stack=r.stack_bytes, shared=r.shared_bytes, lines=r.sass_lines,
                   hist=histogram(text), sha=hashlib.sha256(text.encode()).hexdigest()[:16],
                   compile_s=round(r.compile_s, 1), constants=sorted(c))
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("kernel", "case", "reg", "stack", "shared", "lines", "sha", "err")}), flush=True)
        with open(out + ".sass/" + f"{name}-{label}".replace(" ", "_").replace("=", "") + ".sass", "w") as f:
            f.write(text)
        json.dump(rows, open(out, "w"), indent=1)


if __name__ == "__main__":
    import os
    os.makedirs(sys.argv[1] + ".sass", exist_ok=True)
    run(sys.argv[1])
