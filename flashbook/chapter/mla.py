"""Chapter 16 (multi-head latent attention): the decode step's arithmetic against GQA, the
absorption of the up-projections shown in float64, the kernel's listing, its compile table, the
interpreter's check against float64, the recorded measurements (``results/<gpu>/mla/``, when a
GPU run has written them) and a live step on a GPU."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ..hardware import HBM_TBS, PEAK_TFLOPS

ROOT = Path(__file__).resolve().parents[2]
SASS_TABLE = ROOT / "experiments" / "data" / "mla-sass" / "table.txt"

# Attention shapes of one layer's decode step: query heads, cache heads, Q K^T and P V widths,
# and the values cached per token and cache head (MLA: one latent row serves as K and V).
MODELS = {
    "DeepSeek-V3 (MLA)": dict(Hq=128, Hkv=1, Dqk=576, Dv=512, cached=576, layers=61),
    "Llama-3-70B (GQA 64:8)": dict(Hq=64, Hkv=8, Dqk=128, Dv=128, cached=2 * 128, layers=80),
}
MLA, GQA = MODELS


def step_arith(model: str, Sq: int = 1, elem_bytes: int = 2) -> dict:
    """Per cached token and layer: bytes read (the cache once), FLOPs (Q K^T and P V of every
    query row) and their ratio, FLOP per byte."""
    m = MODELS[model]
    nbytes = m["Hkv"] * m["cached"] * elem_bytes
    flops = 2 * m["Hq"] * Sq * (m["Dqk"] + m["Dv"])
    return dict(bytes=nbytes, flops=flops, intensity=flops / nbytes)


def cache_gb(model: str, tokens: int, elem_bytes: int = 2) -> float:
    """One sequence's cache over all layers, GB (1e9 bytes)."""
    m = MODELS[model]
    return m["layers"] * tokens * m["Hkv"] * m["cached"] * elem_bytes / 1e9


def ridge() -> float:
    """FLOP per byte where the H200's tensor cores (dense bf16) and HBM take equally long."""
    return PEAK_TFLOPS / HBM_TBS


def arith_table(sqs=(1, 2, 4)):
    """Bytes per cached token, FLOPs per cached token and FLOP per byte, per model and Sq."""
    import pandas as pd
    rows = []
    for name in MODELS:
        for sq in sqs:
            a = step_arith(name, sq)
            rows.append({"model": name, "new tokens": sq, "cache bytes / token": a["bytes"],
                         "FLOPs / token": a["flops"], "FLOP / byte": a["intensity"],
                         "÷ ridge": a["intensity"] / ridge()})
    return pd.DataFrame(rows).set_index(["model", "new tokens"])


def bound_ms(model: str, B: int, N: int, Sq: int = 1, elem_bytes: int = 2) -> dict:
    """The roofline's floor for one layer's step: HBM time, tensor-core time (dense peak), the
    larger of the two, and the share of the HBM peak a kernel at that floor would show."""
    a = step_arith(model, Sq, elem_bytes)
    t_mem = B * N * a["bytes"] / (HBM_TBS * 1e12) * 1e3
    t_mma = B * N * a["flops"] / (PEAK_TFLOPS * 1e12) * 1e3
    t = max(t_mem, t_mma)
    return dict(mem_ms=t_mem, mma_ms=t_mma, floor_ms=t, max_frac_hbm=t_mem / t)


def roofline_figure(sqs=(1, 2, 4)):
    """The H200's roofline with both models' decode steps (one point per Sq)."""
    import matplotlib.pyplot as plt
    import numpy as np
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x = np.logspace(0, 3.3, 200)
    ax.plot(x, np.minimum(PEAK_TFLOPS, HBM_TBS * x), color="0.3", lw=1.5,
            label="H200 roofline (dense bf16, HBM)")
    ax.axvline(ridge(), color="0.6", ls=":", lw=1)
    ax.text(ridge() * 1.08, 20, f"ridge {ridge():.0f}", color="0.4", fontsize=8)
    for (name, color, marker) in ((MLA, "C3", "o"), (GQA, "C0", "s")):
        pts = [step_arith(name, sq)["intensity"] for sq in sqs]
        ys = [min(PEAK_TFLOPS, HBM_TBS * p) for p in pts]
        ax.plot(pts, ys, marker, color=color, ms=7, label=name)
        for p, y, sq in zip(pts, ys, sqs):
            ax.annotate(f"Sq={sq}", (p, y), textcoords="offset points", xytext=(5, -12),
                        fontsize=8, color=color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte of cache)")
    ax.set_ylabel("attainable TFLOPS")
    ax.set_ylim(10, 2000)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("One decode step per layer on the H200 roofline")
    plt.close(fig)
    return fig


