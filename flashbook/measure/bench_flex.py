"""FlexAttention on the GPU: ``flashattn.flex_attention`` against ``torch.compile(flex_attention)``
on the SAME BlockMask (chapter 13), B=4 H=32 D=128, N = 4K/8K/16K, fp16 and bf16, forward and
backward; and BLASST's time against the fraction of key tiles it skips.

Rows per workload (implementations in a fresh random order each round, L2 flushed and the GPU idle
before each sample: ``flashattn.timing.time_rounds``):

    flashattn.flex      ours, the BlockMask's partial/full blocks, the mod compiled in
    flashattn.flex#2    the same call again: the control (its gap to the first row is the noise)
    torch.flex          torch.compile(flex_attention) with the same BlockMask and mods
    flashattn.causal    our dense causal kernel (flashattn.attention(causal=True)): what a causal
                        mask costs without block masks or mods (same work as the causal row)

Pass "fwd" times the forward; pass "bwd" the backward alone (``torch.autograd.grad`` of an output
computed once outside the timing; FLOPs counted 2.5x the forward's, as ``bench --backward``).

Workloads: causal; sliding windows 256/1K/4K (causal); document masks of 2, 8, 64 documents
(causal inside each); prefix-LM (prefix N/4); softcap 50 (causal); ALiBi (causal).

    python -m flashbook record --part flex --out results/h200            # fwd, fp16 + bf16
    python -m flashbook record --part flex-backward --out results/h200   # bwd, fp16 + bf16
    python -m flashbook record --part blasst --out results/h200          # BLASST time vs skips
    python -m flashbook.measure.bench_flex --quick --out /tmp/flex       # N=8K, four workloads
    python -m flashbook.measure.bench_flex --dry-run --quick --out /tmp/x   # CPU: tiny shapes,
                                                                       # the interpreter, fake timing

Prints a table (ms, TFLOPS over the visited blocks, ratio torch.flex / flashattn.flex) and writes
flex_bench.json to --out. ``--budget-s`` stops starting new workloads past that many seconds
(compilation included: torch.compile compiles each mod and shape once, our kernels once per mod);
the JSON lists what was skipped.

BLASST (``--blasst``): inputs of three kinds (random; ``local``: each query aligned with its own
key; ``sink``: 16 keys every query attends to), causal and not, thresholds T off/16/8/4/2/1; per
row the time, the control (T off twice), and the fraction of visited key tiles the kernel skips,
computed from the same inputs by :func:`blasst_skipped` (the kernel's rule replayed in torch;
tests check it against the interpreter's count of V loads). Writes blasst_bench.json.
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

from .harness import error_text, max_abs_err


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
    """Timing of ``{name: fn}``: the benches' shared harness on a GPU (launches per sample from
    one call's estimate), or (dry run) host time with the same result keys."""
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

    def project(fns, rounds=10, **_):
        from .harness import check_once, rounds_per_sample, time_in_rounds
        est = {n: check_once(f, lambda o: {})["est_ms"] for n, f in fns.items()}
        timed, fail = time_in_rounds(fns, rounds=rounds, inner=rounds_per_sample(est, 5),
                                     seed=0)
        if fail:
            raise RuntimeError(f"timing failed: {fail}")
        return {n: dict(median_ms=t.median_ms, ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms,
                        method=t.method, samples=t.samples) for n, t in timed.items()}
    return project


BWD_FLOP_FACTOR = 2.5           # backward FLOPs per forward FLOP (five matmuls to two)
BLASST_KINDS = ("random", "local", "sink")
BLASST_THRESHOLDS = (None, 16.0, 8.0, 4.0, 2.0, 1.0)


