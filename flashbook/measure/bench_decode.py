"""Decode and packed-varlen benchmarks (issue 12): latency, achieved bandwidth, host overhead.

    python -m flashbook decode-bench --out results/h200/decode/decode.json      # decode + host
    python -m flashbook decode-bench --part crossover --out results/h200/decode/crossover.json
    python -m flashbook decode-bench --part varlen --out results/h200/decode/varlen.json
    python -m flashbook decode-bench --plan          # the sweep and its time estimate, no GPU

Parts (``--part``, comma-separated):

* ``decode``: one decode step (Nq new tokens per sequence, every sequence's cache of length Nk,
  GQA 32:8, D=128, fp16) for B in {1, 8, 64} x Nk in {1K .. 128K} x Nq in {1, 4}:
  ``flashattn.decode`` on a contiguous cache and on paged caches (16 and 64 tokens per page,
  pages in shuffled order), the square kernel (``flashattn``'s best step, as
  ``attention(step="best")`` launched it before the decode path), PyTorch SDPA with each backend
  (FLASH, EFFICIENT, CUDNN, MATH; a failing backend is a row with its error), and FlexAttention
  with a block mask on a few shapes (``--flex``: it compiles per shape, ~30 s each). Each row:
  the median GPU time per call (``timing.time_rounds``: idle-start CUDA-graph batches in random
  order, bootstrap 95 % interval), ``gbps`` = bytes of K/V the step must read
  (``schema.kv_bytes``) / time, ``frac_peak`` against the HBM peak (``HBM_PEAK_TBPS``), and
  ``ratio_best_torch`` (the fastest PyTorch row's time / this row's: >= 1 meets issue 12's
  target). For Nq > 1 every implementation computes the same bottom-right causal rows (SDPA:
  ``causal_lower_right`` on FLASH/EFFICIENT, a boolean mask on CUDNN/MATH).
* ``host``: at B=8, Nk=32K, Nq=1, the caller's cost of one call: ``host_ms`` (the call returns;
  ``timing.host_time``), ``wall_ms`` (the call and its kernels done, on an idle GPU) and
  ``overhead_ms = wall_ms - median_ms`` (the kernel's own time), for ``flashattn.decode`` called
  eagerly and replayed from a CUDA graph of one call, contiguous and paged, beside the square
  kernel through ``attention()`` and SDPA FLASH.
* ``crossover``: ``flashattn.decode`` against the square kernel at B=8 for Nq in {1, 4, 16} and
  Nk from 128 to 8K: where the decode path starts to win (``decode.DECODE_PATH_MIN_NK``).
* ``varlen``: ``flashattn.varlen.attention_varlen`` on packed sequences against the square
  kernel on the same sequences padded to the longest (B x max_len), equal total tokens (32K),
  causal: equal lengths (the overhead of packing; issue 12's target is within 5 %), uniform
  random lengths 1..4096, and a skewed mix.

Time of the default sweep (``--part decode,host``), estimated by ``estimate_seconds`` (printed
by ``--plan``; the run prints its real time): per measured implementation and shape, ``rounds``
samples of ``IDLE_MS`` (25 ms) + ~``SAMPLE_MS`` (5 ms) each, plus ~0.5 s of set-up (compile
check, graph capture, host time); ~30 s per FlexAttention shape (torch.compile), ~1.5 s per
shape for the square kernel's autotune search and ~5 s per new cuTile variant (tileiras).
28 shapes x ~8 implementations x 15 rounds -> about 7 minutes on an H200: within the ~8
minutes asked. These are estimates from the method's constants, not
measurements.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time

from flashattn.contract import DTYPE_SHORT, dtype_name, parse_gqa
from ..data.schema import (DECODE_PARTS, SKIPPED, add_decode_derived, format_decode_table,
                           kv_bytes, make_decode_row)
from ..hardware import L2_BYTES
# The sweep as data (no GPU) lives in decode_plan; its names are this module's too.
from .decode_plan import *  # noqa: F401,F403
from .decode_plan import (_impl_page, DEFAULT_BATCHES, DEFAULT_CACHE_LENS, DEFAULT_GQA,
                          DEFAULT_HEAD_DIM, DEFAULT_NQ, DEFAULT_PAGE_SIZES, DEFAULT_PARTS,
                          DECODE_IMPLS, FLEX_CHOICES, FLEX_SHAPES, HOST_SHAPE, LIBRARIES,
                          MAX_CACHE_TOKENS, ROUNDS, VARLEN_MIXES, VARLEN_TOTAL,
                          check_decode_impl, default_impls, estimate_seconds, hbm_peak,
                          plan_crossover, plan_decode, plan_host, plan_varlen, varlen_mix)
from .harness import (IDLE_MS, INNER, SAMPLE_MS, check_once, error_text, finite,  # noqa: F401
                      method_meta, qkv_inputs, random_inputs, rotating, rounds_per_sample,
                      time_in_rounds, timed_values)
from .workload import check_gqa, check_names, emit, require_gpu
from .workload import csv as _csv

MEMORY_FRACTION = 0.6     # input sets may take this much of the free GPU memory

__all__ = ["run_decode_bench", "default_impls", "plan_decode", "plan_crossover", "plan_varlen", "plan_host",
           "estimate_seconds", "varlen_mix", "hbm_peak", "HBM_PEAK_TBPS", "H200_HBM_PEAK_TBPS"]


# ---------------------------------------------------------------------------------------------
# Measuring (GPU)
# ---------------------------------------------------------------------------------------------
class Entry:
    """One implementation at one shape: fns (one per input set), the context its calls run in,
    the call a user makes (host time), its kind and configuration label."""

    def __init__(self, kind, fns, *, ctx=contextlib.nullcontext, call=None, config=""):
        self.kind, self.fns, self.ctx, self.config = kind, fns, ctx, config
        self.call = call or fns[0]


_err = error_text


def _l2_bytes(dev) -> int:
    import torch
    try:
        return int(torch.cuda.get_device_properties(dev).L2_cache_size) or L2_BYTES
    except Exception:
        return L2_BYTES


def input_sets_for(set_bytes: int, *, inner: int, l2_bytes: int, free_bytes: int) -> int:
    """How many input sets to rotate through: enough that no call of a batch finds its K/V in
    L2 (``inner`` sets, one per call of a batch, after the flush), one when a set is four times
    the L2 or more (a call streams it all: what L2 keeps of the end is evicted before the next
    call reaches it), and no more than MEMORY_FRACTION of free memory. 0: not even one fits."""
    fit = int(MEMORY_FRACTION * free_bytes // max(1, set_bytes))
    want = 1 if set_bytes >= 4 * l2_bytes else max(1, int(inner))
    return min(want, fit)


def _decode_set(B, Hq, Hkv, Nq, Nk, D, dtype, dev, seed, pages):
    """q, the contiguous cache, full lengths, and a paged copy per page size (pages shuffled)."""
    import torch
    q, k, v = qkv_inputs(B, Hq, Hkv, Nq, Nk, D, dtype, dev, seed)
    lens = torch.full((B,), Nk, dtype=torch.int32, device=dev)
    paged = {}
    for p in pages:
        npp = Nk // p
        perm = torch.randperm(B * npp, generator=torch.Generator().manual_seed(seed + p))
        perm = perm.to(dev)
        kp = torch.empty((B * npp, Hkv, p, D), dtype=dtype, device=dev)
        vp = torch.empty_like(kp)
        for b in range(B):                     # one sequence at a time: little scratch
            ids = perm[b * npp:(b + 1) * npp]
            kp[ids] = k[b].view(Hkv, npp, p, D).permute(1, 0, 2, 3)
            vp[ids] = v[b].view(Hkv, npp, p, D).permute(1, 0, 2, 3)
        paged[p] = (kp, vp, perm.view(B, npp).to(torch.int32))
    return dict(q=q, k=k, v=v, lens=lens, paged=paged, out=torch.empty_like(q))


def decode_reference(q, k, v, scale):
    """fp32 decode attention of batch 0, (Hq, Nq, D): row i at position Nk - Nq + i."""
    import torch
    _, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qg = q[0].float().reshape(Hkv, G * Nq, D)                          # rows g * Nq + i
    s = (qg @ k[0].float().transpose(-1, -2)) * scale                  # (Hkv, G*Nq, Nk)
    pos = Nk - Nq + torch.arange(G * Nq, device=q.device) % Nq
    s = s.masked_fill(torch.arange(Nk, device=q.device)[None, :] > pos[:, None], -math.inf)
    return (torch.softmax(s, -1) @ v[0].float()).reshape(Hq, Nq, D)


def _sdpa_entry(impl, q, k, v, *, scale):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    be = getattr(SDPBackend, LIBRARIES[impl])
    Nq, Nk = q.shape[2], k.shape[2]
    kw = dict(scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    if Nq == 1:
        mask, label = None, "no mask (Nq = 1 sees every key)"
    elif impl in ("sdpa_flash", "sdpa_efficient"):
        from torch.nn.attention.bias import causal_lower_right
        mask, label = causal_lower_right(Nq, Nk), "causal_lower_right"
    else:
        pos = Nk - Nq + torch.arange(Nq, device=q.device)
        mask = torch.arange(Nk, device=q.device)[None, :] <= pos[:, None]   # (Nq, Nk) bool
        label = "boolean mask (bottom-right causal)"
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return (lambda: sdpa(q, k, v, attn_mask=mask, **kw)), (lambda: sdpa_kernel(be)), label


def _flex_entry(q, k, v, *, scale):
    from torch.nn.attention.flex_attention import create_block_mask

    from .libraries import _flex_fn
    Nq, Nk = q.shape[2], k.shape[2]
    offset = Nk - Nq

    def bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    bm = create_block_mask(bottom_right, None, None, Nq, Nk, device=q.device)
    flex = _flex_fn()
    gqa = q.shape[1] != k.shape[1]
    return lambda: flex(q, k, v, block_mask=bm, scale=scale, enable_gqa=gqa)


def decode_entries(impls, sets, *, scale, skip) -> dict:
    """{impl: Entry or error string} for one decode shape on its input sets."""
    from flashbook import attention
    from flashattn.decoding import decode
    from flashattn.launch import launch
    from .bench import resolve_impl
    out = {}
    s0 = sets[0]
    Nq, Nk = s0["q"].shape[2], s0["k"].shape[2]
    for name in impls:
        if name in skip:
            out[name] = skip[name]
            continue
        try:
            if name == "decode":
                fns = [(lambda s=s: decode(s["q"], s["k"], s["v"], s["lens"], out=s["out"]))
                       for s in sets]
                out[name] = Entry("flashattn", fns, config="contiguous cache")
            elif name.startswith("decode_paged"):
                p = _impl_page(name)
                fns = [(lambda s=s: decode(s["q"], s["paged"][p][0], s["paged"][p][1],
                                           s["lens"], block_table=s["paged"][p][2],
                                           out=s["out"])) for s in sets]
                out[name] = Entry("flashattn", fns, config=f"pages of {p}, shuffled")
            elif name == "square_best":
                step, cfg = resolve_impl("best", s0["q"], s0["k"], True)
                fns = [(lambda s=s: launch(s["q"], s["k"], s["v"], s["out"], step, cfg,
                                           causal=True, scale=scale, input_pos=Nk - Nq))
                       for s in sets]
                call = (lambda: attention(s0["q"], s0["k"], s0["v"], causal=True, scale=scale,
                                          input_pos=Nk - Nq, step=step.name))
                out[name] = Entry("flashattn", fns, call=call,
                                  config=f"{step.name}: {cfg.label()}")
            elif name == "flex":
                fns = [_flex_entry(s["q"], s["k"], s["v"], scale=scale) for s in sets]
                out[name] = Entry("library", fns, config="block mask (bottom-right)")
            elif name == "tilegym":           # split-KV flash decode, its own split count
                from .tilegym import kernels
                dec = kernels()[2]
                fns = [(lambda s=s: dec(s["q"], s["k"], s["v"], scale)) for s in sets]
                out[name] = Entry("library", fns, config="fmha_decode (split-KV)")
            else:
                made = [_sdpa_entry(name, s["q"], s["k"], s["v"], scale=scale) for s in sets]
                out[name] = Entry("library", [m[0] for m in made], ctx=made[0][1],
                                  config=made[0][2])
        except Exception as e:               # a library that cannot run this shape: a row
            out[name] = _err(e)
    return out


def _check(entry: Entry, ref_fn) -> dict:
    """Compile and warm up, compare batch 0 with the fp32 reference, estimate one call (ms)."""
    return check_once(entry.fns[0], lambda o: dict(max_abs_err=finite(ref_fn(o))), entry.ctx)


def _wall_time(fn, *, reps: int = 20) -> float:
    """Median ms from a call until its GPU work is done, each call on a drained GPU."""
    import statistics

    import torch
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _graph_of(fn):
    """A CUDA graph of one call of ``fn`` (warmed up on a side stream), or None."""
    import torch
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        return g
    except Exception:
        torch.cuda.synchronize()
        return None


def measure(entries: dict, ref_fn, *, rounds: int, inner: int, max_inner: int, seed: int,
            host: bool = False) -> dict:
    """Check, then time every Entry of one shape in alternation; {name: values dict or error
    string}. Values: the Timing's fields, max_abs_err, host_ms (the user's call), and with
    ``host`` also wall_ms for the eager call and graph_host_ms / graph_wall_ms for a CUDA graph
    of one call."""
    from flashattn import timing
    res, live = {}, {}
    for name, e in entries.items():
        if isinstance(e, str):
            res[name] = e
            continue
        try:
            live[name] = (e, _check(e, ref_fn))
        except Exception as ex:
            res[name] = _err(ex)

    per = rounds_per_sample({n: c["est_ms"] for n, (e, c) in live.items()}, inner, max_inner)
    timed, fail = time_in_rounds({n: rotating(e.fns, e.ctx) for n, (e, _) in live.items()},
                                 rounds=rounds, inner=per, seed=seed)
    fail = fail or "not timed"
    for n, (e, chk) in live.items():
        if n not in timed:
            res[n] = fail
            continue
        vals = dict(timed_values(timed[n], chk), config=e.config, kind=e.kind)
        try:
            with e.ctx():
                vals["host_ms"] = timing.host_time(e.call)
                if host:
                    vals["wall_ms"] = _wall_time(e.call)
                    if n.startswith("decode"):
                        g = _graph_of(e.fns[0])
                        if g is not None:
                            vals["graph_host_ms"] = timing.host_time(g.replay)
                            vals["graph_wall_ms"] = _wall_time(g.replay)
        except Exception as ex:
            print(f"host time of {n} failed: {_err(ex)}", file=sys.stderr)
        res[n] = vals
    return res


def _rows_of(part, shape_kw, res, *, kv: int | None, flops_fn=None, extra=None) -> list[dict]:
    """Rows of one shape from ``measure``'s result; the host part splits eager and graph."""
    from flashattn.timing import tflops
    rows = []
    for name, vals in res.items():
        base = dict(shape_kw, **(extra or {}), page_size=_impl_page(name))
        kind = "library" if name in LIBRARIES else "flashattn"
        if isinstance(vals, str):
            rows.append(make_decode_row(name, kind, part=part, error=vals, **base))
            continue
        vals = dict(vals)
        kind, config = vals.pop("kind"), vals.pop("config")
        graph_host, graph_wall = vals.pop("graph_host_ms", None), vals.pop("graph_wall_ms", None)
        if flops_fn is not None:
            vals["tflops"] = tflops(flops_fn(name), vals["median_ms"])
        if part == "host":
            wall = vals.pop("wall_ms", None)
            rows.append(make_decode_row(name, kind, part=part, config=config, kv_bytes=kv,
                                        graph=False, wall_ms=wall,
                                        overhead_ms=None if wall is None else
                                        wall - vals["median_ms"], **vals, **base))
            if graph_host is not None:
                g = dict(vals, host_ms=graph_host)
                rows.append(make_decode_row(name, kind, part=part, config=config + ", CUDA graph",
                                            kv_bytes=kv, graph=True, wall_ms=graph_wall,
                                            overhead_ms=graph_wall - vals["median_ms"], **g,
                                            **base))
        else:
            rows.append(make_decode_row(name, kind, part=part, config=config, kv_bytes=kv,
                                        **vals, **base))
    return rows


