"""Readers and small computations for the FP8 chapter (notebooks/14_fp8.ipynb).

    from flashbook.chapter import fp8
    fp8.formats()                 # e4m3 / e5m2 beside fp16 and bf16, from torch.finfo
    fp8.accuracy()                # experiments/data/41-fp8-accuracy, one row per case (seed mean)
    fp8.compile_report()          # experiments/data/42-fp8-aot, one row per compiled kernel
    fp8.transpose_cost(rep)       # V stored (N, D) against V^T (D, N): the SASS difference
    fp8.decode_bytes(B, Hkv, Nk, D)   # K+V bytes of one decode step, fp16 against fp8
    fp8.kernel_error_case()       # one small FP8 forward in the interpreter, its error and bound
    fp8.bench()                   # results/h200/fp8: the recorded GPU timings (forward, decode)
    fp8.forward_speed_table(b, D) # speed-up over our fp16 forward per N, causal and not
    fp8.head_dim_table(b)         # the longest N per head dimension, FP8 against the libraries
    fp8.profile_card()            # Nsight Compute: the FP8 forward beside the fp16 kernel
    fp8.decode_speed_table(b)     # the FP8 cache against the fp16 cache per B and cache length

The library's FP8 code is ``flashattn.fp8*`` and ``flashattn.kernels.fp8*``; nothing here is
needed to use it.
"""
from __future__ import annotations

import json
import lzma
import math
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
ACCURACY_RUN = ROOT / "experiments" / "data" / "41-fp8-accuracy"
AOT_RUN = ROOT / "experiments" / "data" / "42-fp8-aot"
BENCH = ROOT / "results" / "h200" / "fp8" / "fp8_bench.json"

