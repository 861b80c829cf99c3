"""The backward pass (chapter 11): what autograd saves, the five products, the recorded
backward benchmarks, the tile sweep (E14), the Nsight Compute profiles of the three backward
kernels beside cuDNN's, the training run and the GPU suite's error ratios.

    from flashbook.chapter import backward as bw
    bw.saved_bytes(fn, q, k, v)                 # bytes autograd keeps for the backward of fn
    bw.bench_frame()                            # the four recorded workloads, one DataFrame
    bw.ratio_table(df, "bwd")                   # ours over cuDNN / FA2, [95 %] by round
    bw.kernel_profile(r)                        # one row per kernel, named for the chapter
    bw.kernel_card(prof, ["bwd_dkdv", "cudnn_bwd"])
    bw.train_figure(bw.train_run())

CPU only: everything reads the recorded data (``results/h200/``, ``experiments/data/``), and
the saved-bytes count runs PyTorch on the CPU and flashattn's operator on the ``meta`` device.
"""
from __future__ import annotations

import lzma
import re
import xml.etree.ElementTree as ET

import numpy as np

from ..data.results import experiments_root, results_root
from ..data.schema import read_json, to_frame
from ..impls import color_of, label_of
from . import plots

GPU = "h200"
OURS = "fmha_bwd"                       # our backward: three kernels, deterministic
ATOMIC = "fmha_bwd_atomic"              # the opt-in variant: dQ by atomic adds
LIBS = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
IMPLS = (OURS, *LIBS)
LABELS = {n: label_of(n, "backward") for n in (OURS, ATOMIC, *LIBS)}   # the registry's
COLORS = {n: color_of(n) for n in (OURS, ATOMIC, *LIBS)}
PASS_NAMES = {"bwd": "backward alone", "fwd_bwd": "forward + backward", "fwd": "forward"}
WORKLOADS = {(dtype, causal): f"{dtype}-{'causal' if causal else 'full'}-d128-bwd"
             for dtype in ("fp16", "bf16") for causal in (True, False)}
SWEEP_RUN = "20-bwd-sweep"
ATOMIC_RUN = "21-bwd-atomic"
SUITE_RUN = "22-gpu-suite"

# The kernels of each profiled backward, by the names this chapter gives them.
KERNELS = {
    "bwd_preprocess_kernel": "bwd_preprocess",
    "bwd_dkdv_kernel": "bwd_dkdv",
    "bwd_dq_kernel": "bwd_dq",
    "bwd_dkdv_dq_atomic_kernel": "bwd_dkdv_dq_atomic",
    "cudnn::compute_dot_do_o_specialized": "cudnn_delta",
    "cudnn::convert_dq_to_16bits": "cudnn_convert_dq",
    "pytorch_flash::flash_bwd_dot_do_o_kernel": "fa2_delta",
    "pytorch_flash::flash_bwd_convert_dq_kernel": "fa2_convert_dq",
}
_KERNEL_PREFIX = {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop": "cudnn_bwd",
                  "pytorch_flash::flash_bwd_dq_dk_dv_loop": "fa2_bwd"}


# --- what autograd keeps for the backward --------------------------------------------------------
def saved_tensors(fn, *args, **kwargs):
    """(output of ``fn(*args, **kwargs)``, [(shape, dtype, bytes)]) of the tensors autograd saves
    for the backward, each storage counted once (a tensor saved twice, or a view of a saved one,
    adds nothing). Tensors on the ``meta`` device count their nominal size."""
    import torch
    seen = {}

    def pack(t):
        if t.device.type == "meta":
            key, n = ("meta", id(t)), t.numel() * t.element_size()
        else:
            st = t.untyped_storage()
            key, n = (t.device.type, st.data_ptr()), st.nbytes()
        seen.setdefault(key, (tuple(t.shape), str(t.dtype).replace("torch.", ""), n))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args, **kwargs)
    return out, list(seen.values())


