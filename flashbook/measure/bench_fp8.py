"""FP8 on the GPU (issue 24): the FP8 forward against our fp16 kernel and cuDNN, and decoding
over an FP8 KV cache against the fp16 cache. For the lead to run on the H200 (~4-5 min).

    python -m flashbook.measure.bench_fp8 --out results/h200/fp8.json          # both parts
    python -m flashbook.measure.bench_fp8 --part forward --d 128 --d 64        # forward only
    python -m flashbook.measure.bench_fp8 --dry-run --out /tmp/fp8-dry.json    # CPU, interpreter

Forward: FlashAttention-3's benchmark shapes (B = 16K / N sequences, H = 2048 / D heads), N 1K
to 16K, causal and not, D=128 (``--d`` repeatable). Rows:

* ``fp8``        the FP8 forward, V transposed on the host each call (the transpose timed);
* ``fp8-vt``     the FP8 forward given V already transposed (B, H, D, N): the kernel alone;
* ``fp8-vk``     the FP8 forward reading V as (N, D), the transpose done by the compiler on chip;
* ``fp16``       ``flashattn.attention`` (step "best") on fp16 inputs; ``fp16#2`` the same
                 again: the control (two readings of one kernel; differences smaller than
                 their gap are noise);
* ``cudnn``      torch SDPA on fp16 inputs with the cuDNN backend only;
* ``fa2``        torch SDPA on fp16 inputs with the FlashAttention-2 backend only;
* ``fp8-vt@CFG`` at the longest N only: ``fp8-vt`` with the tile configuration CFG instead of
                 the arch's default (``--configs``; default ``FP8_ALT_CONFIGS``
                 for the GPU's arch, ``--configs none`` for none): which tiles the lead should
                 make the default;
* ``quant-v`` / ``quant-vt`` at the longest N only: ``quantize_fp8(v)`` and
                 ``quantize_fp8(v, v_transposed=True)`` (V quantised straight into the layout
                 ``fp8-vt`` reads): what V^T costs a caller who quantises anyway.

Decode: B in 8, 64, 1 (``--batch``); caches 4K to 128K (``--cache``; every sequence full),
GQA 32:8, Nq=1, D=128; ``decode-fp16`` (``flashattn.decode``, fp16 cache), ``decode-fp16#2``
(control), ``decode-fp8`` (e4m3 cache with descales, V as K: the tiles widened to fp16 on
chip), ``decode-fp8-mma`` (the same cache with V stored transposed, ``decode(...,
v_transposed=True)``: both products on FP8 tensor cores); ``--decode-impls`` picks rows.
Reported with the bytes of K and V read per step, the bandwidth that makes, and the ratios
to ``decode-fp16`` and ``decode-fp8``. The decode part alone, for the lead (~2 min):

    python -m flashbook.measure.bench_fp8 --part decode --budget-s 100 --out $OUT/fp8dec.json

Timing is the benches' shared harness (``harness.time_in_rounds``, chapter 3's method: CUDA-graph
batches after an L2 flush and an idle GPU, every row once per round in a fresh random order, the
median over rounds with a bootstrap interval). The recordings before 2026-12-02's second run
used an equivalent self-contained CUDA-event loop (no graphs, no intervals). A budget (``--budget-s``, default 270) stops adding shapes when spent and says which
were skipped. Every row is checked once against a reference first (max |error| in the JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


# --- timing: the benches' shared harness (chapter 3's method) ---------------------------------
class Timer:
    """``rounds(fns, rounds)``: on a GPU the harness's timing (``timing.time_rounds``: CUDA-graph
    batches on an idle GPU, a fresh random order every round, bootstrap intervals), launches per
    sample from one call's estimate; on the CPU (the dry run) wall time per call."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def rounds(self, fns: dict, rounds: int) -> dict:
        if not self.cuda:
            out = {}
            for k, f in fns.items():
                t = time.perf_counter()
                f()
                ms = (time.perf_counter() - t) * 1e3
                out[k] = dict(median_ms=ms, min_ms=ms, max_ms=ms, samples=[ms], inner=1)
            return out
        from .harness import INNER, check_once, rounds_per_sample, time_in_rounds
        est = {k: check_once(f, lambda o: {})["est_ms"] for k, f in fns.items()}
        inner = rounds_per_sample(est, INNER)
        timed, fail = time_in_rounds(fns, rounds=rounds, inner=inner, seed=0)
        if fail:
            raise RuntimeError(f"timing failed: {fail}")
        return {k: dict(median_ms=t.median_ms, min_ms=t.min_ms, max_ms=t.max_ms,
                        ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms, samples=t.samples,
                        method=t.method, inner=inner[k]) for k, t in timed.items()}


