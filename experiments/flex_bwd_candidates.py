"""The flex backward's candidate variants against the current one, on the H200, in one process.

Times ``torch.autograd.grad`` of one flex forward (computed outside the timing, as
``flashbook.measure.bench_flex``'s backward pass) for each ``flashbook.ladder.flex_variants``
entry (``flex_variants.flex_attention(..., variant=)``), the current backward twice (``mn`` and its control
``mn#2``) and, on the causal rows, our dense causal backward (``flashattn.attention(causal=
True)``): the same rounds of the shared harness (``time_in_rounds``, random order per round, L2
flushed, the GPU idle before each sample). Every candidate's dQ, dK, dV are checked against the
current backward's (max |diff| / max |current|).

Variants (flashbook/ladder/flex_variants.py; the library ships "t-all"):
    mn          the current backward: dQ and dK/dV on [queries, keys] tiles, Delta by torch
    mn+delta    the same kernels, Delta by the dense backward's preprocess kernel
    t-dq        dQ in the dense backward's shape, dK/dV as now, Delta by the kernel
    t           both kernels in the dense backward's shape (dK/dV on transposed tiles, 64x128),
                Delta by the kernel

Workloads (bench_flex's definitions, BlockMask 128): causal, sliding_window_256, document_64,
sliding_window_1K at N=8K, then causal at 16K while the budget lasts; B=4 H=32 D=128 fp16.

    source .gpu/activate.sh
    python experiments/flex_bwd_candidates.py --out $OUT/fbc --budget-s 130
    python experiments/flex_bwd_candidates.py --dry-run --out /tmp/fbc   # CPU: the interpreter,
                                                                       # tiny shapes, fake timing

Writes DIR/flex_bwd_candidates.json and DIR/flex_bwd_candidates.log; prints one line per
implementation and a summary per workload. ``--budget-s``: no new workload starts past it
(compilation counts; the JSON lists what was skipped).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WORKLOADS = (("causal", 8192), ("sliding_window_256", 8192), ("document_64", 8192),
             ("sliding_window_1K", 8192), ("causal", 16384))
DEFAULT_VARIANTS = ("mn+delta", "t-dq", "t")     # "t-all" is "t" without a score function
DRY_WORKLOADS = (("causal", 256), ("sliding_window_256", 256), ("document_64", 256))


def _parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: the interpreter, B=1 H=2 D=32 N=256, fake (host) timing")
    p.add_argument("--budget-s", type=float, default=130.0)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--variant", action="append", default=None,
                   help="variants to time besides mn (default: mn+delta, t-dq, t)")
    p.add_argument("--no-dense", action="store_true", help="skip our dense causal backward")
    return p


def _grad_fn(fwd, q, k, v, dout):
    """The backward alone: the forward runs once here, outside the timing."""
    import torch
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = fwd(qg, kg, vg)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)


def _diff(a, b) -> float:
    """max |a - b| / max |b| over dQ, dK, dV (the worst of the three)."""
    worst = 0.0
    for x, y in zip(a, b):
        scale = max(float(y.float().abs().max()), 1e-6)
        worst = max(worst, float((x.float() - y.float()).abs().max()) / scale)
    return worst


def _time(fns: dict, *, dry: bool, rounds: int) -> dict:
    if dry:
        res = {}
        for n, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(2):
                f()
            res[n] = dict(median_ms=(time.perf_counter() - t0) * 1e3 / 2,
                          method="fake (CPU host time)")
        return res
    from flashbook.measure.harness import check_once, rounds_per_sample, time_in_rounds
    est = {n: check_once(f, lambda o: {})["est_ms"] for n, f in fns.items()}
    timed, fail = time_in_rounds(fns, rounds=rounds, inner=rounds_per_sample(est, 5), seed=0)
    if fail:
        raise RuntimeError(f"timing failed: {fail}")
    return {n: dict(median_ms=t.median_ms, ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms,
                    method=t.method, samples=t.samples) for n, t in timed.items()}


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    warnings.simplefilter("ignore")
    import contextlib

    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    import flashattn
    from flashattn import interpret
    from flashbook.ladder.flex_variants import VARIANTS as FLEX_BWD_VARIANTS, flex_attention
    from flashbook.measure.bench_flex import workloads

    dry = a.dry_run
    variants = a.variant or list(DEFAULT_VARIANTS)
    for v in variants:
        if v not in FLEX_BWD_VARIANTS:
            raise SystemExit(f"unknown variant {v!r}; choose from {', '.join(FLEX_BWD_VARIANTS)}")
    if dry:
        B, H, D, device, blk, plan = 1, 2, 32, "cpu", 64, DRY_WORKLOADS
        ctx = interpret.enabled
    else:
        B, H, D, device, blk, plan = 4, 32, 128, "cuda", 128, WORKLOADS
        ctx = contextlib.nullcontext
    dtype = torch.float16
    a.out.mkdir(parents=True, exist_ok=True)
    log_lines = []

    def say(msg):
        print(msg, flush=True)
        log_lines.append(msg)
        (a.out / "flex_bwd_candidates.log").write_text("\n".join(log_lines) + "\n")

    t_start = time.perf_counter()
    rows, skipped = [], []

    def save():
        meta = dict(device="CPU (dry run, fake timing)" if dry else torch.cuda.get_device_name(),
                    B=B, H=H, D=D, dtype="float16", block=blk, rounds=a.rounds,
                    variants=["mn", "mn#2", *variants], skipped=skipped,
                    wall_s=round(time.perf_counter() - t_start, 1))
        if not dry:
            from flashattn.env import metadata
            meta = dict(metadata("python experiments/flex_bwd_candidates.py " +
                                 " ".join(sys.argv[1:] if argv is None else argv)), **meta)
        tmp = a.out / ".flex_bwd_candidates.json.tmp"
        tmp.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str) + "\n")
        tmp.replace(a.out / "flex_bwd_candidates.json")

    inputs = {}
    for name, N in plan:
        if time.perf_counter() - t_start > a.budget_s:
            skipped.append(f"{name}@{N}")
            say(f"skip {name} N={N}: past the budget ({a.budget_s:.0f} s)")
            continue
        if N not in inputs:
            inputs.clear()
            g = torch.Generator(device=device).manual_seed(N)      # on the GPU: seconds saved
            inputs[N] = tuple(torch.randn(B, H, N, D, generator=g, device=device).to(dtype)
                              for _ in range(4))
        q, k, v, dout = inputs[N]
        mods_by_name = {n: (s, m) for n, s, m in workloads(N, False)}
        score, mask = mods_by_name[name]
        mask = mask() if callable(mask) and not hasattr(mask, "tile") else mask
        mask = mask.to(device)
        bm = create_block_mask(mask, None, None, N, N, device=str(device), BLOCK_SIZE=blk)
        n_blocks = int(bm.kv_num_blocks.sum()) + int(bm.full_kv_num_blocks.sum())
        row = dict(workload=name, N=N, blocks=n_blocks, dense_blocks=(-(-N // blk)) ** 2,
                   impls={}, errors={})

        def flex_fwd(variant):
            return lambda q_, k_, v_: flex_attention(q_, k_, v_, block_mask=bm,
                                                     variant=variant)
        fwds = {"mn": flex_fwd("mn"), "mn#2": flex_fwd("mn")}
        fwds.update({v: flex_fwd(v) for v in variants})
        if name == "causal" and not a.no_dense:
            fwds["dense causal"] = lambda q_, k_, v_: flashattn.attention(q_, k_, v_,
                                                                          causal=True)
        ok, ref = {}, None
        with ctx():
            for n, fwd in fwds.items():
                try:
                    t0 = time.perf_counter()
                    f = _grad_fn(fwd, q, k, v, dout)
                    grads = f()
                    if not dry:
                        torch.cuda.synchronize()
                    row["impls"][n] = dict(first_call_s=round(time.perf_counter() - t0, 2))
                    if n == "mn":
                        ref = grads
                    elif ref is not None:
                        row["impls"][n]["rel_diff_vs_mn"] = _diff(grads, ref)
                    ok[n] = f
                except Exception as e:       # record, keep going
                    row["errors"][n] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                    say(f"  {name} N={N} {n}: ERROR {row['errors'][n]}")
            try:
                res = _time(ok, dry=dry, rounds=a.rounds)
            except Exception as e:
                res = {}
                row["errors"]["timing"] = f"{type(e).__name__}: {e}"[:300]
                say(f"  {name} N={N}: timing failed: {row['errors']['timing']}")
        for n, t in res.items():
            row["impls"][n].update(t)
        base = res.get("mn", {}).get("median_ms")
        for n, t in res.items():
            if base:
                row["impls"][n]["speedup_vs_mn"] = base / t["median_ms"]
            imp = row["impls"][n]
            say(f"{name:>18} N={N:>6} {n:>12}: {t['median_ms']:8.3f} ms"
                + (f"  x{imp['speedup_vs_mn']:.3f} vs mn" if base else "")
                + (f"  diff {imp['rel_diff_vs_mn']:.1e}" if "rel_diff_vs_mn" in imp else "")
                + f"  (first call {imp['first_call_s']} s, {t.get('method', '')})")
        if "dense causal" in res:
            d = res["dense causal"]["median_ms"]
            say(f"{name:>18} N={N:>6} time / dense causal: " + ", ".join(
                f"{n} {t['median_ms'] / d:.2f}" for n, t in res.items() if n != "dense causal"))
        rows.append(row)
        save()
    save()
    say(f"wrote {a.out / 'flex_bwd_candidates.json'} ({len(rows)} rows, skipped "
        f"{skipped or 'none'}, {time.perf_counter() - t_start:.1f} s)")
    bad = [(r["workload"], r["N"], n) for r in rows for n, i in r["impls"].items()
           if i.get("rel_diff_vs_mn", 0.0) > 2e-2 or not math.isfinite(i.get("rel_diff_vs_mn", 0))]
    if bad:
        say(f"DISAGREE with mn (rel diff > 2e-2): {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
