"""Backward benchmarks (issue 11): the backward pass alone, and forward + backward.

    python -m flashbook bench --backward                            # fp16, causal, N 1K..16K
    python -m flashbook bench --backward --no-causal --dtype bfloat16 --seqlens 4096,16384
    python -m flashbook bench --backward --baselines cudnn,flash --passes bwd

From a notebook::

    doc = run_bench_backward([4096], causal=True)

**FLOPs convention** (FlashAttention-2's, and the seed's): the backward does five matrix products
(S = QK^T recomputed, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q) to the forward's two, so
it counts ``BWD_FLOP_FACTOR`` = 2.5 x the forward's FLOPs (``timing.attention_flops``: 4 B H N^2 D,
halved when causal); forward + backward counts 3.5 x. Recomputation is not counted as useful
work, as for every implementation here (they all recompute S).

What is timed, per implementation, with ``timing.time_rounds`` (the book's method: each sample a
batch of launches replayed from a CUDA graph on an idle GPU, implementations in a random order
every round, bootstrap 95 % intervals, three input sets in rotation):

    pass "bwd"       the backward alone. Ours (``fmha_bwd``): ``launch_bwd.attention_backward``
                     from the forward's out and LSE (the three kernels, Delta included).
                     Libraries: ``torch.autograd.grad`` of their output, the forward done once
                     outside the timing (their backward node and whatever autograd adds).
    pass "fwd_bwd"   a training step's attention: forward (ours: ``flashattn.attention`` through
                     the autograd operator, with the LSE) then ``torch.autograd.grad``.
    pass "fwd"       the forward alone, no grad: ours without the LSE (``fmha_fwd``, the inference
                     kernel) and with it (``fmha_fwd_lse``, what training runs), and the
                     libraries'. The ``fmha_fwd_lse`` row's ``ratio_no_lse`` (with its interval,
                     paired by round) is what writing the LSE costs: below 1 is slower.

Libraries: PyTorch SDPA's FLASH_ATTENTION (FlashAttention-2), CUDNN_ATTENTION and
EFFICIENT_ATTENTION backends, and FlexAttention (``torch.compile``'d, forward and backward).
Gradients are checked once, outside the timing, against the fp64 reference
(``reference.attention_backward``) on the first GQA group of batch 0: ``max_abs_err`` is the
largest error of dQ, dK and dV, ``grad_errs`` each.

The document is a bench document (``data.schema``) whose rows carry ``pass`` ("bwd", "fwd_bwd"
or "fwd"); ``ratio_cudnn`` and ``ratio_fa2`` (each with ``_lo``/``_hi``, a bootstrap 95 %
interval) compare with cuDNN's and FlashAttention-2's rows of the same pass and N, paired by
round: above 1 is faster.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time

from flashattn.contract import dtype_name, parse_gqa
from ..data.schema import add_derived, format_table, make_row, workload_name
from ..impls import LIBRARY_OPTIONS, OPT_IN_LIBRARIES
from flashattn.timing import attention_flops
from .harness import (INNER, INPUT_SETS, ROUNDS, SEED_STRIDE, check_once, error_text,
                      max_abs_err, method_meta, qkv_inputs, rotating, rounds_per_sample,
                      time_in_rounds, timed_values)
from .workload import (DEFAULT_BATCH, DEFAULT_HEAD_DIM, DEFAULT_HEADS, DEFAULT_SEQLENS,
                       add_output_args, add_workload_args, baseline_list, check_baselines,
                       check_gqa, check_seqlens, emit, require_gpu)
from .workload import csv as _csv

BWD_FLOP_FACTOR = 2.5           # backward FLOPs per forward FLOP (five matmuls to two)
PASSES = ("bwd", "fwd_bwd", "fwd")
PASS_FACTOR = {"bwd": BWD_FLOP_FACTOR, "fwd_bwd": 1.0 + BWD_FLOP_FACTOR, "fwd": 1.0}
OURS = "fmha_bwd"               # our rows: the deterministic backward kernels (kernels/fmha_bwd.py)
OURS_ATOMIC = "fmha_bwd_atomic"  # pass bwd: the opt-in variant, dQ by atomic adds (one pass)
OURS_FWD = "fmha_fwd"           # pass fwd: our inference forward (no LSE) ...
OURS_FWD_LSE = "fmha_fwd_lse"   # ... and the same step writing the LSE (WRITE_LSE), paired
BWD_BASELINES = ("flash", "cudnn", "efficient", "flex", "tilegym")  # libraries with a backward
BWD_DEFAULT = tuple(b for b in BWD_BASELINES if b not in OPT_IN_LIBRARIES)
REF_BYTES = 16 << 30            # fp64 reference backward: (heads, N, N) temporaries within this

__all__ = ["run_bench_backward", "backward_flops", "build_parser", "parse_args", "main",
           "format_backward_table", "PASSES", "BWD_FLOP_FACTOR", "BWD_BASELINES", "OURS",
           "OURS_ATOMIC"]


def backward_flops(B: int, Hq: int, N: int, D: int, causal: bool, pass_: str = "bwd") -> float:
    """Useful FLOPs of a pass: ``PASS_FACTOR[pass_]`` x the forward's (see the module docstring)."""
    if pass_ not in PASS_FACTOR:
        raise ValueError(f"pass must be one of {', '.join(PASSES)}, got {pass_!r}")
    return PASS_FACTOR[pass_] * attention_flops(B, Hq, N, N, D, causal)


