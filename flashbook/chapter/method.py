"""The appendix page "How the book measures" (``book/appendix/measurement``; chapter 3 has the
short version): the control of every recorded workload, the
host time of a call, and the power-limit experiment (E11 in ``experiments/LOG.md``).

    from flashbook.chapter import method
    method.control_table(r.bench)                 # best vs best#2, every workload and N
    method.host_table(r.bench)                    # host µs of a call beside the kernel's GPU µs
    doc = results.load_experiment_file("15-noise-probe", "noise_probe.json")
    method.probe_summary(doc)                     # per N and mode: spread, control, ratio, clock
    method.plot_probe(doc)                        # sample time against the SM clock
    method.regime_table(r.bench, r.experiment("17-sustained"))   # idle start vs sustained

Everything here reads recorded data and runs on a CPU. Percentages are relative differences in
percent; a control's "gap" is the speed of the second copy over the first's, minus 1, paired by
round (``flashattn.stats.ratio_ci``), with its bootstrap 95 % interval.
"""
from __future__ import annotations

from flashattn.stats import ratio_ci

# The noise probe's modes (experiments/noise_probe.py), in the order it ran them.
PROBE_MODES = {"batch": "back to back (a batch of launches)",
               "single": "one launch",
               "gap": "one launch after 20 ms of idle"}
PROBE_COLORS = {"batch": "#d62728", "single": "#ff7f0e", "gap": "#1f77b4"}


def _rows(df, impl, N, workload=None):
    sel = (df["impl"] == impl) & (df["Nq"] == N)
    if workload is not None:
        sel &= df["workload"] == workload
    return df[sel]


def _samples(df, impl, N, workload=None):
    """The per-round samples of one row (None if the row is absent or has none)."""
    rows = _rows(df, impl, N, workload)
    if rows.empty:
        return None
    s = rows["samples_ms"].iloc[0]
    return list(s) if s is not None and len(s) else None


def gap_pct(a_samples, b_samples) -> tuple[float, float, float]:
    """(gap, lo, hi) in %: b's speed over a's minus 1, paired by round, with its 95 % interval."""
    return tuple(100 * (x - 1) for x in ratio_ci(a_samples, b_samples))


def control_table(bench, a: str = "best", b: str = "best#2", workloads=None):
    """The control of every workload and N that has both rows ``a`` and ``b`` (the same kernel
    timed as two rows): one row per (workload, N) with ``gap_pct``, ``lo_pct``, ``hi_pct``
    (``gap_pct`` above), ``excludes_zero`` (the interval does not contain 0) and ``config`` (what
    ``a`` ran). Workloads in the order given (default: the order of ``bench``)."""
    import pandas as pd
    wls = list(dict.fromkeys(bench["workload"])) if workloads is None else list(workloads)
    out = []
    for wl in wls:
        d = bench[bench["workload"] == wl]
        for N in sorted(d["Nq"].unique()):
            sa, sb = _samples(d, a, N), _samples(d, b, N)
            if sa is None or sb is None:
                continue
            g, lo, hi = gap_pct(sa, sb)
            out.append(dict(workload=wl, N=int(N), gap_pct=g, lo_pct=lo, hi_pct=hi,
                            excludes_zero=bool(lo > 0 or hi < 0),
                            config=_rows(d, a, N)["config"].iloc[0]))
    return pd.DataFrame(out, columns=["workload", "N", "gap_pct", "lo_pct", "hi_pct",
                                      "excludes_zero", "config"])


def control_cells(ctl, digits: int = 2):
    """``control_table`` as workload x N of "+g [lo, hi]" strings ("" where not recorded)."""
    from .plots import fmt_n
    f = f"{{:+.{digits}f}}"
    t = ctl.assign(cell=[f"{f.format(g)} [{f.format(lo)}, {f.format(hi)}]" for g, lo, hi in
                         zip(ctl["gap_pct"], ctl["lo_pct"], ctl["hi_pct"])])
    wide = t.pivot(index="workload", columns="N", values="cell")
    wide = wide.reindex(index=list(dict.fromkeys(ctl["workload"])))
    wide.columns = [fmt_n(n) for n in wide.columns]
    wide.index.name, wide.columns.name = "workload", "N"
    return wide.fillna("")


# Who makes each call of ``host_table`` (README of results/: "host_ms").
HOST_CALLERS = {"best": "flashattn.attention", "remap@64x128:occ=2": "launch.launch",
                "sdpa_cudnn": "SDPA (cuDNN)", "sdpa_flash": "SDPA (FA2)"}


