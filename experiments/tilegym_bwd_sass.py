"""Our backward kernels and NVIDIA TileGym's (tilegym 1.5.1, its cuTile FMHA backward) compiled
ahead of time for sm_90, side by side: registers, stack, shared memory and the instruction mix
(no GPU: tileiras and cuobjdump). B=4, H=32, D=128, N=4096, fp16, causal.

    python experiments/tilegym_bwd_sass.py OUT.json [CASE[,CASE]]

Cases: ours at the shipped configuration, ours at TileGym's 64x64 tiles (with and without
num_worker_warps=8, occupancy 1 and 2), TileGym's dK/dV and dQ kernels at the tiles its
autotuner kept on the H200 (64x64, occupancy=2, its default hint). The verdict is in
experiments/LOG.md (TileGym's backward beside ours).
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common_sass import histogram  # noqa: E402

N, H, D = 4096, 32, 128
ARCH = "sm_90"
# The instructions the comparison reads (the rest stays in the JSON's histogram).
KEYS = ("HGMMA", "MUFU", "LDGSTS", "UTMALDG", "UBLKCP", "LDG", "STG", "LDS", "LDSM", "STS",
        "BAR", "SYNCS", "WARPGROUP", "FSEL", "ISETP", "FSETP", "FFMA", "FMUL", "FADD", "F2FP",
        "BRA", "LDL", "STL")


SCHED = re.compile(r"(HGMMA\.[0-9x]+\.F32 R\d+|MUFU\.EX2|DEPBAR\.LE gsb0, 0x\d)")


def schedule(text: str) -> str:
    """The loop bodies' order of HGMMA groups (by accumulator register), wgmma waits and
    exponentials, runs collapsed: "HGMMA.64x64x16.F32 R184 x8 | DEPBAR.LE gsb0, 0x0 x1 | ..."."""
    runs = [[m, 1] for m in SCHED.findall(text)]
    out = []
    for r in runs:
        if out and out[-1][0] == r[0]:
            out[-1][1] += 1
        else:
            out.append(r)
    return " | ".join(f"{op} x{n}" for op, n in out)


def ours(kernel: str, cfg_text: str, module: str | None = None, function: str | None = None,
         **kw):
    """Our kernel (or, with ``module``, the same-signature variant from that module)."""
    import dataclasses

    from flashattn.aot import compile_spec
    from flashattn.config import Config
    from flashattn.kernels import BWD, bwd_constants
    cfg = Config.parse(cfg_text)
    c = bwd_constants(kernel, cfg, head_dim=D, causal=True, even_k=True)
    # a variant gets its own name: the cubin cache's key holds the spec's name, not its function
    spec = BWD[kernel] if module is None else dataclasses.replace(
        BWD[kernel], name=f"{kernel}_{function or 'split'}", module=module,
        function=function or BWD[kernel].function)
    return compile_spec(spec, ARCH, c, hints=cfg.hints(), label=cfg.label(),
                        keep_sass=True, **kw)


def _tilegym_sig(kernel: str, tile_m: int, tile_n: int):
    import cuda.tile as ct
    from cuda.tile.compilation import (ArrayConstraint, CallingConvention,
                                       ConstantConstraint, KernelSignature, ScalarConstraint)

    def arr(dtype, ndim, align):
        return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                               alias_groups=(), may_alias_internally=False,
                               stride_constant=(None,) * (ndim - 1) + (1,),
                               stride_divisible_by=(align,) * (ndim - 1) + (1,),
                               base_addr_divisible_by=16)
    io4, f1 = arr(ct.float16, 4, 8), arr(ct.float32, 1, 1)
    if kernel == "dkdv":   # Q K V dO dK dV LSE Delta qk_scale TILE_D H_Q H_KV SEQ_LEN M N G CAUSAL
        consts = (D, H, H, N, tile_m, tile_n, 1, True)
        params = [io4] * 6 + [f1, f1, ScalarConstraint(ct.float32)]
    else:                  # Q K V dO dQ LSE Delta qk_scale TILE_D H SEQ_LEN M N G CAUSAL
        consts = (D, H, N, tile_m, tile_n, 1, True)
        params = [io4] * 5 + [f1, f1, ScalarConstraint(ct.float32)]
    params += [ConstantConstraint(c) for c in consts]
    return KernelSignature(params, calling_convention=CallingConvention.cutile_python_v2())


def tilegym(kernel: str, tile_m: int, tile_n: int, occupancy: int | None = 2):
    """TileGym's kernel object as shipped, with the hint its launcher gives it (occupancy=2)."""
    import warnings

    import cuda.tile as ct
    from flashattn.aot import KernelReport, compile_into
    launch = ct.launch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from tilegym.ops.cutile import attention as A
    finally:
        ct.launch = launch    # tilegym replaces it process-wide
    k = A._fmha_bwd_dkdv_kernel if kernel == "dkdv" else A._fmha_bwd_dq_kernel
    if occupancy:
        k = k.replace_hints(occupancy=occupancy)
    label = f"{tile_m}x{tile_n}" + (f" occ={occupancy}" if occupancy else "")
    rep = KernelReport(step="tilegym", arch=ARCH, kernel=f"tilegym_{kernel}", config=label)
    key = hashlib.sha256(f"{kernel}{tile_m}{tile_n}{occupancy}{N}{H}{D}".encode()).hexdigest()[:16]
    cubin = Path("/tmp") / f"tilegym_bwd_{key}.cubin"
    return compile_into(rep, cubin, lambda: k, lambda: _tilegym_sig(kernel, tile_m, tile_n),
                        ARCH, use_cache=False, keep_sass=True)