def saved_bytes(fn, *args, **kwargs) -> int:
    """Bytes of the distinct tensors autograd saves for the backward of ``fn(*args)``."""
    return sum(n for _, _, n in saved_tensors(fn, *args, **kwargs)[1])


def qkv(B, H, N, D, *, device="cpu", dtype="float16", seed=0):
    """q, k, v (B, H, N, D) that require grad: random on the CPU, empty on ``meta``."""
    import torch
    dt = getattr(torch, dtype)
    if device == "meta":
        return [torch.empty(B, H, N, D, dtype=dt, device="meta", requires_grad=True)
                for _ in range(3)]
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g, dtype=torch.float32).to(dt).requires_grad_()
            for _ in range(3)]


def math_attention(q, k, v, causal=True):
    """PyTorch's math SDPA backend (the unfused reference: it materialises P)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def saved_by_n(seqlens, *, B=1, H=2, D=64, causal=True):
    """DataFrame (N, math, flashattn): bytes saved for the backward by PyTorch's math attention
    (run on the CPU, fp16) and by flashattn's operator (traced on ``meta``), per N."""
    import pandas as pd
    import flashattn
    rows = []
    for n in seqlens:
        math_b = saved_bytes(math_attention, *qkv(B, H, n, D), causal=causal)
        ours = saved_bytes(lambda q, k, v: flashattn.attention(q, k, v, causal=causal),
                           *qkv(B, H, n, D, device="meta"))
        rows.append({"N": n, "math": math_b, "flashattn": ours})
    return pd.DataFrame(rows)


def fit_n2_n(ns, nbytes):
    """(a, b): the least-squares fit of ``nbytes = a N² + b N`` (bytes per (batch, head))."""
    ns = np.asarray(ns, dtype=float)
    A = np.stack([ns ** 2, ns], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.asarray(nbytes, dtype=float), rcond=None)
    return float(a), float(b)


def flashattn_saved_formula(B, H, N, D, elem_bytes=2) -> int:
    """q, k, v, out (B, H, N, D) in the input dtype and the LSE (B, H, N) in fp32."""
    return 4 * B * H * N * D * elem_bytes + 4 * B * H * N


# --- the five products -----------------------------------------------------------------------------
def products_table(N="N", D="D"):
    """The matrix products of one (batch, head) backward: formula, shapes, which kernel
    computes it, and its multiply-adds in units of N²·D (the forward has two)."""
    import pandas as pd
    rows = [
        ("S = Q Kᵀ (recomputed)", f"({N}, {D}) · ({D}, {N}) → ({N}, {N})", "bwd_dkdv, bwd_dq"),
        ("dV = Pᵀ dO", f"({N}, {N}) · ({N}, {D}) → ({N}, {D})", "bwd_dkdv"),
        ("dP = dO Vᵀ", f"({N}, {D}) · ({D}, {N}) → ({N}, {N})", "bwd_dkdv, bwd_dq"),
        ("dK = scale · dSᵀ Q", f"({N}, {N}) · ({N}, {D}) → ({N}, {D})", "bwd_dkdv"),
        ("dQ = scale · dS K", f"({N}, {N}) · ({N}, {D}) → ({N}, {D})", "bwd_dq"),
    ]
    return pd.DataFrame(rows, columns=["product", "shapes", "kernel"],
                        index=pd.RangeIndex(1, 6, name="#"))


# --- the kernels' source ---------------------------------------------------------------------
def listing(name: str) -> str:
    """The source of ``name`` in ``flashattn/kernels/fmha_bwd.py`` (a kernel with its
    ``@ct.kernel`` line, or a plain function such as ``dkdv_program``), read from the file."""
    from ..source import shipped_listing
    return shipped_listing("flashattn.kernels.fmha_bwd", name)