def workload_name_bwd(dtype: str, causal: bool, head_dim: int, Hq: int, Hkv: int) -> str:
    """"fp16-causal-d128-bwd": the forward's workload name with "-bwd"."""
    return workload_name(dtype, causal, head_dim, Hq, Hkv) + "-bwd"


def ref_group(Hq: int, Hkv: int, N: int) -> tuple[int, int]:
    """(query heads, key/value heads) of batch 0 the fp64 reference checks: one GQA group (or
    one head for MHA), fewer query heads if its (heads, N, N) fp64 temporaries (about five)
    would pass ``REF_BYTES``."""
    group = Hq // Hkv
    fit = max(1, REF_BYTES // max(1, 5 * 8 * N * N))
    return min(group, fit), 1


def _ref_grads(q, k, v, dout, hq: int, *, causal: bool, scale: float):
    from flashattn.reference import attention_backward
    return attention_backward(*(t[:1, :n].double() for t, n in ((q, hq), (k, 1), (v, 1),
                                                                 (dout, hq))),
                              causal=causal, scale=scale)


def _grad_errs(grads, ref, hq: int, partial_group: bool) -> dict:
    """Max |error| of each gradient on the checked slice; dK/dV only when the slice holds the
    whole GQA group (their sums run over every query head of it)."""
    out = {}
    names = ("dq",) if partial_group else ("dq", "dk", "dv")
    for name, g, r in zip(("dq", "dk", "dv"), grads, ref):
        if name not in names:
            continue
        n = hq if name == "dq" else 1
        out[name] = max_abs_err(g[:1, :n], r)
    return out


def _inputs(B, Hq, Hkv, N, D, dtype, device, seed):
    """q, k, v and dout of length N (``harness.qkv_inputs``)."""
    return qkv_inputs(B, Hq, Hkv, N, N, D, dtype, device, seed, dout=True)


def _capture_stream():
    """The stream ``torch.cuda.graph`` captures on: a forward run there has its backward
    launched there too (autograd replays a node's backward on its forward's stream), so the
    libraries' backward alone can be captured."""
    import torch
    if getattr(torch.cuda.graph, "default_capture_stream", None) is None:
        torch.cuda.graph.default_capture_stream = torch.cuda.Stream()
    return torch.cuda.graph.default_capture_stream


def forward_thunks(impl: str, sets, *, causal: bool, scale: float, fwd_step: str):
    """(one differentiable forward per input set, the context to run them in). Ours:
    ``flashattn.attention`` (the autograd operator, forward with the LSE); a library: its call
    from ``bench.library_fn`` (block mask and backend chosen once, outside the timing)."""
    if impl == OURS:
        from flashbook import attention
        return [(lambda s=s: attention(s[0], s[1], s[2], causal=causal, scale=scale,
                                       step=fwd_step)) for s in sets], contextlib.nullcontext
    from .libraries import library_fn
    fns = [library_fn(impl, s[0], s[1], s[2], causal=causal, scale=scale) for s in sets]
    return [f for f, _ in fns], fns[0][1]


def _ours_backward_fns(sets, outs, *, causal, scale, deterministic=True):
    """The backward alone, ours: attention_backward from (out, lse), into fixed gradients
    (``deterministic=False``: the atomics variant)."""
    import torch

    from flashattn.launch_bwd import attention_backward
    fns = []
    for (q, k, v, dout), (out, lse) in zip(sets, outs):
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        fns.append(lambda q=q, k=k, v=v, dout=dout, out=out, lse=lse, grads=grads:
                   attention_backward(q, k, v, out, dout, lse, causal=causal, scale=scale,
                                      grads=grads, deterministic=deterministic))
    return fns


def _out_errs(res, ref_out, hq: int) -> dict:
    """Max |error| of the forward's output (``res`` or ``res[0]``) on the checked slice."""
    out = res[0] if isinstance(res, (tuple, list)) else res
    return dict(out=max_abs_err(out[:1, :hq], ref_out))


def _check_once(fn, ref, hq, partial, ref_out=None) -> dict:
    """Warm up (compile), check the gradients (or with ``ref_out``, the output) once, estimate
    one call's time (ms)."""
    chk = check_once(fn, lambda res: dict(grad_errs=_out_errs(res, ref_out, hq)
                                          if ref_out is not None else
                                          _grad_errs(res, ref, hq, partial)))
    errs = chk["grad_errs"]
    return dict(chk, max_abs_err=max(errs.values()) if errs else None)


_err = error_text


def run_bench_backward(seqlens=None, *, causal: bool = True, dtype: str = "float16", gqa=None,
                       head_dim: int = DEFAULT_HEAD_DIM, batch: int = DEFAULT_BATCH,
                       heads: int = DEFAULT_HEADS, baselines=None, passes=PASSES,
                       fwd_step: str = "best", rounds: int = ROUNDS, inner: int = INNER,
                       input_sets: int = INPUT_SETS, progress: bool = True,
                       command: str | None = None, name: str | None = None) -> dict:
    """Time the backward (and forward + backward) of ours and the libraries; a bench document.

    Args:
        seqlens: sequence lengths (Nq = Nk); default 1K .. 16K.
        causal, dtype, gqa, head_dim, batch, heads: the workload (default the seed's: B=4,
            H=32, D=128, fp16, causal).
        baselines: names of ``BWD_BASELINES`` (flash, cudnn, efficient, flex, tilegym);
            default all but tilegym (``BWD_DEFAULT``); [] or "none" for none.
        passes: a subset of ``PASSES``.
        fwd_step: the forward step of our fwd_bwd rows (``"best"``: autotune's choice).
        rounds, inner, input_sets: ``timing.time_rounds``'s.

    Returns:
        {"meta": ..., "rows": [...]}: one row per (implementation, pass, N), with ``pass``,
        ``grad_errs`` and the usual timing fields; failures are rows with ``error``.

    Raises:
        ValueError: unknown baseline or pass, bad lengths; RuntimeError without a CUDA GPU.
    """
    import torch

    from flashattn.env import metadata
    seqlens = [int(n) for n in (DEFAULT_SEQLENS if seqlens is None else seqlens)]
    if not seqlens or min(seqlens) < 1:
        raise ValueError(f"seqlens must be positive lengths, got {seqlens}")
    baselines = baseline_list(baselines, BWD_BASELINES, BWD_DEFAULT, "backward baseline")
    passes = [passes] if isinstance(passes, str) else list(passes)
    if not passes or any(p not in PASSES for p in passes):
        raise ValueError(f"passes must be a non-empty subset of {', '.join(PASSES)}, got "
                         f"{passes}")
    dtype = dtype_name(dtype)
    Hq, Hkv = parse_gqa(gqa) or (heads, heads)
    B, D = int(batch), int(head_dim)
    causal = bool(causal)
    if not torch.cuda.is_available():
        raise RuntimeError("run_bench_backward needs a CUDA GPU (torch.cuda.is_available() is "
                           "False)")
    dev = torch.device("cuda", torch.cuda.current_device())
    tdt = getattr(torch, dtype)
    scale = 1.0 / math.sqrt(D)
    meta = metadata(command)
    meta["workload"] = dict(name=name or workload_name_bwd(dtype, causal, D, Hq, Hkv), B=B,
                            Hq=Hq, Hkv=Hkv, D=D, dtype=dtype, causal=causal, seqlens=seqlens,
                            passes=passes, fwd_step=fwd_step)
    meta["flops"] = (f"forward 4*B*H*N^2*D (halved when causal); backward {BWD_FLOP_FACTOR} x "
                     f"that, forward + backward {1 + BWD_FLOP_FACTOR} x")
    meta["method"] = method_meta(rounds=rounds, inner=inner, input_sets=input_sets,
                                 what="GPU time per call started on an idle GPU, batches replayed "
                                      "from CUDA graphs (method 'batch': eager, capture refused)")
    shape = dict(B=B, Hq=Hq, Hkv=Hkv, D=D, dtype=dtype, causal=causal)
    libs = [LIBRARY_OPTIONS[b] for b in baselines]
    ours_of = {"fwd": [OURS_FWD, OURS_FWD_LSE], "bwd": [OURS, OURS_ATOMIC], "fwd_bwd": [OURS]}
    impls_of = {p: ours_of[p] + libs for p in passes}
    rows: list[dict] = []
    t_all = time.perf_counter()
    for N in seqlens:
        t0 = time.perf_counter()
        sets = [_inputs(B, Hq, Hkv, N, D, tdt, dev, seed=N + SEED_STRIDE * i)
                for i in range(input_sets)]
        sets = [tuple(t.requires_grad_(i < 3) for i, t in enumerate(s)) for s in sets]
        hq, _ = ref_group(Hq, Hkv, N)
        partial = hq < Hq // Hkv
        q0, k0, v0, do0 = sets[0]
        ref = _ref_grads(q0.detach(), k0.detach(), v0.detach(), do0, hq, causal=causal,
                         scale=scale)
        ref_out = _ref_out(q0.detach(), k0.detach(), v0.detach(), hq, causal=causal,
                           scale=scale) if "fwd" in passes else None
        flops = {p: backward_flops(B, Hq, N, D, causal, p) for p in passes}
        entries = {}          # (impl, pass) -> (fns, context, check, config)
        for p in passes:
            for impl in impls_of[p]:
                try:
                    fns, ctx, config = _make_fns(impl, p, sets, causal=causal, scale=scale,
                                                 fwd_step=fwd_step)
                    with ctx():
                        chk = _check_once(fns[0], ref, hq, partial,
                                          ref_out if p == "fwd" else None)
                    entries[(impl, p)] = (fns, ctx, chk, config)
                except Exception as e:    # a failing implementation is a row, not a crash
                    rows.append(make_row(impl, _kind(impl), N=N, error=_err(e), **shape,
                                         **{"pass": p}))
        timed, fail = time_in_rounds(
            {f"{i}|{p}": rotating(e[0], e[1]) for (i, p), e in entries.items()},
            rounds=rounds, inner=rounds_per_sample({f"{i}|{p}": e[2]["est_ms"]
                                                    for (i, p), e in entries.items()}, inner),
            seed=N)
        for (impl, p), (_, _, chk, config) in entries.items():
            kind = _kind(impl)
            key = f"{impl}|{p}"
            if key not in timed:
                rows.append(make_row(impl, kind, N=N, error=fail or "not timed", **shape,
                                     **{"pass": p}))
                continue
            vals = timed_values(timed[key], chk, flops=flops[p],
                                errors=("max_abs_err", "grad_errs"))
            rows.append(make_row(impl, kind, N=N, config=config, **vals, **shape,
                                 **{"pass": p}))
        if progress:
            for r in rows:
                if r["Nq"] == N:
                    msg = r["error"] or (f"{r['tflops']:7.1f} TFLOPS {r['median_ms']:9.3f} ms "
                                         f"err {r['max_abs_err']}")
                    print(f"{r['impl']:<15} {r['pass']:<8} N={N:<6} {msg}", file=sys.stderr,
                          flush=True)
            print(f"N={N}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        del sets, ref, entries
        torch.cuda.empty_cache()
    for p in passes:
        add_derived([r for r in rows if r["pass"] == p])
    _add_ratio_fa2(rows)
    _add_lse_cost(rows)
    meta["elapsed_s"] = round(time.perf_counter() - t_all, 1)
    return dict(meta=meta, rows=rows)


def _kind(impl: str) -> str:
    return "step" if impl in (OURS, OURS_ATOMIC, OURS_FWD, OURS_FWD_LSE) else "library"


def _ref_out(q, k, v, hq: int, *, causal: bool, scale: float):
    from flashattn.reference import attention
    return attention(q[:1, :hq].double(), k[:1, :1].double(), v[:1, :1].double(),
                     causal=causal, scale=scale)


def _add_ratio_fa2(rows: list[dict]) -> None:
    """``ratio_fa2`` (and ``_lo``, ``_hi``): speed over FlashAttention-2's (SDPA's flash
    backend) in the same pass and N, paired by round (issue 11's second target)."""
    from flashattn.stats import ratio_ci
    fa2 = {(r["pass"], r["Nq"]): r for r in rows
           if r["impl"] == LIBRARY_OPTIONS["flash"] and not r.get("error")}
    for r in rows:
        ref = fa2.get((r["pass"], r["Nq"]))
        r["ratio_fa2"] = r["ratio_fa2_lo"] = r["ratio_fa2_hi"] = None
        if ref is not None and not r.get("error") and r.get("samples_ms") \
                and ref.get("samples_ms"):
            r["ratio_fa2"], r["ratio_fa2_lo"], r["ratio_fa2_hi"] = ratio_ci(ref["samples_ms"],
                                                                           r["samples_ms"])


def _add_lse_cost(rows: list[dict]) -> None:
    """``ratio_no_lse`` (and ``_lo``, ``_hi``) on each fmha_fwd_lse row: its speed over the
    inference forward's at the same N, paired by round (below 1: the LSE costs time)."""
    from flashattn.stats import ratio_ci
    plain = {r["Nq"]: r for r in rows if r["impl"] == OURS_FWD and not r.get("error")}
    for r in rows:
        p = plain.get(r["Nq"])
        if r["impl"] != OURS_FWD_LSE or r.get("error") or p is None:
            continue
        if r.get("samples_ms") and p.get("samples_ms"):
            r["ratio_no_lse"], r["ratio_no_lse_lo"], r["ratio_no_lse_hi"] = ratio_ci(
                p["samples_ms"], r["samples_ms"])


def _fwd_fns(impl, sets, *, causal, scale, fwd_step):
    """Pass fwd: (fns, context, config) of the forward alone, no grad."""
    import torch
    det = [tuple(t.detach() for t in s) for s in sets]
    if impl in (OURS_FWD, OURS_FWD_LSE):
        from flashattn.autograd import attention_forward
        fwds, ctx = forward_thunks(OURS, det, causal=causal, scale=scale, fwd_step=fwd_step)
        if impl == OURS_FWD_LSE:
            fwds = [(lambda s=s: attention_forward(s[0], s[1], s[2], causal=causal, scale=scale,
                                                   step=fwd_step)) for s in det]
        from flashattn.autotune import resolve
        st, c = resolve(fwd_step, det[0][0], det[0][1], causal)
        return fwds, ctx, f"{st.name} {c.label()}"
    fwds, ctx = forward_thunks(impl, det, causal=causal, scale=scale, fwd_step=fwd_step)

    def no_grad(f):
        with torch.no_grad():
            return f()
    return [(lambda f=f: no_grad(f)) for f in fwds], ctx, ""


def _make_fns(impl, pass_, sets, *, causal, scale, fwd_step):
    """(fns per input set, context, config label) of one implementation and pass."""
    import torch
    if pass_ == "fwd":
        return _fwd_fns(impl, sets, causal=causal, scale=scale, fwd_step=fwd_step)
    # The atomics variant's forward is ours (only its backward differs).
    fwds, ctx = forward_thunks(OURS if impl == OURS_ATOMIC else impl, sets, causal=causal,
                               scale=scale, fwd_step=fwd_step)
    config = (_ours_config(sets[0], causal=causal, fwd_step=fwd_step, pass_=pass_,
                           atomic=impl == OURS_ATOMIC)
              if impl in (OURS, OURS_ATOMIC) else "")
    if pass_ == "fwd_bwd":
        return [(lambda f=f, s=s: torch.autograd.grad(f(), s[:3], s[3]))
                for f, s in zip(fwds, sets)], ctx, config
    if impl in (OURS, OURS_ATOMIC):
        from flashattn.autograd import attention_forward
        outs = []
        for q, k, v, _ in sets:
            with torch.no_grad():
                outs.append(attention_forward(q, k, v, causal=causal, scale=scale,
                                              step=fwd_step))
        return _ours_backward_fns([tuple(t.detach() for t in s) for s in sets], outs,
                                  causal=causal, scale=scale,
                                  deterministic=impl == OURS), ctx, config
    # The libraries' forward runs once, on the stream the graph capture uses.
    outs = []
    on_gpu = sets[0][0].device.type == "cuda"
    with ctx(), (torch.cuda.stream(_capture_stream()) if on_gpu else contextlib.nullcontext()):
        for f in fwds:
            outs.append(f())
    if on_gpu:
        torch.cuda.current_stream().wait_stream(_capture_stream())
    return [(lambda o=o, s=s: torch.autograd.grad(o, s[:3], s[3], retain_graph=True))
            for o, s in zip(outs, sets)], ctx, config


def _ours_config(s, *, causal, fwd_step, pass_, atomic=False) -> str:
    """"dkdv 64x128 nww=8, dq 128x64 nww=8" (and the forward's step and tiles for fwd_bwd;
    "dkdv+dq atomic 64x128 nww=8" for the atomics variant)."""
    from flashattn.kernels import bwd_configs
    from flashattn.dispatch import device_arch
    q, k = s[0], s[1]
    cfg = bwd_configs(device_arch(q.device), q.shape[-1])
    if atomic:
        return f"dkdv+dq atomic {cfg['bwd_dkdv'].label()}"
    label = f"dkdv {cfg['bwd_dkdv'].label()}, dq {cfg['bwd_dq'].label()}"
    if pass_ == "fwd_bwd":
        from flashattn.autotune import resolve
        st, c = resolve(fwd_step, q.detach(), k.detach(), causal)
        label = f"fwd {st.name} {c.label()}; bwd {label}"
    return label


# --- files and command line -------------------------------------------------------------------
def format_backward_table(doc: dict) -> str:
    """One TFLOPS table per pass (``data.schema.format_table``), and the LSE's cost."""
    parts = []
    for p in PASSES:
        rows = [r for r in doc["rows"] if r.get("pass") == p]
        if rows:
            parts.append(f"pass {p} ({PASS_FACTOR[p]} x forward FLOPs)\n" +
                         format_table(dict(meta=doc.get("meta", {}), rows=rows)))
    cost = [r for r in doc["rows"] if r.get("ratio_no_lse") is not None]
    if cost:
        parts.append("writing the LSE: speed with / without, paired by round\n" + "\n".join(
            f"  N={r['Nq']}: {r['ratio_no_lse']:.3f} [{r['ratio_no_lse_lo']:.3f}, "
            f"{r['ratio_no_lse_hi']:.3f}]" for r in cost))
    return "\n\n".join(parts)


def build_parser():
    """The options of ``bench --backward``: bench's workload options, and the passes."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashbook bench --backward",
                                description="Time the backward pass and forward + backward, "
                                            "ours against the libraries' (backward = 2.5 x "
                                            "the forward's FLOPs, forward + backward 3.5 x).")
    p.add_argument("--backward", action="store_true", required=True,
                   help="the backward benchmarks (this parser)")
    add_workload_args(p, baselines=BWD_BASELINES, default_baselines=BWD_DEFAULT)
    p.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of time_rounds")
    p.add_argument("--inner", type=int, default=INNER, help="calls per sample, at most")
    add_output_args(p)
    p.add_argument("--passes", default=",".join(PASSES),
                   help="comma-separated of %s (default: all)" % ",".join(PASSES))
    p.add_argument("--fwd-step", default="best",
                   help="our forward's step in the fwd_bwd pass (default: best)")
    return p


def parse_args(argv: list[str] | None = None) -> dict:
    """``bench --backward ...`` as run_bench_backward keyword arguments (SystemExit on error).

    The workload options are ``bench``'s (--seqlens, --causal, --dtype, --gqa, --head-dim,
    --batch, --heads, --baselines, --rounds, --inner, --json, --out, --quiet); bench's --steps,
    --method, --reps and --naive-max-n do not apply.
    """
    p = build_parser()
    argv = list(argv or [])
    for opt in ("--steps", "--method", "--reps", "--naive-max-n"):
        if any(x == opt or x.startswith(opt + "=") for x in argv):
            p.error(f"{opt} does not apply to --backward")
    a = p.parse_args(argv)
    seqlens = check_seqlens(p, a.seqlens)
    baselines = check_baselines(p, a.baselines, BWD_BASELINES, what="backward baseline")
    passes = _csv(a.passes)
    if not passes or any(x not in PASSES for x in passes):
        p.error(f"--passes takes a comma-separated subset of {', '.join(PASSES)}, got "
                f"{a.passes!r}")
    if a.fwd_step != "best":
        from flashbook.steps import get_step
        try:
            if get_step(a.fwd_step).kernel != "fmha":
                p.error(f"--fwd-step {a.fwd_step!r} does not write the LSE; use a fused step")
        except ValueError as e:
            p.error(str(e))
    gqa = check_gqa(p, a.gqa)
    if a.rounds < 1 or a.inner < 1:
        p.error("--rounds and --inner must be positive")
    return dict(seqlens=seqlens, causal=a.causal, dtype=a.dtype, gqa=gqa, head_dim=a.head_dim,
                batch=a.batch, heads=a.heads, baselines=baselines, passes=passes,
                fwd_step=a.fwd_step, rounds=a.rounds, inner=a.inner, progress=not a.quiet,
                _json=a.json, _out=a.out)


def main(argv: list[str] | None = None) -> int:
    kw = parse_args(argv)
    as_json, out = kw.pop("_json"), kw.pop("_out")
    if not require_gpu("python -m flashbook bench --backward"):
        return 1
    emit(run_bench_backward(**kw), out=out, as_json=as_json, table=format_backward_table)
    return 0

