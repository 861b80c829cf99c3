"""E30: static strides and static shapes for the forward (issue 27's last untried lever).

    python experiments/static_layout.py compile --out experiments/data/43-static-layout/
    python experiments/static_layout.py time --out experiments/data/43-static-layout/static.json

cuTile 1.6 can make an array's strides (``static_stride_dims``) and shape (``static_shape_dims``)
compile-time constants, taken from the launch's tensors: the kernel is then specialised to one
layout and one sequence length. ``assume_divisible_by`` is the weaker form of the same
information (a divisor instead of the value), so if the full constants change nothing in the
loop, the divisor cannot either.

Two kernels here, both the library's forward (its tile body, ``attend_query_tile``, imported:
cuTile inlines it) with the shipped flags (the seed's FAST_MATH, SPLIT_LOOP, REMAP):
``strides`` (Q, K, V, Out with every stride static) and ``layout`` (every stride and every shape
static: B, H, N and D known to the compiler, so the loop's trip count and the causal split point
of each query tile are constants up to the program id). Baseline: the library's kernel at the
same configuration, twice (the control).

Prediction (written before timing; from the SASS compare of ``compile``): see
experiments/LOG.md E30.
"""
import argparse
import collections
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Annotated

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cuda.tile as ct  # noqa: E402

from flashbook.ladder.fmha import INV_LOG_2, attend_query_tile  # noqa: E402
from flashattn.kernels.spec import Array, KernelSpec  # noqa: E402

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ALL = (0, 1, 2, 3)
Strided = Annotated[ct.Array, ct.ArrayAnnotation(static_stride_dims=ALL)]
Fixed = Annotated[ct.Array, ct.ArrayAnnotation(static_stride_dims=ALL, static_shape_dims=ALL)]


def _body(Q, K, V, Out, Lse, qk_scale, input_pos, num_heads, group_size, num_m_blocks,
          TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K):
    """The library's non-persistent grid with the shipped flags: program -> (tile, head)."""
    qk_scale = qk_scale * INV_LOG_2
    bid_y = ct.bid(1)
    head_idx = bid_y % num_heads
    if CAUSAL:
        bid_x = num_m_blocks - 1 - ct.bid(0)                   # longest tiles first (remap)
    else:
        bid_x = ct.bid(0)
    attend_query_tile(Q, K, V, Out, Lse, qk_scale, input_pos, bid_x, bid_y // num_heads,
                      head_idx, head_idx // group_size, TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K,
                      True, True, False, 0, False, 2, 4, False, False)


@ct.kernel
def fmha_strides_kernel(Q: Strided, K: Strided, V: Strided, Out: Strided, Lse,
                        qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                        num_m_blocks: int, TILE_M: ConstInt, TILE_N: ConstInt,
                        TILE_D: ConstInt, CAUSAL: ConstBool, EVEN_K: ConstBool):
    """The forward with every stride of Q, K, V and Out a compile-time constant."""
    _body(Q, K, V, Out, Lse, qk_scale, input_pos, num_heads, group_size, num_m_blocks,
          TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K)


@ct.kernel
def fmha_layout_kernel(Q: Fixed, K: Fixed, V: Fixed, Out: Fixed, Lse,
                       qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                       num_m_blocks: int, TILE_M: ConstInt, TILE_N: ConstInt,
                       TILE_D: ConstInt, CAUSAL: ConstBool, EVEN_K: ConstBool):
    """The forward with every stride and every shape of Q, K, V and Out a compile-time constant."""
    _body(Q, K, V, Out, Lse, qk_scale, input_pos, num_heads, group_size, num_m_blocks,
          TILE_M, TILE_N, TILE_D, CAUSAL, EVEN_K)


def _spec(name, fn):
    return KernelSpec(
        name, "experiments.static_layout", fn,
        arrays=(Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4),
                Array("Lse", 3, "float32")),
        scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
                 ("group_size", int), ("num_m_blocks", int)),
        constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K"))


SPECS = {"strides": _spec("fmha_strides", "fmha_strides_kernel"),
         "layout": _spec("fmha_layout", "fmha_layout_kernel")}


