"""E17 (prepared, to run on the H200): the two decoding leads of E16, each against PyTorch in
the same rounds.

    python experiments/decode_sweep.py --part splits --out experiments/data/24-decode-sweep/splits.json
    python experiments/decode_sweep.py --part varlen --out experiments/data/24-decode-sweep/varlen.json

splits: ``flashattn.decode`` with the split count of ``kernels.decode_num_splits`` at
``waves`` = 1, 2 (today's ``DECODE_WAVES``), 4 and 8 programs per SM (each also rounded down
to whole waves, where the rule rounds up), each also with the split kernel at two programs per SM
(``occupancy=2``: 128 registers instead of 255, no spills), against SDPA's flash and
cuDNN back ends, one new token (Nq=1), GQA 32:8, D=128, fp16, B in {1, 8} and cache lengths
4K, 32K, 128K. Prediction (E16): bandwidth follows programs per SM, so 4-8 waves should lift
B=1 and B=8 toward B=64's 93 % of the HBM peak; at B=1, 4K there are too few tiles to split.

varlen: ``flashattn.varlen.attention_varlen`` with each configuration of a small Hopper search
space against the square kernel (step ``best``, autotuned) on the same sequences padded to the
longest, equal total tokens (32K): mixes equal_8x4096 and equal_32x1024, where packed read
0.94x and 0.76x the padded kernel in E16 with its fixed 128x128 ``nww=8`` tile. Prediction: the
square kernel's own choice (64x128 ``occ=2``) closes most of the gap.

combine: E18b's part (commit 0447127, ``experiments/data/26-decode-sweep/combine.json``) timed
the one-row combine as the only combine. Now (E21, ran: ``data/30-decode-combine/``) it times
the multi-row combine (``block``, the default) against the one-row combine (``row``, switched on
with ``kernels.DECODE_ROW_COMBINE_MAX``) in the same rounds, B in {1, 2, 4, 8}, Nq in {1, 4},
4K-128K, with SDPA's flash and cuDNN back ends for Nq=1. Prediction (E18b and the decode-b1
profile): ``row`` faster at B=1 (the combine's 8 programs each loop over 16 splits), ``block``
at B=8 (256+ one-row programs); the switch point in between sets ``DECODE_ROW_COMBINE_MAX``.

qtiles (E22, ran: ``data/31-varlen-qtiles/``): ``attention_varlen`` with ``Q_TILES`` = 1, 2, 4,
8, 16 query tiles per program (``kernels.VARLEN_Q_TILES["sm_90"]``), the default configuration,
causal and not, against the padded square kernel in the same rounds, mixes equal 8x4096,
32x1024, 128x256, uniform 1-4096 and skewed. Question (E17): the varlen kernel builds four
tensor maps per program, the square kernel none; is that the 5-15 % it loses on equal lengths?
Prediction: if so, the gap shrinks as ``Q_TILES`` grows (the maps are built once per ``Q_TILES``
tiles), most at 32x1024 and 128x256 (short programs), until too few programs are left to fill
the GPU or balance causal work (at 8x4096, ``Q_TILES`` = 16 leaves 4 x 32 x 8 = 1024 programs).

E23 (ran, ``data/32-decode-fused/``): the combine part also times ``fused``
(``kernels.DECODE_FUSED_COMBINE``: the split kernel's last program per row block merges, counted
with an atomic add; no second launch). Question: is the second launch the 2-4 us by which B=1-8
trail cuDNN at every cache length (E21)? Prediction: if so, ``fused`` beats both two-kernel
merges by about that much wherever there is more than one split, most at short caches.

qtiles_cfg (E25, prepared): ``Q_TILES`` 1, 4, 8 for each of four Hopper tiles (the varlen part's
search space) at 32x1024 and 8x4096, causal, against the padded square kernel in the same
rounds. Question: with the per-program cost shared by several tiles (E22), is another tile than
E18's 64x128 ``occ=2`` (chosen at one tile per program) faster? Prediction: the 128-row tiles,
which halve the programs, gain most from sharing the views.

varlen_bwd (prepared): the packed varlen forward and backward through autograd
(``attention_varlen``, whose backward runs the square backward once per sequence and reads the
offsets on the host) against ``flashattn.attention`` forward and backward on the same sequences
padded to the longest, causal, 32K tokens; both timed as eager batches (``graph=False``: the
packed backward cannot be captured), so host time counts for both.

(E18a ran ``splits`` when the rule rounded up; it now rounds down, so a re-run dedupes the
``_floor`` rows.)

Timing: ``measure.timing.time_rounds`` (idle start, random order, CUDA graphs), one batch
length for all rows of a shape; every row checked against the first correct one before timing.
Writes one JSON document ({"meta", "rows"}); record the verdict in experiments/LOG.md.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

WAVES = (1, 2, 4, 8)
SPLIT_SHAPES = [(b, n) for b in (1, 8) for n in (4096, 32768, 131072)]
VARLEN_CONFIGS = ("128x128 occ=1 nww=8", "64x128 occ=2", "128x64 occ=1 nww=8", "64x64 occ=2")
VARLEN_MIXES = ("equal_8x4096", "equal_32x1024")
QTILES = (1, 2, 4, 8, 16)
QTILES_MIXES = ("equal_8x4096", "equal_32x1024", "equal_128x256", "uniform_1_4096", "skewed")
HQ, HKV, D = 32, 8, 128


def _time(calls: dict, rounds: int, ref_name: str):
    """time_rounds over ``calls`` ({name: fn}) with one batch length; rows with the paired
    ratio to ``ref_name``."""
    from flashattn.stats import ratio_ci
    from flashattn import timing
    from flashbook.measure.harness import estimate_ms
    from flashbook.measure.workload import SAMPLE_MS
    est = estimate_ms(calls)
    inner = max(1, min(10, round(SAMPLE_MS / max(min(est.values()), 1e-3))))
    res = timing.time_rounds(calls, rounds=rounds, inner=inner)
    ref = res[ref_name]
    out = {}
    for name, t in res.items():
        r, lo, hi = ratio_ci(ref.samples, t.samples)
        out[name] = dict(median_ms=t.median_ms, ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms,
                         **{f"ratio_{ref_name}": r, f"ratio_{ref_name}_lo": lo,
                            f"ratio_{ref_name}_hi": hi})
    return out


def _with_hints(hints: dict, fn):
    """Call ``fn`` with ``kernels.DECODE_SPLIT_HINTS["sm_90"]`` set to ``hints`` (restored after:
    a captured CUDA graph keeps the kernel it launched)."""
    from unittest import mock

    from flashattn import kernels
    with mock.patch.dict(kernels.DECODE_SPLIT_HINTS, {"sm_90": hints}):
        return fn()


def _add_libraries(calls: dict, rows: list, libs, q, k, v, **shape):
    """Add each of ``libs`` (SDPA back ends, no mask) to ``calls`` after one trial run; a back
    end that refuses the shape becomes an error row with the ``shape`` keys."""
    from flashbook.measure.libraries import library_fn
    for lib in libs:
        try:
            fn, ctx = library_fn(lib, q, k, v, causal=False, scale=1 / math.sqrt(D))
            with ctx():
                fn()

            def call(fn=fn, ctx=ctx):
                with ctx():
                    return fn()
            calls[lib] = call
        except Exception as e:          # a back end that refuses the shape: a row
            rows.append(dict(**shape, impl=lib, error=f"{type(e).__name__}: {e}"[:200]))


def run_splits(rounds: int) -> list[dict]:
    import torch

    from flashattn.decoding import decode
    from flashattn.kernels import decode_num_splits
    from flashbook.measure.bench_decode import hbm_peak
    peak = hbm_peak(torch.cuda.get_device_name())
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for B, N in SPLIT_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(B * 7 + N)
        q = torch.randn(B, HQ, 1, D, generator=g, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, HKV, N, D, generator=g, device="cuda", dtype=torch.float16)
                for _ in range(2))
        lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
        calls, splits = {}, {}
        base = B * HKV                      # programs without splitting (one row block: G*Nq=4)
        for w in WAVES:
            s = decode_num_splits(B=B, Hkv=HKV, rows=HQ // HKV, max_seqlen=N, head_dim=D,
                                  sm_count=sm, arch="sm_90", waves=w)
            # The same wave count rounded down to whole waves (the rule rounds up: at B=8,
            # 5 splits make 320 programs, 2.42 waves of one program per SM; 4 make 1.94).
            s_floor = max(1, min(s, (w * sm) // base))
            for name, n in ((f"waves{w}", s), (f"waves{w}_floor", s_floor)):
                if n in splits.values():
                    continue                # the same grid as another row
                splits[name] = n
                calls[name] = (lambda n=n: decode(q, k, v, lens, num_splits=n))
                # Two programs per SM (128 registers, no spills; E16's lead): the same grid.
                splits[name + "_occ2"] = n
                calls[name + "_occ2"] = (lambda n=n: _with_hints(
                    {"occupancy": 2}, lambda: decode(q, k, v, lens, num_splits=n)))
        _add_libraries(calls, rows, ("sdpa_flash", "sdpa_cudnn"), q, k, v, B=B, Nk=N)
        ref = decode(q, k, v, lens).float()
        errs = {n: (calls[n]().float() - ref).abs().max().item() for n in calls}
        got = _time(calls, rounds, "sdpa_flash" if "sdpa_flash" in calls else "waves2")
        kv_bytes = 2 * B * HKV * N * D * 2
        for name, t in got.items():
            gbps = kv_bytes / (t["median_ms"] * 1e-3) / 1e9
            rows.append(dict(B=B, Nk=N, impl=name, num_splits=splits.get(name),
                             max_abs_diff=errs[name], gbps=gbps,
                             frac_peak=gbps / (peak[0] * 1e3) if peak[0] else None, **t))
            print(f"B={B} Nk={N} {name:11s} splits={splits.get(name)!s:>4} "
                  f"{t['median_ms']:.4f} ms {gbps:6.0f} GB/s", flush=True)
    return rows


COMBINE_SHAPES = [(b, nq, n) for b in (1, 2, 4, 8) for nq in (1, 4) for n in (4096, 32768, 131072)]


def _with_row_combine(limit: int, fn):
    """Call ``fn`` with ``kernels.DECODE_ROW_COMBINE_MAX = limit`` and no least split count
    (restored after): 0 forces the multi-row combine, a huge limit the one-row combine."""
    from unittest import mock

    from flashattn.kernels import decode_spec as kernels   # the rule's module
    with mock.patch.object(kernels, "DECODE_ROW_COMBINE_MAX", limit), \
            mock.patch.object(kernels, "DECODE_ROW_COMBINE_MIN_SPLITS", 2):
        return fn()


def _with_fused(fn):
    """Call ``fn`` with the book's ``DECODE_FUSED_COMBINE = True`` (restored after); ``fn``
    calls ``flashbook.ladder.variants.decode``, the decode with the fused merge."""
    from unittest import mock

    from flashbook.ladder import variants
    with mock.patch.object(variants, "DECODE_FUSED_COMBINE", True):
        return fn()


def run_combine(rounds: int) -> list[dict]:
    """E21 (prepared): the one-row combine against the multi-row one, per shape; the SDPA back
    ends beside them for one new token (no mask needed)."""
    import torch

    from flashattn.decoding import decode
    from flashbook.ladder.variants import decode as ladder_decode
    from flashattn.kernels import decode_num_splits
    from flashbook.measure.bench_decode import hbm_peak
    peak = hbm_peak(torch.cuda.get_device_name())
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for B, nq, N in COMBINE_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(B * 7 + N + nq)
        q = torch.randn(B, HQ, nq, D, generator=g, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, HKV, N, D, generator=g, device="cuda", dtype=torch.float16)
                for _ in range(2))
        lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
        splits = decode_num_splits(B=B, Hkv=HKV, rows=HQ // HKV * nq, max_seqlen=N, head_dim=D,
                                   sm_count=sm, arch="sm_90")
        calls = {"block": lambda: _with_row_combine(0, lambda: decode(q, k, v, lens)),
                 "row": lambda: _with_row_combine(10 ** 9, lambda: decode(q, k, v, lens)),
                 "fused": lambda: _with_fused(lambda: ladder_decode(q, k, v, lens))}
        _add_libraries(calls, rows, ("sdpa_flash", "sdpa_cudnn") if nq == 1 else (), q, k, v,
                       B=B, Nq=nq, Nk=N)
        ref = calls["block"]().float()
        errs = {n: (calls[n]().float() - ref).abs().max().item() for n in calls}
        got = _time(calls, rounds, "block")
        kv_bytes = 2 * B * HKV * N * D * 2
        for name, t in got.items():
            gbps = kv_bytes / (t["median_ms"] * 1e-3) / 1e9
            rows.append(dict(B=B, Nq=nq, Nk=N, impl=name, num_splits=splits,
                             programs=B * HKV * (HQ // HKV) * nq, max_abs_diff=errs[name],
                             gbps=gbps, frac_peak=gbps / (peak[0] * 1e3) if peak[0] else None,
                             **t))
            print(f"B={B} Nq={nq} Nk={N} splits={splits} {name:10s} {t['median_ms']:.4f} ms "
                  f"{gbps:6.0f} GB/s  x block {t['ratio_block']:.3f}", flush=True)
    return rows


def _packed(mix: str, seed_extra: int = 0):
    """A varlen mix of 32K tokens on the GPU: (lens, q, k, v, cu_seqlens), fp16, GQA 32:8,
    seeded by the mix's total and longest length (plus ``seed_extra``)."""
    import torch

    from flashbook.measure.bench_decode import varlen_mix
    lens = varlen_mix(mix, 32768)
    T, N = sum(lens), max(lens)
    g = torch.Generator(device="cuda").manual_seed(T + N + seed_extra)
    q = torch.randn(T, HQ, D, generator=g, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(T, HKV, D, generator=g, device="cuda", dtype=torch.float16)
            for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device="cuda")
    return lens, q, k, v, cu


