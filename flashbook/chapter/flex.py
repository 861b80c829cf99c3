"""Helpers of the chapter "Beyond causal: masks, scores and sparsity" (FlexAttention in cuTile).

Readers of the recorded CPU evidence (``experiments/data/40-flex``, ``experiments/data/40-blasst``:
interpreter error tables, tile counts, per-mod SASS deltas, BLASST's curve), the tile-visit count
and figure of a BlockMask from an interpreter trace, the listing of the kernel factory, the
recorded GPU runs (``results/h200/flex``: the forward in fp16 and bf16, the backward, BLASST's
time against its skipped share; ``results/h200/profiles/flex-fp8``: the Nsight Compute card),
and the live GPU timing against ``torch.compile(flex_attention)``.
"""
from __future__ import annotations

import inspect
import json
import re
import lzma
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
FLEX_DATA = ROOT / "experiments" / "data" / "40-flex"
BLASST_DATA = ROOT / "experiments" / "data" / "40-blasst"

BENCH = ROOT / "results" / "h200" / "flex" / "flex_bench.json"
BENCH_BWD = ROOT / "results" / "h200" / "flex" / "flex_bench_backward.json"      # the per-arch tiles
BENCH_BWD_BF16 = ROOT / "results" / "h200" / "flex" / "flex_bench_backward_bf16.json"
BENCH_BWD_T = ROOT / "results" / "h200" / "flex" / "flex_bench_backward_t.json"   # as shipped
BENCH_BWD_T_BF16 = ROOT / "results" / "h200" / "flex" / "flex_bench_backward_t_bf16.json"  # 2 rows
BENCH_BWD_FIRST = ROOT / "results" / "h200" / "flex" / "flex_bench_backward_first.json"  # 64x64
BLASST_BENCH = ROOT / "results" / "h200" / "flex" / "blasst_bench.json"
PROFILE = ROOT / "results" / "h200" / "profiles" / "flex-fp8" / "summary.json"

__all__ = ["visit_row", "visit_frame", "visits_figure", "factory_listing", "sass", "sass_frame",
           "errors", "errors_frame", "blasst", "blasst_figure", "recorded_tiles", "live_timing",
           "bench", "bench_frame", "bench_table", "control_drift", "speedup_figure",
           "backward_frame", "backward_table", "blasst_bench", "blasst_speed_figure",
           "profile", "profile_shape", "profile_card", "host_kernels"]


# --- what a program visits --------------------------------------------------------------------
def _lists(bm):
    """Per query block: (partial kv blocks, full kv blocks) of head 0 of batch 0."""
    kn, ki = bm.kv_num_blocks[0, 0], bm.kv_indices[0, 0]
    if bm.full_kv_num_blocks is not None:
        fn, fi = bm.full_kv_num_blocks[0, 0], bm.full_kv_indices[0, 0]
    else:
        fn, fi = None, None
    out = []
    for qb in range(kn.shape[0]):
        part = ki[qb, :int(kn[qb])].tolist()
        full = fi[qb, :int(fn[qb])].tolist() if fn is not None else []
        out.append((part, full))
    return out


def visit_row(bm, tr) -> dict:
    """Tiles one head's programs loaded (``tr``: an interpreter trace of one flex call with
    block mask ``bm``, kernel tiles equal to its blocks) against the BlockMask's lists.
    Raises AssertionError if a program loaded a tile its row does not list."""
    lists = _lists(bm)
    for qb, (part, full) in enumerate(lists):
        got = sorted(int(i[3]) for i in tr.tiles("load", "K", program=(qb, 0, 0)))
        if got != sorted(part + full):
            raise AssertionError(f"program {qb} loaded K tiles {got}, its row lists "
                                 f"{sorted(part + full)}")
    n = len(lists)
    k = sum(tr.loads("K").values())
    return {"K tiles loaded": k, "V tiles loaded": sum(tr.loads("V").values()),
            "partial (mask evaluated)": sum(len(p) for p, _ in lists),
            "full (no mask)": sum(len(f) for _, f in lists), "dense": n * n,
            "% of dense": 100 * k / (n * n)}


def visit_frame(rows: dict) -> pd.DataFrame:
    return pd.DataFrame(rows).T.rename_axis("mask")