def attention_static(q, k, v, *, causal: bool, config, variant: str, out=None):
    """Forward attention through a static-layout kernel (contiguous (B, H, N, D) tensors, GQA
    allowed); CPU tensors run in the interpreter."""
    import torch

    from flashattn.dispatch import launch_kernel
    from flashattn.kernels import hinted
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((1, 1, 1), dtype=torch.float32, device=q.device)
    spec = SPECS[variant]
    m_blocks = -(-Nq // config.TILE_M)
    args = spec.args(dict(Q=q, K=k, V=v, Out=out, Lse=lse),
                     dict(qk_scale=1 / math.sqrt(D), input_pos=0, num_heads=Hq,
                          group_size=Hq // Hkv, num_m_blocks=m_blocks),
                     dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=D,
                          CAUSAL=bool(causal), EVEN_K=Nk % config.TILE_N == 0))
    launch_kernel(q.device, (m_blocks, B * Hq, 1), hinted(spec.kernel(), config.hints()), args,
                  stream="current")
    return out


# --- compile: the SASS of each variant beside the library's kernel -----------------------------
def _signature(spec, constants, *, shape, static_shape: bool, static_stride: bool):
    """A signature as cuTile's JIT builds it for contiguous fp16 (B, H, N, D) tensors, with the
    static dimensions filled in from ``shape``."""
    from cuda.tile.compilation import (ArrayConstraint, CallingConvention, ConstantConstraint,
                                       KernelSignature, ScalarConstraint)
    B, H, N, D = shape
    strides = (H * N * D, N * D, D, 1)

    def arr4():
        return ArrayConstraint(ct.float16, 4, index_dtype=ct.int32, stride_lower_bound_incl=0,
                               alias_groups=(), may_alias_internally=False,
                               stride_constant=strides if static_stride else (None,) * 3 + (1,),
                               shape_constant=shape if static_shape else None,
                               stride_divisible_by=(8, 8, 8, 1), base_addr_divisible_by=16)
    lse = ArrayConstraint(ct.float32, 3, index_dtype=ct.int32, stride_lower_bound_incl=0,
                          alias_groups=(), may_alias_internally=False,
                          stride_constant=(None, None, 1), stride_divisible_by=(8, 8, 1),
                          base_addr_divisible_by=16)
    params = ([arr4() for _ in range(4)] + [lse, ScalarConstraint(ct.float32)] +
              [ScalarConstraint(ct.int32)] * 4 +
              [ConstantConstraint(constants[n]) for n in spec.constants])
    return KernelSignature(params, calling_convention=CallingConvention.cutile_python_v2())


def _compile(spec, constants, config, arch, out_dir, tag, **sig):
    from cuda.tile.compilation import export_kernel

    from flashattn.aot import analyze_cubin
    from flashattn.kernels import hinted
    cubin = Path(out_dir) / f"{tag}.cubin"
    export_kernel(hinted(spec.kernel(), config.hints()), [_signature(spec, constants, **sig)],
                  str(cubin), gpu_code=arch, output_format="cubin")
    a = analyze_cubin(cubin)
    ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)",
                                         a["sass_text"], re.M))
    return dict(registers=a["registers"], stack=a["stack_bytes"], shared=a["shared_bytes"],
                sass_lines=a["sass_lines"], ops=ops)


def compile_report(out_dir: str, arch: str = "sm_90") -> str:
    """Compile the library kernel and both variants at the shipped Hopper configurations and
    write a table of registers, stack, shared memory, SASS lines and the opcodes that differ."""
    from flashattn.kernels import constants_for, fmha_spec
    from flashbook.steps import Config, get_step
    step = get_step("arch_tuned")
    lib = fmha_spec(step)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    lines = [f"# E30 compile report ({arch}, fp16, D=128, B=4 H=32)", ""]
    for cfg in (Config(64, 128, occupancy=2), Config(128, 128, occupancy=1,
                                                      num_worker_warps=8)):
        for causal in (True, False):
            for N in (4096, 16384):
                shape = (4, 32, N, 128)
                base_c = constants_for(lib, step, cfg, head_dim=128, causal=causal,
                                       even_k=True)
                small = {n: base_c[n] for n in SPECS["strides"].constants}
                rows = {"library": _compile(lib, base_c, cfg, arch, out_dir, "lib",
                                            shape=shape, static_shape=False,
                                            static_stride=False)}
                rows["strides"] = _compile(SPECS["strides"], small, cfg, arch, out_dir,
                                           "strides", shape=shape, static_shape=False,
                                           static_stride=True)
                rows["layout"] = _compile(SPECS["layout"], small, cfg, arch, out_dir,
                                          "layout", shape=shape, static_shape=True,
                                          static_stride=True)
                lines.append(f"## {cfg.label()}, causal={causal}, N={N}")
                base_ops = rows["library"]["ops"]
                for name, r in rows.items():
                    diff = {op: r["ops"][op] - base_ops[op]
                            for op in set(r["ops"]) | set(base_ops)
                            if r["ops"][op] != base_ops[op]}
                    key = {op: diff[op] for op in sorted(diff)
                           if op.startswith(("HGMMA", "MUFU", "UTMA", "LDG", "STG", "BAR",
                                             "WARPSYNC", "SYNCS", "BRA", "IMAD", "IADD",
                                             "ISETP", "SHF", "LEA", "LDS", "STS", "R2UR"))}
                    lines.append(f"- {name:8s} REG {r['registers']:3d}  STACK {r['stack']:3d}  "
                                 f"SHARED {r['shared']:6d}  SASS {r['sass_lines']:5d}  "
                                 f"HGMMA {r['ops']['HGMMA']:3d}  MUFU {r['ops']['MUFU']:3d}"
                                 + (f"  opcode deltas {key}" if name != "library" else ""))
                lines.append("")
    text = "\n".join(lines)
    (Path(out_dir) / "compile-report.txt").write_text(text + "\n")
    for p in Path(out_dir).glob("*.cubin"):
        p.unlink()
    return text


