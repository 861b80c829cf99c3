"""The benchmarks' shared harness: inputs, the agreement check, error measures, the library map,
the method's constants and the timing loop that ``bench`` (forward), ``bench_bwd`` (backward)
and ``bench_decode`` (decode, varlen) all run. Their command-line options are in ``workload``.

A benchmark of one shape, in five lines (what each bench module does; a new one, say an FP8 or
a flex-mask bench, does the same)::

    from .harness import (check_once, error_text, max_abs_err, method_meta, qkv_inputs,
                          rounds_per_sample, time_in_rounds)
    sets = [qkv_inputs(B, Hq, Hkv, N, N, D, dtype, dev, seed=N + SEED_STRIDE * i)
            for i in range(3)]                      # input sets, rotated between calls
    checks = {name: check_once(fn, lambda o: {"max_abs_err": max_abs_err(o, ref)}, ctx)
              for name, (fn, ctx) in ...}           # compile, compare once, estimate one call
    timed, fail = time_in_rounds({name: rotating(fns, ctx)}, rounds=ROUNDS,
                                 inner=rounds_per_sample(checks, INNER), seed=N)
    meta["method"] = method_meta(rounds=ROUNDS, inner=INNER, input_sets=3, what="...")
    rows = [make_row(name, kind, N=N, **timed_values(timed[name], checks[name], flops=f),
                     **shape) if name in timed else make_row(name, kind, N=N, error=fail, **shape)
            for name in checks]

A failing implementation becomes a row whose ``error`` is ``error_text(e)``: a benchmark never
stops for one implementation. The rows themselves are ``data.schema.make_row`` (forward and
backward documents) or ``make_decode_row`` (decode documents); ``results/README.md`` describes
both.
"""
from __future__ import annotations

import contextlib
import itertools
import math

from flashattn.timing import IDLE_MS
from ..impls import IMPLS, LIBRARY_IMPLS
from .workload import SAMPLE_MS

# The method (chapter 3): samples of about SAMPLE_MS after IDLE_MS of idle GPU, ROUNDS rounds
# in random order, at most INNER launches per sample, INPUT_SETS input sets in rotation.
ROUNDS = 30
INNER = 10
INPUT_SETS = 3
SEED_STRIDE = 7919          # input set i of length N is seeded N + SEED_STRIDE * i
ERROR_CHARS = 300           # an error row keeps the first line of the message, this long

# The library baselines by row name -> torch backend (an SDPBackend member, or "flex"): the
# registry's (``flashbook.impls``), so a library is added in one place.
LIBRARIES: dict[str, str] = {n: IMPLS[n].backend for n in LIBRARY_IMPLS}

__all__ = ["IDLE_MS", "SAMPLE_MS", "ROUNDS", "INNER", "INPUT_SETS", "SEED_STRIDE", "LIBRARIES",
           "error_text", "finite", "random_inputs", "qkv_inputs", "max_abs_err", "rel_rms_err",
           "check_once", "rotating", "rounds_per_sample", "time_in_rounds", "timed_values",
           "method_meta"]


def error_text(e: BaseException) -> str:
    """"ValueError: first line of the message", at most ERROR_CHARS: an error row's text."""
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:ERROR_CHARS]


def finite(x: float) -> float:
    """``x``, or NaN when it is infinite (the documents write NaN as null)."""
    return x if math.isfinite(x) else float("nan")