def _square_padded(q, k, v, cu, N: int, causal: bool, scale: float):
    """The padded control of the varlen parts: the sequences unpacked to (B, H, N, D) and the
    square kernel of step ``best`` (autotuned) on them. Returns (call, "step: config")."""
    import torch

    from flashattn.launch import launch
    from flashbook.measure.bench import resolve_impl
    from flashattn.reference import unpack
    qp, kp, vp = (unpack(t, cu, N) for t in (q, k, v))
    outp = torch.empty_like(qp)
    step, cfg = resolve_impl("best", qp, kp, causal)
    return (lambda: launch(qp, kp, vp, outp, step, cfg, causal=causal, scale=scale),
            f"{step.name}: {cfg.label()}")


def run_varlen(rounds: int) -> list[dict]:
    from flashattn.config import Config
    from flashattn.varlen import attention_varlen
    rows = []
    scale = 1 / math.sqrt(D)
    for mix in VARLEN_MIXES:
        lens, q, k, v, cu = _packed(mix)
        N = max(lens)
        square, square_config = _square_padded(q, k, v, cu, N, True, scale)
        calls = {"square_padded": square}
        for c in VARLEN_CONFIGS:
            conf = Config.parse(c)
            try:
                attention_varlen(q, k, v, cu, cu, N, N, causal=True, scale=scale, config=conf)
                calls[f"varlen {c}"] = (lambda conf=conf: attention_varlen(
                    q, k, v, cu, cu, N, N, causal=True, scale=scale, check_values=False,
                    config=conf))
            except Exception as e:          # a configuration that does not compile: a row
                rows.append(dict(mix=mix, impl=f"varlen {c}", error=f"{type(e).__name__}: {e}"[:200]))
        got = _time(calls, rounds, "square_padded")
        for name, t in got.items():
            rows.append(dict(mix=mix, impl=name, square_config=square_config, **t))
            print(f"{mix} {name:28s} {t['median_ms']:.4f} ms  x padded "
                  f"{t['ratio_square_padded']:.3f}", flush=True)
    return rows