# --- time: each variant beside the library's kernel and the control -----------------------------
def time_report(out: str, seqlens: str, rounds: int, argv) -> int:
    import torch
    if not torch.cuda.is_available():
        print("error: `static_layout.py time` needs a CUDA GPU", file=sys.stderr)
        return 1
    from flashattn.stats import ratio_ci
    from flashattn.env import metadata
    from flashattn.launch import launch
    from flashattn import timing
    from flashbook.measure.harness import estimate_ms
    from flashbook.measure.libraries import library_fn
    from flashbook.measure.workload import SAMPLE_MS
    from flashbook.steps import Config, get_step
    B, H, D = 4, 32, 128
    rows, t0 = [], time.perf_counter()
    for cfg in (Config(64, 128, occupancy=2), Config(128, 128, occupancy=1,
                                                      num_worker_warps=8)):
        for N in (int(n) for n in seqlens.split(",")):
            for causal in (True, False):
                g = torch.Generator(device="cuda").manual_seed(N + causal)
                q, k, v = (torch.randn(B, H, N, D, generator=g, device="cuda",
                                       dtype=torch.float16) for _ in range(3))
                outs, calls = {}, {}
                for name in ("library", "library#2"):
                    outs[name] = torch.empty_like(q)
                    calls[name] = (lambda o=outs[name]: launch(
                        q, k, v, o, get_step("arch_tuned"), cfg, causal=causal,
                        scale=1 / math.sqrt(D)))
                for var in SPECS:
                    outs[var] = torch.empty_like(q)
                    calls[var] = (lambda var=var: attention_static(
                        q, k, v, causal=causal, config=cfg, variant=var, out=outs[var]))
                fn, ctx = library_fn("sdpa_cudnn", q, k, v, causal=causal,
                                     scale=1 / math.sqrt(D))

                def cudnn(fn=fn, ctx=ctx):
                    with ctx():
                        return fn()
                calls["sdpa_cudnn"] = cudnn
                for c in calls.values():
                    c()
                torch.cuda.synchronize()
                same = {n: bool(torch.equal(o, outs["library"])) for n, o in outs.items()}
                est = estimate_ms(calls)
                inner = max(1, min(10, round(SAMPLE_MS / max(min(est.values()), 1e-3))))
                res = timing.time_rounds(calls, rounds=rounds, inner=inner)
                flops = 4 * B * H * N * N * D * (0.5 if causal else 1.0)
                for name, t in res.items():
                    r, lo, hi = ratio_ci(res["library"].samples, t.samples)
                    rc, _, _ = ratio_ci(res["sdpa_cudnn"].samples, t.samples)
                    rows.append(dict(config=cfg.label(), N=N, causal=causal, impl=name,
                                     median_ms=t.median_ms,
                                     tflops=flops / (t.median_ms * 1e-3) / 1e12,
                                     speedup=r, speedup_lo=lo, speedup_hi=hi, ratio_cudnn=rc,
                                     equal_to_library=same.get(name)))
                    print(f"{cfg.label():22s} N={N:6d} causal={causal!s:5s} {name:11s} "
                          f"{t.median_ms:8.3f} ms  x library {r:.3f} [{lo:.3f}, {hi:.3f}]  "
                          f"x cuDNN {rc:.3f}  equal={same.get(name)}", flush=True)
    meta = metadata("python experiments/static_layout.py " + " ".join(argv))
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("compile", "time"))
    p.add_argument("--out", required=True)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--seqlens", default="1024,4096,16384")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    if a.part == "compile":
        print(compile_report(a.out, a.arch))
        return 0
    return time_report(a.out, a.seqlens, a.rounds, argv)


if __name__ == "__main__":
    raise SystemExit(main())