def random_inputs(shapes, dtype, device, seed: int) -> tuple:
    """Standard-normal tensors of ``shapes``, in order, from one generator seeded ``seed``
    (never zeros: exp of equal scores hides masking bugs)."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(tuple(s), generator=g, device=device, dtype=dtype) for s in shapes)


def qkv_inputs(B, Hq, Hkv, Nq, Nk, D, dtype, device, seed: int, *, dout: bool = False):
    """(q, k, v) of (B, H, N, D), and ``dout`` like q when asked (the backward's)."""
    shapes = [(B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D)]
    return random_inputs(shapes + ([(B, Hq, Nq, D)] if dout else []), dtype, device, seed)


def max_abs_err(out, ref) -> float:
    """The largest |out - ref| in fp64 (NaN if not finite)."""
    return finite((out.double() - ref.double()).abs().max().item())


def rel_rms_err(out, ref) -> float:
    """RMS of the error over RMS of the reference: it discriminates where the max error is set
    by the output's rounding."""
    d = out.double() - ref.double()
    return finite((d.square().mean().sqrt() / ref.double().square().mean().sqrt()).item())


def check_once(fn, errors, ctx=contextlib.nullcontext) -> dict:
    """Compile and warm up ``fn``, check its output once, estimate one call's GPU time.

    ``errors(output) -> dict`` measures the output against a reference; the result is that
    dict with ``est_ms`` (one call, CUDA events, at least 1 us) added.
    """
    import torch
    with ctx():
        fn()                                # JIT compile, module load, autotune caches
        torch.cuda.synchronize()
        out = dict(errors(fn()))
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
    out["est_ms"] = max(s.elapsed_time(e), 1e-3)
    return out


def rotating(fns, ctx=contextlib.nullcontext):
    """One call that runs the next of ``fns`` (one per input set) inside ``ctx()``: consecutive
    calls read other inputs, so none finds its K/V in L2."""
    it = itertools.cycle(fns)

    def call():
        with ctx():
            return next(it)()
    return call


def estimate_ms(fns: dict) -> dict:
    """A rough wall time per call of each function (ms): one warm-up call (compilation), then
    one call timed with ``perf_counter`` between two synchronisations. For sizing batches, not
    for reporting."""
    import time

    import torch
    est = {}
    for name, fn in fns.items():
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        est[name] = (time.perf_counter() - t0) * 1e3
    return est


def rounds_per_sample(est_ms: dict, inner: int, max_inner: int | None = None) -> dict:
    """Launches per sample of each implementation: about SAMPLE_MS of its estimated time, at
    least 1, at most ``inner`` (and ``max_inner``)."""
    cap = inner if max_inner is None else min(inner, max_inner)
    return {n: max(1, min(cap, round(SAMPLE_MS / max(e, 1e-6)))) for n, e in est_ms.items()}


def time_in_rounds(calls: dict, *, rounds: int, inner, seed: int) -> tuple[dict, str]:
    """``timing.time_rounds`` of ``calls`` ({name: call}): ({name: Timing}, "") or, when the
    timing itself fails, ({}, its error text). No calls, no timing."""
    from flashattn import timing
    if not calls:
        return {}, ""
    try:
        return timing.time_rounds(calls, rounds=rounds, inner=inner, seed=seed), ""
    except Exception as e:
        return {}, error_text(e)


def timed_values(timing, check: dict, *, flops: float | None = None,
                 errors=("max_abs_err",)) -> dict:
    """A measured row's values (the row writer's part every bench shares): the Timing's fields,
    the ``errors`` of its check, and ``tflops`` when the row's useful ``flops`` are given. The
    bench passes them to ``schema.make_row`` or ``make_decode_row`` with its own fields."""
    vals = dict(timing.as_dict(), **{k: check[k] for k in errors if k in check})
    if flops is not None:
        from flashattn.timing import tflops
        vals["tflops"] = tflops(flops, vals["median_ms"])
    return vals


def method_meta(*, rounds: int, inner: int, what: str, input_sets: int | None = None,
                name: str = "rounds") -> dict:
    """The document's ``meta["method"]``: the timing method and its constants."""
    m = dict(name=name, rounds=rounds, inner=inner)
    if input_sets is not None:
        m["input_sets"] = input_sets
    m.update(order="random per round", ci="bootstrap 95 % of the median", sample_ms=SAMPLE_MS,
             idle_ms=IDLE_MS, what=what)
    return m