# --- the recorded benchmarks -----------------------------------------------------------------------
def bench_doc(dtype="fp16", causal=True, root=None) -> dict:
    """The recorded bench document of one backward workload (``results/h200/bench-backward/``)."""
    return read_json(results_root(root) / GPU / "bench-backward" / f"{WORKLOADS[(dtype, causal)]}.json")


def bench_frame(root=None):
    """All four backward workloads as one DataFrame, with ``dtype`` and ``causal`` columns;
    error rows (the atomics rows of this record) and rows without a time are dropped."""
    import pandas as pd
    frames = []
    for (dtype, causal), name in WORKLOADS.items():
        df = to_frame(bench_doc(dtype, causal, root))
        df["dtype"], df["causal"], df["workload"] = dtype, causal, name
        frames.append(df)
    df = pd.concat(frames, ignore_index=True)
    ok = df["error"].isna() | (df["error"].fillna("") == "")
    return df[ok & df["median_ms"].notna()].reset_index(drop=True)


def fmt_ci(v, lo, hi, spec=".2f") -> str:
    return f"{v:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def ratio_table(df, pass_="bwd", ref="cudnn", impl=OURS):
    """Rows (dtype, mask), columns N: ``impl``'s speed over cuDNN's (``ref="cudnn"``) or
    FlashAttention-2's (``"fa2"``) in pass ``pass_``, with its 95 % interval paired by round."""
    import pandas as pd
    col = {"cudnn": "ratio_cudnn", "fa2": "ratio_fa2"}[ref]
    d = df[(df["impl"] == impl) & (df["pass"] == pass_)]
    out = {}
    for (dtype, causal), g in d.groupby(["dtype", "causal"], sort=False):
        key = (dtype, "causal" if causal else "non-causal")
        out[key] = {plots.fmt_n(int(r.Nq)): fmt_ci(r[col], r[f"{col}_lo"], r[f"{col}_hi"])
                    for _, r in g.sort_values("Nq").iterrows()}
    t = pd.DataFrame(out).T
    t.index.names = ["dtype", "mask"]
    return t


def ratio_range(df, pass_="bwd", ref="cudnn", impl=OURS, **where):
    """(min, max) of ``impl``'s ratio to ``ref`` over the rows of ``pass_`` (and ``where``)."""
    col = {"cudnn": "ratio_cudnn", "fa2": "ratio_fa2"}[ref]
    d = df[(df["impl"] == impl) & (df["pass"] == pass_)]
    for k, v in where.items():
        d = d[d[k] == v]
    return float(d[col].min()), float(d[col].max())


def lse_cost(df, dtype="fp16"):
    """Rows (mask), columns N: the forward's speed with the LSE written over its speed without
    (``ratio_no_lse``: below 1, the LSE costs time), with its 95 % interval."""
    import pandas as pd
    d = df[(df["impl"] == "fmha_fwd_lse") & (df["dtype"] == dtype)]
    out = {}
    for causal, g in d.groupby("causal", sort=False):
        out["causal" if causal else "non-causal"] = {
            plots.fmt_n(int(r.Nq)): fmt_ci(r.ratio_no_lse, r.ratio_no_lse_lo, r.ratio_no_lse_hi,
                                           ".3f") for _, r in g.sort_values("Nq").iterrows()}
    return pd.DataFrame(out).T


