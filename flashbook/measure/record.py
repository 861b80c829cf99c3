"""Record the book's measurements under ``results/<gpu>/`` (the notebooks read them back).

    python -m flashbook record --out results/h200 --part bench        # ~5 min on an H200
    python -m flashbook record --out results/h200 --part bench-extra  # ~7 min (or --workload)
    python -m flashbook record --out results/h200 --part bench-backward       # ~4 min (fp16)
    python -m flashbook record --out results/h200 --part bench-backward-bf16  # ~4 min
    python -m flashbook record --out results/h200 --part profile      # Nsight Compute
    python -m flashbook record --out results/h200 --part profile-backward  # issue 11's kernels
    python -m flashbook record --out results/h200 --part profile-decode    # issue 12's
    python -m flashbook record --out results/h200 --part compile      # any machine, no GPU
    python -m flashbook record --quick --out /tmp/r                   # tiny, to test the tools

Writes::

    results/<gpu>/bench/<workload>.json     python -m flashbook bench documents
    results/<gpu>/bench-backward/<workload>-bwd.json   bench --backward documents (issue 11)
    results/<gpu>/profiles/                 flashbook.measure.ncu.record_profiles (summary.json, ...)
    results/<gpu>/compile/<arch>.json       python -m flashattn compile --json documents

Each part is sized to finish inside one 10-minute command on an H200; the elapsed time of each
is printed. Files are written atomically, and each carries ``flashattn.env.metadata()``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback
from pathlib import Path

from ..data.schema import workload_name, write_json
from flashattn.env import command_line, gpu_slug, metadata
from ..impls import STEP_IMPLS
from flashbook.steps import STEP_NAMES
from flashbook.steps import HOPPER_LADDER
from .bench import DEFAULT_STEPS, run_bench

PARTS = ("bench", "bench-extra", "bench-backward", "bench-backward-bf16", "profile",
         "profile-backward", "profile-decode", "compile", "flex", "flex-backward", "flex-backward-bf16",
         "blasst", "fp8", "profile-flex-fp8")
# Chapters 13 and 14: FlexAttention, BLASST and FP8 (measure.bench_flex, measure.bench_fp8).
FLEX_BUDGET_S = dict(fwd=400.0, bwd=400.0, blasst=150.0)
FP8_BUDGET_S = 200.0
COMPILE_ARCHS = ("sm_90", "sm_100")
PROFILE_N = 4096
TAIL_STEPS = ("loop_split", "remap", "loop_split@64x128", "remap@64x128")   # profiled at N=1K

# Every recorded workload carries a control: the fastest step timed again as another row
# (chapter 3: the two agree to within the measurement's resolution, or nothing is an effect).
CONTROL = "best#2"
# The default workload: every step, experiment and `best`, the control, and the seed's steps
# replayed at a tile that does not spill on Hopper (chapters 6-8).
MAIN_STEPS = (*DEFAULT_STEPS, CONTROL, *(name for name, _ in HOPPER_LADDER))
# The extra workloads of chapter 10: steps from autotune on, the baseline, the libraries.
EXTRA_STEPS = ("baseline", *STEP_NAMES[STEP_NAMES.index("autotune"):], "best", CONTROL)
LADDER_STEPS = tuple(name for name, _ in HOPPER_LADDER)
EXTRA_WORKLOADS = (
    # Non-causal: the Hopper ladder too (chapters 6-8 measure each rung both ways).
    dict(causal=False, dtype="float16", head_dim=128, gqa=None,
         seqlens=(1024, 2048, 4096, 8192, 16384), steps=(*EXTRA_STEPS, *LADDER_STEPS)),
    # The forward-performance targets for these are at N=8K (one command holds all four).
    dict(causal=True, dtype="bfloat16", head_dim=128, gqa=None, seqlens=(8192,)),
    dict(causal=True, dtype="float16", head_dim=128, gqa=(32, 8), seqlens=(8192,)),
    dict(causal=True, dtype="float16", head_dim=64, gqa=None, seqlens=(8192,)),
    dict(causal=True, dtype="float16", head_dim=256, gqa=None, seqlens=(8192,)),
)

# --quick: a tiny shape, a few implementations; file names say "-quick".
QUICK = dict(seqlens=(256,), batch=1, heads=2, reps=5)
QUICK_STEPS = ("baseline", "best", CONTROL)
QUICK_BASELINES = ("cudnn", "flash")


# The backward (issue 11): B=4, H=32, D=128, N 1K..16K, causal and not, one dtype per part.
# FlexAttention's compile per shape (forward and backward) does not fit the parts' 10 minutes:
# `bench --backward` has it.
BWD_SEQLENS = (1024, 2048, 4096, 8192, 16384)
BWD_BASELINES = ("flash", "cudnn", "efficient")
BWD_ROUNDS = 20
BWD_QUICK = dict(seqlens=(256,), batch=1, heads=2, rounds=3, inner=2, baselines=("cudnn",))


def default_out(quick: bool = False) -> Path:
    """Where ``record`` writes without ``--out``: the dataset folder ``results/<gpu>``; with
    ``quick``, a new temporary folder (a quick run tests the tools: it never lands in the
    repository's results/, where it would look like data)."""
    if quick:
        import tempfile
        return Path(tempfile.mkdtemp(prefix="flashattn-record-quick-"))
    from ..data.results import results_root
    return results_root() / gpu_slug()


def _extra_name(w: dict, heads: int) -> str:
    hq, hkv = w["gqa"] or (heads, heads)
    return workload_name(w["dtype"], w["causal"], w["head_dim"], hq, hkv)


def record_bench(out: Path, *, quick: bool = False, command: str | None = None) -> list[Path]:
    """The default workload (fp16, causal, D=128, B=4, H=32): every step and library."""
    if quick:
        kw = dict(QUICK, steps=list(QUICK_STEPS), baselines=list(QUICK_BASELINES))
        name = workload_name() + "-quick"
    else:
        kw, name = dict(steps=list(MAIN_STEPS)), workload_name()
    doc = run_bench(causal=True, dtype="float16", command=command, name=name, **kw)
    return [write_json(out / "bench" / f"{name}.json", doc)]


def record_bench_extra(out: Path, *, quick: bool = False, workloads: list[str] | None = None,
                       command: str | None = None) -> list[Path]:
    """fp16-full-d128, bf16-causal-d128, fp16-causal-d128-gqa32x8, fp16-causal-d64,
    fp16-causal-d256."""
    written = []
    heads = QUICK["heads"] if quick else 32
    for w in EXTRA_WORKLOADS:
        full_name = _extra_name(w, 32)
        if workloads and full_name not in workloads:
            continue
        t0 = time.perf_counter()
        if quick:
            gqa = (heads, 1) if w["gqa"] else None
            wq = dict(w, gqa=gqa)
            name = _extra_name(wq, heads) + "-quick"
            doc = run_bench(["baseline"], QUICK["seqlens"], causal=w["causal"], dtype=w["dtype"],
                            gqa=gqa, head_dim=w["head_dim"], batch=QUICK["batch"], heads=heads,
                            baselines=["cudnn"], reps=QUICK["reps"], command=command, name=name)
        else:
            name = full_name
            # FlexAttention's torch.compile per shape costs more than the extras' budget;
            # the default workload has it.
            doc = run_bench(list(w.get("steps", EXTRA_STEPS)), list(w["seqlens"]), causal=w["causal"],
                            dtype=w["dtype"], gqa=w["gqa"], head_dim=w["head_dim"],
                            baselines=["flash", "cudnn", "efficient"], command=command,
                            name=name)
        written.append(write_json(out / "bench" / f"{name}.json", doc))
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return written


def record_bench_backward(out: Path, *, dtype: str = "float16", quick: bool = False,
                          command: str | None = None, rounds: int | None = None) -> list[Path]:
    """The backward alone and forward + backward, causal and not (``measure.bench_bwd``);
    ``rounds`` overrides ``BWD_ROUNDS``."""
    from .bench_bwd import run_bench_backward, workload_name_bwd
    written = []
    for causal in (True, False):
        t0 = time.perf_counter()
        if quick:
            kw = dict(BWD_QUICK, baselines=list(BWD_QUICK["baselines"]))
            name = workload_name_bwd(dtype, causal, 128, kw["heads"], kw["heads"]) + "-quick"
        else:
            kw = dict(seqlens=BWD_SEQLENS, baselines=list(BWD_BASELINES),
                      rounds=rounds or BWD_ROUNDS)
            name = workload_name_bwd(dtype, causal, 128, 32, 32)
        doc = run_bench_backward(causal=causal, dtype=dtype, command=command, name=name, **kw)
        written.append(write_json(out / "bench-backward" / f"{name}.json", doc))
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return written


def record_profile(out: Path, *, quick: bool = False, command: str | None = None) -> list[Path]:
    """Nsight Compute on one launch of each step (``measure.ncu`` does the work)."""
    from .ncu import record_profiles
    steps = (["baseline"] if quick else
             [*STEP_IMPLS, *LADDER_STEPS, "sdpa_cudnn", "sdpa_flash"])
    kw = dict(batch=QUICK["batch"], heads=QUICK["heads"]) if quick else {}
    res = record_profiles(out / "profiles", steps, N=512 if quick else PROFILE_N, causal=True,
                          **kw)
    if not quick:
        # Chapter 8: the remap at N=1K, where the last wave's tail is a large share of the time.
        record_profiles(out / "profiles" / "n1024", TAIL_STEPS, N=1024, causal=True)
    if isinstance(res, (list, tuple)):
        return [Path(p) for p in res]
    return [Path(res) if res else out / "profiles"]


def record_profile_backward(out: Path, *, quick: bool = False,
                            command: str | None = None) -> list[Path]:
    """Nsight Compute on one backward of ours (both variants) and of cuDNN and FA2, causal and
    non-causal, B=4 H=32 D=128 fp16 at N=4K (``profiles/backward``, ``profiles/backward-full``):
    the backward chapter's cards."""
    from .ncu import record_profiles
    from .target import BACKWARD_TARGETS
    kw = dict(batch=QUICK["batch"], heads=QUICK["heads"]) if quick else {}
    n = 512 if quick else PROFILE_N
    return [record_profiles(out / "profiles" / "backward", BACKWARD_TARGETS, N=n, causal=True,
                            **kw),
            record_profiles(out / "profiles" / "backward-full", BACKWARD_TARGETS, N=n,
                            causal=False, **kw)]


DECODE_PROFILE = dict(batch=8, heads=32, kv_heads=8, N=32768)   # the decoding chapter's shape


def record_profile_decode(out: Path, *, quick: bool = False,
                          command: str | None = None) -> list[Path]:
    """Nsight Compute on one decode step (one new token per sequence, B=8, GQA 32:8, D=128,
    cache 32K) of the split-KV decode (contiguous and paged), the square kernel and FA2
    (``profiles/decode``): the decoding chapter's occupancy and DRAM evidence; then the same at
    B=1 with 128K keys (``profiles/decode-b1``) and packed varlen against the padded square
    kernel, 32 sequences of 1K (``profiles/varlen``)."""
    from .ncu import record_profiles
    from .target import DECODE_TARGETS, VARLEN_TARGETS
    d = dict(DECODE_PROFILE, N=1024, batch=2) if quick else DECODE_PROFILE
    done = [record_profiles(out / "profiles" / "decode", DECODE_TARGETS, N=d["N"],
                            causal=True, batch=d["batch"], heads=d["heads"],
                            kv_heads=d["kv_heads"])]
    if quick:
        return done
    # One sequence, 128K keys: where split-KV reached only 70 % of the HBM peak (E16).
    done.append(record_profiles(out / "profiles" / "decode-b1", DECODE_TARGETS, N=131072,
                                causal=True, batch=1, heads=d["heads"], kv_heads=d["kv_heads"]))
    # Packed varlen against the padded square kernel, 32 sequences of 1K (E16: 0.76x).
    done.append(record_profiles(out / "profiles" / "varlen", VARLEN_TARGETS, N=1024,
                                causal=True, batch=32, heads=d["heads"],
                                kv_heads=d["kv_heads"]))
    return done


def record_flex(out: Path, *, passes=("fwd",), dtypes=("float16", "bfloat16"),
                quick: bool = False, rounds: int | None = None) -> list[Path]:
    """FlexAttention against torch.compile(flex_attention), one pass per part: the forward in
    fp16 and bf16 (``flex/flex_bench.json``); the backward one dtype per part, as each fills
    most of a 10-minute command (``flex/flex_bench_backward.json``, ``..._backward_bf16.json``)."""
    from . import bench_flex
    name = ("flex_bench" + ("_backward" if "bwd" in passes else "")
            + ("_bf16" if "bwd" in passes and tuple(dtypes) == ("bfloat16",) else "")
            + ("-quick" if quick else ""))
    args = ["--out", str(out / "flex"), "--name", name + ".json",
            "--budget-s", str(FLEX_BUDGET_S["bwd" if "bwd" in passes else "fwd"])]
    for p in passes:
        args += ["--pass", p]
    for d in dtypes:
        args += ["--dtype", d]
    if quick:
        args += ["--quick", "--n", "1024", "--rounds", "2"]
    elif rounds:
        args += ["--rounds", str(rounds)]
    if bench_flex.main(args):
        raise RuntimeError("bench_flex failed")
    return [out / "flex" / (name + ".json")]


def record_blasst(out: Path, *, quick: bool = False, rounds: int | None = None) -> list[Path]:
    """BLASST's time against its skipped fraction (``flex/blasst_bench.json``)."""
    from . import bench_flex
    name = "blasst_bench" + ("-quick" if quick else "") + ".json"
    args = ["--blasst", "--out", str(out / "flex"), "--name", name,
            "--budget-s", str(FLEX_BUDGET_S["blasst"])]
    if quick:
        args += ["--quick", "--n", "1024", "--rounds", "2"]
    elif rounds:
        args += ["--rounds", str(rounds)]
    if bench_flex.main(args):
        raise RuntimeError("bench_flex --blasst failed")
    return [out / "flex" / name]


def record_fp8(out: Path, *, quick: bool = False) -> list[Path]:
    """The FP8 forward against our fp16 kernel and cuDNN; the FP8-cache decode against the fp16
    cache (``fp8/fp8_bench.json``)."""
    from . import bench_fp8
    dest = out / "fp8" / ("fp8_bench-quick.json" if quick else "fp8_bench.json")
    args = ["--out", str(dest), "--budget-s", str(60.0 if quick else FP8_BUDGET_S)]
    if not quick:
        args += ["--d", "64", "--d", "128", "--d", "256"]
    if bench_fp8.main(args):
        raise RuntimeError("bench_fp8 failed")
    return [dest]


def record_profile_flex_fp8(out: Path, *, quick: bool = False,
                            command: str | None = None) -> list[Path]:
    """Nsight Compute on one launch each of our flex kernel (causal, a 1K window, softcap 50),
    torch.compile's flex on the 1K window, our dense causal kernel, and the FP8 forward
    (V transposed) beside it: B=4 H=32 D=128 at N=8K (``profiles/flex-fp8``)."""
    from .ncu import record_profiles
    from .target import FLEX_FP8_TARGETS
    kw = dict(batch=QUICK["batch"], heads=QUICK["heads"]) if quick else {}
    return [record_profiles(out / "profiles" / "flex-fp8", FLEX_FP8_TARGETS,
                            N=512 if quick else 8192, causal=True, **kw)]


def record_compile(out: Path, *, quick: bool = False, archs=COMPILE_ARCHS,
                   command: str | None = None) -> list[Path]:
    """``python -m flashattn compile --arch A --json`` for each arch (no GPU needed)."""
    from flashattn import aot
    written = []
    for arch in archs:
        t0 = time.perf_counter()
        dest = out / "compile" / f"{arch}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.aot{os.getpid()}")
        args = ["--arch", arch, "--json", "--out", str(tmp)]
        if quick:
            args += ["--step", "baseline"]
        else:   # every step and every chapter-10 experiment
            for name in STEP_IMPLS:
                args += ["--step", name]
        with contextlib.redirect_stdout(io.StringIO()):   # the JSON goes to the file only
            rc = aot.main(args)
        try:
            doc = json.loads(tmp.read_text())
        finally:
            tmp.unlink(missing_ok=True)
        env = metadata(command=f"python -m flashattn compile {' '.join(args[:3])} --out {dest}")
        env["record_command"] = command or command_line()
        doc["meta"] = {**env, **{k: v for k, v in doc.get("meta", {}).items() if k not in env}}
        written.append(write_json(dest, doc))
        errors = sum(1 for k in doc.get("kernels", []) if k.get("error"))
        print(f"  compile {arch}: {len(doc.get('kernels', []))} kernels, {errors} errors, "
              f"{time.perf_counter() - t0:.0f} s (aot rc={rc})", file=sys.stderr, flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashbook record",
                                description="Record benchmarks, Nsight Compute profiles and "
                                            "compile reports under results/<gpu>/.")
    p.add_argument("--out", help="output folder (default: results/<gpu>, the dataset; with "
                                 "--quick a new temporary folder, never the repository)")
    p.add_argument("--part", choices=[*PARTS, "all"], default="all",
                   help="what to record (default: all; each part fits a 10-minute command)")
    p.add_argument("--quick", action="store_true", help="a tiny workload, to test the tools")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds of the backward benchmarks (default {BWD_ROUNDS})")
    p.add_argument("--workload", action="append",
                   help="bench-extra: only this workload (repeatable), e.g. fp16-full-d128")
    a = p.parse_args(argv)
    parts = list(PARTS) if a.part == "all" else [a.part]
    command = command_line()
    valid = [_extra_name(w, 32) for w in EXTRA_WORKLOADS]
    for w in a.workload or []:
        if w not in valid:
            p.error(f"unknown workload {w!r}; bench-extra has {', '.join(valid)}")
    needs_gpu = [x for x in parts if x != "compile"]
    if needs_gpu:
        import torch
        if not torch.cuda.is_available():
            if a.part != "all":
                print(f"error: part {a.part} needs a CUDA GPU; only 'compile' runs without one",
                      file=sys.stderr)
                return 1
            print("no CUDA GPU: recording the compile part only", file=sys.stderr)
            parts = ["compile"]
    out = Path(a.out) if a.out else default_out(a.quick)
    if not a.out:
        print(f"no --out: writing to {out}" + (" (a temporary folder: --quick tests the tools; "
              "pass --out to keep it elsewhere)" if a.quick else " (the dataset)"),
              file=sys.stderr)
    failed = []
    t_all = time.perf_counter()
    for part in parts:
        t0 = time.perf_counter()
        print(f"== {part} -> {out}", file=sys.stderr, flush=True)
        try:
            if part == "bench":
                files = record_bench(out, quick=a.quick, command=command)
            elif part == "bench-extra":
                files = record_bench_extra(out, quick=a.quick, workloads=a.workload,
                                           command=command)
            elif part in ("bench-backward", "bench-backward-bf16"):
                files = record_bench_backward(
                    out, dtype="bfloat16" if part.endswith("bf16") else "float16",
                    quick=a.quick, command=command, rounds=a.rounds)
            elif part == "profile":
                files = record_profile(out, quick=a.quick, command=command)
            elif part == "profile-backward":
                files = record_profile_backward(out, quick=a.quick, command=command)
            elif part == "profile-decode":
                files = record_profile_decode(out, quick=a.quick, command=command)
            elif part == "flex":
                files = record_flex(out, quick=a.quick, rounds=a.rounds)
            elif part in ("flex-backward", "flex-backward-bf16"):
                files = record_flex(out, passes=("bwd",), quick=a.quick, rounds=a.rounds,
                                    dtypes=("bfloat16",) if part.endswith("bf16") else ("float16",))
            elif part == "blasst":
                files = record_blasst(out, quick=a.quick, rounds=a.rounds)
            elif part == "fp8":
                files = record_fp8(out, quick=a.quick)
            elif part == "profile-flex-fp8":
                files = record_profile_flex_fp8(out, quick=a.quick, command=command)
            else:
                files = record_compile(out, quick=a.quick, command=command)
            for f in files:
                print(f"  wrote {f}", file=sys.stderr)
        except Exception:
            traceback.print_exc()
            failed.append(part)
        print(f"== {part}: {time.perf_counter() - t0:.0f} s"
              + (" (FAILED)" if part in failed else ""), file=sys.stderr, flush=True)
    print(f"record took {time.perf_counter() - t_all:.0f} s", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
