"""The library FP8 forward after SPLIT and REV (issue 26): compile report of the shipped cases.

    python experiments/fp8_fwd_split_sass.py --out experiments/data/49-fp8-fwd-split

CPU only (tileiras + cuobjdump through ``flashattn.aot.compile_spec``): ``fmha_fp8_kernel`` at
each (arch, head dim, causal) of ``kernels.fp8_spec.FP8_CONFIGS`` (V^T, e4m3, bf16 out, fast
accumulation, EVEN_K), plus sm_90 at its old configs (128x128 nww=8 at D 64/128, 128x64 at
D=256, no split: the baseline of the change; the kernel is the new one, so causal rows launch
the longest tiles first) and the split config tried and not shipped (``--tried``).
Per row: registers, stack (spill) bytes, shared memory, SASS lines, and the per-tile loops
holding an MMA and exponentials (``fp8_decode_v2.loop_table``): instructions per warp and the
keys each trip handles (a thread holds TILE_N / 2 scores of a tile: MUFU.EX2 = keys / 2 + 2).
The loop reader does not find sm_100's loops (its listing branches differently): "-" there.
Writes ``compile.json`` and ``compile.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRIED = [("sm_90", 256, "128x256 occ=1 nww=8")]     # split, not shipped (it spills)


def cases(archs, head_dims, tried: bool):
    from flashattn.kernels.fp8_spec import fp8_config
    from flashattn.config import Config
    out = []
    for arch in archs:
        for d in head_dims:
            out.append((arch, d, fp8_config(arch, d), "shipped"))
    if "sm_90" in archs:
        from experiments.fp8_fwd_variants import old_config
        out += [("sm_90", d, old_config("sm_90", d), "old") for d in head_dims]
    if tried:
        out += [(a, d, Config.parse(c), "tried") for a, d, c in TRIED]
    return out


def row(arch, d, cfg, kind, causal):
    from flashattn.aot import compile_spec
    from flashattn.kernels.fp8_spec import FMHA_FP8, fp8_constants
    from experiments.fp8_decode_v2 import loop_table
    c = fp8_constants(cfg, head_dim=d, causal=causal, even_k=True, v_transposed=True)
    t = time.time()
    r = compile_spec(FMHA_FP8, arch, c, hints=cfg.hints(), dtype="bfloat16", align=16,
                     label=cfg.label(), keep_sass=True)
    text = getattr(r, "sass_text", "")
    loops = [dict(lp, keys=2 * (lp["MUFU.EX2"] - 2)) for lp in
             (loop_table(text, 1200) if text else []) if lp["MMA"] and lp["MUFU.EX2"]]
    return dict(arch=arch, D=d, causal=causal, config=cfg.label(), kind=kind,
                split=c["SPLIT"], registers=r.registers, stack_bytes=r.stack_bytes,
                shared_bytes=r.shared_bytes, sass_lines=r.sass_lines, error=r.error,
                seconds=round(time.time() - t, 1),
                loops=[dict(instr=lp["instr"], keys=lp["keys"], MMA=lp["MMA"],
                            EX2=lp["MUFU.EX2"]) for lp in loops])


def fmt(rows) -> str:
    out = ["| arch | D | mask | config | kind | split | regs | stack | smem B | SASS lines | "
           "loops: instr/keys (instr per 128 keys) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lps = ", ".join(f"{lp['instr']}/{lp['keys']} ({lp['instr'] * 128 / lp['keys']:.0f})"
                        for lp in r["loops"] if lp["keys"] > 0) or "-"
        out.append(f"| {r['arch']} | {r['D']} | {'causal' if r['causal'] else 'full'} | "
                   f"{r['config']} | {r['kind']} | {'yes' if r['split'] else 'no'} | "
                   f"{r['registers']} | {r['stack_bytes']} | {r['shared_bytes']} | "
                   f"{r['sass_lines']} | {lps} |" + (f" ERROR {r['error'][:80]}" if r["error"]
                                                      else ""))
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--arch", nargs="*", default=["sm_90", "sm_100", "sm_120"])
    ap.add_argument("--head-dims", nargs="*", type=int, default=[64, 128, 256])
    ap.add_argument("--tried", action="store_true", help="also the split configs not shipped")
    a = ap.parse_args(argv)
    import cuda.tile as ct
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for arch, d, cfg, kind in cases(a.arch, a.head_dims, a.tried):
        for causal in (False, True):
            r = row(arch, d, cfg, kind, causal)
            rows.append(r)
            print(json.dumps(r), flush=True)
    (out / "compile.json").write_text(json.dumps(dict(
        meta=dict(cuda_tile=ct.__version__, dtype_out="bfloat16", v_t=True, fp8="e4m3",
                  command="python experiments/fp8_fwd_split_sass.py " + " ".join(
                      sys.argv[1:] if argv is None else argv)),
        rows=rows), indent=1) + "\n")
    (out / "compile.md").write_text(fmt(rows))
    print(fmt(rows))
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