def tflops_figure(df, dtype="fp16", meta=None):
    """TFLOPS against N: panels (backward alone, forward + backward) × (causal, non-causal),
    one line per implementation; the shading spans the quartile times. The legend sits under
    the panels, so it covers no line."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(8.4, 6.0), sharex=True)
    for row, pass_ in enumerate(("bwd", "fwd_bwd")):
        for col, causal in enumerate((True, False)):
            ax = axes[row, col]
            d = df[(df["dtype"] == dtype) & (df["pass"] == pass_) & (df["causal"] == causal)]
            for impl in IMPLS:
                g = d[d["impl"] == impl].sort_values("Nq")
                if g.empty:
                    continue
                ax.plot(g["Nq"], g["tflops"], marker="o", ms=3, lw=1.6, color=COLORS[impl],
                        ls="-" if impl == OURS else plots._linestyle(impl), label=LABELS[impl])
                lo = g["tflops"] * g["median_ms"] / g["q3_ms"]
                hi = g["tflops"] * g["median_ms"] / g["q1_ms"]
                ax.fill_between(g["Nq"], lo, hi, color=COLORS[impl], alpha=0.15, lw=0)
            ax.set_xscale("log", base=2)
            ns = sorted(d["Nq"].unique())
            ax.set_xticks(ns, [plots.fmt_n(int(n)) for n in ns])
            ax.minorticks_off()
            ax.set_ylim(0, 700)
            ax.set_title(f"{PASS_NAMES[pass_]}, {'causal' if causal else 'non-causal'}",
                         fontsize=9)
            if col == 0:
                ax.set_ylabel("TFLOPS")
            if row == 1:
                ax.set_xlabel("sequence length N")
    handles, labels = {}, []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    gpu = (meta or {}).get("gpu", "")
    fig.suptitle(f"{dtype} D=128, B=4, H=32 — {gpu}, cuda-tile {(meta or {}).get('cuda_tile', '')},"
                 f" tileiras {(meta or {}).get('tileiras', '')}", fontsize=10)
    ncol = min(4, len(handles)) or 1
    fig.tight_layout(rect=(0, 0.03 * -(-len(handles) // ncol) + 0.015, 1, 1))
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol,
               frameon=False, fontsize=8, bbox_to_anchor=(0.5, 0.0))
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


# --- E14: the tile sweep and the atomics variant ---------------------------------------------------
def sweep_frame(root=None):
    """E14's rows (``experiments/data/20-bwd-sweep/bwd-sweep.json``): N, causal, variant,
    median_ms, ratio_cudnn, ratio_lo, ratio_hi; and the document's meta."""
    import pandas as pd
    doc = read_json(experiments_root(root) / SWEEP_RUN / "bwd-sweep.json")
    return pd.DataFrame(doc["runs"]), doc["meta"]


def sweep_table(sweep):
    """Rows: the variants (the current configuration first, cuDNN dropped); columns (N, mask):
    the ratio to cuDNN with its 95 % interval."""
    import pandas as pd
    d = sweep[sweep["variant"] != "sdpa_cudnn"]
    cols = {}
    for (n, causal), g in d.groupby(["N", "causal"], sort=False):
        cols[(plots.fmt_n(int(n)), "causal" if causal else "non-causal")] = {
            r.variant: fmt_ci(r.ratio_cudnn, r.ratio_lo, r.ratio_hi) for _, r in g.iterrows()}
    t = pd.DataFrame(cols)
    t.index.name = "variant (× cuDNN)"
    return t


def atomic_frame(root=None):
    """The bench document of the atomics row beside ours, cuDNN and FA2 (N=4096, causal)."""
    doc = read_json(experiments_root(root) / ATOMIC_RUN / "bwd-atomic-4k.json")
    df = to_frame(doc)
    return df[df["error"].isna() | (df["error"].fillna("") == "")], doc["meta"]


