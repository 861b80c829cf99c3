"""Benchmarks: every step of the book and the library baselines, on one workload (chapter 3).

    python -m flashattn bench                                  # the seed's workload, all steps
    python -m flashattn bench --steps baseline,pair --seqlens 4096 --baselines cudnn
    python -m flashattn bench --no-causal --json --out full.json

From a notebook::

    doc = run_bench(["baseline", "pair"], [4096], causal=True)
    df = to_frame(doc)

For each sequence length: fresh random inputs; each implementation resolved once (tile shape,
hints; for ``autotune`` this runs its search), compiled and checked against an fp32 reference
outside the timing, then timed with :func:`flashattn.timing.time_cuda` (CUDA events, L2 flushed,
median and quartiles). The document's format is written down in ``results/README.md``.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path

from .steps import EXPERIMENTS, STEP_NAMES, get_step
from .timing import attention_flops, tflops

# The seed's workload: B=4, H=32, D=128, fp16, causal.
DEFAULT_SEQLENS = (1024, 2048, 4096, 8192, 16384)
DEFAULT_BATCH, DEFAULT_HEADS, DEFAULT_HEAD_DIM = 4, 32, 128
DEFAULT_STEPS = (*STEP_NAMES, *EXPERIMENTS, "best")

# --baselines name -> (row impl, torch.nn.attention.SDPBackend member or None for FlexAttention)
LIBRARIES = {
    "flash": ("sdpa_flash", "FLASH_ATTENTION"),          # FlashAttention-2 inside PyTorch
    "cudnn": ("sdpa_cudnn", "CUDNN_ATTENTION"),
    "efficient": ("sdpa_efficient", "EFFICIENT_ATTENTION"),
    "math": ("sdpa_math", "MATH"),                       # materialises the N x N scores
    "flex": ("flex", None),                              # FlexAttention, torch.compile'd
}
DEFAULT_BASELINES = tuple(LIBRARIES)
LIBRARY_IMPLS = tuple(impl for impl, _ in LIBRARIES.values())
# Rows in book order: the steps, the fastest step, the libraries.
IMPL_ORDER = (*STEP_NAMES, *EXPERIMENTS, "best", *LIBRARY_IMPLS)
RATIO_REF = "sdpa_cudnn"

DTYPE_SHORT = {"float16": "fp16", "bfloat16": "bf16"}
ROW_FIELDS = ("impl", "kind", "config", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal",
              "median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "reps", "spread", "tflops",
              "speedup_prev", "ratio_cudnn", "max_abs_err", "error")
TIMING_FIELDS = ("median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "reps", "spread")

SKIP_NAIVE = "skipped: N > naive-max-n"
SKIP_MATH = "skipped: N x N scores do not fit in a third of free memory"
MEASURE_BUDGET_S = 3.0   # slow implementations (~0.3 s a call) get fewer timed calls, at least 5
MIN_REPS = 5
REF_SCORE_BYTES = 6 << 30   # the fp32 reference runs on as many heads as fit in this


# ---------------------------------------------------------------------------------------------
# Workloads and rows
# ---------------------------------------------------------------------------------------------
def workload_name(dtype: str = "float16", causal: bool = True, head_dim: int = 128,
                  Hq: int = 32, Hkv: int | None = None) -> str:
    """"fp16-causal-d128", "bf16-full-d64", "fp16-causal-d128-gqa32x8"."""
    dtype = str(dtype).replace("torch.", "")
    name = f"{DTYPE_SHORT.get(dtype, dtype)}-{'causal' if causal else 'full'}-d{head_dim}"
    if Hkv is not None and Hkv != Hq:
        name += f"-gqa{Hq}x{Hkv}"
    return name


def parse_gqa(gqa) -> tuple[int, int] | None:
    """"32:8" or (32, 8) -> (32, 8); None -> None."""
    if gqa is None or gqa == "":
        return None
    if isinstance(gqa, str):
        parts = gqa.replace("x", ":").split(":")
        if len(parts) != 2:
            raise ValueError(f"--gqa takes HQ:HKV such as 32:8, got {gqa!r}")
        gqa = tuple(parts)
    hq, hkv = (int(x) for x in gqa)
    if hq < 1 or hkv < 1 or hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a positive multiple of key/value heads "
                         f"({hkv})")
    return hq, hkv


def _row(impl: str, kind: str, *, B, Hq, Hkv, N, D, dtype, causal, config="", error=None,
         **values) -> dict:
    row = dict.fromkeys(ROW_FIELDS)
    row.update(impl=impl, kind=kind, config=config, B=B, Hq=Hq, Hkv=Hkv, Nq=N, Nk=N, D=D,
               dtype=dtype, causal=bool(causal), error=error)
    row.update(values)
    return row


def _ok(row: dict | None) -> bool:
    return bool(row) and not row.get("error") and row.get("tflops") not in (None, 0)


def add_derived(rows: list[dict]) -> list[dict]:
    """Fill ``speedup_prev`` and ``ratio_cudnn`` in place (and return ``rows``).

    speedup_prev: a step's TFLOPS over those of the step before it in ``STEP_NAMES`` at the
    same shape (None for the first step, for ``best`` and libraries, or when either is missing
    or failed). ratio_cudnn: TFLOPS over those of ``sdpa_cudnn`` at the same shape.
    """
    def key(r):
        return (r["B"], r["Hq"], r["Hkv"], r["Nq"], r["Nk"], r["D"], r["dtype"], r["causal"])
    by = {(r["impl"], key(r)): r for r in rows}
    for r in rows:
        r["speedup_prev"] = r["ratio_cudnn"] = None
        if not _ok(r):
            continue
        if r["impl"] in STEP_NAMES:
            i = STEP_NAMES.index(r["impl"])
            prev = by.get((STEP_NAMES[i - 1], key(r))) if i > 0 else None
            if _ok(prev):
                r["speedup_prev"] = r["tflops"] / prev["tflops"]
        ref = by.get((RATIO_REF, key(r)))
        if _ok(ref):
            r["ratio_cudnn"] = r["tflops"] / ref["tflops"]
    return rows


def to_frame(doc: dict):
    """The rows of a bench document as a DataFrame, with a ``workload`` column."""
    import pandas as pd
    rows = doc.get("rows", []) if isinstance(doc, dict) else list(doc)
    df = pd.DataFrame(rows, columns=list(ROW_FIELDS) if not rows else None)
    for c in ROW_FIELDS:
        if c not in df.columns:
            df[c] = None
    wl = (doc.get("meta", {}).get("workload", {}) or {}).get("name") if isinstance(doc, dict) \
        else None
    df.insert(0, "workload", wl)
    for c in ("median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "spread", "tflops",
              "speedup_prev", "ratio_cudnn", "max_abs_err"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def format_table(doc: dict) -> str:
    """Rows = implementations (book order), columns = N, cells = TFLOPS ('err', 'skip')."""
    rows = doc["rows"]
    ns = sorted({r["Nq"] for r in rows})
    impls = sorted({r["impl"] for r in rows},
                   key=lambda i: (IMPL_ORDER.index(i) if i in IMPL_ORDER else len(IMPL_ORDER), i))
    cell = {}
    for r in rows:
        if r.get("error"):
            cell[r["impl"], r["Nq"]] = "skip" if str(r["error"]).startswith("skipped") else "err"
        else:
            cell[r["impl"], r["Nq"]] = f"{r['tflops']:.1f}"
    head = ["TFLOPS"] + [f"N={n}" for n in ns] + ["config"]
    configs = {}
    for r in rows:
        configs.setdefault(r["impl"], r.get("config") or "")
    body = [[i] + [cell.get((i, n), "") for n in ns] + [configs[i]] for i in impls]
    w = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = lambda row: "  ".join(str(x).rjust(w[j]) if 0 < j <= len(ns) else str(x).ljust(w[j])  # noqa: E731
                                for j, x in enumerate(row)).rstrip()
    errors = [f"  {r['impl']} N={r['Nq']}: {r['error']}" for r in rows
              if r.get("error") and not str(r["error"]).startswith("skipped")]
    wl = doc.get("meta", {}).get("workload", {})
    title = (f"{wl.get('name', '')}: B={wl.get('B')} Hq={wl.get('Hq')} Hkv={wl.get('Hkv')} "
             f"D={wl.get('D')} {wl.get('dtype')} {'causal' if wl.get('causal') else 'full'}")
    out = [title, fmt(head)] + [fmt(b) for b in body]
    if errors:
        out += ["errors:"] + errors
    return "\n".join(out)


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
            msg = (f"{r['impl']:<15} N={r['Nq']:<6} {r['tflops']:7.1f} TFLOPS  "
                   f"{r['median_ms']:9.3f} ms  (spread {r['spread']:.1%}, {r['reps']} reps"
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


def _err(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0] if lines else ''}"[:300]


def _inputs(B, Hq, Hkv, N, D, dtype, device, seed):
    """Fresh standard-normal q, k, v (never zeros: exp of equal scores hides masking bugs)."""
    import torch
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn((B, Hq, N, D), generator=g, device=device, dtype=dtype)
    k = torch.randn((B, Hkv, N, D), generator=g, device=device, dtype=dtype)
    v = torch.randn((B, Hkv, N, D), generator=g, device=device, dtype=dtype)
    return q, k, v


def ref_heads(Hq: int, Hkv: int, N: int) -> int:
    """How many query heads (of batch 0) the fp32 reference checks: whole GQA groups, and
    as many as fit REF_SCORE_BYTES of fp32 scores (always at least one group)."""
    group = Hq // Hkv
    fit = max(1, REF_SCORE_BYTES // max(1, 4 * N * N * group))
    return min(Hq, group * fit)


def reference_output(q, k, v, *, causal: bool, scale: float):
    """fp32 attention of the checked slice: flashattn.reference if present, else torch math."""
    import torch
    q, k, v = (t.float() for t in (q, k, v))
    try:
        from .reference import attention as ref_attention
    except ImportError:
        ref_attention = None
    if ref_attention is not None:
        return ref_attention(q, k, v, causal=causal, scale=scale).float()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                scale=scale)


_FLEX = {}


def _flex_fn():
    """flex_attention compiled once per process (torch.compile caches per shape)."""
    if "fn" not in _FLEX:
        import torch
        from torch.nn.attention.flex_attention import flex_attention
        # One compiled graph per shape and dtype: a record run sees a dozen, more than
        # dynamo's default limit of 8 (past it, flex_attention would run eagerly).
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
        if hasattr(torch._dynamo.config, "accumulated_cache_size_limit"):
            torch._dynamo.config.accumulated_cache_size_limit = max(
                512, torch._dynamo.config.accumulated_cache_size_limit)
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["fn"]


def _causal_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _library_fn(impl: str, backend: str | None, q, k, v, *, causal: bool, scale: float):
    """(fn, context): ``fn()`` returns the library's output and runs inside ``context()``.

    The backend is chosen by a context entered around the whole measurement, not inside the
    timed call, so its Python overhead stays out of the numbers. Raises if unsupported.
    """
    import contextlib

    import torch
    gqa = q.shape[1] != k.shape[1]
    if backend is None:   # FlexAttention
        from torch.nn.attention.flex_attention import create_block_mask
        flex = _flex_fn()
        N, Nk = q.shape[2], k.shape[2]
        bm = create_block_mask(_causal_mod, None, None, N, Nk, device=q.device) if causal else None
        return (lambda: flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=gqa),
                contextlib.nullcontext)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = getattr(SDPBackend, backend)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kw = dict(is_causal=causal, scale=scale, enable_gqa=True) if gqa else \
        dict(is_causal=causal, scale=scale)
    return (lambda: sdpa(q, k, v, **kw)), (lambda: sdpa_kernel(be))


def _check(fn, ref, hr: int, reps: int) -> dict:
    """Compile/warm up, check once against ``ref``, estimate one call's time.

    Returns {"max_abs_err", "reps"}: how many timed calls fit MEASURE_BUDGET_S.
    """
    import torch
    fn()                                   # JIT compile, module load, autotune caches
    torch.cuda.synchronize()
    o = fn()                               # the checked output
    torch.cuda.synchronize()
    err = (o[:1, :hr].float() - ref).abs().max().item()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    est_ms = max(s.elapsed_time(e), 1e-3)
    n = max(MIN_REPS, min(reps, int(MEASURE_BUDGET_S * 1e3 / est_ms)))
    return dict(max_abs_err=err if math.isfinite(err) else float("nan"), reps=n)


def _warm_job(job) -> str:
    """Compile one (step, config) in a worker process; cuTile's disk cache serves the parent."""
    name, cfg, causal, N, B, Hq, Hkv, D, dtype = job
    import time

    import torch

    from . import api
    from .steps import Config
    t0 = time.perf_counter()
    try:
        tdt = getattr(torch, dtype)
        q = torch.randn(B, Hq, N, D, device="cuda", dtype=tdt)
        k = torch.randn(B, Hkv, N, D, device="cuda", dtype=tdt)
        api.launch(q, k, k, torch.empty_like(q), get_step(name), Config(*cfg), causal=causal,
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

    from .api import arch_of
    from .autotune import best_step_name, search_space
    import torch
    arch = arch_of(torch.device("cuda"))
    jobs = set()
    for s in steps:
        step = get_step(best_step_name(arch) if s == "best" else s)
        cfgs = search_space(arch, step) if step.tuned else [step.config_for(arch)]
        for c in cfgs:
            jobs.add((step.name, (c.TILE_M, c.TILE_N, c.occupancy, c.num_ctas), causal, N, B,
                      Hq, Hkv, D, dtype))
    with mp.get_context("spawn").Pool(procs) as pool:
        for line in pool.imap_unordered(_warm_job, sorted(jobs, key=str)):
            print(line, file=sys.stderr, flush=True)


def run_bench(steps=None, seqlens=None, *, causal: bool = True, dtype: str = "float16",
              gqa=None, head_dim: int = DEFAULT_HEAD_DIM, batch: int = DEFAULT_BATCH,
              heads: int = DEFAULT_HEADS, baselines=None, reps: int = 20,
              progress: bool = True, naive_max_n: int = 4096, command: str | None = None,
              name: str | None = None, prewarm_procs: int = 0) -> dict:
    """Time steps and library baselines on one workload; return the bench document.

    Args:
        steps: names from ``flashattn.STEP_NAMES`` and/or "best"; default all of them + "best".
        seqlens: sequence lengths (Nq = Nk); default 1024 .. 16384.
        causal, dtype ("float16" | "bfloat16"), head_dim, batch: the workload.
        gqa: (Hq, Hkv) or "Hq:Hkv" for grouped-query attention; default Hq = Hkv = ``heads``.
        baselines: names from ``LIBRARIES`` (flash, cudnn, efficient, math, flex); default all;
            [] or "none" for none.
        reps: timed calls per measurement (fewer for calls over MEASURE_BUDGET_S / reps).
        naive_max_n: the naive step (N x N scores in memory) only runs up to this N.
        name: workload name; default ``workload_name(...)``.

    Returns:
        {"meta": env.metadata() + {"workload": {...}}, "rows": [...]}, see results/README.md.
        A failing implementation gives a row with ``error`` set; nothing is raised for it.
    """
    import torch

    from . import api
    from .env import metadata
    from .timing import time_interleaved
    steps = list(DEFAULT_STEPS if steps is None else steps)
    for s in steps:
        if s != "best":
            get_step(s)
    seqlens = [int(n) for n in (DEFAULT_SEQLENS if seqlens is None else seqlens)]
    if baselines is None:
        baselines = list(DEFAULT_BASELINES)
    elif isinstance(baselines, str):
        baselines = [] if baselines in ("", "none") else baselines.split(",")
    for b in baselines:
        if b not in LIBRARIES:
            raise ValueError(f"unknown baseline {b!r}; choose from {', '.join(LIBRARIES)}")
    dtype = str(dtype).replace("torch.", "")
    if dtype not in DTYPE_SHORT:
        raise ValueError(f"dtype must be float16 or bfloat16, got {dtype!r}")
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
    rows: list[dict] = []
    prog = _Progress(len(seqlens) * (len(steps) + len(baselines)), progress)
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        for N in seqlens:
            q, k, v = _inputs(B, Hq, Hkv, N, D, tdt, dev, seed=N)
            hr = ref_heads(Hq, Hkv, N)
            ref = reference_output(q[:1, :hr], k[:1, :hr // (Hq // Hkv)],
                                   v[:1, :hr // (Hq // Hkv)], causal=causal, scale=scale)
            flops = attention_flops(B, Hq, N, N, D, causal)
            out = torch.empty_like(q)
            # Phase 1: compile, check and estimate each implementation once.
            entries = {}   # impl -> (kind, config label, fn, context, check values)
            for s in steps:
                prog.start(f"{s} N={N}")
                if s == "naive" and N > naive_max_n:
                    rows.append(_row(s, "step", N=N, error=SKIP_NAIVE, **shape))
                    prog.done(rows[-1])
                    continue
                try:
                    step_obj, cfg = api.resolve(s, q, k, causal)   # autotune searches here, once
                    label = cfg.label() if s != "best" else f"{step_obj.name}: {cfg.label()}"
                    fn = (lambda so=step_obj, c=cfg:
                          api.launch(q, k, v, out, so, c, causal=causal, scale=scale))
                    out.fill_(float("nan"))   # rows a step forgets to write cannot pass the check
                    entries[s] = ("step", label, fn, contextlib.nullcontext,
                                  _check(fn, ref, hr, reps))
                except Exception as e:   # a step that fails here is a row, not a crash
                    rows.append(_row(s, "step", N=N, error=_err(e), **shape))
                    prog.done(rows[-1])
            for b in baselines:
                impl, backend = LIBRARIES[b]
                prog.start(f"{impl} N={N}")
                if b == "math":
                    free = torch.cuda.mem_get_info(dev)[0]
                    if B * Hq * N * N * (4 + 2) > free / 3:
                        rows.append(_row(impl, "library", N=N, error=SKIP_MATH, **shape))
                        prog.done(rows[-1])
                        continue
                try:
                    fn, ctx = _library_fn(impl, backend, q, k, v, causal=causal, scale=scale)
                    with ctx():
                        entries[impl] = ("library", "", fn, ctx, _check(fn, ref, hr, reps))
                except Exception as e:
                    rows.append(_row(impl, "library", N=N, error=_err(e), **shape))
                    prog.done(rows[-1])
            # Phase 2: time them all in alternation, so drift of a shared GPU hits all alike.
            def in_ctx(fn, ctx):
                def call():
                    with ctx():
                        return fn()
                return call
            try:
                timed = time_interleaved({n: in_ctx(e[2], e[3]) for n, e in entries.items()},
                                         {n: e[4]["reps"] for n, e in entries.items()})
            except Exception as e:
                timed, fail = {}, _err(e)
            for n, (kind, label, _, _, chk) in entries.items():
                if n not in timed:
                    rows.append(_row(n, kind, N=N, error=fail, **shape))
                else:
                    vals = dict(timed[n].as_dict(), max_abs_err=chk["max_abs_err"])
                    rows.append(_row(n, kind, N=N, config=label,
                                     tflops=tflops(flops, vals["median_ms"]), **vals, **shape))
                prog.done(rows[-1])
            del q, k, v, out, ref
            torch.cuda.empty_cache()
    finally:
        torch.set_grad_enabled(grad)
        prog.close()
    add_derived(rows)
    return dict(meta=meta, rows=rows)


# ---------------------------------------------------------------------------------------------
# Files and command line
# ---------------------------------------------------------------------------------------------
def _clean(x):
    """NaN/inf -> None, so the JSON is strict."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def dumps(doc: dict) -> str:
    return json.dumps(_clean(doc), indent=1, allow_nan=False)


def write_json(path, doc: dict) -> Path:
    """Write ``doc`` as JSON atomically (a temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(dumps(doc) + "\n")
    os.replace(tmp, path)
    return path


def _csv(s: str) -> list[str]:
    return [x.strip() for x in s.split(",") if x.strip()]


def build_parser():
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashattn bench",
                                description="Time the steps of the book and library baselines "
                                            "(CUDA events, L2 flushed, median of many runs).")
    p.add_argument("--steps", default=",".join(DEFAULT_STEPS),
                   help="comma-separated steps (and 'best'), or 'none'; default: all + best")
    p.add_argument("--seqlens", default=",".join(map(str, DEFAULT_SEQLENS)),
                   help="comma-separated sequence lengths (default %(default)s)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                   help="causal masking (default: on)")
    p.add_argument("--dtype", choices=list(DTYPE_SHORT), default="float16")
    p.add_argument("--gqa", default=None, metavar="HQ:HKV",
                   help="grouped-query attention, e.g. 32:8 (overrides --heads)")
    p.add_argument("--head-dim", type=int, default=DEFAULT_HEAD_DIM)
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH)
    p.add_argument("--heads", type=int, default=DEFAULT_HEADS)
    p.add_argument("--baselines", default=",".join(DEFAULT_BASELINES),
                   help="comma-separated of %s, or 'none' (default: all)" % ",".join(LIBRARIES))
    p.add_argument("--reps", type=int, default=20, help="timed calls per measurement")
    p.add_argument("--naive-max-n", type=int, default=4096,
                   help="skip the naive step above this N (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the JSON document to stdout")
    p.add_argument("--out", help="write the JSON document to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def parse_args(argv: list[str] | None = None) -> dict:
    """The command line as run_bench keyword arguments (validated; raises SystemExit on error)."""
    p = build_parser()
    a = p.parse_args(argv)
    steps = [] if a.steps.strip() == "none" else _csv(a.steps)
    for s in steps:
        if s != "best" and s not in STEP_NAMES and s not in EXPERIMENTS:
            p.error(f"unknown step {s!r}; choose from {', '.join(DEFAULT_STEPS)}")
    try:
        seqlens = [int(x) for x in _csv(a.seqlens)]
    except ValueError:
        p.error(f"--seqlens takes comma-separated integers, got {a.seqlens!r}")
    if not seqlens or min(seqlens) < 1:
        p.error("--seqlens needs at least one positive length")
    baselines = [] if a.baselines.strip() in ("none", "") else _csv(a.baselines)
    for b in baselines:
        if b not in LIBRARIES:
            p.error(f"unknown baseline {b!r}; choose from {', '.join(LIBRARIES)} or none")
    try:
        gqa = parse_gqa(a.gqa)
    except ValueError as e:
        p.error(str(e))
    return dict(steps=steps, seqlens=seqlens, causal=a.causal, dtype=a.dtype, gqa=gqa,
                head_dim=a.head_dim, batch=a.batch, heads=a.heads, baselines=baselines,
                reps=a.reps, naive_max_n=a.naive_max_n, progress=not a.quiet,
                _json=a.json, _out=a.out)


def main(argv: list[str] | None = None) -> int:
    kw = parse_args(argv)
    as_json, out = kw.pop("_json"), kw.pop("_out")
    t0 = time.perf_counter()
    import torch
    if not torch.cuda.is_available():
        print("error: python -m flashattn bench needs a CUDA GPU; this machine has none "
              "(python -m flashattn info says what it has)", file=sys.stderr)
        return 1
    doc = run_bench(**kw)
    if out:
        write_json(out, doc)
        print(f"wrote {out}", file=sys.stderr)
    print(dumps(doc) if as_json else format_table(doc))
    print(f"bench took {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
