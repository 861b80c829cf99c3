"""The remaining gap to cuDNN (chapter 10, and the experiment record ``book/appendix/experiments``):
effects against a control, stall breakdowns, the
memory units, and the forward-performance targets, all from the recorded data.

    from flashbook.chapter import gap
    gap.paired(r.bench, "pair", "arch_tuned", 4096)            # (ratio, lo, hi), paired by round
    gap.resolution(r.bench, 4096)                               # what identical code reads apart
    gap.call(gap.paired(...), gap.resolution(...))              # "faster" / "slower" / ...
    gap.stall_table(r.profile, ["arch_tuned", "sdpa_cudnn"])   # WarpStateStats per instruction
    gap.stall_cycles(r.profile, ["arch_tuned", "sdpa_cudnn"])  # ... and per launch
    gap.memory_units("results/h200/profiles/steps.ncu-rep.xz", ["arch_tuned", "sdpa_cudnn"])
    gap.target_table(r)                                         # workload x N: ratio, peak, met

CPU only: everything reads recorded samples and Nsight Compute metrics.
"""
from __future__ import annotations

from ..hardware import PEAK_TFLOPS  # the H200 datasheet peak, defined once

DEFAULT_WORKLOAD = "fp16-causal-d128"

# (label, what the warp waits for): Nsight Compute's WarpStateStats, in
# smsp__average_warps_issue_stalled_<key>_per_issue_active.ratio (warps stalled per issued
# instruction). The reasons that are ~0 for every kernel here are summed into "other".
STALLS = {
    "long_scoreboard": "long scoreboard (data from the memory system)",
    "barrier": "barrier (the program's other warps)",
    "wait": "wait (fixed-latency dependency)",
    "selected": "selected (issuing)",
    "short_scoreboard": "short scoreboard (shared memory, MUFU)",
    "dispatch_stall": "dispatch stall",
    "not_selected": "not selected (another warp issued)",
    "mio_throttle": "MIO throttle",
    "math_pipe_throttle": "math pipe throttle",
    "gmma": "GMMA (waits for a warpgroup MMA)",
}
_OTHER = ("branch_resolving", "drain", "imc_miss", "lg_throttle", "membar", "misc",
          "no_instruction", "sleeping", "tex_throttle")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
CPI_METRIC = "smsp__average_warp_latency_per_inst_issued.ratio"
SCHEDULERS_PER_SM = 4

# The units of Nsight Compute's memory chart / throughput breakdown (MemoryWorkloadAnalysis),
# in % of their peak over the launch (the L2 -> SM crossbar is lts2xbar, the L2 sectors
# lts__t_sectors); and the bytes that reach DRAM.
MEMORY_UNITS = {
    "L2 → SM crossbar %": "lts__lts2xbar_cycles_active.sum.pct_of_peak_sustained_elapsed",
    "L2 sectors %": "lts__t_sectors.sum.pct_of_peak_sustained_elapsed",
    "L2 tag requests %": "lts__t_tag_requests.sum.pct_of_peak_sustained_elapsed",
    "SM ← crossbar read sectors (L1) %":
        "l1tex__m_xbar2l1tex_read_sectors.sum.pct_of_peak_sustained_elapsed",
    "L1 / shared-memory wavefronts %":
        "l1tex__data_pipe_lsu_wavefronts.sum.pct_of_peak_sustained_elapsed",
    "DRAM %": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "memory (busiest unit) %": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "L2 hit rate %": "lts__t_sector_hit_rate.pct",
    "DRAM read (MB)": "dram__bytes_read.sum",
    "DRAM write (MB)": "dram__bytes_write.sum",
    "duration (ms)": "gpu__time_duration.sum",
}
_SCALE = {"dram__bytes_read.sum": 1e-6, "dram__bytes_write.sum": 1e-6,
          "gpu__time_duration.sum": 1e-6}


# --- effects against a control -----------------------------------------------------------------
def samples(bench, impl: str, N: int, workload: str = DEFAULT_WORKLOAD):
    """The per-round times (ms) of one recorded row. Raises KeyError if it was not recorded."""
    sel = (bench["workload"] == workload) & (bench["impl"] == impl) & (bench["Nq"] == N)
    if not sel.any():
        raise KeyError(f"no recorded row {impl!r} at N={N} in {workload!r}")
    return list(bench.loc[sel, "samples_ms"].iloc[0])


def paired(bench, impl: str, ref: str, N: int, workload: str = DEFAULT_WORKLOAD):
    """Speed of ``impl`` over ``ref``, paired round by round: (ratio, lo, hi), a bootstrap 95 %
    interval (``stats.ratio_ci``); > 1 means ``impl`` is faster."""
    from flashattn import stats
    return stats.ratio_ci(samples(bench, ref, N, workload), samples(bench, impl, N, workload))