def visits_figure(block_masks: dict):
    """Which key block each query block's program visits, one panel per BlockMask
    (``{title: bm}``): full (no mask function), partial (mask evaluated) or not at all (no
    load, no MMA)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    colors = ["#eeeeee", "#f4a259", "#3b7dd8"]
    fig, axes = plt.subplots(1, len(block_masks), figsize=(4.2 * len(block_masks), 4.6),
                             squeeze=False)
    for ax, (title, bm) in zip(axes[0], block_masks.items()):
        lists = _lists(bm)
        n = len(lists)
        grid = np.zeros((n, n), int)
        for qb, (part, full) in enumerate(lists):
            grid[qb, part] = 1
            grid[qb, full] = 2
        ax.imshow(grid, cmap=ListedColormap(colors), vmin=0, vmax=2)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticks(np.arange(-0.5, n), minor=True)
        ax.set_yticks(np.arange(-0.5, n), minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.grid(which="major", visible=False)
        ax.tick_params(which="minor", length=0)
        ax.set_xlabel("key block")
        ax.set_title(title, fontsize=10)
    axes[0][0].set_ylabel("program (query block)")
    fig.legend(handles=[Patch(color=colors[2], label="full: loaded, no mask function"),
                        Patch(color=colors[1], label="partial: loaded, mask evaluated"),
                        Patch(color=colors[0], label="not visited: no load, no MMA")],
               loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    plt.close(fig)
    return fig


# --- the kernel factory ----------------------------------------------------------------------
def _between(src: str, start: str, end: str, *, include_end: bool = False) -> str:
    lines = src.splitlines()
    i = next(n for n, ln in enumerate(lines) if start in ln)
    j = next(n for n, ln in enumerate(lines[i + 1:], i + 1) if end in ln)
    block = lines[i:j + (1 if include_end else 0)]
    indent = min(len(ln) - len(ln.lstrip()) for ln in block if ln.strip())
    return "\n".join(ln[indent:] for ln in block)


def factory_listing(part: str = "mods") -> str:
    """Excerpts of ``flashattn/kernels/flex.py``: ``"mods"`` the factory's head and the lines
    of the tile body where the score function and the mask run; ``"blocks"`` the kernel's loop
    over the key blocks its BlockMask row lists."""
    from flashattn.kernels import flex as kf
    src = inspect.getsource(kf.make_flex_kernel)
    if part == "mods":
        head = _between(src, "def make_flex_kernel", "def flex_tile(")
        head = re.sub(r'\n    """.*?"""', "", head, count=1, flags=re.S)   # the docstring
        body = _between(src, "        if HAS_SCORE:", "if not EVEN_K:")
        body = re.sub(r"\s{2,}# \[TILE_M, TILE_N\]$", "", body, flags=re.M)
        return (head.rstrip() + "\n\n    def flex_tile(...):     # one key tile j, after S = Q K^T\n"
                + "\n".join("        " + ln for ln in body.splitlines()) + "\n        ...")
    if part == "blocks":
        body = _between(src, "n_part = mask_row(KvNum", "# TAIL:")
        return (body.rstrip() + "\n        m_i, l_i, acc = flex_tile(..., j, ..., partial, ...)"
                "   # the tile body")
    raise ValueError(f"part is 'mods' or 'blocks', not {part!r}")


# --- recorded evidence -----------------------------------------------------------------------
def sass() -> dict:
    return json.loads(lzma.open(FLEX_DATA / "sass.json.xz").read())


def _sink_blasst(name):
    return name.startswith(("sink", "blasst"))


def sass_frame(archs=("sm_90", "sm_100", "sm_120")) -> pd.DataFrame:
    """Per mod and architecture: SASS instructions the mod adds per tile (the kernel's growth
    over its baseline, divided by the copies of the tile loop in it), registers, and spill
    instructions (STL) added."""
    s = sass()
    rows = {}
    for arch in archs:
        a = s[arch]
        for name, m in a["mods"].items():
            base = a[m["base"]]
            copies = int(m["copies"])
            d = eval_dict(m["delta_per_copy"])
            r = rows.setdefault(name, {"kind": "mask" if m["base"] == "blocks" else "score"})
            r[f"{arch} +instr/tile"] = (int(m["sass_lines"]) - base["sass_lines"]) / copies
            r[f"{arch} REG"] = int(m["registers"])
            r[f"{arch} STL"] = d.get("STL", 0.0) * copies
    return pd.DataFrame(rows).T.rename_axis("mod")


def eval_dict(text):
    """The recorded opcode deltas (a dict, or its repr)."""
    if isinstance(text, dict):
        return text
    import ast
    return ast.literal_eval(text)


def errors() -> dict:
    return json.loads((FLEX_DATA / "errors.json").read_text())


def errors_frame(dtype: str = "float16") -> pd.DataFrame:
    """Worst forward error per mod over both masks (causal, full) in ``dtype``: ours and
    torch's flex_attention against fp64, and the worst backward error (dq, dk, dv) of ours
    and of the same-precision PyTorch reference."""
    e = errors()
    rows = {}
    for key, v in e["forward"].items():
        mod, mask, dt = key.split("|")
        if dt != dtype:
            continue
        r = rows.setdefault(mod, {"ours vs fp64": 0.0, "torch flex vs fp64": 0.0,
                                  "ours vs torch flex": 0.0, "bwd ours": 0.0, "bwd torch": 0.0})
        r["ours vs fp64"] = max(r["ours vs fp64"], v["vs_fp64"])
        r["torch flex vs fp64"] = max(r["torch flex vs fp64"], v["torch_vs_fp64"])
        r["ours vs torch flex"] = max(r["ours vs torch flex"], v["vs_flex"])
    for key, v in e["backward"].items():
        mod, mask, dt = key.split("|")
        if dt != dtype or mod not in rows:
            continue
        r = rows[mod]
        r["bwd ours"] = max(r["bwd ours"], *(v[g] for g in ("dq", "dk", "dv")))
        r["bwd torch"] = max(r["bwd torch"], *(v[g + "_torch"] for g in ("dq", "dk", "dv")))
    return pd.DataFrame(rows).T.rename_axis("score mod / mask")


def recorded_tiles() -> dict:
    return json.loads((FLEX_DATA / "tiles.json").read_text())


def blasst() -> list:
    return json.loads((BLASST_DATA / "blasst.json").read_text())


def blasst_figure():
    """Skipped key tiles and max error against BLASST's threshold T, per input kind."""
    import matplotlib.pyplot as plt
    runs = blasst()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9.5, 3.8))
    colors = {"random": "#777777", "local": "#d1495b", "sink": "#3b7dd8"}
    for run in runs:
        rows = [r for r in run["rows"] if r["T"] is not None]
        T = [r["T"] for r in rows]
        ls = "--" if run["causal"] else "-"
        lab = f"{run['kind']}{', causal' if run['causal'] else ''}"
        c = colors.get(run["kind"], None)
        a1.plot(T, [100 * r["skipped"] for r in rows], ls, marker="o", ms=3, color=c, label=lab)
        a2.plot(T, [r["max_err"] for r in rows], ls, marker="o", ms=3, color=c, label=lab)
        off = next(r for r in run["rows"] if r["T"] is None)
        a2.axhline(off["max_err"], color=c, lw=0.6, ls=":")
    for a in (a1, a2):
        a.set_xlabel("threshold T (log2 units; larger keeps more)")
        a.invert_xaxis()
        a.set_xscale("log", base=2)
        a.set_xticks([1, 2, 4, 8, 16, 20])
        a.set_xticklabels(["1", "2", "4", "8", "16", "20"])
        a.minorticks_off()
    a1.set_ylabel("key tiles skipped (%)")
    a2.set_ylabel("max |out - exact fp64|")
    a2.set_yscale("log")
    h, lab = a1.get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=6, frameon=False, fontsize=8)
    a2.set_title("dotted: BLASST off", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    plt.close(fig)
    return fig


# --- recorded GPU timings --------------------------------------------------------------------

# the benchmark's workload names, as the chapter writes them
WORKLOADS = {"causal": "causal", "prefix_lm_N/4": "prefix-LM (N/4)",
             "sliding_window_4K": "window 4K", "sliding_window_1K": "window 1K",
             "sliding_window_256": "window 256", "document_2": "2 documents",
             "document_8": "8 documents", "document_64": "64 documents", "alibi": "ALiBi",
             "softcap_50": "softcap 50"}


def bench(path=BENCH) -> dict:
    """The recorded GPU run: flex against torch.compile(flex_attention) on the same BlockMask."""
    from flashbook.data.schema import read_json
    return read_json(str(path))


def _k(n: int) -> str:
    return f"{n // 1024}K"


def _rows(data: dict, dtype: str) -> list:
    """The rows of one dtype (rows without a dtype are fp16, as the first recordings were)."""
    rows = [r for r in data["rows"] if r.get("dtype", "float16") == dtype]
    if not rows:
        raise ValueError(f"no rows of dtype {dtype!r} in the recording")
    return rows


def bench_frame(data: dict | None = None, dtype: str = "float16") -> pd.DataFrame:
    """One row per (workload, N) of ``dtype``: visited blocks (% of dense), speed-up over torch.compile(flex)
    (its median time over ours), our TFLOPS on the visited blocks, and that throughput over our
    dense causal kernel's on the causal mask at the same N (timed in the same rounds), and the
    control's ratio (the flex kernel timed twice)."""
    data = bench() if data is None else data
    rows = _rows(data, dtype)
    causal_flops = {r["N"]: r["visited_flops"] for r in rows if r["workload"] == "causal"}
    out = []
    for r in rows:
        im = r["impls"]
        ours, ctl = im["flashattn.flex"], im["flashattn.flex#2"]
        dense_tf = causal_flops[r["N"]] / (im["flashattn.causal"]["median_ms"] * 1e-3) / 1e12
        out.append({"workload": r["workload"], "N": r["N"],
                    "visited %": 100 * r["blocks"] / r["dense_blocks"],
                    "speedup": im["torch.flex"]["median_ms"] / ours["median_ms"],
                    "tflops": ours["tflops_visited"],
                    "vs causal": ours["tflops_visited"] / dense_tf,
                    "time vs causal": ours["median_ms"] / im["flashattn.causal"]["median_ms"],
                    "control": ours["median_ms"] / ctl["median_ms"],
                    "max diff": im["torch.flex"]["max_diff_vs_ours"]})
    return pd.DataFrame(out)


def control_drift(data: dict | None = None, dtype: str = "float16") -> pd.Series:
    """Per N, how far two timings of the same kernel differ at worst: the largest
    1 - faster/slower over the workloads (0.05: the slower reads 5 % below the faster's speed)."""
    f = bench_frame(data, dtype)
    c = f["control"]
    return (1 - np.minimum(c, 1 / c)).groupby(f["N"]).max()


def bench_table(data: dict | None = None, dtype: str = "float16") -> pd.DataFrame:
    """Workloads x N for people: speed-up over torch.compile(flex) and TFLOPS per visited block
    over our dense causal kernel's, with the share of blocks visited at the largest N."""
    f = bench_frame(data, dtype)
    ns = sorted(f["N"].unique())
    t = {}
    for col, key in (("× torch", "speedup"), ("TF / causal", "vs causal")):
        for n in ns:
            sub = f[f["N"] == n].set_index("workload")[key]
            t[f"{_k(n)} {col}"] = sub
    big = f[f["N"] == ns[-1]].set_index("workload")["visited %"]
    t[f"visited % ({_k(ns[-1])})"] = big
    out = pd.DataFrame(t).loc[[w for w in WORKLOADS if w in set(f["workload"])]]
    out.index = [WORKLOADS[w] for w in out.index]
    return out.rename_axis("workload")


def speedup_figure(data: dict | None = None, dtype: str = "float16"):
    """Speed-up of flashattn.flex_attention over torch.compile(flex_attention), per workload,
    one bar per sequence length; the line at 1 is parity."""
    import matplotlib.pyplot as plt
    f = bench_frame(data, dtype)
    ns = sorted(f["N"].unique())
    names = [w for w in WORKLOADS if w in set(f["workload"])]
    fig, ax = plt.subplots(figsize=(7.0, 3.6))
    width = 0.8 / len(ns)
    colors = ["#9ecae1", "#4292c6", "#08519c"]
    y = np.arange(len(names))
    for i, n in enumerate(ns):
        sub = f[f["N"] == n].set_index("workload")["speedup"]
        ax.barh(y + (i - (len(ns) - 1) / 2) * width, [sub[w] for w in names], height=width,
                color=colors[i % len(colors)], label=f"N = {_k(n)}")
    ax.set_yticks(y)
    ax.set_yticklabels([WORKLOADS[w] for w in names])
    ax.invert_yaxis()
    ax.axvline(1.0, color="#444444", lw=0.8)
    ax.set_xlim(0, max(1.8, float(f["speedup"].max()) + 0.1))
    ax.set_xlabel(f"speed-up over torch.compile(flex_attention) (×, time ratio), {dtype}")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(ns), frameon=False,
              fontsize=8)
    ax.grid(axis="x", lw=0.4, alpha=0.5)
    fig.tight_layout()
    plt.close(fig)
    return fig


