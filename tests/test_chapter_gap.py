"""flashbook.chapter.gap: effects against a control, stall breakdowns, memory units and the
target table of chapter 10 (CPU only, synthetic rows and the recorded dataset)."""
from pathlib import Path

import pandas as pd
import pytest

from flashbook.chapter import gap

ROOT = Path(__file__).resolve().parents[1]


def _bench(rows):
    """A bench frame from {impl: samples} at N=1024 of the default workload."""
    return pd.DataFrame([dict(workload=gap.DEFAULT_WORKLOAD, impl=i, Nq=1024, samples_ms=s)
                         for i, s in rows.items()])


def test_paired_is_the_speed_of_impl_over_ref():
    b = _bench({"ref": [2.0] * 10, "fast": [1.0] * 10})
    assert gap.paired(b, "fast", "ref", 1024) == (2.0, 2.0, 2.0)
    with pytest.raises(KeyError, match="no recorded row"):
        gap.paired(b, "absent", "ref", 1024)


def test_resolution_is_the_widest_control_bound_and_skips_absent_controls():
    b = _bench({"best": [1.0] * 10, "best#2": [1.0, 1.02] * 5})
    res = gap.resolution(b, 1024)              # unchecked_kv/arch_tuned are absent
    assert 0.019 < res < 0.021


@pytest.mark.parametrize("effect,res,expected", [
    ((1.05, 1.03, 1.07), 0.01, "faster"),
    ((0.95, 0.93, 0.97), 0.01, "slower"),
    ((1.005, 1.002, 1.008), 0.01, "no effect detected"),   # inside the resolution
    ((1.05, 0.99, 1.10), 0.0, "no effect detected"),       # the interval crosses 1
])
def test_call_needs_the_whole_interval_beyond_the_resolution(effect, res, expected):
    assert gap.call(effect, res) == expected


def test_fmt_ci():
    assert gap.fmt_ci((1.0, 0.5, 1.25), ".2f") == "1.00 [0.50, 1.25]"


def _profile():
    row = {gap.STALL_METRIC.format(k): 0.0 for k in list(gap.STALLS) + list(gap._OTHER)}
    row.update({gap.STALL_METRIC.format("long_scoreboard"): 3.0,
                gap.STALL_METRIC.format("selected"): 1.0,
                gap.STALL_METRIC.format("drain"): 0.5,
                gap.CPI_METRIC: 4.5, "launch__sm_count": 2.0,
                "smsp__inst_executed.sum": 8e6, "smsp__warps_active.avg.per_cycle_active": 2.0,
                "sm__cycles_elapsed.avg": 4.6e6})
    return pd.DataFrame([dict(step="k", **row)])


def test_stall_table_sums_the_minor_reasons_into_other():
    t = gap.stall_table(_profile(), ["k"])
    assert t.loc["other", "k"] == 0.5
    assert t.loc["total", "k"] == 4.5
    assert t.loc[gap.STALLS["long_scoreboard"], "k"] == 3.0


def test_stall_cycles_are_per_instruction_times_instructions_per_scheduler():
    c = gap.stall_cycles(_profile(), ["k"])
    # 8e6 instructions over 2 SMs x 4 schedulers = 1e6 per scheduler
    assert c.loc["instructions issued per scheduler (10⁶)", "k"] == pytest.approx(1.0)
    assert c.loc["total", "k"] == pytest.approx(4.5)
    assert c.loc["cycles = total / warps (10⁶)", "k"] == pytest.approx(2.25)
    with pytest.raises(KeyError):
        gap.stall_table(_profile(), ["absent"])


class _Results:
    def __init__(self, rows):
        self.rows = rows

    def row(self, impl, N, workload):
        return self.rows.get((impl, N, workload))