# torch's names of the four 16- and 8-bit formats the chapter compares, with the book's names.
FORMATS = {"float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}


def formats(names=tuple(FORMATS)) -> pd.DataFrame:
    """Bits, range and precision of each format, computed from ``torch.finfo``.

    Columns: bits, exponent bits, mantissa bits (stored), max, smallest normal, smallest
    subnormal, eps (the spacing just above 1, 2^-mantissa), unit roundoff (eps / 2: the
    largest relative error of one rounding in the normal range), and binades (log2 of max over
    the smallest subnormal: the dynamic range in powers of two).
    """
    import torch
    rows = {}
    for name in names:
        if name not in FORMATS:
            raise ValueError(f"unknown format {name!r}; one of {sorted(FORMATS)}")
        fi = torch.finfo(getattr(torch, name))
        mant = round(-math.log2(fi.eps))
        expo = fi.bits - 1 - mant
        sub = fi.smallest_normal * fi.eps
        rows[FORMATS[name]] = {
            "bits": fi.bits, "exponent bits": expo, "mantissa bits": mant,
            "max": float(fi.max), "smallest normal": float(fi.smallest_normal),
            "smallest subnormal": float(sub), "eps": float(fi.eps),
            "unit roundoff": float(fi.eps) / 2,
            "binades": round(math.log2(float(fi.max) / sub)),
        }
    return pd.DataFrame(rows).T


def formats_table(f: pd.DataFrame | None = None) -> pd.DataFrame:
    """``formats()`` for people: powers of two written as such, counts as integers."""
    f = formats() if f is None else f

    def p2(x: float) -> str:
        e = math.log2(x)
        return f"2^{round(e)}" if abs(e - round(e)) < 1e-9 else f"{x:g}"

    out = pd.DataFrame(index=f.index)
    for c in ("bits", "exponent bits", "mantissa bits"):
        out[c] = f[c].astype(int)
    out["max"] = [f"{x:,.0f}" if x < 1e6 else f"{x:.2e}" for x in f["max"]]
    for c in ("smallest normal", "smallest subnormal", "unit roundoff"):
        out[c] = [p2(x) for x in f[c]]
    out["binades"] = f["binades"].astype(int)
    return out


# --- the accuracy study (experiments/data/41-fp8-accuracy) -------------------------------------
def accuracy(path: Path | None = None) -> pd.DataFrame:
    """The recorded accuracy rows, averaged over seeds: index (inputs, mask, method), columns
    user_rmse, user_max (against fp64 attention of the original inputs: what a user loses),
    kernel_rmse, kernel_max (against fp32 attention of the kernel's own, dequantised inputs).
    ``.attrs["meta"]`` holds the run's metadata (shape, seeds, runner)."""
    doc = json.loads(((path or ACCURACY_RUN) / "accuracy.json").read_text())
    rows = [{"inputs": r["dist"], "mask": "causal" if r["causal"] else "full",
             "method": r["method"], "seed": r["seed"],
             "user_rmse": r["user"]["rmse"], "user_max": r["user"]["max"],
             "kernel_rmse": r["kernel"]["rmse"], "kernel_max": r["kernel"]["max"]}
            for r in doc["rows"]]
    df = pd.DataFrame(rows)
    out = (df.drop(columns="seed").groupby(["inputs", "mask", "method"], sort=False).mean())
    out.attrs["meta"] = doc["meta"]
    return out


def accuracy_table(acc: pd.DataFrame | None = None, mask: str = "full") -> pd.DataFrame:
    """RMSE (x 1e-3) of each method against the originals and against its own inputs, random
    and outlier inputs side by side, for one mask."""
    acc = accuracy() if acc is None else acc
    a = acc.xs(mask, level="mask")
    out = pd.DataFrame({
        ("random", "vs originals"): a.loc["random", "user_rmse"] * 1e3,
        ("random", "vs own inputs"): a.loc["random", "kernel_rmse"] * 1e3,
        ("outliers", "vs originals"): a.loc["outliers", "user_rmse"] * 1e3,
        ("outliers", "vs own inputs"): a.loc["outliers", "kernel_rmse"] * 1e3,
    })
    out.columns = [f"{d}, {w} (RMSE ×1e-3)" for d, w in out.columns]
    out.index.name = "method"
    return out


def incoherent_gain(acc: pd.DataFrame | None = None, fmt: str = "e4m3", inputs: str = "outliers",
                    mask: str = "full", column: str = "user_rmse") -> float:
    """How many times lower ``column`` is with incoherent processing than without."""
    acc = accuracy() if acc is None else acc
    return float(acc.loc[(inputs, mask, fmt), column] / acc.loc[(inputs, mask, f"{fmt}+inc"),
                                                                  column])


# --- the compile report (experiments/data/42-fp8-aot) ------------------------------------------
def compile_report(path: Path | None = None) -> pd.DataFrame:
    """One row per compiled kernel: arch, kernel (fwd / decode), D, causal, v_t, fp8, label,
    registers, stack_bytes, shared_bytes and the SASS counts (QGMMA, UTCQMMA, QMMA, HMMA, PRMT,
    STSM, F2FP.E4M3, ...). ``.attrs["meta"]``: cuda-tile version, archs."""
    p = (path or AOT_RUN) / "report.json.xz"
    doc = json.loads(lzma.decompress(p.read_bytes()))
    rows = []
    for r in doc["rows"]:
        if r.get("error"):
            continue
        row = {k: r.get(k) for k in ("arch", "D", "causal", "fp8", "label", "registers",
                                     "stack_bytes", "shared_bytes")}
        row["kernel"] = "fwd" if r["kernel"].startswith("fmha") else "decode"
        row["v_t"] = bool(r.get("v_t", False))
        row["fast_acc"] = bool(r.get("fast_acc", True))
        row["mma_forms"] = ", ".join(r.get("mma_forms", []))
        row.update(r["sass"])
        rows.append(row)
    df = pd.DataFrame(rows)
    df.attrs["meta"] = doc["meta"]
    return df


def forward_rows(rep: pd.DataFrame, arch: str, *, D: int = 128, causal: bool = True,
                 fp8: str = "float8_e4m3fn", fast_acc: bool = True) -> pd.DataFrame:
    """The forward kernels of one arch and shape, indexed by V's layout ("V^T" or "V")."""
    f = rep[(rep.kernel == "fwd") & (rep.arch == arch) & (rep.D == D) & (rep.causal == causal)
            & (rep.fp8 == fp8) & (rep.fast_acc == fast_acc)]
    if f.empty:
        raise KeyError(f"no forward kernel for {arch}, D={D}, causal={causal}, {fp8}")
    return f.set_index(f.v_t.map({True: "V^T (D, N)", False: "V (N, D)"}))


def transpose_table(rep: pd.DataFrame, *, D: int = 128, causal: bool = True,
                    archs=("sm_90", "sm_100", "sm_120")) -> pd.DataFrame:
    """The forward with V stored transposed against V stored as is, per arch: the MMA count,
    the byte permutes (PRMT), registers, shared memory."""
    mma = {"sm_90": "QGMMA", "sm_100": "UTCQMMA", "sm_120": "QMMA"}
    parts = []
    for arch in archs:
        f = forward_rows(rep, arch, D=D, causal=causal)
        t = pd.DataFrame({"arch": arch, "V layout": f.index, "FP8 MMA": mma[arch],
                          "MMAs": f[mma[arch]].values, "PRMT": f["PRMT"].values,
                          "registers": f["registers"].values,
                          "shared memory (KB)":
                              (f["shared_bytes"] / 1024).round().astype(int).values,
                          "spills (B)": f["stack_bytes"].values})
        parts.append(t)
    return pd.concat(parts).set_index(["arch", "V layout"])


def forward_table(rep: pd.DataFrame, arch: str = "sm_90") -> pd.DataFrame:
    """Every forward kernel of one arch with V^T: head dim, mask, format, tile, MMAs, registers,
    spills, shared memory, the fp8 casts (F2FP) and exp2s."""
    f = rep[(rep.kernel == "fwd") & (rep.arch == arch) & rep.v_t]
    mma = {"sm_90": "QGMMA", "sm_100": "UTCQMMA", "sm_120": "QMMA"}[arch]
    out = pd.DataFrame({
        "D": f.D, "mask": f.causal.map({True: "causal", False: "full"}),
        "format": f.fp8.map(lambda x: FORMATS.get(x, x)),
        "accumulation": f.fast_acc.map({True: "fast", False: "exact"}),
        "tile": f.label.str.extract(r"(\d+x\d+)")[0],
        "FP8 MMAs": f[mma], "registers": f.registers, "spills (B)": f.stack_bytes,
        "shared memory (KB)": (f.shared_bytes / 1024).round().astype(int),
        "fp8 casts (F2FP)": f["F2FP.E4M3"] + f["F2FP.E5M2"], "exp2 (MUFU.EX2)": f["MUFU.EX2"]})
    return out.reset_index(drop=True)


# --- decoding: the bytes of one step -----------------------------------------------------------
def decode_bytes(B: int, Hkv: int, Nk: int, D: int) -> dict:
    """K+V bytes one decode step reads, fp16 against fp8 (one descale per (batch, kv head) for
    K and for V adds 2 x B x Hkv x 4 bytes), and their ratio."""
    from ..data.schema import kv_bytes
    fp16 = kv_bytes(B, Hkv, Nk, D, 2)
    fp8 = kv_bytes(B, Hkv, Nk, D, 1) + 2 * B * Hkv * 4
    return {"fp16": fp16, "fp8": fp8, "ratio": fp16 / fp8}


# --- one live case in the interpreter ----------------------------------------------------------
def kernel_error_case(B: int = 1, Hq: int = 2, Hkv: int = 1, N: int = 200, D: int = 64, *,
                      causal: bool = True, seed: int = 0, fmt: str = "float8_e4m3fn") -> dict:
    """Run the FP8 forward once through the CPU interpreter on random inputs and compare it
    with fp32 attention of its own dequantised inputs (``flashattn.fp8.reference_fp8``).

    Returns err (max |O - O_ref|), bound (the worst case derived from the formats, as in
    tests/test_fp8.py: (u + Nk 2^-18 + u_bf16) max|V|, u = e4m3's unit roundoff 2^-4, 2^-18 for
    P's subnormals against a row sum >= 2^8) and user_err (max error against fp64 attention of
    the original fp32 inputs).
    """
    import torch

    import flashattn
    from flashattn import fp8 as lib, interpret
    from flashattn.reference import attention as ref_attention
    dtype = getattr(torch, fmt)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    q8, qd = lib.quantize_fp8(q, num_kv_heads=Hkv, dtype=dtype)
    k8, kd = lib.quantize_fp8(k, dtype=dtype)
    v8, vd = lib.quantize_fp8(v, dtype=dtype)
    with interpret.enabled():
        o = flashattn.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                causal=causal)
    ref = lib.reference_fp8(q8, k8, v8, qd, kd, vd, causal=causal)
    err = (o.float() - ref.float()).abs().max().item()
    u = torch.finfo(dtype).eps / 2
    sub = N * 2.0 ** -18 if fmt == "float8_e4m3fn" else 0.0
    u_out = torch.finfo(torch.bfloat16).eps / 2
    vmax = lib.dequantize_fp8(v8, vd).abs().max().item()
    bound = (u + sub + u_out) * vmax
    G = Hq // Hkv
    exact = ref_attention(q.double(), k.double().repeat_interleave(G, 1),
                          v.double().repeat_interleave(G, 1), causal=causal)
    user = (o.double() - exact).abs().max().item()
    return {"err": err, "bound": bound, "user_err": user, "vmax": vmax, "u": u, "sub": sub,
            "u_out": u_out, "shape": (B, Hq, Hkv, N, D), "dtype": str(o.dtype)}