def absorption_demo(seed: int = 0, B: int = 1, Sq: int = 2, H: int = 8, n: int = 300,
                    d_nope: int = 128, d_rope: int = 64, d_lat: int = 512, d_v: int = 128):
    """DeepSeek's layer in both forms, float64: per-head keys and values expanded from the
    latent (``mla_unabsorbed_reference``) against the absorbed queries over the latent cache
    (``mla_decode_reference``) followed by ``W_UV``. Returns the two outputs' and LSEs' largest
    difference and the sizes of what each form reads per token."""
    import torch

    from flashattn.reference.mla import absorb, mla_decode_reference, mla_unabsorbed_reference
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([n] * B, dtype=torch.int32)
    latent = torch.randn(B, n, d_lat, generator=g, dtype=torch.float64)
    k_rope = torch.randn(B, n, d_rope, generator=g, dtype=torch.float64)
    w_uk = torch.randn(H, d_nope, d_lat, generator=g, dtype=torch.float64) / math.sqrt(d_lat)
    w_uv = torch.randn(H, d_v, d_lat, generator=g, dtype=torch.float64) / math.sqrt(d_lat)
    q_nope = torch.randn(B, Sq, H, d_nope, generator=g, dtype=torch.float64)
    q_rope = torch.randn(B, Sq, H, d_rope, generator=g, dtype=torch.float64)
    scale = (d_nope + d_rope) ** -0.5
    o_ref, lse_ref = mla_unabsorbed_reference(q_nope, q_rope, latent, k_rope, w_uk, w_uv, lens,
                                              scale, causal=True)
    # The latent cache in pages of 64 tokens, the pages in reverse order.
    page = 64
    pages = -(-n // page)
    cache = torch.zeros(B * pages, page, 1, d_lat + d_rope, dtype=torch.float64)
    table = torch.arange(B * pages - 1, -1, -1, dtype=torch.int32).view(B, pages)
    for b in range(B):
        rows = torch.cat([latent[b], k_rope[b]], dim=-1)
        for t in range(n):
            cache[table[b, t // page], t % page, 0] = rows[t]
    q_abs, up = absorb(q_nope, q_rope, w_uk, w_uv)
    o_lat, lse_abs = mla_decode_reference(q_abs, cache, table, lens, d_lat, softmax_scale=scale,
                                          causal=True)
    return dict(out_diff=float((up(o_lat) - o_ref).abs().max()),
                lse_diff=float((lse_abs - lse_ref).abs().max()),
                out_max=float(o_ref.abs().max()),
                expanded_per_token=H * (d_nope + d_rope + d_v), latent_per_token=d_lat + d_rope,
                H=H, n=n, Sq=Sq)


def kernel_listing(name: str) -> str:
    """One function of ``flashattn/kernels/mla_decode.py`` as it ships (read as text)."""
    from ..source import shipped_listing
    return shipped_listing("flashattn.kernels.mla_decode", name).rstrip("\n")


def sass_table(path: Path = SASS_TABLE):
    """The compile table of ``tests/test_mla_aot.py`` (committed under experiments/data/):
    one row per (arch, kernel, configuration), with the MMA instructions by shape."""
    import pandas as pd
    lines = path.read_text().splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("step "))
    cols = ["REG", "STACK", "SHARED", "MMA", "EX2", "RCP", "LDL", "STL"]
    rows = []
    for ln in lines[head + 1:]:
        if not ln.strip():
            break
        parts = re.split(r"\s{2,}", ln.strip())
        step, arch, kernel, config, *nums = parts
        rows.append(dict(arch=arch, kernel=kernel, config=config,
                         **{c: int(v) for c, v in zip(cols, nums[:len(cols)])}))
    df = pd.DataFrame(rows)
    mma = {}
    start = next((i for i, ln in enumerate(lines) if ln.startswith("MMA instructions")), None)
    if start is not None:
        for ln in lines[start + 1:]:
            m = re.match(r"(sm_\d+)\s+(.+?)\s{2,}(.*)$", ln.strip())
            if m:
                mma[(m.group(1), m.group(2).strip())] = m.group(3).strip()
    df["kind"] = [c.split(" ")[0] + (" final" if " final " in f" {c} " else "")
                  if k != "mla_combine" else "combine" for c, k in zip(df.config, df.kernel)]
    df["MMA shapes"] = [mma.get((a, k), "") for a, k in zip(df.arch, df.kind)]
    return df


def sass_meta(path: Path = SASS_TABLE) -> dict:
    """The compile table's header: the compiler versions and the date."""
    head = path.read_text().splitlines()[1]
    m = re.search(r"tileiras ([\d.]+) \| cuda-tile ([\d.]+) \| (\d{4}-\d\d-\d\d)", head)
    return dict(tileiras=m.group(1), cuda_tile=m.group(2), date=m.group(3))


def cpu_check(seed: int = 0):
    """The shipped kernels in the CPU interpreter against the float64 reference: a few
    configurations (several splits, causal speculative tokens, pages shuffled, an empty
    sequence, fp16, an FP8 cache with per-sequence descales). Returns a DataFrame with each
    case's largest output and LSE error."""
    import pandas as pd
    import torch

    import flashattn
    from flashattn.reference.mla import mla_decode_reference
    cases = [("bf16, 1 token, 1 split", torch.bfloat16, 1, (70, 129), False, 1, None),
             ("bf16, 2 tokens causal, 3 splits", torch.bfloat16, 2, (1, 0, 200), True, 3, None),
             ("fp16, 4 tokens causal, 2 splits", torch.float16, 4, (3, 190), True, 2, None),
             ("FP8 cache, 2 tokens causal", torch.bfloat16, 2, (97, 40), True, 2, "fp8")]
    rows = []
    for i, (label, dt, Sq, lens, causal, splits, fp8) in enumerate(cases):
        g = torch.Generator().manual_seed(seed + i)
        lens_t = torch.tensor(lens, dtype=torch.int32)
        pages = [max(1, -(-n // 64)) for n in lens]
        perm = torch.randperm(sum(pages) + 1, generator=g)
        table = torch.full((len(lens), max(pages)), int(perm[-1]), dtype=torch.int32)
        j = 0
        for b, p in enumerate(pages):
            table[b, :p] = perm[j:j + p].to(torch.int32)
            j += p
        kv = torch.randn(sum(pages) + 1, 64, 1, 576, generator=g)
        q = torch.randn(len(lens), Sq, 16, 576, generator=g).to(dt)
        kw, descale = {}, None
        if fp8:
            kv = (kv * 4).to(torch.float8_e4m3fn)
            descale = torch.tensor([0.02, 0.05])
            kw = dict(descale=descale)
        else:
            kv = kv.to(dt)
        with flashattn.interpret.enabled():
            meta, ns = flashattn.get_mla_metadata(lens_t, Sq * 16, 1)
            meta = meta.clone()
            meta[0, 0] = splits
            o, lse = flashattn.flash_mla_with_kvcache(q, kv, table, lens_t, 512, meta, ns,
                                                      causal=causal, **kw)
        ro, rlse = mla_decode_reference(q, kv, table, lens_t, 512, causal=causal,
                                        descale=descale)
        fin = torch.isfinite(rlse)
        rows.append({"case": label, "lengths": ", ".join(map(str, lens)),
                     "out error": float((o.double() - ro).abs().max()),
                     "LSE error": float((lse.double() - rlse)[fin].abs().max()),
                     "+inf LSE where no key": bool(torch.equal(torch.isinf(lse), ~fin))})
    return pd.DataFrame(rows).set_index("case")


def measurements(gpu: str = "h200"):
    """The recorded decode benchmark (``experiments/mla_bench.py``'s JSON files under
    ``results/<gpu>/mla/``), or None when no GPU run has recorded one."""
    folder = ROOT / "results" / gpu / "mla"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    docs = [json.loads(p.read_text()) for p in files]
    docs = [d for d in docs if not d.get("dry_run")]
    return docs or None


def live_step(B: int = 64, N: int = 8192):
    """On a GPU: one decode step at DeepSeek-V3's shape (Hq 128, one latent head, bf16, pages
    of 64 shuffled) through ``flash_mla_with_kvcache`` beside SDPA over the gathered latent
    (128 heads as the rows of one head, PyTorch's default backend), by CUDA events with L2
    flushed. Returns a DataFrame (ms, GB/s) with the max difference in ``attrs``."""
    import pandas as pd
    import torch

    import flashattn
    from flashattn.timing import time_cuda
    dev = torch.device("cuda")
    pages = N // 64
    q = torch.randn(B, 1, 128, 576, device=dev, dtype=torch.bfloat16)
    lat = torch.randn(B, N, 576, device=dev, dtype=torch.bfloat16)
    perm = torch.randperm(B * pages, device=dev)
    cache = torch.empty(B * pages, 64, 1, 576, device=dev, dtype=torch.bfloat16)
    cache[perm] = lat.view(B * pages, 64, 1, 576)
    table = perm.view(B, pages).to(torch.int32)
    lens = torch.full((B,), N, dtype=torch.int32, device=dev)
    meta, ns = flashattn.get_mla_metadata(lens, 128, 1)
    k = lat.view(B, 1, N, 576)

    def ours():
        return flashattn.flash_mla_with_kvcache(q, cache, table, lens, 512, meta, ns)[0]

    def sdpa():
        o = torch.nn.functional.scaled_dot_product_attention(
            q.view(B, 1, 128, 576), k, k[..., :512], scale=576 ** -0.5)
        return o.view(B, 1, 128, 512)
    err = float((ours().float() - sdpa().float()).abs().max())
    nbytes = B * N * 576 * 2
    rows = {}
    for name, fn in (("flash_mla_with_kvcache", ours), ("SDPA, gathered latent", sdpa)):
        t = time_cuda(fn, warmup=3, reps=20)
        rows[name] = {"ms": t.median_ms, "GB/s": nbytes / t.median_ms / 1e6}
    df = pd.DataFrame(rows).T
    df.attrs["max_abs_err"] = err
    return df