# --- the recorded backward, BLASST's timings and the profile -----------------------------------
def backward_path(dtype: str = "float16"):
    """The recorded backward run of ``dtype`` (the per-arch tiles, torch and dense beside)."""
    return {"float16": BENCH_BWD, "bfloat16": BENCH_BWD_BF16}[dtype]


def backward_frame(data: dict | None = None, dtype: str = "float16") -> pd.DataFrame:
    """The recorded flex backward (the backward alone: the forward runs once, outside the
    timing), one row per (workload, N): torch.compile(flex)'s time over ours ("speedup", below
    1: ours is slower), our time over our dense causal backward's in the same rounds, our
    TFLOPS on the visited blocks over the dense causal backward's on the causal mask ("vs
    causal"), and the control's ratio."""
    data = bench(backward_path(dtype)) if data is None else data
    rows = _rows(data, dtype)
    causal_flops = {r["N"]: r["visited_flops"] for r in rows if r["workload"] == "causal"}
    out = []
    for r in rows:
        im = r["impls"]
        ours = im["flashattn.flex"]["median_ms"]
        dense = im["flashattn.causal"]["median_ms"]
        out.append({"workload": r["workload"], "N": r["N"], "ms": ours,
                    "torch ms": im["torch.flex"]["median_ms"],
                    "speedup": im["torch.flex"]["median_ms"] / ours,
                    "time vs causal": ours / dense,
                    "vs causal": (r["visited_flops"] / ours) / (causal_flops[r["N"]] / dense),
                    "control": ours / im["flashattn.flex#2"]["median_ms"]})
    return pd.DataFrame(out)