# --- a live timing, on a GPU only --------------------------------------------------------------
def time_fp8_vs_fp16(N: int = 8192, *, B: int = 4, H: int = 16, D: int = 128,
                     causal: bool = False, rounds: int = 20) -> pd.DataFrame:
    """Median ms of the fp16 forward and the FP8 forward (V^T from the quantising pass) at one
    shape on this machine's GPU (``flashattn.timing.time_rounds``). RuntimeError without a
    GPU."""
    import torch

    import flashattn
    from flashattn import fp8 as lib
    if not torch.cuda.is_available():
        raise RuntimeError("time_fp8_vs_fp16 needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    q8, qd = lib.quantize_fp8(q)
    k8, kd = lib.quantize_fp8(k)
    v8, vd = lib.quantize_fp8(v, v_transposed=True)
    runs = {
        "fp16": lambda: flashattn.attention(q, k, v, causal=causal),
        "fp8 (e4m3, V^T)": lambda: lib.attention_fp8(
            q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal,
            v_transposed=True),
    }
    from flashattn.timing import time_rounds
    t = time_rounds(runs, rounds=rounds, inner=5)
    rows = {name: {"median (ms)": tm.median_ms} for name, tm in t.items()}
    out = pd.DataFrame(rows).T
    out["speed-up over fp16"] = out.loc["fp16", "median (ms)"] / out["median (ms)"]
    return out


# --- the recorded GPU timings (results/h200/fp8) ----------------------------------------------
# The forward's implementations, in the order the chapter shows them, with the book's names.
FORWARD_IMPLS = {"fp8-vt": "fp8, Vᵀ given", "fp8": "fp8, host transpose",
                 "fp8-vk": "fp8, on-chip transpose", "fp16#2": "fp16 again (control)",
                 "cudnn": "cuDNN fp16", "fa2": "FlashAttention-2 fp16"}


def bench(path: Path | None = None) -> pd.DataFrame:
    """The recorded FP8 timings, one row per (part, shape, impl): part "forward" (N, B, H, D,
    causal) or "decode" (L = cache length, B, Hq, Hkv, D), impl, median_ms, vs_fp16 (our fp16
    kernel's time over this one's, same rounds), vs_cudnn, gbps (decode). ``.attrs["meta"]``:
    the GPU, versions, rounds and method. FileNotFoundError when the file is absent."""
    from ..data.schema import read_json
    doc = read_json(path or BENCH)
    df = pd.DataFrame(doc["rows"])
    if df.empty or "part" not in df:
        raise ValueError("the FP8 benchmark file has no rows")
    df.attrs["meta"] = doc["meta"]
    return df


def forward_speed_table(b: pd.DataFrame | None = None, D: int = 128) -> pd.DataFrame:
    """Speed-up over our fp16 forward (its time over each one's, the same rounds) at head
    dimension ``D``, index (mask, N), one column per ``FORWARD_IMPLS`` entry. The default tile
    only."""
    b = bench() if b is None else b
    f = b[(b.part == "forward") & b.impl.isin(list(FORWARD_IMPLS))].copy()
    f = f[f.D.astype(int) == D]
    if f.empty:
        raise ValueError(f"no forward rows at head dimension {D}")
    f["mask"] = f.causal.map({False: "full", True: "causal"})
    f["N"] = f.N.astype(int)
    t = f.pivot_table(index=["mask", "N"], columns="impl", values="vs_fp16", aggfunc="first")
    t = t.reindex(columns=list(FORWARD_IMPLS)).rename(columns=FORWARD_IMPLS)
    t = t.reindex(["full", "causal"], level="mask")
    t.columns.name = None
    return t


def forward_speed_figure(b: pd.DataFrame | None = None, D: int = 128):
    """The forward's speed-up over fp16 against N at head dimension ``D``, full and causal side
    by side."""
    from .plots import _plt
    b = bench() if b is None else b
    t = forward_speed_table(b, D)
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.6), sharey=True)
    styles = {"fp8, Vᵀ given": ("#d62728", "o", "-"), "fp8, host transpose": ("#ff7f0e", "s", "-"),
              "fp8, on-chip transpose": ("#9467bd", "^", "-"),
              "fp16 again (control)": ("#7f7f7f", ".", ":"), "cuDNN fp16": ("#2ca02c", "d", "--"),
              "FlashAttention-2 fp16": ("#8c564b", "v", "--")}
    for ax, mask in zip(axes, ("full", "causal")):
        s = t.loc[mask]
        for col, (c, m, ls) in styles.items():
            ax.plot(s.index, s[col], color=c, marker=m, ls=ls, ms=4, lw=1.2, label=col)
        ax.axhline(1.0, color="#444", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(s.index))
        ax.set_xticklabels([f"{n // 1024}K" for n in s.index], fontsize=8)
        ax.set_xlabel("sequence length N")
        ax.set_title("causal" if mask == "causal" else "not causal", fontsize=9)
    axes[0].set_ylabel("speed-up over our fp16 (×)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, frameon=False, fontsize=8, ncol=3, loc="lower center")
    fig.suptitle(f"FP8 forward, D={D}, against our fp16 forward — {b.attrs['meta']['gpu']}",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    plt.close(fig)
    return fig


def head_dim_table(b: pd.DataFrame | None = None, N: int | None = None) -> pd.DataFrame:
    """At one length (the longest recorded by default), per head dimension and mask: the speed-up
    over our fp16 forward of the FP8 paths, cuDNN and FlashAttention-2, and FP8 (Vᵀ given) over
    each of the two libraries."""
    b = bench() if b is None else b
    f = b[(b.part == "forward") & b.impl.isin(list(FORWARD_IMPLS))].copy()
    N = int(f.N.max()) if N is None else N
    f = f[f.N.astype(int) == N]
    f["mask"] = f.causal.map({False: "full", True: "causal"})
    f["D"] = f.D.astype(int)
    t = f.pivot_table(index=["D", "mask"], columns="impl", values="vs_fp16", aggfunc="first")
    out = pd.DataFrame({"fp8, Vᵀ given": t["fp8-vt"], "fp8, host transpose": t["fp8"],
                        "cuDNN fp16": t["cudnn"], "FlashAttention-2 fp16": t["fa2"],
                        "fp8 Vᵀ / cuDNN": t["fp8-vt"] / t["cudnn"],
                        "fp8 Vᵀ / FA2": t["fp8-vt"] / t["fa2"]})
    out = out.reindex(["full", "causal"], level="mask")
    out.attrs["N"] = N
    return out


def profile_card(w: pd.DataFrame | None = None) -> pd.DataFrame:
    """The Nsight Compute card of the FP8 forward beside our dense fp16 kernel (``best``), one
    call each, with the CTAs each SM holds (from the theoretical occupancy: 64 warps per SM on
    Hopper)."""
    from . import flex
    w = flex.profile() if w is None else w
    card = flex.profile_card({"fp8_forward": "fp8 forward (Vᵀ given)", "best": "fp16 forward"}, w)
    occ = {}
    for step, name in (("fp8_forward", "fp8 forward (Vᵀ given)"), ("best", "fp16 forward")):
        r = w[(w["step"] == step) & w["kernel"].str.startswith("fmha")].iloc[0]
        warps = r["sm__maximum_warps_per_active_cycle_pct"] / 100 * 64
        occ[name] = int(round(warps / (r["launch__block_size"] / 32)))
    card["CTAs per SM"] = pd.Series(occ)
    return card


def decode_speed_table(b: pd.DataFrame | None = None) -> pd.DataFrame:
    """The FP8-cache decode step against the fp16 cache, index (B, cache length): both times
    (ms), the speed-up (fp16 time over fp8 time: below 1 is slower), the control (the fp16
    cache timed again), and the bytes per second each one streams (TB/s)."""
    b = bench() if b is None else b
    d = b[b.part == "decode"].copy()
    d["cache"] = d.L.astype(int)
    idx = ["B", "cache"]
    ms = d.pivot_table(index=idx, columns="impl", values="median_ms", aggfunc="first")
    x = d.pivot_table(index=idx, columns="impl", values="vs_fp16", aggfunc="first")
    bw = d.pivot_table(index=idx, columns="impl", values="gbps", aggfunc="first")
    out = pd.DataFrame({
        "fp16 cache (ms)": ms["decode-fp16"], "fp8 cache (ms)": ms["decode-fp8"],
        "fp8 speed-up (×)": x["decode-fp8"], "control (×)": x["decode-fp16#2"],
        "fp16 (TB/s)": bw["decode-fp16"] / 1e3, "fp8 (TB/s)": bw["decode-fp8"] / 1e3})
    out.index = out.index.set_names(["B", "cache length"])
    return out


# --- the redesign: the decode on FP8 MMAs (experiments/fp8_decode_v2.py) ------------------------
DECODE_V2 = ROOT / "results" / "h200" / "fp8" / "fp8_decode_v2.json"
# The library's FP8-MMA decode (decode(..., v_transposed=True)), bench_fp8 --part decode.
DECODE_MMA = ROOT / "results" / "h200" / "fp8" / "fp8_decode_mma.json"


def decode_v2(path: Path | None = None) -> pd.DataFrame:
    """The recorded timing of the FP8-MMA decode variants beside the fp16 cache and the
    library's FP8-cache decode (one row per (B, cache length, implementation))."""
    from flashbook.data.schema import read_json
    doc = read_json(str(path or DECODE_V2))
    return pd.DataFrame([r for r in doc["rows"] if r.get("part") == "decode"])


def decode_v2_table(d: pd.DataFrame | None = None, variant: str = "v2-qk8-pv8") -> pd.DataFrame:
    """Per (B, cache length): the fp16 cache, the library's FP8 cache and ``variant`` (ms), the
    variant's speed-up over each (time over time: above 1 is faster), and the control (the fp16
    cache timed again)."""
    d = decode_v2() if d is None else d
    d = d.assign(cache=d.L.astype(int))
    ms = d.pivot_table(index=["B", "cache"], columns="impl", values="median_ms", aggfunc="first")
    ms = ms.dropna(subset=[variant])
    out = pd.DataFrame({
        "fp16 cache (ms)": ms["decode-fp16"], "library fp8 (ms)": ms["decode-fp8"],
        "FP8 MMAs (ms)": ms[variant],
        "× fp16 cache": ms["decode-fp16"] / ms[variant],
        "× library fp8": ms["decode-fp8"] / ms[variant],
        "control (×)": ms["decode-fp16"] / ms["decode-fp16#2"]})
    out.index = out.index.set_names(["B", "cache length"])
    return out.sort_index(level=["B", "cache length"], ascending=[False, True])


# --- P's cast: why 2^8 -------------------------------------------------------------------------
def p_cast_table(shifts=(0, 4, 8, 9), *, binades: int = 16, points: int = 4097,
                 fmt: str = "float8_e4m3fn") -> pd.DataFrame:
    """What casting P = 2^(s - m) to fp8 does, P first scaled by 2^shift (the kernel's
    ``P_SHIFT``): P runs over ``points`` values 2^-x, x evenly spaced in [0, binades] (score
    gaps up to ``binades`` powers of two below the row max).

    Columns: largest scaled P (2^shift), fits (below the format's max), rounded to zero (%),
    subnormal (% of the values that land among the subnormals, where the relative error grows),
    and above u (% of the values whose cast errs by more than the format's unit roundoff,
    the zeros included: the values that lost precision to the range).
    """
    import torch
    dtype = getattr(torch, fmt)
    fi = torch.finfo(dtype)
    x = torch.linspace(0, binades, points, dtype=torch.float64)
    p = torch.exp2(-x)
    rows = {}
    for s in shifts:
        ps = p * 2.0 ** s
        fits = bool(ps.max() <= fi.max)
        c = ps.clamp(max=fi.max).float().to(dtype).double()
        nz = c > 0
        rel = (c - ps).abs() / ps
        rows[s] = {"largest scaled P": float(2.0 ** s), "fits": fits,
                   "rounded to zero (%)": 100 * float((~nz).double().mean()),
                   "subnormal (%)": 100 * float(((ps < fi.smallest_normal) & nz).double().mean()),
                   "above u (%)": 100 * float((rel > fi.eps / 2 * (1 + 1e-9)).double().mean())}
    out = pd.DataFrame(rows).T
    out.index.name = "shift"
    return out


def outlier_demo(N: int = 1024, D: int = 128, *, rate: float = 1e-3, std: float = 10.0,
                 seed: int = 0) -> pd.DataFrame:
    """Q, K, V with the accuracy study's outliers (N(0, 1) plus, with probability ``rate`` per
    entry, N(0, std^2)); Q and K quantised to e4m3 with one scale per head, before and after
    the random Hadamard rotation of incoherent processing (``flashattn.fp8.hadamard_rotation``),
    V left exact, everything else in fp64: the error that Q's and K's quantisation alone causes.

    Rows: as is, rotated. Columns: K's amax / RMS (how far the largest entry stands above the
    typical one), the RMS and the largest error of the scaled scores Q K^T / sqrt(D), and the
    RMS error of the attention output."""
    import torch

    from flashattn import fp8 as lib
    g = torch.Generator().manual_seed(seed)

    def make():
        x = torch.randn(1, 1, N, D, generator=g)
        big = torch.randn(1, 1, N, D, generator=g) * std
        return x + big * (torch.rand(1, 1, N, D, generator=g) < rate)

    q, k, v = make(), make(), make()
    sc = D ** -0.5

    def attend(s):
        return torch.softmax(s, dim=-1) @ v.double()

    s_ex = q.double() @ k.double().transpose(-1, -2) * sc
    o_ex = attend(s_ex)
    rows = {}
    for name, (qq, kk) in {"as is": (q, k), "rotated": lib.incoherent(q, k, seed=seed)}.items():
        q8, qd = lib.quantize_fp8(qq)
        k8, kd = lib.quantize_fp8(kk)
        s = (lib.dequantize_fp8(q8, qd).double()
             @ lib.dequantize_fp8(k8, kd).double().transpose(-1, -2) * sc)
        e = s - s_ex
        rows[name] = {"K amax / RMS": float(kk.abs().max() / kk.pow(2).mean().sqrt()),
                      "score error, RMS": float(e.pow(2).mean().sqrt()),
                      "score error, largest": float(e.abs().max()),
                      "output error, RMS": float((attend(s) - o_ex).pow(2).mean().sqrt())}
    return pd.DataFrame(rows).T


# --- the split loop: 256-key tiles where no mask applies -----------------------------------------
FORWARD_SPLIT = ROOT / "results" / "h200" / "fp8" / "fp8_fwd_split.json"


def forward_split_table(path: Path | None = None) -> pd.DataFrame:
    """The FP8 forward (Vᵀ given) at one length per (D, mask): our fp16 forward's time and each
    FP8 kernel's speed-up over it (fp16 time over its time), timed in the same rounds: the
    kernel as it was ("before": no split, shortest causal tiles first; D=128 only), the
    shipped kernel at the previous tile configuration ("previous tiles"), and as shipped."""
    from flashbook.data.schema import read_json
    doc = read_json(str(path or FORWARD_SPLIT))
    d = pd.DataFrame(doc["rows"])
    d = d[d["error"].fillna("") == ""]
    ms = d.pivot_table(index=["D", "causal"], columns="impl", values="median_ms", aggfunc="first")
    base = ms["fp16"]
    out = pd.DataFrame({"fp16 (ms)": base,
                        "before (×)": base / ms["base"] if "base" in ms else float("nan"),
                        "previous tiles (×)": base / ms["fp8@old"],
                        "shipped (×)": base / ms["fp8"],
                        "change (×)": ms["fp8@old"] / ms["fp8"]})
    out.index = pd.MultiIndex.from_tuples(
        [(int(D), "causal" if c else "full") for D, c in out.index], names=["D", "mask"])
    out.attrs["N"] = int(d["N"].iloc[0])
    out.attrs["control"] = (ms["fp8"] / ms["fp8#2"]).dropna()
    return out


def shipped_forward_table(st: pd.DataFrame | None = None) -> pd.DataFrame:
    """The FP8 forward as shipped (Vᵀ given), from the run of ``forward_split_table``: per head
    dimension, our fp16 forward's time and the FP8 kernel's speed-up over it (fp16 time over FP8
    time, the same rounds), not causal and causal side by side. ``attrs``: N, and the control
    (the shipped kernel timed twice: its first time over its second) where it was timed."""
    st = forward_split_table() if st is None else st
    cols = {}
    for mask in ("full", "causal"):
        s = st.xs(mask, level="mask")
        cols[f"fp16, {mask} (ms)"] = s["fp16 (ms)"]
        cols[f"fp8, {mask} (×)"] = s["shipped (×)"]
    out = pd.DataFrame(cols)
    out.index.name = "D"
    out.attrs.update(st.attrs)
    return out


def group_rules(sty, level: int = 0):
    """A pandas Styler of a table with a row MultiIndex, with a rule above each new group of
    index level ``level`` and the group's label at the top of its rows (a centred label with no
    rule reads as belonging to the rows around it). Other tables are returned unchanged."""
    idx = sty.data.index
    if not isinstance(idx, pd.MultiIndex):
        return sty
    keys = idx.get_level_values(level)
    first = [i > 0 and keys[i] != keys[i - 1] for i in range(len(keys))]
    rule = "border-top: 1.5px solid #888"
    sty = sty.apply(lambda d: pd.DataFrame([[rule if f else ""] * d.shape[1] for f in first],
                                           index=d.index, columns=d.columns), axis=None)
    sty = sty.apply_index(lambda s: [rule if f else "" for f in first], axis=0,
                          level=list(range(idx.nlevels)))
    return sty.set_table_styles([{"selector": "tbody th", "props": "vertical-align: top;"}],
                                overwrite=False)