def attention_flops(B, H, N, D, causal):
    f = 4.0 * B * H * N * N * D
    return f / 2 if causal else f


# --- the forward -------------------------------------------------------------------------------
# Alternatives to FP8_CONFIGS at D=128 that compile without spills (tileiras 13.4, sm_90,
# causal and not, V^T), for --configs to time against the default.
# Registers / shared memory (full, causal), from the compile report:
#   128x256 occ=1 nww=8  168 regs, 181 / 116 KB   (the default, SPLIT: one CTA per SM)
#   128x128 occ=1 nww=8  168 regs, 165 / 165 KB   (the default before SPLIT)
#   128x64 occ=1 nww=8   168 regs, 116 / 182 KB
#   64x128 occ=2         128 regs, 116 /  67 KB   (two CTAs per SM causal)
#   64x128 occ=1         255 regs, 173 / 132 KB
# Not listed: 128x128 without nww=8 (occ=1, or nww=4) spills 256-264 bytes; 256x128 nww=16
# fails to compile (UnsupportedFeatureError).
FP8_ALT_CONFIGS: dict[str, list[str]] = {
    "sm_90": ["128x128 occ=1 nww=8", "128x64 occ=1 nww=8", "64x128 occ=2", "64x128 occ=1"],
}


def attention_fp8_vk(q8, k8, v8, *, q_descale, k_descale, v_descale, causal: bool = False,
                     scale=None, input_pos: int = 0, out_dtype=None, config=None):
    """The FP8 forward reading V as (N, D), each tile transposed on chip by the compiler (the
    kernel's ``V_T`` off; ``flashattn.fp8.attention_fp8`` always hands it V^T): the ``fp8-vk``
    row. Checked and launched by the library's own steps."""
    import torch
    from flashattn.fp8_attention import check_fp8_inputs, launch_fp8
    qd, kd, vd, out_dtype, fast_acc, config = check_fp8_inputs(
        q8, k8, v8, q_descale, k_descale, v_descale, causal=causal, scale=scale,
        input_pos=input_pos, out_dtype=out_dtype, v_transposed=False, fast_acc=None,
        config=config)
    out = torch.empty(q8.shape, dtype=out_dtype, device=q8.device)
    if out.numel() == 0:
        return out
    return launch_fp8(q8, k8, v8, out, qd, kd, vd, causal=causal, scale=scale,
                      input_pos=input_pos, fast_acc=fast_acc, config=config, v_t=False)


