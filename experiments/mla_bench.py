"""MLA decoding at DeepSeek-V3's shape (issue 37): flashattn.flash_mla_with_kvcache against
PyTorch's paths on the same GPU, in the same rounds.

    python experiments/mla_bench.py results/h200/mla/decode.json            # the H200 run
    python experiments/mla_bench.py /tmp/mla_dry.json --dry-run             # CPU, interpreter

Shape: Sq 1 new token, Hq 128 query heads over one latent cache head of 576 values (512 latent,
which is also V, + 64 rotary), bf16, pages of 64 tokens in shuffled order, every sequence at the
cache length: B in {64, 128} x cache in {4K, 8K, 16K, 32K}, and the FP8 (e4m3) cache with a
per-sequence descale at B 64, 32K. Per row:

* ``flashattn``: ``flash_mla_with_kvcache`` with the metadata made once (as a model does per
  step); the FP8 row also times the bf16 cache at the same shape in the same rounds.
* ``sdpa``: PyTorch SDPA over the latent cache gathered contiguous (the gather is *not* timed:
  PyTorch's best case), K = the 576 columns, V = the first 512. PyTorch has no paged or
  latent-aware path, so the fastest formulation is chosen by a probe at the first shape (all
  recorded): ``rows`` puts the 128 heads as 128 query rows of one head (exact for Sq = 1: every
  head sees every key) under each SDPA backend; ``gqa`` is the literal (B, 128, 1, 576) query
  with ``enable_gqa=True`` over one K head (the default backend; PyTorch's fallback repeats K
  and V per query head, so the probe skips it where that would exceed ``GQA_EXPAND_MAX`` bytes
  and records why).
* ``flex``: ``torch.compile``'d ``flex_attention`` in the ``rows`` form, no mask, at a few shapes
  (``--flex``; it compiles per shape, ~30 s each) and only while the run is within its budget.

Timing: ``flashattn.timing.time_rounds`` (idle-start CUDA-graph batches, random order per round,
L2 flushed; median per call and its bootstrap 95 % interval). Derived: ``gbps`` = latent-cache
bytes read (B x cache x 576 x element bytes; Q and the output are < 0.1 % of it) / time,
``frac_peak`` against the GPU's datasheet HBM bandwidth (4.8 TB/s for an H200),
``speedup_vs_<impl>`` = that implementation's time / flashattn's, ``fp8_over_bf16`` = the bf16
time / the FP8 time at the FP8 row's shape, and ``max_err_vs_<impl>`` = max |flashattn -
impl| of the outputs (the FP8 row: against PyTorch on the bf16 cache it was quantised from, so
the error includes the quantisation). Sized for ~4 minutes on an H200 (``--rounds``).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import flashattn  # noqa: E402
from flashattn.env import metadata  # noqa: E402

HQ, HKV, SQ, D_LAT, D_ROPE, PAGE = 128, 1, 1, 512, 64, 64
D = D_LAT + D_ROPE
BATCHES = (64, 128)
CACHE_LENS = (4096, 8192, 16384, 32768)
FP8_ROW = (64, 32768)
FLEX_DEFAULT = {(64, 4096), (64, 32768)}
BUDGET_S = 200.0
GQA_EXPAND_MAX = 8e9       # bytes: the probe skips the literal GQA call beyond this           # flex shapes are skipped once the run has used this much
SDPA_BACKENDS = ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "FLASH_ATTENTION", "MATH")
# Dry run: the interpreter's shapes (the kernels' real head dims, a few heads and keys).
DRY = dict(hq=16, batches=(2,), cache_lens=(128, 200), fp8_row=(2, 200),
           flex={(2, 128)})


def hbm_peak_tbps(gpu: str | None):
    """(TB/s, source) of the GPU's datasheet HBM bandwidth, or (None, None)."""
    try:
        from flashbook.measure.decode_plan import HBM_PEAK_TBPS
    except ImportError:
        return None, None
    name = (gpu or "").lower()
    for key, (tbps, src) in HBM_PEAK_TBPS.items():
        if key in name:
            return tbps, src
    return None, None