def run_qtiles(rounds: int) -> list[dict]:
    """E22: query tiles per varlen program, against the padded square kernel."""
    from unittest import mock

    from flashattn import kernels
    from flashattn.varlen import attention_varlen
    rows = []
    scale = 1 / math.sqrt(D)
    for mix, causal in itertools.product(QTILES_MIXES, (True, False)):
        lens, q, k, v, cu = _packed(mix)
        N = max(lens)
        square, square_config = _square_padded(q, k, v, cu, N, causal, scale)
        calls = {"square_padded": square}

        def packed(qt, causal=causal):
            with mock.patch.object(kernels, "VARLEN_Q_TILES", {"sm_90": qt}), \
                    mock.patch.object(kernels, "VARLEN_Q_TILES_BELOW", 10 ** 9):
                return attention_varlen(q, k, v, cu, cu, N, N, causal=causal, scale=scale,
                                        check_values=False)
        for qt in QTILES:
            calls[f"varlen q_tiles={qt}"] = (lambda qt=qt: packed(qt))
        ref = calls["varlen q_tiles=1"]().float()
        errs = {n: (calls[n]().float() - ref).abs().max().item()
                for n in calls if n != "square_padded"}
        got = _time(calls, rounds, "square_padded")
        for name, t in got.items():
            rows.append(dict(mix=mix, causal=causal, B=len(lens), max_len=N, impl=name,
                             square_config=square_config,
                             max_abs_diff=errs.get(name), **t))
            print(f"{mix} causal={causal} {name:20s} {t['median_ms']:.4f} ms  x padded "
                  f"{t['ratio_square_padded']:.3f}", flush=True)
    return rows


