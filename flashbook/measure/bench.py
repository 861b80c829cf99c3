"""Benchmarks: every step of the book and the library baselines, on one workload (chapter 3).

    python -m flashbook bench                                  # the seed's workload, all steps
    python -m flashbook bench --steps baseline,pair --seqlens 4096 --baselines cudnn
    python -m flashbook bench --no-causal --json --out full.json
    python -m flashbook bench --steps arch_tuned,arch_tuned#2,arch_tuned@128x128:occ=1:nww=8
                                                # a control copy and a pinned variant
    python -m flashbook bench --backward        # the backward pass (measure.bench_bwd)

From a notebook::

    doc = run_bench(["baseline", "pair"], [4096], causal=True)
    df = to_frame(doc)

For each sequence length: fresh random inputs; each implementation resolved once (tile shape,
hints; for ``autotune`` this runs its search), compiled and checked against an fp32 reference
outside the timing, then timed in alternation with the others (``measure.timing``). The document's format is written down in ``results/README.md``.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time

from flashattn.contract import dtype_name, parse_gqa
from ..data.schema import (SKIPPED, add_derived, dumps, format_table, make_row, to_frame,
                           workload_name, write_json)
from ..impls import LIBRARY_OPTIONS, OPT_IN_LIBRARIES, STEP_IMPLS
from flashbook.steps import Config, get_step, resolve_name, with_config
from .libraries import _FLEX, _causal_mod, _flex_fn, library_fn  # noqa: F401 (bench's names)
from flashattn.timing import attention_flops
from .harness import (INNER, INPUT_SETS, ROUNDS, SEED_STRIDE, check_once, error_text,
                      max_abs_err, method_meta, qkv_inputs, rel_rms_err, rotating,
                      time_in_rounds, timed_values)
from .workload import (DEFAULT_BATCH, DEFAULT_HEAD_DIM, DEFAULT_HEADS, DEFAULT_SEQLENS,
                       SAMPLE_MS, add_output_args, add_workload_args, baseline_list,
                       check_baselines, check_gqa, check_names, check_seqlens, emit,
                       require_gpu)
from .workload import csv as _csv

DEFAULT_STEPS = (*STEP_IMPLS, "best")
# flash, cudnn, efficient, math, flex; tilegym when named
DEFAULT_BASELINES = tuple(o for o in LIBRARY_OPTIONS if o not in OPT_IN_LIBRARIES)

SKIP_NAIVE = f"{SKIPPED}: N > naive-max-n"
SKIP_MATH = f"{SKIPPED}: N x N scores do not fit in a third of free memory"
MEASURE_BUDGET_S = 3.0   # slow implementations (~0.3 s a call) get fewer timed calls, at least 5
MIN_REPS = 5
METHODS = ("rounds", "interleaved")
REF_SCORE_BYTES = 6 << 30   # the fp32 reference runs on as many heads as fit in this

__all__ = ["run_bench", "to_frame", "format_table", "workload_name", "write_json", "dumps",
           "add_derived", "parse_gqa", "DEFAULT_STEPS", "DEFAULT_BASELINES", "DEFAULT_SEQLENS"]


# ---------------------------------------------------------------------------------------------
# Measuring (GPU)
# ---------------------------------------------------------------------------------------------
class _Progress:
    """One line per measurement on stderr; a tqdm bar when tqdm is installed."""

    def __init__(self, total: int, enabled: bool):
        self.enabled, self.total, self.i, self.bar = enabled, total, 0, None
        if enabled:
            try:
                from tqdm.auto import tqdm
                self.bar = tqdm(total=total, file=sys.stderr, unit="run", leave=False)
            except ImportError:
                self.bar = None

    def start(self, what: str) -> None:
        if self.enabled and self.bar is not None:
            self.bar.set_description(what)

    def done(self, row: dict) -> None:
        self.i += 1
        if not self.enabled:
            return
        r = row
        if r.get("error"):
            msg = f"{r['impl']:<15} N={r['Nq']:<6} {str(r['error'])[:100]}"
        else:
            ci = (f", 95% CI {r['ci_lo_ms']:.3f}-{r['ci_hi_ms']:.3f}"
                  if r.get("ci_lo_ms") is not None else "")
            msg = (f"{r['impl']:<15} N={r['Nq']:<6} {r['tflops']:7.1f} TFLOPS  "
                   f"{r['median_ms']:9.3f} ms  (spread {r['spread']:.1%}{ci}, {r['reps']} reps"
                   f"{', err %.1e' % r['max_abs_err'] if r.get('max_abs_err') is not None else ''})")
        line = f"[{self.i}/{self.total}] {msg}"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
            self.bar.update(1)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def batch_sizes(est_ms: dict, inner: int) -> dict:
    """Launches per sample for each implementation of one shape (method rounds).

    Every implementation within 4 × ``SAMPLE_MS`` at the common size gets the same batch: the
    fastest one's (a batch of about ``SAMPLE_MS``, at most ``inner`` launches). Time per launch
    depends a little on the batch length after an idle GPU (the first launch starts at full
    clock), and two rows of one kernel with batches of 4 and 5 read 0.3 % apart (LOG E12).
    Slower implementations get a batch of about ``SAMPLE_MS`` of their own (>= 1 launch). A
    control copy ("X#2") always gets its twin's batch.
    """
    if not est_ms:
        return {}
    common = max(1, min(inner, round(SAMPLE_MS / max(min(est_ms.values()), 1e-6))))
    per = {n: (common if e * common <= 4 * SAMPLE_MS
               else max(1, min(inner, round(SAMPLE_MS / max(e, 1e-6)))))
           for n, e in est_ms.items()}
    return {n: per.get(n.split("#")[0], v) for n, v in per.items()}


def check_impl_name(name: str) -> None:
    """ValueError unless ``name`` is a step, an experiment, "best", a variant
    ("STEP@128x128 occ=1 nww=8": the step pinned to one configuration) or a control copy
    ("STEP#2": the same implementation timed again as another row, chapter 3)."""
    base = name.split("#", 1)[0]
    step, _, cfg = base.partition("@")
    if step != "best" or cfg:
        get_step(step)
    if cfg:
        Config.parse(cfg)
    if "#" in name and not name.split("#", 1)[1].isdigit():
        raise ValueError(f"a control copy is NAME#N with a number N, got {name!r}")


def step_of(name: str, arch: str | None):
    """(Step, pinned Config or None) of a step, "best", variant or control name."""
    base = name.split("#", 1)[0]
    step, _, cfg = base.partition("@")
    if cfg:
        config = Config.parse(cfg)
        return with_config(get_step(step), config), config
    return resolve_name(step, arch), None


def resolve_impl(name: str, q, k, causal: bool):
    """(Step, Config) that ``name`` runs with on these inputs (``autotune.resolve`` for plain names)."""
    from flashattn.autotune import resolve
    from flashattn.dispatch import device_arch
    step, pinned = step_of(name, device_arch(q.device))
    if pinned is not None:
        return step, pinned
    return resolve(name.split("#", 1)[0], q, k, causal)


_err = error_text


def _inputs(B, Hq, Hkv, N, D, dtype, device, seed):
    """Fresh standard-normal q, k, v of length N (``harness.qkv_inputs``)."""
    return qkv_inputs(B, Hq, Hkv, N, N, D, dtype, device, seed)


def ref_heads(Hq: int, Hkv: int, N: int) -> int:
    """How many query heads (of batch 0) the fp64 reference checks: whole GQA groups, and
    as many as fit REF_SCORE_BYTES of fp64 scores (always at least one group)."""
    group = Hq // Hkv
    fit = max(1, REF_SCORE_BYTES // max(1, 8 * N * N * group))
    return min(Hq, group * fit)


def reference_output(q, k, v, *, causal: bool, scale: float):
    """fp64 attention of the checked slice (``flashattn.reference.attention``)."""
    from flashattn.reference import attention as ref_attention
    return ref_attention(*(t.double() for t in (q, k, v)), causal=causal, scale=scale)


def _check(fn, ref, hr: int, reps: int) -> dict:
    """Compile/warm up, check once against the fp64 ``ref``, estimate one call's time.

    Returns {"max_abs_err", "rel_rms_err", "est_ms", "reps"}: the largest absolute error, the
    RMS error over the RMS of the reference (``harness.rel_rms_err``), and how many timed calls
    fit MEASURE_BUDGET_S (method "interleaved").
    """
    chk = check_once(fn, lambda o: dict(max_abs_err=max_abs_err(o[:1, :hr], ref),
                                        rel_rms_err=rel_rms_err(o[:1, :hr], ref)))
    chk["reps"] = max(MIN_REPS, min(reps, int(MEASURE_BUDGET_S * 1e3 / chk["est_ms"])))
    return chk


def _warm_job(job) -> str:
    """Compile one (step, config) in a worker process; cuTile's disk cache serves the parent."""
    name, cfg, causal, N, B, Hq, Hkv, D, dtype = job
    import time

    import torch

    from flashattn.launch import launch
    from flashattn.config import Config
    t0 = time.perf_counter()
    try:
        tdt = getattr(torch, dtype)
        q = torch.randn(B, Hq, N, D, device="cuda", dtype=tdt)
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=tdt)
        launch(q, k, k, torch.empty_like(q), get_step(name), Config(*cfg), causal=causal,
                   scale=D ** -0.5)
        torch.cuda.synchronize()
        return f"compiled {name} {Config(*cfg).label()} in {time.perf_counter() - t0:.1f} s"
    except Exception as e:  # the timed run reports it properly
        return f"compile {name} {Config(*cfg).label()} failed: {type(e).__name__}: {e}"[:300]