def _run_decode_like(part, plan, *, Hq, Hkv, D, dtype, pages, rounds, inner, prog, dev):
    import torch
    tdt = getattr(torch, dtype)
    scale = 1.0 / math.sqrt(D)
    l2 = _l2_bytes(dev)
    rows = []
    for i, s in enumerate(plan):
        B, Nk, Nq = s["B"], s["Nk"], s["Nq"]
        shape_kw = dict(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, dtype=dtype)
        kv = kv_bytes(B, Hkv, Nk, D, torch.tensor([], dtype=tdt).element_size())
        my_pages = [p for p in pages if f"decode_paged{p}" in s["impls"]
                    and f"decode_paged{p}" not in s["skip"]]
        per_set = kv * (1 + len(my_pages)) + 2 * B * Hq * Nq * D * 2
        free = torch.cuda.mem_get_info(dev)[0]
        n_sets = input_sets_for(per_set, inner=inner, l2_bytes=l2, free_bytes=free)
        prog(f"{part} B={B} Nk={Nk} Nq={Nq}: {n_sets} input set(s) of {per_set / 2**30:.2f} GiB")
        if n_sets == 0:
            rows += [make_decode_row(n, "library" if n in LIBRARIES else "flashattn",
                                     part=part, error=f"{SKIPPED}: inputs do not fit in "
                                     f"{MEMORY_FRACTION:.0%} of free memory", **shape_kw)
                     for n in s["impls"]]
            continue
        try:
            sets = [_decode_set(B, Hq, Hkv, Nq, Nk, D, tdt, dev, seed=1000 * i + j,
                                pages=my_pages) for j in range(n_sets)]
            ref = decode_reference(sets[0]["q"], sets[0]["k"], sets[0]["v"], scale)
        except Exception as e:               # out of memory, say: this shape's rows say so
            sets = None
            rows += [make_decode_row(n, "library" if n in LIBRARIES else "flashattn",
                                     part=part, error=f"inputs: {_err(e)}", **shape_kw)
                     for n in s["impls"]]
            torch.cuda.empty_cache()
            continue
        ref_fn = lambda o: (o[0].float() - ref).abs().max().item()  # noqa: E731
        entries = decode_entries(s["impls"], sets, scale=scale, skip=s["skip"])
        res = measure(entries, ref_fn, rounds=rounds, inner=inner, max_inner=n_sets if
                      n_sets > 1 else inner, seed=i, host=part == "host")
        new = _rows_of(part, shape_kw, res, kv=kv)
        for r in new:
            prog(_line(r))
        rows += new
        del sets, entries, ref
        torch.cuda.empty_cache()
    return rows


