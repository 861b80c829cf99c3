"""E27: programmatic dependent launch (PDL) between the decode's split and combine kernels and
between the backward's three kernels, against the same launches without it, in one run.

    python experiments/pdl_sweep.py --part decode --out experiments/data/38-pdl/decode.json
    python experiments/pdl_sweep.py --part bwd --out experiments/data/38-pdl/bwd.json

Prediction (from the compile report, before timing): the combine launched as a dependent of
the split kernel starts without the launch gap, a fixed ~1-3 µs per decode step, so the gain is
largest at B=1-8 with 1K-4K caches (a 10-20 µs step) and vanishes at long caches; the early
signal (``DECODE_PDL_TRIGGER``) changes the split kernel's compiled loop (shared memory 83 KB
-> 216 KB on sm_90), so it may lose what the launch saves. The backward's dependent launches
save two gaps per call (~0.1-0.5 % of a 1K-16K backward): below the control's resolution
except perhaps at 1K.

Every variant is timed in the same rounds as its baseline and a second copy of the baseline
(``base#2``, the control) with ``measure.timing.time_rounds`` (idle start, random order per
round); answers are checked equal to the baseline's (bit for bit) before timing. Writes one
JSON document ({"meta", "rows"}); the verdict goes in experiments/LOG.md (E27).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DECODE_SHAPES = [(b, n) for b in (1, 8, 64) for n in (1024, 4096, 32768)]
BWD_SEQLENS = (1024, 4096, 16384)
HQ, HKV, D = 32, 8, 128


def _flags(**flags):
    """A context setting the book's switches (``flashbook.ladder.variants``, restored after)."""
    from contextlib import ExitStack

    from flashbook.ladder import variants
    stack = ExitStack()
    for k, v in flags.items():
        stack.enter_context(mock.patch.object(variants, k, v))
    return stack


def _wrap(fn, **flags):
    def call():
        with _flags(**flags):
            return fn()
    return call


def _time(calls: dict, rounds: int, ref: str) -> dict:
    from flashattn.stats import ratio_ci
    from flashattn import timing
    from flashbook.measure.harness import estimate_ms
    from flashbook.measure.workload import SAMPLE_MS
    est = estimate_ms(calls)
    inner = max(1, min(10, round(SAMPLE_MS / max(min(est.values()), 1e-3))))
    res = timing.time_rounds(calls, rounds=rounds, inner=inner)
    out = {}
    for name, t in res.items():
        r, lo, hi = ratio_ci(res[ref].samples, t.samples)
        out[name] = dict(median_ms=t.median_ms, ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms,
                         speedup=r, speedup_lo=lo, speedup_hi=hi, inner=inner)
    return out


def _equal(calls: dict, ref: str) -> dict:
    """Each call's answer equal, bit for bit, to ``ref``'s."""
    import torch
    want = calls[ref]().clone()
    res = {}
    for name, fn in calls.items():
        got = fn()
        torch.cuda.synchronize()
        res[name] = bool(torch.equal(got, want))
    return res


def run_decode(rounds: int) -> list[dict]:
    import torch

    from flashattn.decoding import decode
    from flashbook.ladder.variants import decode as ladder_decode
    from flashbook.measure.libraries import library_fn
    rows = []
    for B, N in DECODE_SHAPES:
        g = torch.Generator(device="cuda").manual_seed(B * 13 + N)
        q = torch.randn(B, HQ, 1, D, generator=g, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(B, HKV, N, D, generator=g, device="cuda", dtype=torch.float16)
                for _ in range(2))
        lens = torch.full((B,), N, dtype=torch.int32, device="cuda")
        base = lambda: decode(q, k, v, lens)                      # noqa: E731
        ladder = lambda: ladder_decode(q, k, v, lens)             # noqa: E731
        calls = {"base": base, "base#2": lambda: decode(q, k, v, lens),
                 "pdl": _wrap(ladder, DECODE_PDL=True),
                 "pdl_trigger": _wrap(ladder, DECODE_PDL=True, DECODE_PDL_TRIGGER=True)}
        same = _equal(calls, "base")
        try:
            fn, ctx = library_fn("sdpa_flash", q, k, v, causal=False, scale=1 / math.sqrt(D))

            def lib(fn=fn, ctx=ctx):
                with ctx():
                    return fn()
            lib()
            calls["sdpa_flash"] = lib
        except Exception as e:
            rows.append(dict(B=B, Nk=N, impl="sdpa_flash", error=f"{type(e).__name__}: {e}"[:200]))
        got = _time(calls, rounds, "base")
        for name, t in got.items():
            rows.append(dict(B=B, Nk=N, impl=name, equal_to_base=same.get(name), **t))
            print(f"decode B={B:3d} Nk={N:6d} {name:12s} {t['median_ms'] * 1e3:8.1f} us  "
                  f"x base {t['speedup']:.3f} [{t['speedup_lo']:.3f}, {t['speedup_hi']:.3f}]"
                  f"  equal={same.get(name)}", flush=True)
    return rows


def run_bwd(rounds: int) -> list[dict]:
    import torch

    from flashattn.autograd import attention_forward
    from flashattn.launch_bwd import attention_backward
    from flashbook.ladder.variants import attention_backward as ladder_backward
    B, H = 4, 32
    scale = 1 / math.sqrt(D)
    rows = []
    for N in BWD_SEQLENS:
        for causal in (True, False):
            g = torch.Generator(device="cuda").manual_seed(N + causal)
            q, k, v, do = (torch.randn(B, H, N, D, generator=g, device="cuda",
                                       dtype=torch.float16) for _ in range(4))
            with torch.no_grad():
                out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
            grads = tuple(torch.empty_like(t) for t in (q, k, v))

            def base(grads=grads, q=q, k=k, v=v, do=do, out=out, lse=lse, causal=causal):
                return attention_backward(q, k, v, out, do, lse, causal=causal, scale=scale,
                                          grads=grads)
            def ladder(grads=grads, q=q, k=k, v=v, do=do, out=out, lse=lse, causal=causal):
                return ladder_backward(q, k, v, out, do, lse, causal=causal, scale=scale,
                                       grads=grads)
            calls = {"base": base, "base#2": base, "pdl_wait": _wrap(ladder, BWD_PDL=1),
                     "pdl_overlap": _wrap(ladder, BWD_PDL=2)}
            ref = [t.clone() for t in base()]
            same = {}
            for name, fn in calls.items():
                got = fn()
                torch.cuda.synchronize()
                same[name] = all(torch.equal(a, b) for a, b in zip(got, ref))
            got = _time(calls, rounds, "base")
            for name, t in got.items():
                rows.append(dict(N=N, causal=causal, impl=name, equal_to_base=same[name], **t))
                print(f"bwd N={N:6d} causal={causal!s:5s} {name:11s} {t['median_ms']:8.3f} ms  "
                      f"x base {t['speedup']:.3f} [{t['speedup_lo']:.3f}, {t['speedup_hi']:.3f}]"
                      f"  equal={same[name]}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("decode", "bwd"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("error: experiments/pdl_sweep.py needs a CUDA GPU", file=sys.stderr)
        return 1
    from flashattn.env import metadata
    t0 = time.perf_counter()
    rows = {"decode": run_decode, "bwd": run_bwd}[a.part](a.rounds)
    meta = metadata("python experiments/pdl_sweep.py " + " ".join(argv or sys.argv[1:]))
    meta["seconds"] = round(time.perf_counter() - t0, 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
