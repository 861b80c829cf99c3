"""GPU benchmark of flashattn.flex_attention against torch.compile(flex_attention) on the SAME
BlockMask (issue 23), forward, B=4 H=32 D=128 fp16, N = 4K/8K/16K.

Rows per workload (one CUDA-graph batch per round, implementations in a fresh random order each
round, L2 flushed and the GPU idle before each sample: flashattn.timing.time_rounds, or
plain CUDA events if that module is not there):

    flashattn.flex      ours, the BlockMask's partial/full blocks, the mod compiled in
    flashattn.flex#2    the same call again: the control (its gap to the first row is the noise)
    torch.flex          torch.compile(flex_attention) with the same BlockMask and mods
    flashattn.causal    our dense causal kernel (flashattn.attention(causal=True)): what a causal
                        mask costs without block masks or mods (same work as the causal row)

Workloads: causal; sliding windows 256/1K/4K (causal); document masks of 2, 8, 64 documents
(causal inside each); prefix-LM (prefix N/4); softcap 50 (causal); ALiBi (causal).

    python experiments/flex_bench.py --out results/h200/flex           # ~6 min on an H200
    python experiments/flex_bench.py --quick --out /tmp/flex           # N=8K, four workloads
    python experiments/flex_bench.py --dry-run --quick --out /tmp/x    # CPU: tiny shapes, the
                                                                       # interpreter, fake timing

Prints a table (ms, TFLOPS over the visited blocks, ratio torch.flex / flashattn.flex) and writes
flex_bench.json to --out. ``--budget-s`` stops starting new workloads past that many seconds
(compilation included: torch.compile compiles each mod and shape once, our kernels once per mod);
the JSON lists what was skipped.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
import warnings
from pathlib import Path


def workloads(N: int, quick: bool):
    """(name, score_mod, mask_mod, causal_dense_equivalent) for sequence length N."""
    import torch
    from flashattn import mods

    def docs(n_docs):
        g = torch.Generator().manual_seed(n_docs)
        cuts = torch.randperm(N - 1, generator=g)[:n_docs - 1].add(1).sort().values
        ids = torch.zeros(N, dtype=torch.int32)
        for c in cuts.tolist():
            ids[c:] += 1
        return ids

    out = [("causal", None, mods.causal()),
           ("sliding_window_1K", None, mods.sliding_window(1024)),
           ("document_8", None, lambda: mods.document(docs(8), causal=True)),
           ("softcap_50", mods.softcap(50.0), mods.causal())]
    if quick:
        return out
    return out + [
        ("sliding_window_256", None, mods.sliding_window(256)),
        ("sliding_window_4K", None, mods.sliding_window(4096)),
        ("document_2", None, lambda: mods.document(docs(2), causal=True)),
        ("document_64", None, lambda: mods.document(docs(64), causal=True)),
        ("prefix_lm_N/4", None, mods.prefix_lm(N // 4)),
        ("alibi", lambda: mods.alibi(mods.alibi_slopes(32)), mods.causal()),
    ]


def _timer(dry: bool):
    """time_rounds-compatible timer: the project's, CUDA events, or (dry run) host time."""
    if dry:
        def fake(fns, rounds=2, **_):
            res = {}
            for n, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(rounds):
                    f()
                res[n] = dict(median_ms=(time.perf_counter() - t0) * 1e3 / rounds,
                              method="fake (CPU host time)")
            return res
        return fake
    try:
        from flashattn.timing import time_rounds

        def project(fns, rounds=10, **_):
            return {n: dict(median_ms=t.median_ms, ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms,
                            method=t.method, samples=t.samples)
                    for n, t in time_rounds(fns, rounds=rounds, inner=5).items()}
        return project
    except ImportError:
        import torch

        def events(fns, rounds=10, **_):
            import random
            samples = {n: [] for n in fns}
            for _ in range(rounds):
                order = list(fns)
                random.shuffle(order)
                for n in order:
                    torch.cuda.synchronize()
                    a, b = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                    a.record()
                    for _ in range(5):
                        fns[n]()
                    b.record()
                    b.synchronize()
                    samples[n].append(a.elapsed_time(b) / 5)
            return {n: dict(median_ms=sorted(s)[len(s) // 2], method="events", samples=s)
                    for n, s in samples.items()}
        return events


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, action="append", help="sequence lengths (default 4K 8K 16K)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="N=8K and four workloads")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: tiny shapes through the interpreter, eager torch flex, fake timing")
    p.add_argument("--budget-s", type=float, default=330.0)
    p.add_argument("--no-torch", action="store_true", help="skip torch.compile(flex_attention)")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    import flashattn
    from flashattn import interpret
    from flashattn.flex import flex_attention

    dry = a.dry_run
    if dry:
        B, H, D, device, dtype = 1, 2, 32, "cpu", torch.float16
        Ns = a.n or [256]
        ctx = interpret.enabled
    else:
        B, H, D, device, dtype = 4, 32, 128, "cuda", torch.float16
        Ns = a.n or ([8192] if a.quick else [4096, 8192, 16384])
        import contextlib
        ctx = contextlib.nullcontext
        torch._dynamo.config.cache_size_limit = 256
    tflex = torch_flex if dry else torch.compile(torch_flex, dynamic=False)
    timer = _timer(dry)
    t_start = time.perf_counter()
    rows, skipped = [], []
    for N in Ns:
        g = torch.Generator(device="cpu").manual_seed(N)
        q, k, v = (torch.randn(B, H, N, D, generator=g).to(device=device, dtype=dtype)
                   for _ in range(3))
        for name, score, mask in workloads(N, a.quick):
            if time.perf_counter() - t_start > a.budget_s:
                skipped.append(f"{name}@{N}")
                continue
            score = score() if callable(score) and not hasattr(score, "tile") else score
            mask = mask() if callable(mask) and not hasattr(mask, "tile") else mask
            if mask is not None:
                mask = mask.to(device)
            if score is not None:
                score = score.to(device)
            blk = 64 if dry else 128
            bm = create_block_mask(mask, None, None, N, N, device=device, BLOCK_SIZE=blk)
            n_blocks = int(bm.kv_num_blocks.sum()) + int(bm.full_kv_num_blocks.sum())
            visited_pairs = n_blocks * blk * blk                  # per (batch, head)
            flops = 4.0 * B * H * D * visited_pairs
            fns = {}
            with ctx():
                fns["flashattn.flex"] = lambda: flex_attention(q, k, v, score_mod=score,
                                                               block_mask=bm)
                fns["flashattn.flex#2"] = lambda: flex_attention(q, k, v, score_mod=score,
                                                                 block_mask=bm)
                if name == "causal" or not dry:
                    fns["flashattn.causal"] = lambda: flashattn.attention(q, k, v, causal=True)
                if not a.no_torch:
                    fns["torch.flex"] = lambda: tflex(q, k, v, score_mod=score, block_mask=bm)
                row = dict(workload=name, N=N, B=B, H=H, D=D, dtype=str(dtype).split(".")[-1],
                           blocks=n_blocks, dense_blocks=(-(-N // blk)) ** 2,
                           visited_flops=flops, impls={})
                errors = {}
                ok = {}
                for n, f in fns.items():       # warm up: compile, and check agreement
                    try:
                        t0 = time.perf_counter()
                        o = f()
                        if not dry:
                            torch.cuda.synchronize()
                        ok[n] = f
                        row["impls"].setdefault(n, {})["first_call_s"] = round(
                            time.perf_counter() - t0, 2)
                        row["impls"][n]["out"] = o
                    except Exception as e:   # record, keep going
                        errors[n] = f"{type(e).__name__}: {str(e)[:300]}"
                ref = row["impls"].get("flashattn.flex", {}).pop("out", None)
                for n in list(row["impls"]):
                    o = row["impls"][n].pop("out", None)
                    if ref is not None and o is not None and n != "flashattn.causal":
                        row["impls"][n]["max_diff_vs_ours"] = (o.float() - ref.float()).abs() \
                            .max().item()
                res = timer(ok, rounds=a.rounds) if ok else {}
            for n, t in res.items():
                row["impls"][n].update(t)
                row["impls"][n]["tflops_visited"] = flops / (t["median_ms"] * 1e-3) / 1e12
            row["errors"] = errors
            if "torch.flex" in res and "flashattn.flex" in res:
                row["speedup_vs_torch_flex"] = res["torch.flex"]["median_ms"] / \
                    res["flashattn.flex"]["median_ms"]
            rows.append(row)
            _print_row(row)
    meta = dict(device=("CPU (dry run, fake timing)" if dry else torch.cuda.get_device_name()),
                torch=torch.__version__, python=platform.python_version(),
                rounds=a.rounds, skipped=skipped, wall_s=round(time.perf_counter() - t_start, 1))
    if not dry:                        # driver, CUDA, cuda-tile, tileiras, GPU: as every dataset
        from flashattn.env import metadata
        meta = dict(metadata("python experiments/flex_bench.py " + " ".join(
            sys.argv[1:] if argv is None else argv)), **meta)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "flex_bench.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1,
                                                      default=str) + "\n")
    print(f"wrote {a.out / 'flex_bench.json'} ({len(rows)} workloads, skipped {skipped or 'none'}"
          f", {meta['wall_s']} s)")
    return 0


def _print_row(row):
    cells = []
    for n, t in row["impls"].items():
        if "median_ms" in t:
            cells.append(f"{n} {t['median_ms']:.3f} ms ({t['tflops_visited']:.0f} TF)")
    sp = row.get("speedup_vs_torch_flex")
    print(f"{row['workload']:>20} N={row['N']:>6} blocks {row['blocks']}/{row['dense_blocks']}: "
          + "; ".join(cells) + (f"; torch/ours {sp:.2f}x" if sp else "") +
          (f"; errors {row['errors']}" if row["errors"] else ""), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
