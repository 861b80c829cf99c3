"""The Nsight Compute profiles of the backward kernels beside cuDNN's and FlashAttention-2's."""
from __future__ import annotations

import re

import numpy as np

from .. import plots
from .names import _KERNEL_PREFIX, KERNELS

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