def _run_varlen(plan, *, Hq, Hkv, D, dtype, rounds, inner, prog, dev):
    import torch

    from flashattn.launch import launch
    from flashattn.reference import pack, unpack
    from flashattn.varlen import attention_varlen
    from .bench import resolve_impl
    from flashattn.timing import attention_flops
    tdt = getattr(torch, dtype)
    scale = 1.0 / math.sqrt(D)
    rows = []
    for i, s in enumerate(plan):
        lens = s["lens"]
        T, B, N = sum(lens), len(lens), max(lens)
        shape_kw = dict(B=B, Hq=Hq, Hkv=Hkv, Nq=N, Nk=N, D=D, dtype=dtype)
        extra = dict(total_tokens=T, lens=list(lens))
        prog(f"varlen {s['mix']}: {B} sequences, {T} tokens, longest {N}")
        q, k, v = random_inputs([(T, Hq, D), (T, Hkv, D), (T, Hkv, D)], tdt, dev, seed=7 + i)
        cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=dev)
        out = torch.empty_like(q)
        qp, kp, vp = (unpack(t, cu, N) for t in (q, k, v))          # (B, H, N, D), zeros
        outp = torch.empty_like(qp)
        n0 = lens[0]
        ref = _ref_causal(q[:n0], k[:n0], v[:n0], scale)             # sequence 0, fp32
        entries = {}
        for name in s["impls"]:
            if name in s["skip"]:
                entries[name] = s["skip"][name]
            elif name == "varlen":
                fn = (lambda: attention_varlen(q, k, v, cu, cu, N, N, causal=True, scale=scale,
                                               check_values=False, out=out))
                entries[name] = Entry("flashattn", [fn], config="packed")
            else:
                try:
                    step, cfg = resolve_impl("best", qp, kp, True)
                    fn = (lambda step=step, cfg=cfg: launch(qp, kp, vp, outp, step, cfg,
                                                            causal=True, scale=scale))
                    entries[name] = Entry("flashattn", [fn],
                                          config=f"{step.name}: {cfg.label()}, padded to {N}")
                except Exception as e:
                    entries[name] = _err(e)

        def ref_fn(o):
            first = o[:n0] if o.dim() == 3 else pack(o[:1], [n0])[0]
            return (first.float() - ref).abs().max().item()
        useful = sum(attention_flops(1, Hq, n, n, D, True) for n in lens)
        res = measure(entries, ref_fn, rounds=rounds, inner=inner, max_inner=inner, seed=i)
        new = _rows_of("varlen", shape_kw, res, kv=None, flops_fn=lambda name: useful,
                       extra=extra)
        for r in new:
            r["config"] = f"{s['mix']}: {r['config'] or ''}".rstrip(": ")
            prog(_line(r))
        rows += new
        del q, k, v, qp, kp, vp, out, outp, entries
        torch.cuda.empty_cache()
    return rows