def prewarm(steps, *, causal, N, B, Hq, Hkv, D, dtype, procs: int) -> None:
    """Compile every kernel variant the run needs in ``procs`` processes at once.

    tileiras takes seconds per variant and a bench run needs a few dozen: compiling them in
    parallel first (the GPU host has many cores) turns minutes of serial compiling into
    seconds. Timings are unaffected: the timed process still warms up before it measures.
    """
    import multiprocessing as mp

    from flashattn.dispatch import device_arch
    import torch
    arch = device_arch(torch.device("cuda"))
    jobs = set()
    for s in steps:
        step, pinned = step_of(s, arch)
        for c in ([pinned] if pinned else step.configs(arch)):
            jobs.add((step.name, c.as_tuple(), causal, N, B, Hq, Hkv, D, dtype))
    with mp.get_context("spawn").Pool(procs) as pool:
        for line in pool.imap_unordered(_warm_job, sorted(jobs, key=str)):
            print(line, file=sys.stderr, flush=True)


def run_bench(steps=None, seqlens=None, *, causal: bool = True, dtype: str = "float16",
              gqa=None, head_dim: int = DEFAULT_HEAD_DIM, batch: int = DEFAULT_BATCH,
              heads: int = DEFAULT_HEADS, baselines=None, reps: int = 20,
              progress: bool = True, naive_max_n: int = 4096, command: str | None = None,
              name: str | None = None, prewarm_procs: int = 0, method: str = "rounds",
              rounds: int = ROUNDS, inner: int = INNER,
              input_sets: int = INPUT_SETS) -> dict:
    """Time steps and library baselines on one workload; return the bench document.

    Args:
        steps: names from ``flashbook.STEP_NAMES`` and/or "best"; default all of them + "best".
        seqlens: sequence lengths (Nq = Nk); default 1024 .. 16384.
        causal, dtype ("float16" | "bfloat16"), head_dim, batch: the workload.
        gqa: (Hq, Hkv) or "Hq:Hkv" for grouped-query attention; default Hq = Hkv = ``heads``.
        baselines: names from ``LIBRARIES`` (flash, cudnn, efficient, math, flex, tilegym);
            default all but tilegym (``DEFAULT_BASELINES``); [] or "none" for none.
        reps: timed calls per measurement (fewer for calls over MEASURE_BUDGET_S / reps).
        naive_max_n: the naive step (N x N scores in memory) only runs up to this N.
        name: workload name; default ``workload_name(...)``.
        method: "rounds" (default; ``timing.time_rounds``: ``rounds`` rounds in random order,
            ``inner`` launches per sample replayed from a CUDA graph, ``input_sets`` input sets
            in rotation, bootstrap intervals, plus the caller's wait per call) or
            "interleaved" (the first version's events around each launch; ``reps``).

    Returns:
        {"meta": env.metadata() + {"workload": {...}}, "rows": [...]}, see results/README.md.
        A failing implementation gives a row with ``error`` set; nothing is raised for it.
    """
    import torch

    from flashattn.env import metadata
    from flashattn.launch import launch
    from flashattn.timing import host_time, time_interleaved
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    steps = list(DEFAULT_STEPS if steps is None else steps)
    for s in steps:
        check_impl_name(s)
    seqlens = [int(n) for n in (DEFAULT_SEQLENS if seqlens is None else seqlens)]
    baselines = baseline_list(baselines, LIBRARY_OPTIONS, DEFAULT_BASELINES)
    dtype = dtype_name(dtype)
    Hq, Hkv = parse_gqa(gqa) or (heads, heads)
    B, D = batch, head_dim
    causal = bool(causal)
    if not torch.cuda.is_available():
        raise RuntimeError("run_bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    dev = torch.device("cuda", torch.cuda.current_device())
    tdt = getattr(torch, dtype)
    scale = 1.0 / math.sqrt(D)
    meta = metadata(command)
    meta["workload"] = dict(name=name or workload_name(dtype, causal, D, Hq, Hkv), B=B, Hq=Hq,
                            Hkv=Hkv, D=D, dtype=dtype, causal=causal, seqlens=seqlens)
    shape = dict(B=B, Hq=Hq, Hkv=Hkv, D=D, dtype=dtype, causal=causal)
    prewarm_procs = prewarm_procs or int(os.environ.get("FLASHATTN_PREWARM", "0"))
    if prewarm_procs:
        prewarm(steps, causal=causal, N=min(seqlens), B=B, Hq=Hq, Hkv=Hkv, D=D, dtype=dtype,
                procs=prewarm_procs)
    meta["method"] = method_meta(
        name=method, rounds=rounds, inner=inner, input_sets=input_sets,
        what=("GPU time per launch started on an idle GPU, batches replayed from CUDA graphs"
              if method == "rounds" else "events around each launch"))
    rows: list[dict] = []
    prog = _Progress(len(seqlens) * (len(steps) + len(baselines)), progress)
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        for N in seqlens:
            sets = [_inputs(B, Hq, Hkv, N, D, tdt, dev, seed=N + SEED_STRIDE * i)
                    for i in range(input_sets if method == "rounds" else 1)]
            q, k, v = sets[0]
            hr = ref_heads(Hq, Hkv, N)
            ref = reference_output(q[:1, :hr], k[:1, :hr // (Hq // Hkv)],
                                   v[:1, :hr // (Hq // Hkv)], causal=causal, scale=scale)
            flops = attention_flops(B, Hq, N, N, D, causal)
            outs = [torch.empty_like(q) for _ in sets]
            # Phase 1: compile, check and estimate each implementation once.
            entries = {}   # impl -> (kind, config label, fns per input set, context, check, call)
            for s in steps:
                prog.start(f"{s} N={N}")
                if s.split("#")[0] == "naive" and N > naive_max_n:
                    rows.append(make_row(s, "step", N=N, error=SKIP_NAIVE, **shape))
                    prog.done(rows[-1])
                    continue
                try:
                    step_obj, cfg = resolve_impl(s, q, k, causal)   # autotune searches here, once
                    label = cfg.label() if s != "best" else f"{step_obj.name}: {cfg.label()}"
                    fns = [(lambda so=step_obj, c=cfg, t=t, o=o:
                            launch(t[0], t[1], t[2], o, so, c, causal=causal, scale=scale))
                           for t, o in zip(sets, outs)]
                    outs[0].fill_(float("nan"))   # rows a step forgets to write fail the check
                    call = fns[0]
                    if "@" not in s:   # the caller's view: the public API, validation included
                        from flashbook import attention
                        call = (lambda name=s.split("#")[0]: attention(
                            q, k, v, causal=causal, scale=scale, step=name))
                    entries[s] = ("step", label, fns, contextlib.nullcontext,
                                  _check(fns[0], ref, hr, reps), call)
                except Exception as e:   # a step that fails here is a row, not a crash
                    rows.append(make_row(s, "step", N=N, error=_err(e), **shape))
                    prog.done(rows[-1])
            for b in baselines:
                impl = LIBRARY_OPTIONS[b]
                prog.start(f"{impl} N={N}")
                if b == "math":
                    free = torch.cuda.mem_get_info(dev)[0]
                    if B * Hq * N * N * (4 + 2) > free / 3:
                        rows.append(make_row(impl, "library", N=N, error=SKIP_MATH, **shape))
                        prog.done(rows[-1])
                        continue
                try:
                    fns = [library_fn(impl, *t, causal=causal, scale=scale)[0] for t in sets]
                    ctx = library_fn(impl, q, k, v, causal=causal, scale=scale)[1]
                    with ctx():
                        entries[impl] = ("library", "", fns, ctx,
                                         _check(fns[0], ref, hr, reps), fns[0])
                except Exception as e:
                    rows.append(make_row(impl, "library", N=N, error=_err(e), **shape))
                    prog.done(rows[-1])

            # Phase 2: time them all in alternation, so drift of a shared GPU hits all alike.
            if method == "rounds":
                per = batch_sizes({n: e[4]["est_ms"] for n, e in entries.items()}, inner)
                timed, fail = time_in_rounds({n: rotating(e[2], e[3])
                                              for n, e in entries.items()},
                                             rounds=rounds, inner=per, seed=N)
            else:
                try:
                    timed, fail = time_interleaved({n: rotating(e[2][:1], e[3])
                                                    for n, e in entries.items()},
                                                   {n: e[4]["reps"]
                                                    for n, e in entries.items()}), ""
                except Exception as e:
                    timed, fail = {}, _err(e)
            for n, (kind, label, _, ctx, chk, call) in entries.items():
                if n not in timed:
                    rows.append(make_row(n, kind, N=N, error=fail, **shape))
                else:
                    vals = timed_values(timed[n], chk, flops=flops,
                                        errors=("max_abs_err", "rel_rms_err"))
                    if method == "rounds":
                        try:
                            with ctx():
                                vals["host_ms"] = host_time(call)
                        except Exception as e:   # the timing stands; say why this is missing
                            print(f"host time of {n} failed: {_err(e)}", file=sys.stderr)
                    rows.append(make_row(n, kind, N=N, config=label, **vals, **shape))
                prog.done(rows[-1])
            del q, k, v, sets, outs, ref, entries
            torch.cuda.empty_cache()
    finally:
        torch.set_grad_enabled(grad)
        prog.close()
    add_derived(rows)
    return dict(meta=meta, rows=rows)


# ---------------------------------------------------------------------------------------------
# Files and command line
# ---------------------------------------------------------------------------------------------
def build_parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashbook bench",
                                description="Time the steps of the book and library baselines "
                                            "(CUDA events, L2 flushed, median of many runs).")
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                   help="comma-separated steps (and 'best'), or 'none'; default: all + best")
    add_workload_args(p, baselines=tuple(LIBRARY_OPTIONS), default_baselines=DEFAULT_BASELINES)
    p.add_argument("--method", choices=METHODS, default="rounds",
                   help="rounds: CUDA-graph batches in random order, with 95%% intervals "
                        "(default); interleaved: events around each launch (first version)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="rounds (method rounds)")
    p.add_argument("--inner", type=int, default=INNER, help="launches per sample (method rounds)")
    p.add_argument("--reps", type=int, default=20,
                   help="timed calls per measurement (method interleaved)")
    p.add_argument("--naive-max-n", type=int, default=4096,
                   help="skip the naive step above this N (default %(default)s)")
    add_output_args(p)
    p.add_argument("--backward", action="store_true",
                   help="time the backward pass and forward + backward instead (ours vs the "
                        "libraries' backward; backward = 2.5 x forward FLOPs; see "
                        "flashbook.measure.bench_bwd; adds --passes and --fwd-step)")
    return p


def parse_args(argv: list[str] | None = None) -> dict:
    """The command line as run_bench keyword arguments (validated; raises SystemExit on error)."""
    p = build_parser()
    a = p.parse_args(argv)
    if a.backward:
        p.error("--backward is handled by flashbook.measure.bench_bwd.parse_args")
    steps = check_names(p, [] if a.steps.strip() == "none" else _csv(a.steps), check_impl_name)
    seqlens = check_seqlens(p, a.seqlens)
    baselines = check_baselines(p, a.baselines, LIBRARY_OPTIONS)
    gqa = check_gqa(p, a.gqa)
    return dict(steps=steps, seqlens=seqlens, causal=a.causal, dtype=a.dtype, gqa=gqa,
                head_dim=a.head_dim, batch=a.batch, heads=a.heads, baselines=baselines,
                reps=a.reps, naive_max_n=a.naive_max_n, progress=not a.quiet,
                method=a.method, rounds=a.rounds, inner=a.inner,
                _json=a.json, _out=a.out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--backward" in argv:
        from .bench_bwd import main as main_bwd
        return main_bwd(argv)
    kw = parse_args(argv)
    as_json, out = kw.pop("_json"), kw.pop("_out")
    t0 = time.perf_counter()
    if not require_gpu("python -m flashbook bench", "python -m flashattn info says what it has"):
        return 1
    doc = run_bench(**kw)
    emit(doc, out=out, as_json=as_json, table=format_table)
    print(f"bench took {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