VARLEN_BWD_MIXES = ("equal_8x4096", "equal_32x1024", "uniform_1_4096", "skewed")


def run_varlen_bwd(rounds: int) -> list[dict]:
    """Forward + backward, packed (per-sequence backward) against padded (square autograd)."""
    import torch

    from flashattn import attention
    from flashattn.stats import ratio_ci
    from flashattn import timing
    from flashattn.reference import unpack
    from flashattn.varlen import attention_varlen
    rows = []
    scale = 1 / math.sqrt(D)
    for mix in VARLEN_BWD_MIXES:
        lens, q, k, v, cu = _packed(mix, seed_extra=1)
        N = max(lens)
        dout = torch.randn_like(q)
        qp, kp, vp, doutp = (unpack(t, cu, N).contiguous() for t in (q, k, v, dout))
        for t in (q, k, v, qp, kp, vp):
            t.requires_grad_(True)

        def packed():
            o = attention_varlen(q, k, v, cu, cu, N, N, causal=True, scale=scale,
                                 check_values=False)
            return torch.autograd.grad(o, (q, k, v), dout)

        def padded():
            o = attention(qp, kp, vp, causal=True, scale=scale)
            return torch.autograd.grad(o, (qp, kp, vp), doutp)
        # Agreement of dQ on the first sequence (the padded rows past its end are 0 in both).
        dq_packed, dq_padded = packed()[0], padded()[0]
        n0 = lens[0]
        err = (dq_packed[:n0].float() - dq_padded[0, :, :n0].transpose(0, 1).float()).abs().max()
        res = timing.time_rounds({"padded": padded, "packed": packed}, rounds=rounds, inner=1,
                                 graph=False)
        ref = res["padded"]
        for name, t in res.items():
            r, lo, hi = ratio_ci(ref.samples, t.samples)
            rows.append(dict(mix=mix, B=len(lens), max_len=N, impl=name, median_ms=t.median_ms,
                             ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms, method=t.method,
                             ratio_padded=r, ratio_padded_lo=lo, ratio_padded_hi=hi,
                             dq_seq0_max_abs_diff=float(err)))
            print(f"{mix} {name:7s} {t.median_ms:.3f} ms  x padded {r:.3f} [{lo:.3f}, {hi:.3f}]"
                  f"  ({t.method}; dq diff {float(err):.2e})", flush=True)
        del q, k, v, qp, kp, vp, dout, doutp
        torch.cuda.empty_cache()
    return rows