def _ref_causal(q, k, v, scale):
    """fp32 causal attention of one packed sequence: (n, Hq, D) -> (n, Hq, D)."""
    import torch
    n, Hq, D = q.shape
    G = Hq // k.shape[1]
    qh = q.float().transpose(0, 1)                                     # (Hq, n, D)
    kh = k.float().transpose(0, 1).repeat_interleave(G, 0)
    vh = v.float().transpose(0, 1).repeat_interleave(G, 0)
    s = (qh @ kh.transpose(-1, -2)) * scale
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return (torch.softmax(s, -1) @ vh).transpose(0, 1)


def _line(r: dict) -> str:
    if r.get("error"):
        return f"  {r['impl']:<16} {str(r['error'])[:100]}"
    ci = (f" [{r['ci_lo_ms']:.4f}, {r['ci_hi_ms']:.4f}]" if r.get("ci_lo_ms") is not None
          else "")
    host = f", host {r['host_ms']:.4f} ms" if r.get("host_ms") is not None else ""
    return (f"  {r['impl']:<16} {r['median_ms']:.4f} ms{ci}{host}"
            f"{', err %.1e' % r['max_abs_err'] if r.get('max_abs_err') is not None else ''}"
            f"  {r.get('config') or ''}")


def run_decode_bench(parts=DEFAULT_PARTS, *, batches=DEFAULT_BATCHES,
                     cache_lens=DEFAULT_CACHE_LENS, nqs=DEFAULT_NQ, gqa=DEFAULT_GQA,
                     head_dim: int = DEFAULT_HEAD_DIM, dtype: str = "float16",
                     page_sizes=DEFAULT_PAGE_SIZES, impls=None, flex: str = "default",
                     max_cache_tokens: int = MAX_CACHE_TOKENS, varlen_mixes=VARLEN_MIXES,
                     varlen_total: int = VARLEN_TOTAL, rounds: int = ROUNDS,
                     inner: int = INNER, progress: bool = True,
                     command: str | None = None) -> dict:
    """Measure the parts; return the decode-bench document ({"meta", "rows"}, rows as
    ``schema.make_decode_row``). A failing implementation is a row with ``error``; nothing is
    raised for it. See the module docstring for the parts."""
    import torch

    from flashattn.env import metadata
    parts = list(parts)
    for p in parts:
        if p not in DECODE_PARTS:
            raise ValueError(f"unknown part {p!r}; choose from {', '.join(DECODE_PARTS)}")
    dtype = dtype_name(dtype)
    Hq, Hkv = parse_gqa(gqa)
    impls = default_impls(page_sizes) if impls is None else list(impls)
    plans = _plans(parts, batches=batches, cache_lens=cache_lens, nqs=nqs, impls=impls,
                   flex=flex, max_cache_tokens=max_cache_tokens, varlen_mixes=varlen_mixes,
                   varlen_total=varlen_total)
    if not torch.cuda.is_available():
        raise RuntimeError("run_decode_bench needs a CUDA GPU (torch.cuda.is_available() is "
                           "False); --plan shows the sweep without one")
    dev = torch.device("cuda", torch.cuda.current_device())
    meta = metadata(command)
    peak, source = hbm_peak(meta.get("gpu"))
    meta.update(hbm_peak_tbps=peak, hbm_peak_source=source, parts=parts,
                estimate_s=round(estimate_seconds(plans, rounds=rounds)),
                workload=dict(name=f"{DTYPE_SHORT[dtype]}-decode-d{head_dim}-gqa{Hq}x{Hkv}",
                              Hq=Hq, Hkv=Hkv, D=head_dim, dtype=dtype),
                method=method_meta(rounds=rounds, inner=inner,
                                   what="GPU time per call started on an idle GPU, batches "
                                        "replayed from CUDA graphs, L2 flushed, no call reading "
                                        "K/V another call of its batch left in L2"),
                plans={p: [{k: v for k, v in s.items() if k != "lens"} for s in plan]
                       for p, plan in plans.items()})

    def prog(msg):
        if progress:
            print(msg, file=sys.stderr, flush=True)
    rows = []
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        for part, plan in plans.items():
            if part == "varlen":
                rows += _run_varlen(plan, Hq=Hq, Hkv=Hkv, D=head_dim, dtype=dtype,
                                    rounds=rounds, inner=inner, prog=prog, dev=dev)
            else:
                pages = page_sizes if part != "host" else (64,)
                rows += _run_decode_like(part, plan, Hq=Hq, Hkv=Hkv, D=head_dim, dtype=dtype,
                                         pages=pages, rounds=rounds, inner=inner, prog=prog,
                                         dev=dev)
    finally:
        torch.set_grad_enabled(grad)
    add_decode_derived(rows, peak_tbps=peak)
    return dict(meta=meta, rows=rows)