def backward_table(data: dict | None = None, dtype: str = "float16") -> pd.DataFrame:
    """Workloads x N for people: the backward's speed-up over torch.compile(flex) (below 1:
    slower) and its time over our dense causal backward's."""
    f = backward_frame(data, dtype)
    ns = sorted(f["N"].unique())
    t = {}
    for col, key in (("× torch", "speedup"), ("time / dense causal", "time vs causal")):
        for n in ns:
            t[f"{_k(n)} {col}"] = f[f["N"] == n].set_index("workload")[key]
    out = pd.DataFrame(t).loc[[w for w in WORKLOADS if w in set(f["workload"])]]
    out.index = [WORKLOADS[w] for w in out.index]
    return out.rename_axis("workload")


def blasst_bench(data: dict | None = None) -> pd.DataFrame:
    """BLASST timed on the GPU: one row per (kind, causal, setting), the share of key tiles it
    skipped and its speed-up over BLASST off (the time off over the time on). Setting "off#2"
    is the control (BLASST off, timed twice)."""
    data = bench(BLASST_BENCH) if data is None else data
    f = pd.DataFrame(data["rows"])
    f["skipped %"] = 100 * f["skipped_fraction"]
    f["speedup"] = f["speedup_vs_off"]
    f.attrs["meta"] = data["meta"]
    return f[["kind", "causal", "N", "impl", "T", "skipped %", "speedup", "median_ms",
              "max_diff_vs_off"]]