# --- the tiles each backward program visits ---------------------------------------------------------
def visit_kinds(N, *, causal=True, dkdv=(64, 128), dq=(128, 64), input_pos=0):
    """Two arrays [query tiles, key tiles] of 0 (skipped) / 1 (full) / 2 (masked), on one grid
    of 64 × 64 cells: what bwd_dkdv's programs (one per key tile) visit and what bwd_dq's (one
    per query tile) visit, from ``reference.backward``'s schedules, at their own tile shapes."""
    from flashattn.reference.backward import dkdv_schedule, dq_schedule
    from flashattn.steps import Config
    cell = 64
    n = -(-N // cell)
    a = np.zeros((n, n), dtype=int)
    tm, tn = dkdv
    for prog in dkdv_schedule(N, N, causal=causal, input_pos=input_pos, config=Config(tm, tn)):
        for i, kind in prog.query_tiles:
            a[i * tm // cell:(i + 1) * tm // cell,
              prog.key_tile * tn // cell:(prog.key_tile + 1) * tn // cell] = 1 + (kind == "masked")
    b = np.zeros((n, n), dtype=int)
    tm, tn = dq
    for i, visits in dq_schedule(N, N, causal=causal, input_pos=input_pos, config=Config(tm, tn)):
        for j, kind in visits:
            b[i * tm // cell:(i + 1) * tm // cell, j * tn // cell:(j + 1) * tn // cell] = \
                1 + (kind == "masked")
    return a, b


def visits_figure(N=1024, *, dkdv=(64, 128), dq=(128, 64)):
    """The two causal schedules side by side, with each kernel's tile outlined."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle
    a, b = visit_kinds(N, causal=True, dkdv=dkdv, dq=dq)
    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.9))
    for ax, k, (tm, tn), name in ((axes[0], a, dkdv, "bwd_dkdv: one program per key tile"),
                                   (axes[1], b, dq, "bwd_dq: one program per query tile")):
        plots.causal_tiles(k, 64, 64, ax=ax, title=f"{name}\n{tm}×{tn} tiles, N={N}")
        n = k.shape[0]
        if tm != tn:     # outline the kernel's own tiles: columns for bwd_dkdv, rows for bwd_dq
            for t in range(n * 64 // (tn if name.startswith("bwd_dkdv") else tm)):
                if name.startswith("bwd_dkdv"):
                    ax.add_patch(Rectangle((t * tn / 64 - 0.5, -0.5), tn / 64, n, fill=False,
                                           lw=1.0, ec="#333333"))
                else:
                    ax.add_patch(Rectangle((-0.5, t * tm / 64 - 0.5), n, tm / 64, fill=False,
                                           lw=1.0, ec="#333333"))
        ax.set_xlabel("key position / 64")
        ax.set_ylabel("query position / 64")
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


# --- Nsight Compute -------------------------------------------------------------------------------
def kernel_name(raw: str) -> str:
    """A profiled kernel's name in this chapter (``KERNELS``; cuDNN's and FA2's long generated
    names by prefix); PyTorch's elementwise kernels keep theirs."""
    if raw in KERNELS:
        return KERNELS[raw]
    for prefix, name in _KERNEL_PREFIX.items():
        if raw.startswith(prefix):
            return name
    return raw


def kernel_profile(r, sub="backward"):
    """The backward profile (``profiles/<sub>/``: ``backward`` causal, ``backward-full``
    non-causal) with one row per kernel: ``step`` is the kernel's chapter name (so the
    per-step tables of ``plots`` and ``gap`` take kernels), ``backward`` the profiled backward
    it belongs to, ``kernel`` its full name. Returns (frame, meta)."""
    prof, _units, _rules, meta = r.profile_at(sub)
    prof = prof.copy()
    prof["backward"] = prof["step"]
    names, seen = [], set()
    for k, b in zip(prof["kernel"], prof["backward"]):
        n = kernel_name(k)
        n = n if n not in seen else f"{n} ({b})"     # the atomic variant's own preprocess
        seen.add(n)
        names.append(n)
    prof["step"] = names
    return prof.reset_index(drop=True), meta


def work_table(prof, backwards=("backward", "sdpa_cudnn_backward", "sdpa_flash_backward",
                                "backward_atomic")):
    """Per profiled backward (columns), summed over its kernels: duration (ms), instructions
    issued (10⁹), and the tensor pipe's busy time (ms: its % of each kernel's duration)."""
    import pandas as pd
    out = {}
    tensor = [c for c in prof.columns if str(c).startswith("sm__pipe_tensor")
              and str(c).endswith("cycles_active.avg.pct_of_peak_sustained_active")]
    for b in backwards:
        g = prof[prof["backward"] == b]
        ms = g["gpu__time_duration.sum"] / 1e6
        busy = (g[tensor].max(axis=1).fillna(0) / 100 * ms).sum() if tensor else np.nan
        out[b] = {"kernels": len(g), "duration (ms)": ms.sum(),
                  "instructions (10⁹)": g["smsp__inst_executed.sum"].sum() / 1e9,
                  "tensor pipe busy (ms)": busy}
    return pd.DataFrame(out)


def durations(prof):
    """ms per kernel and per profiled backward (summed over its kernels)."""
    d = prof.assign(ms=prof["gpu__time_duration.sum"] / 1e6)
    return d.groupby("backward", sort=False)["ms"].sum(), d.set_index("step")["ms"]


def kernel_card(prof, kernels, styled=True):
    """The Nsight Compute card (``plots.CARD_SECTIONS``) of several kernels side by side:
    rows (section, metric), one column per kernel."""
    import pandas as pd
    d = plots.per_step(prof, kernels)
    by = {r["step"]: r for _, r in d.iterrows()}
    missing = [k for k in kernels if k not in by]
    if missing:
        raise KeyError(f"no recorded profile for {', '.join(missing)}")
    rows, index, fmts = [], [], {}
    for section, fields in plots.CARD_SECTIONS.items():
        for label, metric, fmt in fields:
            vals = [by[k].get(metric, np.nan) for k in kernels]
            if all(v != v for v in vals):
                continue
            rows.append(vals)
            index.append((section, label))
            fmts[label] = fmt
    table = pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["section", "metric"]),
                         columns=list(kernels), dtype=float)
    if not styled:
        return table
    sty = table.style
    for section, label in table.index:
        sty = sty.format(lambda v, f=fmts[label]: plots._card_fmt(f, v),
                         subset=pd.IndexSlice[[(section, label)], :])
    uid = re.sub(r"[^A-Za-z0-9_-]", "-", "bwd-card-" + "-".join(kernels))
    return sty.set_uuid(uid).set_caption("Nsight Compute: " + ", ".join(kernels))