def _plans(parts, *, batches, cache_lens, nqs, impls, flex, max_cache_tokens, varlen_mixes,
           varlen_total) -> dict:
    plans = {}
    for p in parts:
        if p == "decode":
            plans[p] = plan_decode(batches, cache_lens, nqs, impls, flex=flex,
                                   max_cache_tokens=max_cache_tokens)
        elif p == "host":
            plans[p] = plan_host(HOST_SHAPE)
        elif p == "crossover":
            plans[p] = plan_crossover()
        elif p == "varlen":
            plans[p] = plan_varlen(varlen_mixes, varlen_total)
        else:
            raise ValueError(f"unknown part {p!r}; choose from {', '.join(DECODE_PARTS)}")
    return plans


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def build_parser():
    import argparse
    p = argparse.ArgumentParser(
        prog="python -m flashbook decode-bench",
        description="Time decode steps (flashattn.decode, contiguous and paged, against the "
                    "square kernel, PyTorch SDPA and FlexAttention: latency and K/V bandwidth "
                    "against the HBM peak), the host overhead per call with and without a "
                    "CUDA graph, the decode/square crossover, and packed varlen prefill "
                    "against the padded square kernel.")
    p.add_argument("--part", default=",".join(DEFAULT_PARTS),
                   help=f"comma-separated of {', '.join(DECODE_PARTS)} (default %(default)s)")
    p.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    p.add_argument("--cache-lens", default=",".join(map(str, DEFAULT_CACHE_LENS)),
                   help="cache lengths Nk (default %(default)s)")
    p.add_argument("--nq", default=",".join(map(str, DEFAULT_NQ)),
                   help="new tokens per sequence, 1..16 (default %(default)s)")
    p.add_argument("--gqa", default="%d:%d" % DEFAULT_GQA, metavar="HQ:HKV")
    p.add_argument("--head-dim", type=int, default=DEFAULT_HEAD_DIM)
    p.add_argument("--dtype", choices=list(DTYPE_SHORT), default="float16")
    p.add_argument("--page-sizes", default=",".join(map(str, DEFAULT_PAGE_SIZES)),
                   help="tokens per page of the paged caches (multiples of 16), or 'none'")
    p.add_argument("--impls", default=None,
                   help="decode part: comma-separated of %s, or tilegym (default: all but "
                        "tilegym, paged per --page-sizes)" % ",".join(DECODE_IMPLS))
    p.add_argument("--flex", choices=FLEX_CHOICES, default="default",
                   help="where FlexAttention runs: default %s (B, Nk, Nq), all, none"
                        % (FLEX_SHAPES,))
    p.add_argument("--max-cache-tokens", type=int, default=MAX_CACHE_TOKENS,
                   help="leave out shapes with B x Nk above this (default %(default)s)")
    p.add_argument("--varlen-mixes", default=",".join(VARLEN_MIXES),
                   help="varlen part: mixes (equal_BxN, uniform_A_B, skewed)")
    p.add_argument("--varlen-total", type=int, default=VARLEN_TOTAL,
                   help="varlen part: total tokens of every mix (default %(default)s)")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--inner", type=int, default=INNER, help="launches per sample at most")
    p.add_argument("--plan", action="store_true",
                   help="print the shapes and the time estimate, measure nothing (no GPU)")
    p.add_argument("--json", action="store_true", help="print the JSON document to stdout")
    p.add_argument("--out", help="write the JSON document to this file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _ints(p, name, text, *, lo=1, hi=None):
    try:
        xs = [int(x) for x in _csv(text)]
    except ValueError:
        p.error(f"--{name} takes comma-separated integers, got {text!r}")
    if not xs or min(xs) < lo or (hi is not None and max(xs) > hi):
        p.error(f"--{name} needs integers in [{lo}, {hi if hi is not None else 'inf'}], got "
                f"{text!r}")
    return xs


def parse_args(argv: list[str] | None = None) -> dict:
    """The command line as run_decode_bench keyword arguments (validated; SystemExit on an
    error), plus ``_plan``, ``_json``, ``_out``."""
    p = build_parser()
    a = p.parse_args(argv)
    parts = _csv(a.part)
    for x in parts:
        if x not in DECODE_PARTS:
            p.error(f"unknown part {x!r}; choose from {', '.join(DECODE_PARTS)}")
    if not parts:
        p.error("--part needs at least one part")
    pages = [] if a.page_sizes.strip() in ("none", "") else _ints(p, "page-sizes",
                                                                  a.page_sizes, lo=16)
    if any(x % 16 for x in pages):
        p.error(f"--page-sizes must be multiples of 16, got {a.page_sizes!r}")
    impls = None
    if a.impls is not None:
        impls = check_names(p, _csv(a.impls), check_decode_impl)
    gqa = check_gqa(p, a.gqa)
    if not 1 <= a.head_dim <= 256:
        p.error(f"--head-dim must be in [1, 256], got {a.head_dim}")
    mixes = _csv(a.varlen_mixes)
    for m in mixes:
        try:
            varlen_mix(m, a.varlen_total)
        except ValueError as e:
            p.error(str(e))
    if a.rounds < 2 or a.inner < 1:
        p.error("--rounds needs at least 2 and --inner at least 1")
    return dict(parts=parts, batches=_ints(p, "batches", a.batches),
                cache_lens=_ints(p, "cache-lens", a.cache_lens),
                nqs=_ints(p, "nq", a.nq, hi=16), gqa=gqa, head_dim=a.head_dim, dtype=a.dtype,
                page_sizes=pages, impls=impls, flex=a.flex,
                max_cache_tokens=a.max_cache_tokens, varlen_mixes=mixes,
                varlen_total=a.varlen_total, rounds=a.rounds, inner=a.inner,
                progress=not a.quiet, _plan=a.plan, _json=a.json, _out=a.out)


def format_plan(kw: dict) -> str:
    """The shapes each part measures and the estimated time (``--plan``)."""
    impls = kw.get("impls") or default_impls(kw["page_sizes"])
    plans = _plans(kw["parts"], batches=kw["batches"], cache_lens=kw["cache_lens"],
                   nqs=kw["nqs"], impls=impls, flex=kw["flex"],
                   max_cache_tokens=kw["max_cache_tokens"], varlen_mixes=kw["varlen_mixes"],
                   varlen_total=kw["varlen_total"])
    lines = []
    for part, plan in plans.items():
        n = sum(len([i for i in s["impls"] if i not in s["skip"]]) for s in plan)
        lines.append(f"{part}: {len(plan)} shapes, {n} measurements")
        for s in plan:
            shape = (f"{s['mix']} ({s['B']} sequences)" if "mix" in s else
                     f"B={s['B']} Nk={s['Nk']} Nq={s['Nq']}")
            run = [i for i in s["impls"] if i not in s["skip"]]
            lines.append(f"  {shape}: {', '.join(run)}")
    est = estimate_seconds(plans, rounds=kw["rounds"])
    lines.append(f"estimated time on an H200: {est / 60:.1f} min ({est:.0f} s; from the "
                 "method's constants, not a measurement)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    kw = parse_args(argv)
    plan_only, as_json, out = kw.pop("_plan"), kw.pop("_json"), kw.pop("_out")
    if plan_only:
        print(format_plan(kw))
        return 0
    t0 = time.perf_counter()
    if not require_gpu("python -m flashbook decode-bench",
                       "--plan shows the sweep; python -m flashattn info says what it has"):
        return 1
    doc = run_decode_bench(**kw)
    doc["meta"]["elapsed_s"] = round(time.perf_counter() - t0, 1)
    emit(doc, out=out, as_json=as_json, table=format_decode_table)
    print(f"decode-bench took {time.perf_counter() - t0:.0f} s (estimated "
          f"{doc['meta'].get('estimate_s')} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