def blasst_speed_figure(f: pd.DataFrame | None = None):
    """BLASST's speed-up over BLASST off against the share of key tiles it skipped, one point
    per (input kind, mask, threshold); the line at 1 is BLASST off."""
    import matplotlib.pyplot as plt
    f = blasst_bench() if f is None else f
    on = f[f["T"].notna()]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    colors = {"random": "#777777", "local": "#d1495b", "sink": "#3b7dd8"}
    for (kind, causal), g in on.groupby(["kind", "causal"], sort=False):
        ax.scatter(g["skipped %"], g["speedup"], s=28, color=colors.get(kind),
                   marker="s" if causal else "o", facecolors="none" if causal else None,
                   label=f"{kind}{', causal' if causal else ''}")
    ax.axhline(1.0, color="#444444", lw=0.8)
    ax.set_xlabel("key tiles skipped (%)")
    ax.set_ylabel("speed-up over BLASST off (×)")
    ax.set_xlim(-3, 103)
    ax.grid(lw=0.4, alpha=0.5)
    ax.legend(frameon=False, fontsize=8, ncol=3, loc="upper left")
    fig.tight_layout()
    plt.close(fig)
    return fig


# Nsight Compute's metrics the chapter's profile card shows, with the card's names.
CARD_METRICS = {"duration (ms)": "gpu__time_duration.sum",
                "SM throughput (%)": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                "memory throughput (%)":
                    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
                "registers": "launch__registers_per_thread",
                "threads per CTA": "launch__block_size",
                "achieved occupancy (%)": "sm__warps_active.avg.pct_of_peak_sustained_active"}


