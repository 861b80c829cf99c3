"""Chapter 14's compile report of the FP8 kernels (ahead of time, no GPU): every variant the
chapter discusses compiled with tileiras and read back with cuobjdump (registers, spills, shared
memory, the FP8 SASS instructions). ``tests/test_fp8_aot.py`` and ``experiments/fp8_compile.py``
run it; ``flashbook.chapter.fp8`` reads its recorded output.
"""
from __future__ import annotations

import re

from flashattn.kernels.fp8_fwd_spec import FMHA_FP8, fp8_config, fp8_constants, with_fp8

__all__ = ["FP8_SASS", "compile_cases", "compile_report", "format_compile_report"]

# FP8 tensor-core instructions in SASS: QGMMA (Hopper's warpgroup MMA on fp8 operands, the FP8
# form of HGMMA: "QGMMA.64x128x32.F32.E4M3.E4M3"), UTCQMMA (Blackwell's tensor-memory MMA on
# fp8), QMMA (the warp-level mma.sync on fp8, sm_89/sm_120). F2FP...E4M3: the casts of P.
FP8_SASS = {"QGMMA": r"\bQGMMA\b", "UTCQMMA": r"\bUTC\w*QMMA\b", "QMMA": r"\bQMMA\b",
            "HGMMA": r"\bHGMMA\b", "UTCHMMA": r"\bUTC\w*HMMA\b", "HMMA": r"\bHMMA\b",
            "F2FP.E4M3": r"\bF2FP\.\w*\.?E4M3", "F2FP.E5M2": r"\bF2FP\.\w*\.?E5M2",
            "PRMT": r"\bPRMT\b", "STSM": r"\bSTSM\b", "LDSM": r"\bLDSM\b",
            "MUFU.EX2": r"\bMUFU\.EX2\b", "LDL": r"\bLDL\b", "STL": r"\bSTL\b",
            "UTMALDG": r"\bUTMALDG\b", "LDS.U8": r"\bLDS\.U8\b", "LDS.U16": r"\bLDS\.U16\b",
            "LDS.128": r"\bLDS\.128\b", "STS.128": r"\bSTS\.128\b"}


def compile_cases(*, archs=("sm_90", "sm_100", "sm_120"), head_dims=(64, 128, 256),
                  quick: bool = False) -> list[dict]:
    """The FP8 kernels' variants the compile report covers: the forward for every arch, head
    dim, causal or not, V transposed (K-major, ``V_T``) or not; e5m2 and the accumulation
    without fast_acc on sm_90 at D=128; the fp8-cache decode split kernel (contiguous and
    paged, one split FINAL or not) at D=128, paged at the other head dims; the FP8-MMA decode
    (V transposed) contiguous and paged at every head dim, FINAL too at D=128. ``quick``: D=128
    only."""
    from flashattn.kernels.decode_spec import decode_kernel_constants
    cases = []
    dims = (128,) if quick else head_dims
    for arch in archs:
        for d in dims:
            cfg = fp8_config(arch, d)
            for causal in (True, False):
                for vt in (True, False):
                    if d != 128 and not vt:
                        continue
                    cases.append(dict(kernel="fmha_fp8", arch=arch, D=d, causal=causal,
                                      v_t=vt, fp8="float8_e4m3fn", fast_acc=True,
                                      config=cfg))
        if arch == "sm_90":
            cfg = fp8_config(arch, 128)
            cases.append(dict(kernel="fmha_fp8", arch=arch, D=128, causal=True, v_t=True,
                              fp8="float8_e5m2", fast_acc=True, config=cfg))
            cases.append(dict(kernel="fmha_fp8", arch=arch, D=128, causal=True, v_t=True,
                              fp8="float8_e4m3fn", fast_acc=False, config=cfg))
        for d in dims:
            for page in (None, 64):
                for final in (False, True):
                    if d != 128 and (final or page is None):
                        continue
                    c = decode_kernel_constants(rows=4, head_dim=d, page_size=page, arch=arch,
                                                final=final, cache="float8_e4m3fn")
                    cases.append(dict(kernel="decode_split_fp8", arch=arch, D=d, page=page,
                                      final=final, rows=4, fp8="float8_e4m3fn",
                                      constants=c))
        # The FP8-MMA decode (V transposed): every head dim contiguous and paged, FINAL or
        # not at D=128.
        for d in dims:
            for page in (None, 64):
                for final in (False, True):
                    if d != 128 and final:
                        continue
                    c = decode_kernel_constants(rows=4, head_dim=d, page_size=page, arch=arch,
                                                final=final, cache="float8_e4m3fn",
                                                v_transposed=True)
                    cases.append(dict(kernel="decode_fp8mma", arch=arch, D=d, page=page,
                                      final=final, rows=4, fp8="float8_e4m3fn",
                                      constants=c))
    return cases


