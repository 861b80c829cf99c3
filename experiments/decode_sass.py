"""The decode kernels compiled ahead of time (tileiras, no GPU), before and after a refactor.

    python experiments/decode_sass.py save experiments/data/decode-equivalence/sass-before.json
    python experiments/decode_sass.py save OUT.json "fp8_vt"       # only the keys matching
    python experiments/decode_sass.py diff experiments/data/decode-equivalence/sass-before.json.xz \
        experiments/data/decode-equivalence/sass-after.json.xz

One row per (arch, path, D, cache layout, one split or not): registers, stack (spill) bytes,
shared memory and SASS instruction lines, and the count of each opcode. The paths are those of
``flashattn.decode``: the 16-bit cache (fp16), the fp8 cache widened on chip (bf16 queries, as
the FP8 compile report) and the fp8 cache with V transposed on FP8 MMAs; plus both combines.
"""
import collections
import json
import re
import sys

from flashattn.aot import compile_spec

ARCHS = ("sm_90", "sm_100", "sm_120")
ROWS = 4                                   # GQA 4:1, one new token: the chapter's shape


def _cases():
    for arch in ARCHS:
        for path in ("fp16", "fp8", "fp8_vt"):
            for d in (64, 128, 256):
                for page in (None, 64):
                    for final in (False, True):
                        if d != 128 and (final or page is None) and path != "fp8_vt":
                            continue
                        if path == "fp8_vt" and d != 128 and final:
                            continue
                        yield dict(arch=arch, path=path, D=d, page=page, final=final)
        for d in (64, 128, 256):
            yield dict(arch=arch, path="combine", D=d, page=None, final=False)
            yield dict(arch=arch, path="combine_row", D=d, page=None, final=False)


def _resolve(case):
    """(spec, constants, hints, dtype) of a case, in whichever API the tree has."""
    import flashattn.kernels as K
    arch, d, page, final = case["arch"], case["D"], case["page"], case["final"]
    if hasattr(K, "decode_kernel_constants"):          # after issue 35: one kernel family
        from flashattn.kernels.decode_spec import (DECODE_COMBINE, DECODE_COMBINE_ROW,
                                                   decode_combine_constants,
                                                   decode_combine_row_constants,
                                                   decode_kernel_constants, decode_hints,
                                                   decode_split_spec)
        if case["path"] == "combine":
            return DECODE_COMBINE, decode_combine_constants(split_tile_m=16, head_dim=d), {}, \
                "float16"
        if case["path"] == "combine_row":
            return DECODE_COMBINE_ROW, decode_combine_row_constants(head_dim=d, num_splits=16), \
                {}, "float16"
        cache = {"fp16": None, "fp8": "float8_e4m3fn", "fp8_vt": "float8_e4m3fn"}[case["path"]]
        vt = case["path"] == "fp8_vt"
        c = decode_kernel_constants(rows=ROWS, head_dim=d, page_size=page, arch=arch,
                                    final=final, cache=cache, v_transposed=vt)
        return (decode_split_spec(cache), c, decode_hints(c, arch),
                "float16" if cache is None else "bfloat16")
    if case["path"] == "combine":
        return K.DECODE_COMBINE, K.decode_combine_constants(split_tile_m=16, head_dim=d), {}, \
            "float16"
    if case["path"] == "combine_row":
        return K.DECODE_COMBINE_ROW, K.decode_combine_row_constants(head_dim=d, num_splits=16), \
            {}, "float16"
    base = K.decode_split_constants(rows=ROWS, head_dim=d, page_size=page, arch=arch,
                                    final=final)
    if case["path"] == "fp16":
        return K.DECODE_SPLIT, base, dict(K.DECODE_SPLIT_HINTS.get(arch, {})), "float16"
    if case["path"] == "fp8":
        from flashattn.kernels.fp8_spec import (DECODE_SPLIT_FP8, fp8_decode_constants,
                                                fp8_decode_hints)
        c = fp8_decode_constants(dict(base, FUSED=False, PDL=False), arch)
        return DECODE_SPLIT_FP8, c, fp8_decode_hints(c, arch, K.DECODE_SPLIT_HINTS.get(arch, {})), \
            "bfloat16"
    from flashattn.kernels.fp8_decode_spec import (DECODE_FP8MMA, fp8_decode_mma_constants,
                                                   fp8_decode_mma_hints)
    c = fp8_decode_mma_constants(base, arch)
    return DECODE_FP8MMA, c, fp8_decode_mma_hints(c, arch), "bfloat16"


def _key(case):
    return (f"{case['arch']} {case['path']} D={case['D']} "
            f"{'page=' + str(case['page']) if case['page'] else 'contiguous'}"
            f"{' final' if case['final'] else ''}")


def save(path, only=None):
    """Compile every case (``only``: those whose key matches this regex) and write the rows."""
    rows = {}
    for case in _cases():
        if only and not re.search(only, _key(case)):
            continue
        spec, consts, hints, dtype = _resolve(case)
        r = compile_spec(spec, case["arch"], consts, hints=hints, dtype=dtype, align=16,
                         label=_key(case), keep_sass=True)
        ops = collections.Counter()
        for ln in getattr(r, "sass_text", "").splitlines():
            m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)", ln)
            if m:
                ops[m.group(1)] += 1
        rows[_key(case)] = dict(registers=r.registers, stack=r.stack_bytes,
                                shared=r.shared_bytes, sass=r.sass_lines, error=r.error,
                                constants={k: v for k, v in consts.items()}, hints=hints,
                                ops=dict(ops))
        print(f"{_key(case):45} regs={r.registers} stack={r.stack_bytes} "
              f"smem={r.shared_bytes} sass={r.sass_lines} {r.error or ''}", flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1, sort_keys=True)


def _read(path):
    """A saved table, plain or xz-compressed (``.json.xz``)."""
    import lzma
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def diff(a_path, b_path):
    """One line per case of ``b_path`` (every case of ``a_path`` without ``b_path``'s only)."""
    a, b = _read(a_path), _read(b_path)
    a = {k: v for k, v in a.items() if k in b}
    print(f"{'case':45}{'regs':>10}{'stack':>10}{'smem':>14}{'sass':>12}  opcodes that differ")
    for key in a:
        x, y = a[key], b.get(key)
        if y is None:
            print(f"{key:45} MISSING after")
            continue
        ops = sorted(set(x["ops"]) | set(y["ops"]))
        dops = [f"{o} {x['ops'].get(o, 0)}->{y['ops'].get(o, 0)}" for o in ops
                if x["ops"].get(o, 0) != y["ops"].get(o, 0)]
        cell = lambda f: (f"{x[f]}" if x[f] == y[f] else f"{x[f]}->{y[f]}")
        print(f"{key:45}{cell('registers'):>10}{cell('stack'):>10}{cell('shared'):>14}"
              f"{cell('sass'):>12}  {', '.join(dops) or '='}")


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        diff(sys.argv[2], sys.argv[3])