def forward_rows(B, H, N, D, causal, device, *, cudnn=True, configs=(), quant=False):
    import torch
    import flashattn
    from flashattn.fp8 import attention_fp8, quantize_fp8
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, device=device, dtype=torch.float16)
               for _ in range(3))
    q8, qd = quantize_fp8(q)
    k8, kd = quantize_fp8(k)
    v8, vd = quantize_fp8(v)
    v8t = v8.transpose(-1, -2).contiguous()
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
    fns = {
        "fp8": lambda: attention_fp8(q8, k8, v8, **kw),
        "fp8-vt": lambda: attention_fp8(q8, k8, v8t, v_transposed=True, **kw),
        "fp8-vk": lambda: attention_fp8_vk(q8, k8, v8, **kw),
        "fp16": lambda: flashattn.attention(q, k, v, causal=causal),
        "fp16#2": lambda: flashattn.attention(q, k, v, causal=causal),
    }
    for cfg in configs:
        fns[f"fp8-vt@{cfg}"] = (lambda c=cfg: attention_fp8(q8, k8, v8t, v_transposed=True,
                                                           config=c, **kw))
    if quant:
        fns["quant-v"] = lambda: quantize_fp8(v)
        fns["quant-vt"] = lambda: quantize_fp8(v, v_transposed=True)
    if cudnn and device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F

        def cudnn_fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["cudnn"] = cudnn_fn

        def fa2_fn():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["fa2"] = fa2_fn
    # One check each: the fp8 rows against fp32 attention of the dequantised inputs, the fp16
    # rows against fp32 attention of the fp16 inputs (on a slice of heads: memory).
    from flashattn.fp8 import reference_fp8
    hs = slice(0, 1)
    ref8 = reference_fp8(q8[:1, hs], k8[:1, hs], v8[:1, hs], qd[:1, hs], kd[:1, hs],
                         vd[:1, hs], causal=causal)
    ref16 = flashattn.reference.attention(q[:1, hs].float(), k[:1, hs].float(),
                                          v[:1, hs].float(), causal=causal)
    errs = {}
    for name, fn in fns.items():
        o = fn()
        if name.startswith("quant"):
            # The quantised V (either layout) against V: e4m3's rounding, |v| <= 2^-4 |v|.
            v8q, vdq = o
            if name == "quant-vt":
                v8q = v8q.transpose(-1, -2)
            back = v8q[:1, hs].float() * vdq[:1, hs, None, None]
            errs[name] = ((back - v[:1, hs].float()).abs()
                          / v[:1, hs].float().abs().clamp_min(1e-3)).max().item()
            continue
        ref = ref8 if name.startswith("fp8") else ref16
        errs[name] = (o[:1, hs].float() - ref).abs().max().item()
    return fns, errs


# --- decode ------------------------------------------------------------------------------------
DECODE_IMPLS = ("decode-fp16", "decode-fp16#2", "decode-fp8", "decode-fp8-mma")


def decode_rows(B, L, device, *, Hq=32, Hkv=8, D=128, impls=DECODE_IMPLS):
    import torch
    import flashattn
    from flashattn.reference.decode import decode_reference_fp8
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, Hq, 1, D, generator=g, device=device, dtype=torch.float16)
    kc = torch.randn(B, Hkv, L, D, generator=g, device=device, dtype=torch.float16)
    vc = torch.randn(B, Hkv, L, D, generator=g, device=device, dtype=torch.float16)
    # N(0, 1) values fit e4m3 as they are: descale 1 (quantize_fp8's fp32 temporaries would
    # need ~3x the cache in memory at B=64, 128K).
    k8 = kc.to(torch.float8_e4m3fn)
    v8 = vc.to(torch.float8_e4m3fn) if "decode-fp8" in impls else None
    v8t = None
    if "decode-fp8-mma" in impls:
        # The V cache transposed, (B, Hkv, D, L): the layout the FP8-MMA decode reads (a byte
        # copy of the same values: both fp8 rows read one cache).
        v8t = torch.empty((B, Hkv, D, L), dtype=torch.float8_e4m3fn, device=device)
        v8t.view(torch.uint8).copy_(vc.to(torch.float8_e4m3fn).view(torch.uint8)
                                    .transpose(-1, -2))
    kd = torch.ones(B, Hkv, dtype=torch.float32, device=device)
    vd = torch.ones(B, Hkv, dtype=torch.float32, device=device)
    lens = torch.full((B,), L, dtype=torch.int32, device=device)
    out16 = torch.empty_like(q)
    out8 = torch.empty_like(q)
    out8m = torch.empty_like(q)
    fns = {
        "decode-fp16": lambda: flashattn.decode(q, kc, vc, lens, out=out16),
        "decode-fp16#2": lambda: flashattn.decode(q, kc, vc, lens, out=out16),
        "decode-fp8": lambda: flashattn.decode(q, k8, v8, lens, k_descale=kd, v_descale=vd,
                                               out=out8),
        "decode-fp8-mma": lambda: flashattn.decode(q, k8, v8t, lens, k_descale=kd,
                                                   v_descale=vd, out=out8m, v_transposed=True),
    }
    fns = {k: f for k, f in fns.items() if k in impls}
    b1 = slice(0, 1)
    v_ref = v8[b1] if v8 is not None else v8t[b1].transpose(-1, -2)
    ref8 = decode_reference_fp8(q[b1], k8[b1], v_ref, lens[b1], kd[b1], vd[b1])
    ref16 = flashattn.reference.decode_attention(q[b1].float(), kc[b1].float(),
                                                 vc[b1].float(), lens[b1])
    errs = {}
    for name, fn in fns.items():
        o = fn()
        ref = ref8 if "fp8" in name else ref16
        errs[name] = (o[b1].float().cpu() - ref.float().cpu()).abs().max().item()
    return fns, errs