def profile(path=PROFILE):
    """The Nsight Compute summary of the flex and FP8 kernels: one row per (profiled call,
    kernel), one column per metric."""
    from ..measure import ncu
    rows, _rules = ncu.load_summary(str(path))
    return ncu.wide(rows)


def profile_shape(path=PROFILE) -> dict:
    """The shape every profiled call ran (B, Hq, Hkv, N, D, dtype, causal)."""
    from flashbook.data.schema import read_json
    return read_json(str(path))["meta"]["shape"]


def profile_card(steps: dict, w: pd.DataFrame | None = None, kernels=("flex_kernel",
                 "fmha_kernel", "fmha_fp8_kernel", "triton")) -> pd.DataFrame:
    """The attention kernel of each profiled call (``steps``: {step: the card's name}), with
    ``CARD_METRICS``; the host's small kernels inside the call are left out (``host_kernels``)."""
    w = profile() if w is None else w
    out = {}
    for step, name in steps.items():
        g = w[(w["step"] == step) & w["kernel"].str.startswith(kernels)]
        if len(g) != 1:
            raise KeyError(f"profile has {len(g)} attention kernels for {step!r}")
        r = g.iloc[0]
        out[name] = {k: float(r[m]) for k, m in CARD_METRICS.items()}
    t = pd.DataFrame(out).T
    t["duration (ms)"] /= 1e6
    for c in ("registers", "threads per CTA"):
        t[c] = t[c].astype(int)
    return t.rename_axis("kernel")


