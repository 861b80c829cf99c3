"""The kernels' listings, the recorded backward benchmarks, the tile sweep and the atomics
variant."""
from __future__ import annotations

from ...data.results import experiments_root, results_root
from ...data.schema import read_json, to_frame
from .. import plots
from .names import (ATOMIC_RUN, COLORS, GPU, IMPLS, LABELS, OURS, PASS_NAMES, SWEEP_RUN,
                    WORKLOADS)

# --- the kernels' source ---------------------------------------------------------------------
def listing(name: str) -> str:
    """The source of ``name`` in ``flashattn/kernels/fmha_bwd.py`` (a kernel with its
    ``@ct.kernel`` line, or a plain function such as ``dkdv_program``), read from the file."""
    from ...source import shipped_listing
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