# --- the training run ---------------------------------------------------------------------------
def train_run(root=None) -> dict:
    """``results/h200/train/gpt-bf16.json``: meta, runs (flashattn, sdpa), comparison."""
    return read_json(results_root(root) / GPU / "train" / "gpt-bf16.json")


def train_diff(doc):
    """(steps, |train loss flashattn − sdpa|) per step."""
    a, b = doc["runs"]["flashattn"], doc["runs"]["sdpa"]
    return np.asarray(a["step"]), np.abs(np.asarray(a["train_loss"]) - np.asarray(b["train_loss"]))


def train_figure(doc):
    """The two loss curves (train every step, validation markers) and their difference."""
    import matplotlib.pyplot as plt
    m = doc["meta"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9.0, 3.4))
    for name, color, label in (("flashattn", COLORS[OURS], "flashattn"),
                               ("sdpa", COLORS["sdpa_cudnn"], "PyTorch SDPA")):
        run = doc["runs"][name]
        ax.plot(run["step"], run["train_loss"], lw=1.0, color=color, alpha=0.8,
                label=f"{label}: train")
        ax.plot(run["val_step"], run["val_loss"], "o", ms=3.5, color=color,
                mfc="none" if name == "sdpa" else color, label=f"{label}: validation")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, log scale)")
    ax.legend(frameon=False, fontsize=8)
    steps, diff = train_diff(doc)
    ax2.plot(steps, diff, lw=0.9, color="#555555")
    ax2.set_xlabel("step")
    ax2.set_ylabel("|train loss: flashattn − SDPA|")
    c = m["config"]
    fig.suptitle(f"GPT, {c['n_layer']} layers, {c['n_head']}:{c['n_kv_head']} heads, block "
                 f"{c['block']}, {m['dtype']}, seed {m['seed']} — {m['gpu']}, torch {m['torch']}",
                 fontsize=10)
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