def kv_bytes(B, L, Hkv=8, D=128, elem=2):
    return 2 * B * Hkv * L * D * elem


# --- main --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("forward", "decode", "both"), default="both")
    ap.add_argument("--d", type=int, action="append", help="head dims (default 128)")
    ap.add_argument("--n", type=int, action="append", help="forward lengths (1K..16K)")
    ap.add_argument("--configs", action="append",
                    help="FP8 forward tile configurations timed at the longest N as "
                         "'fp8-vt@CFG' rows, e.g. '128x64 occ=1 nww=8' (repeatable; default "
                         "FP8_ALT_CONFIGS of the GPU's arch; 'none': none)")
    ap.add_argument("--batch", type=int, action="append",
                    help="decode batch sizes (repeatable; default 8, 64, 1: the target's B=8 "
                         "first)")
    ap.add_argument("--cache", type=int, action="append",
                    help="decode cache lengths (repeatable; default 4K..128K)")
    ap.add_argument("--decode-impls", nargs="+", choices=DECODE_IMPLS, default=None,
                    help=f"decode rows (default all: {' '.join(DECODE_IMPLS)})")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--autotune", action="store_true",
                    help="let step='best' autotune (default: FLASHATTN_AUTOTUNE=0, the "
                         "first configuration, cached winners still used)")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU: tiny shapes in the interpreter, to check the script")
    ap.add_argument("--out", default="fp8-bench.json")
    a = ap.parse_args(argv)
    if not a.autotune:
        os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")
    import torch
    t_start = time.time()
    if a.dry_run:
        from flashattn import interpret
        ctx = interpret.enabled()
        device = torch.device("cpu")
        lengths, dims, rounds = [128], [64], 1
        dec_shapes = ([(b, L) for b in (a.batch or [1]) for L in (a.cache or [256])]
                      if a.batch or a.cache else [(1, 256), (2, 512)])
        tokens, head_total = 256, 128
        configs = ["64x64"] if a.configs is None else a.configs
    else:
        import contextlib
        ctx = contextlib.nullcontext()
        device = torch.device("cuda")
        lengths = a.n or [1024, 2048, 4096, 8192, 16384]
        dims, rounds = a.d or [128], a.rounds
        dec_shapes = [(b, L) for b in (a.batch or (8, 64, 1))
                      for L in (a.cache or (4096, 16384, 32768, 65536, 131072))]
        tokens, head_total = 16384, 2048
        if a.configs is None:
            from flashattn.dispatch import device_arch
            configs = list(FP8_ALT_CONFIGS.get(device_arch(device), []))
        else:
            configs = a.configs
    configs = [c for c in configs if c.strip().lower() != "none"]
    from flashattn.config import Config
    for c in configs:
        Config.parse(c)                               # a bad label fails before any timing
    timer = Timer(device)
    rows, skipped = [], []

    def over_budget():
        return time.time() - t_start > a.budget_s

    def fmt(r):
        if r["impl"].startswith("quant"):
            return (f"fwd  D={r['D']:<3} N={r['N']:<6} B={r['B']:<3} H={r['H']:<3} "
                    f"{r['impl']:8} {r['median_ms']:9.4f} ms x{r['vs_quant_v']:.3f} "
                    f"quant-v  rel err {r['max_err']:.2e}")
        if r["part"] == "forward":
            return (f"fwd  D={r['D']:<3} N={r['N']:<6} B={r['B']:<3} H={r['H']:<3} "
                    f"{'causal' if r['causal'] else 'full  '} {r['impl']:8} "
                    f"{r['median_ms']:9.4f} ms {r['tflops']:7.1f} TFLOPS "
                    f"x{r['vs_fp16']:.3f} fp16 x{r['vs_cudnn']:.3f} cudnn "
                    f"err {r['max_err']:.2e}")
        return (f"dec  B={r['B']:<3} L={r['L']:<7} {r['impl']:14} "
                f"{r['median_ms']:9.4f} ms {r['gbps']:8.1f} GB/s (K+V "
                f"{r['kv_bytes'] / 1e9:.3f} GB) "
                + (f"x{r['vs_fp16']:.3f} fp16 " if r["vs_fp16"] else "")
                + (f"x{r['vs_fp8']:.3f} fp8 " if r["vs_fp8"] else "")
                + f"err {r['max_err']:.2e}")

    from flashattn.env import metadata
    out = Path(a.out)
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)

    def write(done: bool):
        """The JSON so far (after every shape: a run cut short by a time limit keeps what it
        timed; ``meta.complete`` says whether it finished)."""
        meta = dict(metadata("python -m flashbook.measure.bench_fp8 " + " ".join(
                        sys.argv[1:] if argv is None else argv),
                             device=device if device.type == "cuda" else None),
                    device=(torch.cuda.get_device_name(device) if device.type == "cuda"
                            else "cpu (interpreter dry run)"),
                    rounds=rounds, dry_run=a.dry_run, budget_s=a.budget_s, configs=configs,
                    autotune=a.autotune, seconds=round(time.time() - t_start, 1),
                    complete=done,
                    method="the shared harness (harness.time_in_rounds): CUDA graphs, L2 "
                           "flush + idle per sample, rounds in random order")
        out.write_text(json.dumps(dict(meta=meta, rows=rows, skipped=skipped), indent=1) + "\n")
        return meta

    def shape_done(new_rows):
        print("\n".join(fmt(r) for r in new_rows), flush=True)
        write(False)

    with ctx, torch.no_grad():
        if a.part in ("forward", "both"):
            for D in dims:
                for N in lengths:
                    for causal in (False, True):
                        B, H = max(1, tokens // N), max(1, head_total // D)
                        shape = dict(part="forward", B=B, H=H, N=N, D=D, causal=causal)
                        if over_budget():
                            skipped.append(shape)
                            continue
                        longest = N == max(lengths)
                        fns, errs = forward_rows(B, H, N, D, causal, device,
                                                 configs=configs if longest else (),
                                                 quant=longest and not causal)
                        res = timer.rounds(fns, rounds)
                        fl = attention_flops(B, H, N, D, causal)
                        base = res.get("cudnn", res["fp16"])["median_ms"]
                        for name, r in res.items():
                            if name.startswith("quant"):
                                rows.append(dict(shape, impl=name, max_err=errs[name],
                                                 vs_quant_v=res["quant-v"]["median_ms"]
                                                 / r["median_ms"], **r))
                                continue
                            rows.append(dict(shape, impl=name, max_err=errs[name],
                                             tflops=fl / r["median_ms"] / 1e9,
                                             vs_cudnn=base / r["median_ms"],
                                             vs_fp16=res["fp16"]["median_ms"] / r["median_ms"],
                                             **r))
                        shape_done([r for r in rows if r.get("N") == N and r["part"] ==
                                    "forward" and r["D"] == D and r.get("causal") == causal])
                        del fns
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
        if a.part in ("decode", "both"):
            for B, L in dec_shapes:
                shape = dict(part="decode", B=B, L=L, Hq=32, Hkv=8, D=128)
                if over_budget():
                    skipped.append(shape)
                    continue
                fns, errs = decode_rows(B, L, device, impls=a.decode_impls or DECODE_IMPLS)
                res = timer.rounds(fns, rounds)
                base = res.get("decode-fp16", {}).get("median_ms")
                old8 = res.get("decode-fp8", {}).get("median_ms")
                for name, r in res.items():
                    nbytes = kv_bytes(B, L, elem=1 if "fp8" in name else 2)
                    rows.append(dict(shape, impl=name, max_err=errs[name], kv_bytes=nbytes,
                                     gbps=nbytes / r["median_ms"] / 1e6,
                                     vs_fp16=base / r["median_ms"] if base else None,
                                     vs_fp8=old8 / r["median_ms"] if old8 else None,
                                     **r))
                shape_done(rows[-len(res):])
                del fns
                if device.type == "cuda":
                    torch.cuda.empty_cache()

    if skipped:
        print(f"skipped (budget {a.budget_s} s spent): {skipped}")
    meta = write(True)
    print(f"wrote {out} ({meta['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
