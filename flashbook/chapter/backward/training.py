"""The training run and the GPU suite's error ratios."""
from __future__ import annotations

import lzma
import re
import xml.etree.ElementTree as ET

import numpy as np

from ...data.results import experiments_root, results_root
from ...data.schema import read_json
from .names import COLORS, GPU, OURS, SUITE_RUN

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