QTILES_CFG = (1, 4, 8)
QTILES_CFG_MIXES = ("equal_32x1024", "equal_8x4096")


def run_qtiles_cfg(rounds: int) -> list[dict]:
    """E25: tile x query tiles per program, causal, against the padded square kernel."""
    from unittest import mock

    from flashattn import kernels
    from flashattn.config import Config
    from flashattn.varlen import attention_varlen
    rows = []
    scale = 1 / math.sqrt(D)
    for mix in QTILES_CFG_MIXES:
        lens, q, k, v, cu = _packed(mix)
        N = max(lens)
        square, square_config = _square_padded(q, k, v, cu, N, True, scale)
        calls = {"square_padded": square}

        def packed(conf, qt):
            with mock.patch.object(kernels, "VARLEN_Q_TILES", {"sm_90": qt}), \
                    mock.patch.object(kernels, "VARLEN_Q_TILES_BELOW", 10 ** 9):
                return attention_varlen(q, k, v, cu, cu, N, N, causal=True, scale=scale,
                                        check_values=False, config=conf)
        for c in VARLEN_CONFIGS:
            conf = Config.parse(c)
            for qt in QTILES_CFG:
                calls[f"{c} q_tiles={qt}"] = (lambda conf=conf, qt=qt: packed(conf, qt))
        got = _time(calls, rounds, "square_padded")
        for name, t in got.items():
            rows.append(dict(mix=mix, causal=True, impl=name,
                             square_config=square_config, **t))
            print(f"{mix} {name:34s} {t['median_ms']:.4f} ms  x padded "
                  f"{t['ratio_square_padded']:.3f}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("splits", "combine", "varlen", "qtiles", "varlen_bwd",
                                       "qtiles_cfg"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("error: experiments/decode_sweep.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from flashattn.env import metadata
    t0 = time.perf_counter()
    rows = {"splits": run_splits, "combine": run_combine, "varlen": run_varlen,
            "qtiles": run_qtiles, "varlen_bwd": run_varlen_bwd,
            "qtiles_cfg": run_qtiles_cfg}[a.part](a.rounds)
    meta = metadata("python experiments/decode_sweep.py " + " ".join(argv or sys.argv[1:]))
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