def _parser():
    p = argparse.ArgumentParser(prog="python -m flashbook.measure.bench_flex",
                                description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--n", type=int, action="append", help="sequence lengths (default 4K 8K 16K)")
    p.add_argument("--dtype", action="append", choices=("float16", "bfloat16"),
                   help="repeatable (default float16)")
    p.add_argument("--pass", dest="passes", action="append", choices=("fwd", "bwd"),
                   help="repeatable (default fwd)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="N=8K and four workloads")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: tiny shapes through the interpreter, eager torch flex, fake timing")
    p.add_argument("--budget-s", type=float, default=330.0)
    p.add_argument("--no-torch", action="store_true", help="skip torch.compile(flex_attention)")
    p.add_argument("--blasst", action="store_true",
                   help="BLASST's time against its skipped fraction instead (blasst_bench.json)")
    p.add_argument("--name", default=None, help="output file name (default flex_bench.json, "
                   "blasst_bench.json with --blasst)")
    return p


def _shape(dry: bool):
    import torch
    if dry:
        return 1, 2, 32, "cpu"
    return 4, 32, 128, "cuda"


def _grad_fn(fwd, q, k, v, dout):
    """The backward alone: the forward runs once here, outside the timing."""
    import torch
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    out = fwd(qg, kg, vg)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    warnings.simplefilter("ignore")
    if a.blasst:
        return main_blasst(a, argv)
    import torch
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as torch_flex

    import flashattn
    from flashattn import interpret
    from flashattn.flex import flex_attention

    dry = a.dry_run
    B, H, D, device = _shape(dry)
    if dry:
        Ns = a.n or [256]
        ctx = interpret.enabled
    else:
        Ns = a.n or ([8192] if a.quick else [4096, 8192, 16384])
        import contextlib
        ctx = contextlib.nullcontext
        torch._dynamo.config.cache_size_limit = 256
    dtypes = [getattr(torch, d) for d in (a.dtype or ["float16"])]
    passes = a.passes or ["fwd"]
    tflex = torch_flex if dry else torch.compile(torch_flex, dynamic=False)
    timer = _timer(dry)
    t_start = time.perf_counter()
    rows, skipped = [], []

    def save(quiet=False):
        _write(a, argv, dry, rows, skipped, t_start, a.name or "flex_bench.json",
               dict(passes=passes, dtypes=[str(d).split(".")[-1] for d in dtypes]), quiet=quiet)

    for pas in passes:
        for dtype in dtypes:
            for N in Ns:
                g = torch.Generator(device="cpu").manual_seed(N)
                q, k, v, dout = (torch.randn(B, H, N, D, generator=g).to(device=device,
                                                                         dtype=dtype)
                                 for _ in range(4))
                for name, score, mask in workloads(N, a.quick):
                    dname = str(dtype).split(".")[-1]
                    if time.perf_counter() - t_start > a.budget_s:
                        skipped.append(f"{pas}/{dname}/{name}@{N}")
                        continue
                    row = _flex_row(pas, name, score, mask, q, k, v, dout, N=N, dry=dry,
                                    ctx=ctx, tflex=tflex, timer=timer, rounds=a.rounds,
                                    no_torch=a.no_torch, create_block_mask=create_block_mask,
                                    flex_attention=flex_attention, dense=flashattn.attention)
                    rows.append(row)
                    _print_row(row)
                    save(quiet=True)      # after every row: a stopped run keeps what it timed
    save()
    return 0


def _flex_row(pas, name, score, mask, q, k, v, dout, *, N, dry, ctx, tflex, timer, rounds,
              no_torch, create_block_mask, flex_attention, dense):
    """Time one workload: every implementation, checked against ours first."""
    import torch
    B, H, _, D = q.shape
    device = q.device
    score = score() if callable(score) and not hasattr(score, "tile") else score
    mask = mask() if callable(mask) and not hasattr(mask, "tile") else mask
    if mask is not None:
        mask = mask.to(device)
    if score is not None:
        score = score.to(device)
    blk = 64 if dry else 128
    bm = create_block_mask(mask, None, None, N, N, device=str(device), BLOCK_SIZE=blk)
    n_blocks = int(bm.kv_num_blocks.sum()) + int(bm.full_kv_num_blocks.sum())
    visited_pairs = n_blocks * blk * blk                  # per (batch, head)
    flops = 4.0 * B * H * D * visited_pairs * (BWD_FLOP_FACTOR if pas == "bwd" else 1.0)
    fwds = {"flashattn.flex": lambda q_, k_, v_: flex_attention(q_, k_, v_, score_mod=score,
                                                                block_mask=bm),
            "flashattn.flex#2": lambda q_, k_, v_: flex_attention(q_, k_, v_, score_mod=score,
                                                                  block_mask=bm)}
    if name == "causal" or not dry:
        fwds["flashattn.causal"] = lambda q_, k_, v_: dense(q_, k_, v_, causal=True)
    if not no_torch and not (dry and pas == "bwd"):     # PyTorch has no flex backward on CPU
        fwds["torch.flex"] = lambda q_, k_, v_: tflex(q_, k_, v_, score_mod=score, block_mask=bm)
    row = dict(workload=name, N=N, B=B, H=H, D=D, dtype=str(q.dtype).split(".")[-1],
               **{"pass": pas}, blocks=n_blocks, dense_blocks=(-(-N // blk)) ** 2,
               visited_flops=flops, impls={})
    errors, ok = {}, {}
    with ctx():
        for n, fwd in fwds.items():       # warm up: compile, and check agreement
            try:
                t0 = time.perf_counter()
                if pas == "bwd":
                    f = _grad_fn(fwd, q, k, v, dout)
                    o = f()[0]                       # dQ
                else:
                    f = (lambda fwd=fwd: fwd(q, k, v))
                    o = f()
                if not dry:
                    torch.cuda.synchronize()
                ok[n] = f
                row["impls"].setdefault(n, {})["first_call_s"] = round(
                    time.perf_counter() - t0, 2)
                row["impls"][n]["out"] = o
            except Exception as e:   # record, keep going
                errors[n] = error_text(e)
                ok.pop(n, None)
        ref = row["impls"].get("flashattn.flex", {}).pop("out", None)
        for n in list(row["impls"]):
            o = row["impls"][n].pop("out", None)
            if ref is not None and o is not None and n != "flashattn.causal":
                row["impls"][n]["max_diff_vs_ours"] = max_abs_err(o, ref)
        res = timer(ok, rounds=rounds) if ok else {}
    for n, t in res.items():
        row["impls"][n].update(t)
        row["impls"][n]["tflops_visited"] = flops / (t["median_ms"] * 1e-3) / 1e12
    row["errors"] = errors
    if "torch.flex" in res and "flashattn.flex" in res:
        row["speedup_vs_torch_flex"] = res["torch.flex"]["median_ms"] / \
            res["flashattn.flex"]["median_ms"]
    return row


def _write(a, argv, dry, rows, skipped, t_start, fname, extra, quiet=False):
    import torch
    meta = dict(device=("CPU (dry run, fake timing)" if dry else torch.cuda.get_device_name()),
                torch=torch.__version__, python=platform.python_version(),
                rounds=a.rounds, skipped=skipped, wall_s=round(time.perf_counter() - t_start, 1),
                **extra)
    if not dry:                        # driver, CUDA, cuda-tile, tileiras, GPU: as every dataset
        from flashattn.env import metadata
        meta = dict(metadata("python -m flashbook.measure.bench_flex " + " ".join(
            sys.argv[1:] if argv is None else argv)), **meta)
    a.out.mkdir(parents=True, exist_ok=True)
    tmp = a.out / f".{fname}.tmp"
    tmp.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1, default=str) + "\n")
    tmp.replace(a.out / fname)
    if not quiet:
        print(f"wrote {a.out / fname} ({len(rows)} rows, skipped {skipped or 'none'}"
          f", {meta['wall_s']} s)")


# --- BLASST: time against the skipped fraction ------------------------------------------------

def blasst_inputs(kind: str, B: int, H: int, N: int, D: int, *, dtype, device, seed: int = 0):
    """q, k, v of one kind: ``random`` (flat attention), ``local`` (each query aligned with its
    own key, a logit ~12 natural units above the rest), ``sink`` (16 keys with a logit ~20 for
    every query): the inputs of the chapter's accuracy study, at any size."""
    import torch
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    if kind == "local":
        q = 1.5 * k + 0.5 * q
    elif kind == "sink":
        u = torch.randn(D, generator=g)
        u = u / u.norm()
        k[:, :, :16] = 20.0 * u
        q = q + 8.0 * u
    elif kind != "random":
        raise ValueError(f"kind must be one of {BLASST_KINDS}, got {kind!r}")
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def blasst_skipped(q, k, T: float, block_mask=None, *, tile_m: int, tile_n: int,
                   scale: float | None = None) -> dict:
    """The fraction of visited key tiles the flex kernel's BLASST rule skips on these inputs.

    The kernel's rule, replayed in torch: for each query tile, the key tiles in the kernel's
    order (the BlockMask's partial blocks, then its full blocks; every tile without a mask), a
    tile is skipped when no row's maximum (log2 units, scale applied) exceeds that row's running
    maximum over the tiles before it minus ``T``. Masked entries of partial blocks are -inf
    (only causal masks are replayed: ``block_mask`` from ``create_block_mask`` over causal or
    None). Returns {"visited": tiles, "skipped": tiles, "fraction": skipped / visited}."""
    import torch
    B, H, N, D = q.shape
    Nk = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    log2e = 1.4426950408889634
    ntm, ntn = -(-N // tile_m), -(-Nk // tile_n)
    order = _tile_order(block_mask, ntm, ntn, tile_m, tile_n, q.device)   # (ntm, L) and valid
    idx, valid, partial = order
    visited = skipped = 0
    for b in range(B):
        for h in range(H):
            s = (q[b, h].float() @ k[b, h].float().T) * (scale * log2e)       # (N, Nk)
            if block_mask is not None:
                qi = torch.arange(N, device=q.device)[:, None]
                ki = torch.arange(Nk, device=q.device)[None, :]
                s = s.masked_fill(ki > qi, -math.inf)
            s = torch.nn.functional.pad(s, (0, ntn * tile_n - Nk, 0, ntm * tile_m - N),
                                        value=-math.inf)
            rmax = s.view(ntm * tile_m, ntn, tile_n).amax(-1)                 # (Mpad, ntn)
            rmax = rmax.view(ntm, tile_m, ntn)
            seq = torch.gather(rmax, 2, idx[:, None, :].expand(ntm, tile_m, idx.shape[1]))
            seq = seq.masked_fill(~valid[:, None, :], -math.inf)
            run = torch.cummax(seq, dim=2).values
            prev = torch.cat([torch.full_like(run[:, :, :1], -math.inf), run[:, :, :-1]], 2)
            need = (seq > prev - T).any(dim=1)                                # (ntm, L)
            visited += int(valid.sum())
            skipped += int((~need & valid).sum())
    return dict(visited=visited, skipped=skipped, fraction=skipped / max(visited, 1))


def _tile_order(block_mask, ntm, ntn, tile_m, tile_n, device):
    """Per query tile, the key tiles the kernel visits, in its order: (index, valid, partial)."""
    import torch
    if block_mask is None:
        idx = torch.arange(ntn, device=device).expand(ntm, ntn).contiguous()
        valid = torch.ones(ntm, ntn, dtype=torch.bool, device=device)
        return idx, valid, torch.zeros_like(valid)
    qbs, kbs = block_mask.BLOCK_SIZE
    qpb, tpb = qbs // tile_m, kbs // tile_n
    rows = []
    for t in range(ntm):
        qb = t // qpb
        num = int(block_mask.kv_num_blocks[0, 0, qb])
        blks = block_mask.kv_indices[0, 0, qb, :num].tolist()
        if block_mask.full_kv_num_blocks is not None:
            fn = int(block_mask.full_kv_num_blocks[0, 0, qb])
            blks += block_mask.full_kv_indices[0, 0, qb, :fn].tolist()
        rows.append([b * tpb + i for b in blks for i in range(tpb) if b * tpb + i < ntn])
    L = max(len(r) for r in rows)
    idx = torch.zeros(ntm, L, dtype=torch.long)
    valid = torch.zeros(ntm, L, dtype=torch.bool)
    for t, r in enumerate(rows):
        idx[t, :len(r)] = torch.tensor(r, dtype=torch.long)
        valid[t, :len(r)] = True
    return idx.to(device), valid.to(device), None


def main_blasst(a, argv) -> int:
    import torch
    from torch.nn.attention.flex_attention import create_block_mask

    from flashattn import interpret, mods
    from flashattn.flex import flex_attention
    dry = a.dry_run
    B, H, D, device = _shape(dry)
    Ns = a.n or ([256] if dry else [8192])
    dtype = getattr(torch, (a.dtype or ["float16"])[0])
    tile = (32, 32) if dry else (64, 128)
    ko = {"BLOCK_M": tile[0], "BLOCK_N": tile[1]}
    import contextlib
    ctx = interpret.enabled if dry else contextlib.nullcontext
    timer = _timer(dry)
    t_start = time.perf_counter()
    rows, skipped = [], []
    thresholds = BLASST_THRESHOLDS[:3] if a.quick else BLASST_THRESHOLDS
    for N in Ns:
        for kind in (BLASST_KINDS[1:2] if a.quick else BLASST_KINDS):
            q, k, v = blasst_inputs(kind, B, H, N, D, dtype=dtype, device=device)
            for causal in (False, True):
                if time.perf_counter() - t_start > a.budget_s:
                    skipped.append(f"{kind}/{'causal' if causal else 'full'}@{N}")
                    continue
                bm = (create_block_mask(mods.causal(), None, None, N, N, device=str(device),
                                        BLOCK_SIZE=128 if not dry else 64) if causal else None)
                fns, info, errors = {}, {}, {}
                with ctx():
                    ref = None
                    for T in thresholds:
                        name = "off" if T is None else f"T={T:g}"
                        f = (lambda T=T: flex_attention(q, k, v, block_mask=bm,
                                                        blasst_threshold=T, kernel_options=ko))
                        try:
                            o = f()
                        except Exception as e:
                            errors[name] = error_text(e)
                            continue
                        if ref is None:
                            ref = o
                            fns["off#2"] = f
                        fns[name] = f
                        sk = (blasst_skipped(q, k, T, bm, tile_m=tile[0], tile_n=tile[1])
                              if T is not None else dict(fraction=0.0, skipped=0, visited=None))
                        info[name] = dict(T=T, skipped_fraction=sk["fraction"],
                                          skipped_tiles=sk["skipped"], visited_tiles=sk["visited"],
                                          max_diff_vs_off=(o.float() - ref.float()).abs().max()
                                          .item())
                    info["off#2"] = dict(info.get("off", {}), T=None)
                    res = timer(fns, rounds=a.rounds) if fns else {}
                base = res.get("off", {}).get("median_ms")
                for name, t in res.items():
                    r = dict(kind=kind, causal=causal, N=N, B=B, H=H, D=D,
                             dtype=str(dtype).split(".")[-1], impl=name, tile=list(tile),
                             **info[name], **t)
                    if base:
                        r["speedup_vs_off"] = base / t["median_ms"]
                    rows.append(r)
                    print(f"{kind:>7} causal={causal!s:5} N={N} {name:>6}: skipped "
                          f"{r['skipped_fraction']:.1%}, {t['median_ms']:.3f} ms"
                          + (f", {r['speedup_vs_off']:.3f}x off" if base else ""), flush=True)
                if errors:
                    print(f"errors: {errors}", flush=True)
                    rows.append(dict(kind=kind, causal=causal, N=N, errors=errors))
    _write(a, argv, dry, rows, skipped, t_start, a.name or "blasst_bench.json",
           dict(thresholds=list(thresholds), kinds=list(BLASST_KINDS)))
    return 0


def _print_row(row):
    cells = []
    for n, t in row["impls"].items():
        if "median_ms" in t:
            cells.append(f"{n} {t['median_ms']:.3f} ms ({t['tflops_visited']:.0f} TF)")
    sp = row.get("speedup_vs_torch_flex")
    print(f"{row['pass']} {row['dtype']:>8} {row['workload']:>20} N={row['N']:>6} blocks {row['blocks']}/{row['dense_blocks']}: "
          + "; ".join(cells) + (f"; torch/ours {sp:.2f}x" if sp else "") +
          (f"; errors {row['errors']}" if row["errors"] else ""), flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