def compile_report(cases=None, **kw) -> list[dict]:
    """Compile each case (``compile_cases``) with ``aot.compile_spec`` (tileiras, no GPU) and
    read its cubin: registers, stack (spill) bytes, shared memory, SASS counts (``FP8_SASS``).
    One dict per case: the case's fields plus ``label``, ``registers``, ``stack_bytes``,
    ``shared_bytes``, ``sass_lines``, ``sass`` and ``error``."""
    import re
    from flashattn.aot import compile_spec
    from flashattn.kernels.decode_spec import decode_hints, decode_split_spec
    out = []
    for case in (compile_cases(**kw) if cases is None else cases):
        arch = case["arch"]
        if case["kernel"] == "fmha_fp8":
            cfg = case["config"]
            spec = with_fp8(FMHA_FP8, case["fp8"])
            consts = fp8_constants(cfg, head_dim=case["D"], causal=case["causal"],
                                   even_k=True, v_transposed=case["v_t"],
                                   fast_acc=case["fast_acc"])
            hints = cfg.hints()
            label = (f"fwd {case['fp8'].split('_')[1]} D={case['D']} "
                     f"{'causal' if case['causal'] else 'full'} "
                     f"{'V^T' if case['v_t'] else 'V'} {cfg.label()}"
                     + ("" if case["fast_acc"] else " exact-acc"))
        else:
            spec = decode_split_spec(case["fp8"])
            consts = case["constants"]
            hints = decode_hints(consts, arch)
            kind = "decode-mma" if case["kernel"] == "decode_fp8mma" else "decode"
            label = (f"{kind} {case['fp8'].split('_')[1]} D={case['D']} "
                     f"{'page=' + str(case['page']) if case['page'] else 'contiguous'}"
                     f"{' final' if case['final'] else ''} "
                     f"{consts['TILE_M']}x{consts['TILE_N']}")
        r = compile_spec(spec, arch, consts, hints=hints, dtype="bfloat16", align=16,
                         label=label, step=spec.name, keep_sass=True)
        text = getattr(r, "sass_text", "")
        instr = [ln for ln in text.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", ln)]
        sass = {k: sum(1 for ln in instr if re.search(p, ln)) for k, p in FP8_SASS.items()}
        mma_forms = sorted({m for ln in instr
                            for m in re.findall(r"\b(?:QGMMA|UTC\w*QMMA|QMMA|HGMMA|UTC\w*HMMA|"
                                                r"HMMA)[\w.]*", ln)})
        row = {k: v for k, v in case.items() if k not in ("config", "constants")}
        row.update(label=label, registers=r.registers, stack_bytes=r.stack_bytes,
                   shared_bytes=r.shared_bytes, sass_lines=r.sass_lines, sass=sass,
                   mma_forms=mma_forms, error=r.error, compile_s=round(r.compile_s, 1))
        out.append(row)
    return out


def format_compile_report(rows) -> str:
    """A plain-text table of ``compile_report``'s rows."""
    head = (f"{'arch':7}{'kernel':50}{'regs':>5}{'stack':>6}{'smem':>8}{'sass':>6}"
            f"{'QGMMA':>6}{'UTCQ':>5}{'QMMA':>5}{'HGMMA':>6}{'HMMA':>5}{'F2FP8':>6}{'PRMT':>5}"
            f"{'STSM':>5}{'EX2':>5}{'LDS8':>5}{'LDS16':>6}{'LDS128':>7}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r["error"]:
            lines.append(f"{r['arch']:7}{r['label']:50} ERROR {r['error'][:80]}")
            continue
        s = r["sass"]
        lines.append(f"{r['arch']:7}{r['label']:50}{r['registers']:>5}{r['stack_bytes']:>6}"
                     f"{r['shared_bytes']:>8}{r['sass_lines']:>6}{s['QGMMA']:>6}"
                     f"{s['UTCQMMA']:>5}{s['QMMA']:>5}{s['HGMMA']:>6}{s['HMMA']:>5}"
                     f"{s['F2FP.E4M3'] + s['F2FP.E5M2']:>6}{s['PRMT']:>5}{s['STSM']:>5}"
                     f"{s['MUFU.EX2']:>5}{s['LDS.U8']:>5}{s['LDS.U16']:>6}{s['LDS.128']:>7}")
    return "\n".join(lines)