def resolution(bench, N: int, workload: str = DEFAULT_WORKLOAD,
               controls=(("best#2", "best"), ("unchecked_kv", "arch_tuned"))) -> float:
    """How far from 1 two rows of identical code read at ``N``: the largest |bound − 1| of the
    intervals of the ``controls`` (pairs of rows that run the same SASS) that were recorded.

    ``best``/``best#2`` is the declared control; ``unchecked_kv`` and ``arch_tuned`` compile to
    the same instructions but are timed as different rows, possibly with another batch length.
    """
    out = 0.0
    for a, b in controls:
        try:
            _, lo, hi = paired(bench, a, b, N, workload)
        except KeyError:
            continue
        out = max(out, abs(lo - 1), abs(hi - 1))
    return out


def call(effect, res: float) -> str:
    """'faster' / 'slower' only if the whole interval lies beyond 1 ± ``res`` (the resolution);
    otherwise 'no effect detected'."""
    _, lo, hi = effect
    if lo > 1 + res:
        return "faster"
    if hi < 1 - res:
        return "slower"
    return "no effect detected"


def fmt_ci(t, spec: str = ".3f") -> str:
    """(x, lo, hi) -> 'x [lo, hi]'."""
    x, lo, hi = t
    return f"{x:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def effects(bench, impls, ref: str = "arch_tuned", workload: str = DEFAULT_WORKLOAD, Ns=None):
    """One row per (impl, N): the speed over ``ref`` paired by round (ratio, lo, hi), the
    resolution at that N and the call."""
    import pandas as pd
    df = bench[bench["workload"] == workload]
    Ns = sorted(df["Nq"].unique()) if Ns is None else Ns
    rows = []
    for n in Ns:
        res = resolution(bench, n, workload)
        for impl in impls:
            e = paired(bench, impl, ref, n, workload)
            rows.append(dict(impl=impl, N=int(n), ratio=e[0], lo=e[1], hi=e[2], resolution=res,
                             call=call(e, res)))
    return pd.DataFrame(rows)


# --- WarpStateStats ----------------------------------------------------------------------------
def _prof_row(profile, step):
    p = profile.set_index("step") if "step" in profile.columns else profile
    if step not in p.index:
        raise KeyError(f"no recorded profile for {step!r}")
    row = p.loc[step]
    return row.iloc[0] if getattr(row, "ndim", 1) == 2 else row


def stall_table(profile, steps):
    """Warp cycles per issued instruction, by stall reason (rows) and step (columns), from the
    recorded WarpStateStats; "other" sums the reasons not listed in ``STALLS``; "total" is
    Nsight Compute's average warp latency per issued instruction."""
    import pandas as pd
    out = {}
    for s in steps:
        row = _prof_row(profile, s)
        d = {label: float(row[STALL_METRIC.format(k)]) for k, label in STALLS.items()}
        d["other"] = sum(float(row.get(STALL_METRIC.format(k), 0.0) or 0.0) for k in _OTHER)
        d["total"] = float(row[CPI_METRIC])
        out[s] = d
    return pd.DataFrame(out)


def stall_cycles(profile, steps):
    """The stall breakdown per launch: warp-cycles (in units of 10⁶ per scheduler) spent in each
    reason = cycles per issued instruction × instructions issued per scheduler. Their sum over
    the warps resident on a scheduler is the launch's active cycles; the rows after the reasons
    check that: instructions, warps resident per scheduler, the cycles that identity gives, and
    the cycles Nsight Compute measured."""
    import pandas as pd
    per_inst = stall_table(profile, steps)
    out = {}
    for s in steps:
        row = _prof_row(profile, s)
        sms = float(row["launch__sm_count"])
        inst = float(row["smsp__inst_executed.sum"]) / (sms * SCHEDULERS_PER_SM)
        d = {k: v * inst / 1e6 for k, v in per_inst[s].items()}
        warps = float(row["smsp__warps_active.avg.per_cycle_active"])
        d["instructions issued per scheduler (10⁶)"] = inst / 1e6
        d["warps resident per scheduler"] = warps
        d["cycles = total / warps (10⁶)"] = d["total"] / warps
        d["cycles measured, SM average (10⁶)"] = float(row["sm__cycles_elapsed.avg"]) / 1e6
        out[s] = d
    return pd.DataFrame(out)


# --- the memory units (from the Nsight Compute report itself) -----------------------------------
def memory_units(report, steps, metrics=None):
    """The memory units of Nsight Compute's memory chart for ``steps`` (columns), read from the
    recorded report (``.ncu-rep`` or ``.ncu-rep.xz``; needs the ``ncu-report`` package): % of
    each unit's peak over the launch, the L2 hit rate, DRAM bytes (MB) and the duration (ms).
    The profile summary keeps only the busiest unit; the report has all of them. Raises
    KeyError if a step was not profiled in the report."""
    import pandas as pd
    from ..measure.ncu import report_metrics
    metrics = MEMORY_UNITS if metrics is None else metrics
    rows = report_metrics(report, list(metrics.values()))
    missing = [s for s in steps if s not in rows]
    if missing:
        raise KeyError(f"not in the report {report}: {', '.join(missing)}")
    return pd.DataFrame({s: {label: rows[s][m] * _SCALE.get(m, 1.0)
                             for label, m in metrics.items()} for s in steps})