def host_table(bench, workload: str = "fp16-causal-d128", callers=None, kernel: str = "best"):
    """Host time of one call on an idle GPU (``host_ms``, in µs) per N for each caller, and the
    GPU time of ``kernel``'s launch (``median_ms``, µs) beside it: N x columns."""
    import pandas as pd
    callers = HOST_CALLERS if callers is None else callers
    d = bench[bench["workload"] == workload]
    t = d[d["impl"].isin(list(callers))].pivot_table(index="Nq", columns="impl",
                                                     values="host_ms") * 1000
    t = t[[c for c in callers if c in t.columns]]
    t = t.rename(columns={k: f"{v} host µs" for k, v in callers.items()})
    k = d[d["impl"] == kernel].set_index("Nq")["median_ms"] * 1000
    t[f"kernel µs ({kernel}, GPU time)"] = k
    t.index.name, t.columns.name = "N", None
    return pd.DataFrame(t)


# --- the noise probe (E11) -----------------------------------------------------------------------
def probe_frame(doc):
    """The noise probe (``experiments/data/15-noise-probe/noise_probe.json``) as one long
    DataFrame: N, mode, impl ("A", "A#2": ``arch_tuned``'s 64x128 kernel twice; "cudnn"),
    round, ms (per launch), clock_mhz (SM clock read through NVML right after the sample),
    power_w (board power, likewise)."""
    import pandas as pd
    out = []
    for row in doc["rows"]:
        for impl, ms in row["samples"].items():
            clk, pw = row["clocks"][impl], row["powers"][impl]
            for i, (t, c, p) in enumerate(zip(ms, clk, pw)):
                out.append(dict(N=int(row["N"]), mode=row["mode"], impl=impl, round=i, ms=t,
                                clock_mhz=c, power_w=p))
    return pd.DataFrame(out)


def probe_summary(doc, ours: str = "A", twin: str = "A#2", ref: str = "cudnn"):
    """Per (N, mode) of the noise probe: launches per sample (``inner``), the sample spread of
    ``ours`` (``sd_pct``: standard deviation over the median), the control (``gap_pct`` with
    ``gap_lo``/``gap_hi``: ``twin`` against ``ours``), the speed of ``ours`` over ``ref`` paired
    by round (``ratio``, ``ratio_lo``, ``ratio_hi``), the SM clock range and median power during
    ``ours``' samples, and the correlation of its sample time with the clock."""
    import numpy as np
    import pandas as pd
    out = []
    for row in doc["rows"]:
        a = np.asarray(row["samples"][ours], dtype=float)
        clk = np.asarray(row["clocks"][ours], dtype=float)
        g, glo, ghi = gap_pct(row["samples"][ours], row["samples"][twin])
        rr, rlo, rhi = ratio_ci(row["samples"][ref], row["samples"][ours])
        corr = float(np.corrcoef(a, clk)[0, 1]) if clk.std() > 0 else float("nan")
        out.append(dict(N=int(row["N"]), mode=row["mode"], inner=int(row["inner"]),
                        sd_pct=100 * a.std() / np.median(a), gap_pct=g, gap_lo=glo, gap_hi=ghi,
                        ratio=rr, ratio_lo=rlo, ratio_hi=rhi, clock_min=int(clk.min()),
                        clock_max=int(clk.max()),
                        power_w=float(np.median(row["powers"][ours])), corr_t_clock=corr))
    return pd.DataFrame(out).set_index(["N", "mode"])


def plot_probe(doc, impls=("A", "A#2"), title: str | None = None):
    """Sample time against the SM clock, one panel per N: every sample of ``impls`` (our kernel
    and its control copy) over the median of those samples in mode "gap", coloured by mode."""
    import matplotlib.pyplot as plt
    from .plots import fmt_n
    df = probe_frame(doc)
    df = df[df["impl"].isin(list(impls))]
    Ns = sorted(df["N"].unique())
    fig, axes = plt.subplots(1, len(Ns), figsize=(3.0 * len(Ns), 3.3), sharey=True,
                             squeeze=False)
    for ax, N in zip(axes[0], Ns):
        d = df[df["N"] == N]
        base = d[d["mode"] == "gap"]["ms"].median()
        for mode, label in PROBE_MODES.items():
            m = d[d["mode"] == mode]
            if m.empty:
                continue
            ax.scatter(m["clock_mhz"], m["ms"] / base, s=10, alpha=0.55,
                       color=PROBE_COLORS[mode], label=label, linewidths=0)
        ax.axhline(1.0, color="#444444", lw=0.7, ls=":")
        ax.set_title(f"N = {fmt_n(N)}", fontsize=9)
        ax.set_xlabel("SM clock after the sample (MHz)", fontsize=8)
        ax.tick_params(labelsize=8)
    axes[0][0].set_ylabel("sample time / median after idle", fontsize=8)
    axes[0][-1].legend(fontsize=7, frameon=False, loc="upper right")
    fig.suptitle(title or "One kernel, three ways of timing it: sample time against the SM clock "
                 "(H200, 15-noise-probe)", fontsize=10)
    fig.tight_layout()
    return fig


