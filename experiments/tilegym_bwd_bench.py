"""Our backward at TileGym's tiles and with a split dK/dV loop: the shipped configuration, four
candidates, TileGym's backward and cuDNN's, in the same rounds (causal, B=4, H=32, D=128, fp16).

    python experiments/tilegym_bwd_bench.py --out OUT.json            # the H200 (~2 min cold)
    python experiments/tilegym_bwd_bench.py --dry                     # CPU: the interpreter

E38 measured NVIDIA TileGym's cuTile backward (tilegym 1.5.1) 1.07-1.10x faster than ours; its
autotuner kept 64x64 tiles with its default occupancy=2 hint for both its dK/dV and dQ kernels.
The candidates (``VARIANTS``) are ours at those tiles and that hint, and the dK/dV kernel of
``bwd_split_variant.py`` (``experiments/tilegym_bwd_sass.py`` has the SASS behind both).
TileGym's backward runs its own host code (``_fmha_backward``) with its tune caches filled with
the configuration its autotuner picked on the H200 (so no search runs), from our forward's
output and LSE (converted to its base-2 units). The backward alone, as ``bench --backward``'s
pass ``bwd``; ``timing.time_rounds`` (CUDA-graph batches, random order per round, idle start,
L2 flushed). ``--dry`` runs each of our variants and TileGym's backward once through the
interpreter at a small shape against the fp64 reference, without a GPU. The verdict goes in
experiments/LOG.md.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))      # bwd_split_variant

# (label, {kernel: Config string}, {kernel: function of experiments/bwd_split_variant.py}):
# the shipped configuration first. The split dK/dV kernel gives its masked (diagonal) query
# tiles their own loop; on sm_90 its SASS then overlaps the dP^T products with the
# exponentials, as TileGym's does and the library's does not (tilegym_bwd_sass.py).
VARIANTS = [
    ("shipped", {}, {}),
    ("both 64x64 occ=2", {"bwd_dkdv": "64x64 occ=2", "bwd_dq": "64x64 occ=2"}, {}),
    ("dkdv 64x64 occ=2", {"bwd_dkdv": "64x64 occ=2"}, {}),
    ("split dkdv", {}, {"bwd_dkdv": "bwd_dkdv_kernel"}),
    ("split dkdv, both 64x64 occ=2", {"bwd_dkdv": "64x64 occ=2", "bwd_dq": "64x64 occ=2"},
     {"bwd_dkdv": "bwd_dkdv_kernel"}),
]
VARIANT_MODULE = "bwd_split_variant"
TILEGYM_TILES = {"dkdv": (64, 64), "dq": (64, 64)}     # its H200 pick (E38), occupancy=2


def _configs(var):
    from flashattn.config import Config
    return {kname: Config.parse(c) for kname, c in var.items()}


def variant_backward(q, k, v, out, do, lse, *, scale, configs, kernels, grads, causal=True):
    """``attention_backward``'s launches with some kernels swapped for the same-signature
    variants of ``bwd_split_variant`` (the library's host rules: grids, constants, hints)."""
    import dataclasses

    import torch
    from flashattn.dispatch import launch_kernel
    from flashattn.kernels import hinted
    from flashattn.dispatch import device_arch
    from flashattn.launch_bwd import attention_backward, backward_launches
    if not kernels:
        return attention_backward(q, k, v, out, do, lse, causal=causal, scale=scale,
                                  grads=grads, configs=configs)
    dq, dk, dv = grads
    delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    launches = backward_launches(q, k, v, out, do, lse, delta, dq, dk, dv, causal=causal,
                                 scale=scale, input_pos=0, arch=device_arch(q.device),
                                 configs=configs)
    for x in launches:
        spec = x.spec
        if spec.name in kernels:
            spec = dataclasses.replace(spec, module=VARIANT_MODULE,
                                       function=kernels[spec.name])
        launch_kernel(q.device, x.grid, hinted(spec.kernel(), x.hints), x.args,
                      stream="current")
    return dq, dk, dv


def tilegym_backward():
    """TileGym's ``_fmha_backward`` and a function that fills its tune caches for one shape."""
    from types import SimpleNamespace

    from flashbook.measure import tilegym
    why = tilegym.available()
    if why:
        raise ImportError(why)
    A = tilegym._CACHE["mods"][0]
    kernels = {name: getattr(A, f"_fmha_bwd_{name}_kernel").replace_hints(occupancy=2)
               for name in TILEGYM_TILES}       # built once: replace_hints makes a new kernel

    def seed(q, k, causal):
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        # its two caches' keys (tilegym 1.5.1 _fmha_backward): dQ's has no kv-head count
        keys = {"dkdv": (B, Hq, Hkv, Nq, Nk, D, Hq // Hkv, causal, q.dtype, str(q.device)),
                "dq": (B, Hq, Nq, Nk, D, Hq // Hkv, causal, q.dtype, str(q.device))}
        for name, (tm, tn) in TILEGYM_TILES.items():
            cache = getattr(A, f"_fmha_bwd_{name}_tune_cache")
            cache[keys[name]] = (SimpleNamespace(TILE_M=tm, TILE_N=tn), kernels[name])
    return A._fmha_backward, seed


def dry() -> int:
    """CPU: every variant of ours and TileGym's backward through the interpreter at a small
    causal shape, checked against the fp64 reference."""
    import torch

    from flashattn import interpret, reference as R
    B, H, N, D = 1, 2, 160, 64
    scale = 1 / math.sqrt(D)
    g = torch.Generator().manual_seed(0)
    # GQA 2:1 and N not a tile multiple: the group loop and the ragged last key tile
    q, k, v, do = (torch.randn(B, h, N, D, generator=g).half() for h in (H, 1, 1, H))
    q64, k64, v64, do64 = (t.double() for t in (q, k, v, do))
    out = R.attention(q64, k64, v64, causal=True, scale=scale).half()
    lse = R.attention_lse(q64, k64, causal=True, scale=scale).float()
    want = R.attention_backward(q64, k64, v64, do64, causal=True, scale=scale)
    worst = 0.0
    with interpret.enabled():
        for label, var, kern in VARIANTS:
            grads = tuple(torch.full_like(t, math.nan) for t in (q, k, v))
            got = variant_backward(q, k, v, out, do, lse, scale=scale,
                                   configs=_configs(var) or None, kernels=kern, grads=grads)
            err = max(float((torch.as_tensor(gg).double() - torch.as_tensor(w)).abs().max())
                      for gg, w in zip(got, want))
            worst = max(worst, err)
            print(f"dry {label:30s} max |grad - fp64 reference| = {err:.2e}", flush=True)
    try:
        bwd, seed = tilegym_backward()
    except ImportError as e:
        print(f"dry tilegym: {e}", flush=True)
    else:
        # TileGym's host code as the GPU run calls it, its launches run by the interpreter
        # (cuda.tile.launch and torch's current stream stood in for, then put back); a search
        # would mean the filled tune cache was missed, so it is made to fail
        from flashbook.measure import tilegym
        A = tilegym._CACHE["mods"][0]
        saved = A.ct.launch, A.torch.cuda.current_stream, A.exhaustive_search
        A.ct.launch = lambda stream, grid, kernel, args: interpret.launch(grid, kernel, args)
        A.torch.cuda.current_stream = lambda *a, **kw: None
        A.exhaustive_search = None
        try:
            seed(q, k, True)
            got = bwd(q, k, v, out, do, (lse / math.log(2)).contiguous(), scale, True)
        finally:
            A.ct.launch, A.torch.cuda.current_stream, A.exhaustive_search = saved
        err = max(float((torch.as_tensor(gg).double() - torch.as_tensor(w)).abs().max())
                  for gg, w in zip(got, want))
        worst = max(worst, err)
        print(f"dry {'tilegym (its tuned 64x64)':30s} max |grad - fp64 reference| = {err:.2e}",
              flush=True)
    return 0 if worst < 2e-2 else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--seqlens", default="4096,16384")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--no-tilegym", action="store_true")
    p.add_argument("--no-cudnn", action="store_true")
    p.add_argument("--dry", action="store_true", help="CPU: the interpreter at a small shape")
    a = p.parse_args(argv)
    if a.dry:
        return dry()
    if not a.out:
        p.error("--out is required (or --dry)")
    import torch

    from flashattn import timing
    from flashattn.autograd import attention_forward
    from flashattn.env import metadata
    from flashattn.stats import ratio_ci
    from flashbook.measure.workload import SAMPLE_MS
    B, H, D = 4, 32, 128
    causal = True
    scale = 1 / math.sqrt(D)
    tg = None
    if not a.no_tilegym:
        try:
            tg = tilegym_backward()
        except ImportError as e:
            print("tilegym:", e, flush=True)
    doc = {"meta": metadata("python experiments/tilegym_bwd_bench.py " +
                            " ".join(argv or sys.argv[1:])),
           "workload": dict(B=B, H=H, D=D, dtype="float16", causal=causal),
           "variants": {lab: dict(configs=v, kernels=kn) for lab, v, kn in VARIANTS},
           "tilegym_tiles": TILEGYM_TILES, "runs": []}
    t_all = time.perf_counter()
    for N in (int(n) for n in a.seqlens.split(",")):
        sets = []
        for i in range(3):
            g = torch.Generator(device="cuda").manual_seed(N + 31 * i)
            q, k, v, do = (torch.randn(B, H, N, D, generator=g, device="cuda",
                                       dtype=torch.float16) for _ in range(4))
            with torch.no_grad():
                out, lse = attention_forward(q, k, v, causal=causal, scale=scale)
            sets.append((q, k, v, do, out, lse))
        calls, errs, ref = {}, {}, None
        for label, var, kern in VARIANTS:
            cfgs = _configs(var) or None
            fs = []
            for q, k, v, do, out, lse in sets:
                grads = tuple(torch.empty_like(t) for t in (q, k, v))
                fs.append(lambda q=q, k=k, v=v, do=do, out=out, lse=lse, grads=grads, cfgs=cfgs,
                          kern=kern:
                          variant_backward(q, k, v, out, do, lse, scale=scale, configs=cfgs,
                                           kernels=kern, grads=grads, causal=causal))
            try:
                got = fs[0]()
                torch.cuda.synchronize()
                if ref is None:
                    ref = [t.float() for t in got]
                errs[label] = max((x.float() - r).abs().max().item() for x, r in zip(got, ref))
                calls[label] = fs
            except Exception as e:      # a configuration that fails is a row
                doc["runs"].append(dict(N=N, variant=label, error=f"{type(e).__name__}: {e}"[:300]))
                print(N, label, "ERROR", e, flush=True)
        if tg is not None:
            bwd, seed = tg
            try:
                fs = []
                for q, k, v, do, out, lse in sets:
                    seed(q, k, causal)
                    lse2 = (lse * (1 / math.log(2))).contiguous()   # its LSE is in base 2
                    fs.append(lambda q=q, k=k, v=v, do=do, out=out, lse2=lse2:
                              bwd(q, k, v, out, do, lse2, scale, causal))
                got = fs[0]()
                torch.cuda.synchronize()
                errs["tilegym"] = max((x.float() - r).abs().max().item() for x, r in zip(got, ref))
                calls["tilegym"] = fs
            except Exception as e:
                doc["runs"].append(dict(N=N, variant="tilegym",
                                        error=f"{type(e).__name__}: {e}"[:300]))
                print(N, "tilegym ERROR", e, flush=True)
        if not a.no_cudnn:
            # cuDNN's backward from its own forward, exactly as bench --backward times it
            from flashbook.measure.bench_bwd import _make_fns
            lib_sets = [tuple(t.detach().requires_grad_(i < 3) for i, t in
                              enumerate((q, k, v, do))) for q, k, v, do, _, _ in sets]
            cud, ctx, _ = _make_fns("sdpa_cudnn", "bwd", lib_sets, causal=causal, scale=scale,
                                    fwd_step="best")

            def cudnn_call(cud=cud, ctx=ctx, it=[0]):
                it[0] += 1
                with ctx():
                    return cud[it[0] % len(cud)]()
            fns = {"sdpa_cudnn": cudnn_call}
        else:
            fns = {}
        for label, fs in calls.items():
            fns[label] = (lambda fs=fs, c=[0]: (c.__setitem__(0, c[0] + 1),
                                                fs[c[0] % len(fs)]())[1])
        est = timing.estimate_ms(fns)
        inner = min(max(1, min(10, round(SAMPLE_MS / max(e, 1e-3)))) for e in est.values())
        res = timing.time_rounds(fns, rounds=a.rounds, inner=inner)
        base = "sdpa_cudnn" if "sdpa_cudnn" in res else "shipped"
        for name, t in res.items():
            r, lo, hi = ratio_ci(res[base].samples, t.samples)
            rs = ratio_ci(res["shipped"].samples, t.samples)[0] if "shipped" in res else None
            doc["runs"].append(dict(N=N, variant=name, median_ms=t.median_ms, method=t.method,
                                    samples=t.samples, ratio_to=base, ratio=r, ratio_lo=lo,
                                    ratio_hi=hi, speedup_vs_shipped=rs,
                                    max_abs_diff_vs_shipped=errs.get(name)))
            print(f"N={N} {name:18s} {t.median_ms:8.3f} ms  x {base} {r:.3f} [{lo:.3f}, {hi:.3f}]"
                  f"  shipped/this {rs if rs is None else round(rs, 3)}"
                  f"  diff {errs.get(name)}", flush=True)
        del sets, calls, fns
        torch.cuda.empty_cache()
        # written after each length: a run cut by its time limit keeps what it measured
        doc["meta"]["seconds"] = round(time.perf_counter() - t_all, 1)
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(doc, indent=1))
    print("wrote", a.out, f"({doc['meta']['seconds']} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