def test_target_table_status_and_margin():
    wl = "fp16-causal-d128"
    r = _Results({("best", 1024, wl): dict(ratio_cudnn=0.95, ratio_cudnn_lo=0.94,
                                           ratio_cudnn_hi=0.96, tflops=494.5,
                                           config="warp_groups: 64x128 occ=2"),
                  ("sdpa_cudnn", 1024, wl): dict(tflops=520.5),
                  ("best", 2048, wl): dict(ratio_cudnn=1.01, ratio_cudnn_lo=0.99,
                                           ratio_cudnn_hi=1.02, tflops=500.0, config="x"),
                  ("sdpa_cudnn", 2048, wl): dict(tflops=495.0)})
    t = gap.target_table(r, targets=[("c", wl, 1024, 1.0), ("c", wl, 2048, 1.0),
                                     ("c", wl, 4096, 1.0)])
    assert list(t["N"]) == [1024, 2048]                 # 4096 was not recorded: left out
    assert list(t["status"]) == ["not met", "open"]
    assert t["margin %"].iloc[0] == pytest.approx(-5.0)
    assert t["% of peak"].iloc[0] == pytest.approx(50.0)
    assert t["config"].iloc[0] == "64x128 occ=2"


def test_on_the_recorded_dataset():
    from flashbook.data import results
    try:
        r = results.load("h200")
    except Exception:
        pytest.skip("no recorded dataset")
    if r.bench is None or r.bench.empty or r.profile is None or r.profile.empty:
        pytest.skip("no recorded dataset")
    t = gap.target_table(r)
    assert len(t) == len(gap.TARGETS)
    assert set(t["status"]) <= {"met", "not met", "open"}
    assert ((t["lo"] <= t["ratio"]) & (t["ratio"] <= t["hi"])).all()
    s = gap.stall_cycles(r.profile, ["arch_tuned", "sdpa_cudnn"])
    # the identity cycles = warp-cycles / warps resident holds to a few percent
    ratio = s.loc["cycles = total / warps (10⁶)"] / s.loc["cycles measured, SM average (10⁶)"]
    assert ((ratio > 0.9) & (ratio < 1.1)).all()


def test_memory_units_from_the_recorded_report():
    pytest.importorskip("ncu_report")
    report = ROOT / "results" / "h200" / "profiles" / "steps.ncu-rep.xz"
    if not report.exists():
        pytest.skip("no recorded report")
    m = gap.memory_units(report, ["arch_tuned", "sdpa_cudnn"])
    assert not m.isna().any().any()
    busiest = m.loc["memory (busiest unit) %"]
    units = m.loc[[k for k in gap.MEMORY_UNITS if k.endswith("%") and "hit" not in k
                   and "busiest" not in k]]
    assert (units.max() <= busiest + 1e-6).all()
    with pytest.raises(KeyError, match="not in the report"):
        gap.memory_units(report, ["no_such_step"])


def _run(doc, rows):
    """An experiment run's rows: (impl, N, samples, config)."""
    return pd.DataFrame([dict(document=doc, workload="w-" + doc, impl=i, Nq=n, samples_ms=s,
                              config=c, tflops=100.0) for i, n, s, c in rows])


def test_revisit_table_pairs_against_the_tile_and_cudnn():
    ref, cfg = gap.WG128, "128x128:occ=1:nww=8"
    base = [1.0, 1.1, 0.9, 1.0, 1.05]
    rows = [(ref, 4096, base, "128x128"), (ref + "#2", 4096, base, "128x128"),
            ("sdpa_cudnn", 4096, [t / 2 for t in base], ""),
            (f"pair@{cfg}", 4096, [t * 0.5 for t in base], "128x128"),      # twice as fast
            (f"persistent@{cfg}", 4096, [t * 2 for t in base], "128x128"),  # twice as slow
            ("best", 4096, base, "64x128")]
    t = gap.revisit_table({"13.4": _run("causal", rows), "13.5": _run("full", rows[:3])})
    a = t[t.compiler == "13.4"].set_index("impl")
    assert a.loc["pair", "x_ref"] == (2.0, 2.0, 2.0) and a.loc["pair", "call"] == "faster"
    assert a.loc["persistent", "call"] == "slower" and a.loc["best", "call"] == "no effect detected"
    assert a.loc["warp_groups", "call"] == "reference"
    assert a.loc["warp_groups", "x_cudnn"] == (0.5, 0.5, 0.5)
    assert bool(a["causal"].all()) and "arch_tuned" not in a.index   # absent rows are skipped
    b = t[t.compiler == "13.5"]
    assert list(b["impl"]) == ["warp_groups"] and not b["causal"].any()