# --- the GPU suite -----------------------------------------------------------------------------
_LEN = re.compile(r"-n(\d+):(\d+)@")


def suite_error_ratios(name="call2-junit.xml.xz", root=None):
    """One row per GPU test with error ratios (our max error over PyTorch's at the same
    precision, per gradient): test, Nq, Nk, dq, dk, dv; and the suite's totals (tests,
    failures, errors, skipped)."""
    import pandas as pd
    xml = lzma.decompress((experiments_root(root) / SUITE_RUN / name).read_bytes())
    root_el = ET.fromstring(xml)
    suite = root_el if root_el.tag == "testsuite" else root_el.find("testsuite")
    totals = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    rows = []
    for tc in root_el.iter("testcase"):
        props = {p.get("name"): p.get("value") for p in tc.iter("property")}
        if "err_ratio_dq" not in props:
            continue
        m = _LEN.search(tc.get("name", ""))
        rows.append({"test": f"{tc.get('classname')}::{tc.get('name')}",
                     "Nq": int(m[1]) if m else None, "Nk": int(m[2]) if m else None,
                     **{g: float(props[f"err_ratio_{g}"]) for g in ("dq", "dk", "dv")}})
    return pd.DataFrame(rows), totals


def worst_ratios(ratios):
    """The largest error ratio per gradient, leaving out one-key cases (N=1), where PyTorch's
    own error is 0 and the ratio says nothing."""
    d = ratios[(ratios["Nq"] > 1) & (ratios["Nk"] > 1)]
    return {g: float(d[g].max()) for g in ("dq", "dk", "dv")}


def error_ratio_figure(ratios, criterion=2.0):
    """Histogram of the error ratios of the suite's gradient tests (N > 1), the criterion marked."""
    import matplotlib.pyplot as plt
    d = ratios[(ratios["Nq"] > 1) & (ratios["Nk"] > 1)]
    fig, ax = plt.subplots(figsize=(7.0, 2.8))
    bins = np.linspace(0, criterion * 1.05, 43)
    for g, c in (("dq", "#1f77b4"), ("dk", "#ff7f0e"), ("dv", "#2ca02c")):
        ax.hist(d[g], bins=bins, histtype="step", lw=1.5, color=c, label=g)
    ax.axvline(criterion, color="#cc0000", ls="--", lw=1)
    ax.text(criterion, ax.get_ylim()[1] * 0.9, " criterion", color="#cc0000", fontsize=8,
            ha="right")
    ax.set_xlabel("our max error / PyTorch's max error at the same precision")
    ax.set_ylabel("tests")
    ax.legend(frameon=False, fontsize=8)
    ax.set_title(f"GPU suite: {len(d)} gradient tests with N > 1 (H200)", fontsize=10)
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


def flops_ratio() -> float:
    """The backward's FLOPs over the forward's, by the benchmark's convention (5 products of
    N²·D against 2: 2.5)."""
    from ..measure.bench_bwd import backward_flops
    return backward_flops(1, 1, 1024, 128, False) / backward_flops(1, 1, 1024, 128, False, "fwd")


__all__ = ["listing", "saved_tensors", "saved_bytes", "qkv", "math_attention", "saved_by_n", "fit_n2_n",
           "flashattn_saved_formula", "products_table", "bench_doc", "bench_frame", "ratio_table",
           "ratio_range", "lse_cost", "tflops_figure", "sweep_frame", "sweep_table",
           "atomic_frame", "visit_kinds", "visits_figure", "kernel_name", "kernel_profile",
           "durations", "work_table", "kernel_card", "train_run", "train_diff", "train_figure",
           "suite_error_ratios", "worst_ratios", "error_ratio_figure", "flops_ratio", "fmt_ci"]