def host_kernels(w: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per profiled flex call: how many of PyTorch's elementwise kernels ran inside it (host
    code's tensor operations before the launch) and their total and largest duration (µs)."""
    w = profile() if w is None else w
    g = w[w["kernel"].str.startswith("at::")]
    d = g["gpu__time_duration.sum"] / 1e3
    return pd.DataFrame({"kernels": g.groupby("step").size(),
                         "total (µs)": d.groupby(g["step"]).sum(),
                         "largest (µs)": d.groupby(g["step"]).max()})


# --- live GPU timing -------------------------------------------------------------------------
def live_timing(N: int = 8192, B: int = 4, H: int = 32, D: int = 128, window: int = 1024):
    """GPU only: ``flashattn.flex_attention`` against ``torch.compile(flex_attention)`` on the
    same BlockMask (causal sliding window), fp16 forward; median ms per call and the ratio."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import flashattn
    from flashattn import mods
    from flashattn.timing import time_rounds
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16, generator=g)
               for _ in range(3))
    rows = {}
    for name, mask in (("causal", mods.causal()),
                       (f"sliding_window({window})", mods.sliding_window(window))):
        bm = create_block_mask(mask, None, None, N, N, device="cuda", BLOCK_SIZE=128)
        compiled = torch.compile(flex_attention)
        fns = {"flashattn.flex_attention": lambda: flashattn.flex_attention(q, k, v, block_mask=bm),
               "torch.compile(flex_attention)": lambda: compiled(q, k, v, block_mask=bm)}
        for f in fns.values():
            f()
        err = (fns["flashattn.flex_attention"]().float()
               - fns["torch.compile(flex_attention)"]().float()).abs().max().item()
        t = time_rounds(fns, rounds=10, inner=5)
        ours = t["flashattn.flex_attention"].median_ms
        theirs = t["torch.compile(flex_attention)"].median_ms
        rows[name] = {"flashattn (ms)": ours, "torch flex (ms)": theirs,
                      "torch / ours": theirs / ours, "max |diff|": err}
    return pd.DataFrame(rows).T.rename_axis(f"B={B} H={H} N={N} D={D} fp16")


# --- the backward's tiles, re-timed ------------------------------------------------------------


def backward_tiles_table(path=None, before=None, N: int = 8192) -> pd.DataFrame:
    """The flex backward on the per-arch tiles (the full fp16 run) beside the first run on 64 x 64
    tiles, at ``N``: both times, the speed-up, each one's time over the dense causal backward
    timed in its own run, and torch.compile(flex)'s time in each run (the same code twice: how
    far the two runs' machines differ)."""
    from flashbook.data.schema import read_json
    new = read_json(str(path or BENCH_BWD))["rows"]
    old = read_json(str(before or BENCH_BWD_FIRST))["rows"]
    rows = {}
    for r in new:
        if r["N"] != N or r["dtype"] != "float16":
            continue
        o = next(x for x in old if x["workload"] == r["workload"] and x["N"] == r["N"]
                 and x["dtype"] == r["dtype"])
        im, om = r["impls"], o["impls"]
        n_ms, o_ms = im["flashattn.flex"]["median_ms"], om["flashattn.flex"]["median_ms"]
        rows[WORKLOADS.get(r["workload"], r["workload"])] = {
            "first run (ms)": o_ms, "tuned tiles (ms)": n_ms, "speed-up (×)": o_ms / n_ms,
            "first: / dense": o_ms / om["flashattn.causal"]["median_ms"],
            "tuned: / dense": n_ms / im["flashattn.causal"]["median_ms"],
            "torch, runs (×)": om["torch.flex"]["median_ms"] / im["torch.flex"]["median_ms"]}
    return pd.DataFrame(rows).T.rename_axis(f"mask (fp16, {_k(N)})")


# --- the backward's kernel pairs ---------------------------------------------------------------
BWD_CANDIDATES = ROOT / "results" / "h200" / "flex" / "flex_bwd_candidates.json"
PAIR_LABELS = {"mn": "first pair", "mn+delta": "+ Delta kernel", "t-dq": "+ dense-shaped dQ",
               "t": "+ transposed dK/dV"}


def backward_candidates_table(path=None) -> pd.DataFrame:
    """The backward's kernel pairs timed in one run (backward only, fp16): the first pair's time,
    each cumulative change's speed-up over it and the control (the first pair timed twice).
    ``attrs["dense"]``: per causal row, the last pair's time over the dense causal backward's."""
    from flashbook.data.schema import read_json
    rows, dense = {}, {}
    for r in read_json(str(path or BWD_CANDIDATES))["rows"]:
        im = r["impls"]
        base = im["mn"]["median_ms"]
        row = {"first pair (ms)": base}
        for k, label in PAIR_LABELS.items():
            if k != "mn":
                row[f"{label} (×)"] = base / im[k]["median_ms"]
        row["control (×)"] = base / im["mn#2"]["median_ms"]
        name = f"{WORKLOADS.get(r['workload'], r['workload'])}, {_k(r['N'])}"
        if "dense causal" in im:
            dense[name] = im["t"]["median_ms"] / im["dense causal"]["median_ms"]
        rows[name] = row
    out = pd.DataFrame(rows).T.rename_axis("mask (fp16)")
    out.attrs["dense"] = dense
    return out