CASES = {
    "ours_dkdv_shipped": lambda: ours("bwd_dkdv", "64x128 nww=8"),
    "ours_dq_shipped": lambda: ours("bwd_dq", "128x64 nww=8"),
    "ours_dkdv_64x64": lambda: ours("bwd_dkdv", "64x64"),
    "ours_dkdv_64x64_occ2": lambda: ours("bwd_dkdv", "64x64 occ=2"),
    "ours_dkdv_64x64_nww8": lambda: ours("bwd_dkdv", "64x64 nww=8"),
    "ours_dq_64x64": lambda: ours("bwd_dq", "64x64"),
    "ours_dq_64x64_occ2": lambda: ours("bwd_dq", "64x64 occ=2"),
    "ours_dq_64x64_nww8": lambda: ours("bwd_dq", "64x64 nww=8"),
    "ours_dq_128x64_occ2": lambda: ours("bwd_dq", "128x64 occ=2"),
    "ours_dkdv_64x128_occ2": lambda: ours("bwd_dkdv", "64x128 occ=2"),
    "split_dkdv_64x64_occ2": lambda: ours("bwd_dkdv", "64x64 occ=2", "bwd_split_variant"),
    "split_dq_64x64_occ2": lambda: ours("bwd_dq", "64x64 occ=2", "bwd_split_variant"),
    "vrow_dq_64x64_occ2": lambda: ours("bwd_dq", "64x64 occ=2", "bwd_split_variant",
                                       "bwd_dq_vrow_kernel"),
    "maskall_dq_64x64_occ2": lambda: ours("bwd_dq", "64x64 occ=2", "bwd_split_variant",
                                          "bwd_dq_maskall_kernel"),
    "maskall_dq_shipped": lambda: ours("bwd_dq", "128x64 nww=8", "bwd_split_variant",
                                       "bwd_dq_maskall_kernel"),
    "split_dkdv_shipped": lambda: ours("bwd_dkdv", "64x128 nww=8", "bwd_split_variant"),
    "split_dq_shipped": lambda: ours("bwd_dq", "128x64 nww=8", "bwd_split_variant"),
    "tilegym_dkdv_64x64": lambda: tilegym("dkdv", 64, 64),
    "tilegym_dq_64x64": lambda: tilegym("dq", 64, 64),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    out = Path(argv[0])
    only = argv[1].split(",") if len(argv) > 1 else list(CASES)
    extra = {}
    if Path(out).exists():
        extra = {r["case"]: r for r in json.loads(out.read_text())}
    rows = dict(extra)
    for name in only:
        t0 = time.perf_counter()
        r = CASES[name]()
        text = "\n".join(x for x in getattr(r, "sass_text", "").splitlines()
                         if "Function :" not in x)
        hist = histogram(text)
        # opcode families (HGMMA.64x64x16.F32 counts as HGMMA: histogram keys are opcodes)
        row = dict(case=name, config=r.config, err=r.error[:300], reg=r.registers,
                   stack=r.stack_bytes, shared=r.shared_bytes, lines=r.sass_lines,
                   hist=hist, schedule=schedule(text), s=round(time.perf_counter() - t0, 1))
        rows[name] = row
        print(json.dumps({k: row[k] for k in ("case", "config", "reg", "stack", "shared",
                                              "lines", "s", "err")}), flush=True)
        print("   ", {k: hist.get(k, 0) for k in KEYS if hist.get(k)}, flush=True)
        print("   ", row["schedule"][:400], flush=True)
        out.write_text(json.dumps(list(rows.values()), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