# --- the targets -------------------------------------------------------------------------------
# (label, workload, N, target ratio to cuDNN): the forward-performance targets.
TARGETS = ([("fp16 causal D=128", "fp16-causal-d128", n, 1.0) for n in (1024, 2048, 4096, 8192, 16384)]
           + [("fp16 causal D=128", "fp16-causal-d128", 16384, 1.10)]
           + [("fp16 non-causal D=128", "fp16-full-d128", n, 1.0)
              for n in (1024, 2048, 4096, 8192, 16384)]
           + [("fp16 non-causal D=128", "fp16-full-d128", 16384, 1.10)]
           + [("bf16 causal D=128", "bf16-causal-d128", 8192, 1.0),
              ("fp16 causal GQA 32:8 D=128", "fp16-causal-d128-gqa32x8", 8192, 1.0),
              ("fp16 causal D=64", "fp16-causal-d64", 8192, 1.0),
              ("fp16 causal D=256", "fp16-causal-d256", 8192, 1.0)])


def target_table(results, impl: str = "best", targets=TARGETS, peak: float = PEAK_TFLOPS):
    """One row per target: the configuration ``impl`` ran, its ratio to cuDNN paired by round
    with its 95 % interval, its TFLOPS and cuDNN's as % of ``peak``, the target, the status
    ("met": the whole interval at or above the target; "not met": the whole interval below;
    "open" otherwise) and the margin (ratio − target, in % of cuDNN's speed; negative =
    short by)."""
    import pandas as pd
    rows = []
    for label, wl, n, tgt in targets:
        row = results.row(impl, n, wl)
        ref = results.row("sdpa_cudnn", n, wl)
        if row is None or ref is None:
            continue
        x, lo, hi = row["ratio_cudnn"], row["ratio_cudnn_lo"], row["ratio_cudnn_hi"]
        status = "met" if lo >= tgt else "not met" if hi < tgt else "open"
        rows.append({"workload": label, "N": int(n), "config": str(row["config"]).split(": ")[-1],
                     "ratio": x, "lo": lo, "hi": hi,
                     "% of peak": 100 * row["tflops"] / peak,
                     "cuDNN % of peak": 100 * ref["tflops"] / peak,
                     "target": tgt, "status": status, "margin %": 100 * (x - tgt)})
    return pd.DataFrame(rows)


# --- E19/E20: the refuted experiments at 128-row warp-group tiles, per compiler ----------------
WG128 = "warp_groups@128x128:occ=1:nww=8"
REVISITED = ("pair", "lazy_rescale", "exp_poly", "persistent")


def revisit_table(runs: dict, ref: str = WG128, variants=REVISITED,
                  config: str = "128x128:occ=1:nww=8", documents=("causal", "full")):
    """One row per (compiler, causal, N, implementation) of experiment runs made with
    ``experiments/e19_run.sh``: the speed over cuDNN and over ``ref`` (the 128-row tile with
    two consumer warp groups), each paired by round (ratio, lo, hi); the resolution (the
    control ``ref#2`` against ``ref``) and the call against ``ref``.

    runs: {compiler label: experiment DataFrame (``Results.experiment``)}; documents: the
    runs' documents to read (file stems), causal first.
    """
    import pandas as pd
    impls = ("best", "arch_tuned", ref, *(f"{v}@{config}" for v in variants))
    rows = []
    for label, df in runs.items():
        for doc in documents:
            b = df[df["document"] == doc]
            if b.empty:
                continue
            wl = b["workload"].iloc[0]
            for n in sorted(b["Nq"].unique()):
                res = resolution(b, n, wl, controls=((ref + "#2", ref),))
                for impl in impls:
                    sel = (b["impl"] == impl) & (b["Nq"] == n)
                    if not sel.any():
                        continue
                    mine = impl == ref
                    e = (1.0, 1.0, 1.0) if mine else paired(b, impl, ref, n, wl)
                    rows.append(dict(
                        compiler=label, causal=doc.startswith("causal"), N=int(n),
                        impl=impl.split("@")[0], config=b.loc[sel, "config"].iloc[0],
                        tflops=float(b.loc[sel, "tflops"].iloc[0]),
                        x_cudnn=paired(b, impl, "sdpa_cudnn", n, wl), x_ref=e, resolution=res,
                        call="reference" if mine else call(e, res)))
    return pd.DataFrame(rows)