def make_inputs(B, N, hq, *, device, gen_seed):
    """q, the contiguous latent (B, N, 576) and its paged copy with a shuffled block table."""
    g = torch.Generator(device=device).manual_seed(gen_seed)
    n_pages = -(-N // PAGE)
    q = torch.randn(B, SQ, hq, D, generator=g, device=device).to(torch.bfloat16)
    lat = torch.randn(B, n_pages * PAGE, D, generator=g, device=device).to(torch.bfloat16)
    perm = torch.randperm(B * n_pages, generator=g, device=device)
    table = perm.view(B, n_pages).to(torch.int32)
    cache = torch.empty(B * n_pages, PAGE, HKV, D, dtype=torch.bfloat16, device=device)
    cache[perm.long()] = lat.view(B * n_pages, PAGE, 1, D)
    lens = torch.full((B,), N, dtype=torch.int32, device=device)
    return q, lat[:, :N], cache, table, lens


def quantize(lat, cache, table):
    """The FP8 paged cache (e4m3, block table as the bf16 one's) and its (B,) descales."""
    lat8, descale = flashattn.quantize_fp8(lat[:, None])             # (B, 1, N, D), (B, 1)
    descale = descale.reshape(-1).contiguous()
    B, N = lat.shape[:2]
    n_pages = table.shape[1]
    pad = torch.zeros(B, n_pages * PAGE, D, dtype=lat8.dtype, device=lat.device)
    pad[:, :N] = lat8[:, 0]
    cache8 = torch.empty(cache.shape, dtype=lat8.dtype, device=lat.device)
    cache8[table.reshape(-1).long()] = pad.view(B * n_pages, PAGE, 1, D)
    return cache8, descale


def flash_fn(q, cache, table, lens, *, descale=None):
    meta, splits = flashattn.get_mla_metadata(lens, SQ * q.shape[2] // HKV, HKV)
    kw = {} if descale is None else dict(descale=descale)
    return (lambda: flashattn.flash_mla_with_kvcache(q, cache, table, lens, D_LAT, meta, splits,
                                                     causal=True, **kw)[0]), int(meta[0, 0])


def sdpa_fn(form, backend, q, lat):
    """SDPA over the contiguous latent; returns a callable giving (B, Sq, Hq, 512)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    sdpa = torch.nn.functional.scaled_dot_product_attention
    B, N = lat.shape[:2]
    k = lat.view(B, 1, N, D)
    v = k[..., :D_LAT]
    hq = q.shape[2]
    scale = D ** -0.5
    if form == "rows":          # Sq = 1: the heads are the rows of one head's attention
        qr = q.view(B, 1, SQ * hq, D)

        def call():
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return sdpa(qr, k, v, scale=scale).view(B, SQ, hq, D_LAT)
    else:                       # the literal MQA call
        qg = q.transpose(1, 2)                                      # (B, Hq, Sq, D)

        def call():
            return sdpa(qg, k, v, scale=scale, enable_gqa=True).transpose(1, 2)
    return call


def flex_fn(q, lat, *, compiled):
    from torch.nn.attention.flex_attention import flex_attention
    if compiled:
        from flashbook.measure.libraries import _flex_fn
        fa = _flex_fn()
    else:
        fa = flex_attention
    B, N = lat.shape[:2]
    hq = q.shape[2]
    qr = q.view(B, 1, SQ * hq, D)
    k = lat.view(B, 1, N, D)
    v = k[..., :D_LAT]
    return lambda: fa(qr, k, v, scale=D ** -0.5).view(B, SQ, hq, D_LAT)


def max_err(a, b) -> float:
    return float((a.float() - b.float()).abs().max())


def timed(fns: dict, *, dry: bool, rounds: int, inner: int) -> dict:
    """{name: Timing dict}: time_rounds on a GPU; one wall-clock call each in a dry run (not a
    measurement: the interpreter)."""
    if dry:
        out = {}
        for n, f in fns.items():
            t0 = time.perf_counter()
            f()
            out[n] = dict(wall_s_cpu=time.perf_counter() - t0, note="dry run: not a measurement")
        return out
    from flashattn.timing import time_rounds
    return {n: t.as_dict() for n, t in time_rounds(fns, rounds=rounds, inner=inner).items()}


def ms(t: dict):
    return t.get("median_ms")


def probe_sdpa(q, lat, ref, *, dry, rounds):
    """Every SDPA formulation at the first shape: error, or its time and error against
    flashattn. Returns (records, the fastest's (form, backend))."""
    cands = [("rows", b) for b in SDPA_BACKENDS] + [("gqa", "default")]
    recs, fns = {}, {}
    for form, be in cands:
        name = f"sdpa_{form}_{be.lower()}"
        expanded = q.shape[0] * q.shape[2] * lat.shape[1] * (D + D_LAT) * 2
        if form == "gqa" and q.is_cuda and expanded > GQA_EXPAND_MAX:
            # PyTorch's GQA fallback repeats K and V per query head: too large to capture.
            recs[name] = dict(form=form, backend=be, error=f"skipped: K and V expanded per "
                              f"head would take {expanded / 1e9:.0f} GB")
            continue
        f = sdpa_fn(form, be, q, lat)
        try:
            out = f()
            if q.is_cuda:
                torch.cuda.synchronize()
            recs[name] = dict(form=form, backend=be, max_err_vs_flashattn=max_err(out, ref))
            fns[name] = f
        except Exception as e:                 # a backend that refuses the shape, or OOM
            recs[name] = dict(form=form, backend=be, error=f"{type(e).__name__}: {str(e)[:300]}")
        if q.is_cuda:
            torch.cuda.empty_cache()
    if not fns:
        return recs, None
    t = timed(fns, dry=dry, rounds=rounds, inner=2)
    for n, tt in t.items():
        recs[n]["timing"] = tt
    key = (lambda n: t[n].get("wall_s_cpu")) if dry else (lambda n: ms(t[n]))
    best = min(fns, key=key)
    return recs, (recs[best]["form"], recs[best]["backend"])


def inner_for(nbytes: int) -> int:
    """Calls per timed batch: a batch of at least ~1 ms of HBM traffic at 4.8 TB/s."""
    return max(2, min(20, math.ceil(4.8e9 / max(nbytes, 1))))


def run(args) -> dict:
    dry = args.dry_run
    device = torch.device("cpu" if dry else "cuda")
    hq = DRY["hq"] if dry else HQ
    batches = DRY["batches"] if dry else BATCHES
    lens_ = DRY["cache_lens"] if dry else CACHE_LENS
    fp8_row = DRY["fp8_row"] if dry else FP8_ROW
    flex_rows = (DRY["flex"] if dry else
                 {(b, n) for b in batches for n in lens_} if args.flex == "all" else
                 set() if args.flex == "none" else FLEX_DEFAULT)
    meta = metadata(command=" ".join(sys.argv), device=device if not dry else None)
    peak, peak_src = hbm_peak_tbps(meta.get("gpu"))
    doc = dict(metadata=meta, dry_run=dry,
               shape=dict(Hq=hq, Hkv=HKV, Sq=SQ, D=D, Dv=D_LAT, page_size=PAGE, causal=True,
                          dtype="bfloat16", pages="shuffled"),
               hbm_peak_tbps=peak, hbm_peak_source=peak_src, rounds=args.rounds, rows=[])
    t_start = time.perf_counter()
    choice = None
    shapes = [(b, n) for b in batches for n in lens_]
    for i, (B, N) in enumerate(shapes):
        q, lat, cache, table, lens = make_inputs(B, N, hq, device=device, gen_seed=1000 + i)
        nbytes = B * N * D * 2
        flash, splits = flash_fn(q, cache, table, lens)
        ref = flash()
        fns = {"flashattn": flash}
        row = dict(B=B, cache_len=N, kv_dtype="bfloat16", bytes=nbytes, num_splits=splits)
        if choice is None:
            doc["sdpa_probe"], choice = probe_sdpa(q, lat, ref, dry=dry, rounds=5)
            doc["sdpa_choice"] = None if choice is None else dict(form=choice[0],
                                                                   backend=choice[1])
            print(f"SDPA probe at B={B} N={N}: " + ", ".join(
                f"{k}: {v.get('error', 'ok')[:60] if 'error' in v else ms(v.get('timing', {}))}"
                for k, v in doc["sdpa_probe"].items()) + f" -> {choice}", flush=True)
        errs = {}
        if choice is not None:
            fns["sdpa"] = sdpa_fn(choice[0], choice[1], q, lat)
            errs["sdpa"] = max_err(ref, fns["sdpa"]())
        if (B, N) in flex_rows:
            if time.perf_counter() - t_start > BUDGET_S and not dry:
                row["flex_error"] = "skipped: the run's time budget was spent"
            else:
                try:
                    f = flex_fn(q, lat, compiled=not dry)
                    errs["flex"] = max_err(ref, f())
                    fns["flex"] = f
                except Exception as e:
                    row["flex_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        fp8 = (B, N) == tuple(fp8_row)
        if fp8:
            cache8, descale = quantize(lat, cache, table)
            flash8, _ = flash_fn(q, cache8, table, lens, descale=descale)
            fns["flashattn_fp8"] = flash8
            out8 = flash8()
            for k in [k for k in fns if k not in ("flashattn", "flashattn_fp8")]:
                errs[f"fp8_vs_{k}"] = max_err(out8, fns[k]())
            errs["fp8_vs_flashattn_bf16"] = max_err(out8, ref)
        t = timed(fns, dry=dry, rounds=args.rounds, inner=inner_for(nbytes))
        row["timing"] = t
        row["max_err"] = errs
        tf = ms(t["flashattn"])
        if tf:
            row["ms"] = {k: ms(v) for k, v in t.items()}
            row["gbps"] = nbytes / tf / 1e6
            row["frac_peak"] = row["gbps"] / (peak * 1e3) if peak else None
            for k in t:
                if k not in ("flashattn", "flashattn_fp8"):
                    row[f"speedup_vs_{k}"] = ms(t[k]) / tf
            if fp8:
                t8 = ms(t["flashattn_fp8"])
                row["fp8_ms"] = t8
                row["fp8_bytes"] = nbytes // 2
                row["fp8_gbps"] = nbytes / 2 / t8 / 1e6
                row["fp8_over_bf16"] = tf / t8
        doc["rows"].append(row)
        print(f"B={B:4} N={N:6}{' +fp8' if fp8 else ''}: " + "  ".join(
            f"{k} {ms(v):.4g} ms" if ms(v) else f"{k} {v.get('wall_s_cpu', 0):.2f} s (cpu)"
            for k, v in t.items()) + (f"  {row['gbps']:.0f} GB/s" if "gbps" in row else "") +
            "  err " + " ".join(f"{k}={v:.2g}" for k, v in errs.items()), flush=True)
        del q, lat, cache, table, lens, fns
        if not dry:
            torch.cuda.empty_cache()
    doc["elapsed_s"] = time.perf_counter() - t_start
    return doc


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--flex", choices=("default", "all", "none"), default="default")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny shapes on the CPU through the interpreter (checks the script)")
    args = p.parse_args(argv)
    if args.dry_run:
        with flashattn.interpret.enabled():
            doc = run(args)
    else:
        if not torch.cuda.is_available():
            p.error("needs a CUDA GPU (or --dry-run)")
        doc = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {out} ({doc['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