# --- the two power regimes -----------------------------------------------------------------------
def regime_table(idle, sustained, impl: str = "best", twin: str = "best#2",
                 workload: str = "fp16-causal-d128"):
    """Speed of ``impl`` over cuDNN per N in two recordings of one workload: ``idle`` (every
    sample started on an idle GPU: ``results/h200``) and ``sustained`` (back to back, at the
    power limit: ``experiments/data/17-sustained``), each the paired ratio with its 95 %
    interval from the rows' ``ratio_cudnn*`` columns, plus each recording's control gap in %
    (``impl`` vs ``twin``) and ``separated``: the two intervals do not overlap."""
    import pandas as pd
    out = []
    idle = idle[idle["workload"] == workload]
    sustained = sustained[sustained["workload"] == workload]
    for N in sorted(set(idle["Nq"]) & set(sustained["Nq"])):
        row = dict(N=int(N))
        for name, df in (("idle", idle), ("sustained", sustained)):
            x = _rows(df, impl, N).iloc[0]
            row[f"{name}"] = x["ratio_cudnn"]
            row[f"{name}_lo"] = x["ratio_cudnn_lo"]
            row[f"{name}_hi"] = x["ratio_cudnn_hi"]
            sa, sb = _samples(df, impl, N), _samples(df, twin, N)
            row[f"{name}_control_pct"] = abs(gap_pct(sa, sb)[0]) if sa and sb else float("nan")
        row["separated"] = bool(row["sustained_lo"] > row["idle_hi"]
                                or row["sustained_hi"] < row["idle_lo"])
        out.append(row)
    return pd.DataFrame(out).set_index("N")


def plot_regimes(regimes, probe=None, title: str | None = None):
    """Our kernel's speed over cuDNN against N in the two regimes: ``regime_table`` (lines with
    95 % intervals) and, if given, ``probe_summary``'s "batch" and "gap" modes (markers)."""
    import matplotlib.pyplot as plt
    import numpy as np
    from .plots import fmt_n
    fig, ax = plt.subplots(figsize=(7, 3.4))
    x = np.asarray(regimes.index, dtype=float)
    for name, color, label in (("idle", PROBE_COLORS["gap"], "started on an idle GPU (the book)"),
                               ("sustained", PROBE_COLORS["batch"],
                                "sustained, power-limited (17-sustained)")):
        y = regimes[name].to_numpy()
        err = np.vstack([y - regimes[f"{name}_lo"].to_numpy(),
                         regimes[f"{name}_hi"].to_numpy() - y])
        ax.errorbar(x, y, yerr=err, color=color, marker="o", ms=4, capsize=3, lw=1.2,
                    label=label)
    if probe is not None:
        for mode, marker in (("gap", "s"), ("batch", "D")):
            p = probe.xs(mode, level="mode")
            px = np.asarray(p.index, dtype=float)
            err = np.vstack([p["ratio"] - p["ratio_lo"], p["ratio_hi"] - p["ratio"]])
            ax.errorbar(px * 1.06, p["ratio"], yerr=err, color=PROBE_COLORS[mode], marker=marker,
                        ms=5, mfc="white", capsize=2, ls="none",
                        label=f"noise probe, 64x128 kernel: {PROBE_MODES[mode]}")
    ax.axhline(1.0, color="#444444", lw=0.8, ls=":")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [fmt_n(int(n)) for n in x])
    ax.set_xlabel("sequence length N")
    ax.set_ylabel("speed over cuDNN")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    ax.set_title(title or "Our best kernel against cuDNN in two power regimes (H200, causal)",
                 fontsize=10)
    fig.tight_layout()
    return fig


__all__ = ["control_table", "control_cells", "gap_pct", "host_table", "HOST_CALLERS",
           "probe_frame", "probe_summary", "plot_probe", "regime_table", "plot_regimes",
           "PROBE_MODES", "PROBE_COLORS"]
