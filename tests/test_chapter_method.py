"""flashbook.chapter.method: chapter 3's control table, host times, noise probe and power regimes
(CPU only; synthetic data, and the recorded dataset where it is in the repository)."""
import math

import pandas as pd
import pytest

from flashbook.chapter import method
from flashbook.data import results


def _row(wl, impl, N, samples, **kw):
    ms = sorted(samples)[len(samples) // 2]
    return dict(workload=wl, impl=impl, Nq=N, samples_ms=list(samples), median_ms=ms,
                config=kw.pop("config", "64x128 occ=2"), **kw)


def _bench():
    a = [1.00, 1.01, 0.99, 1.00, 1.02, 0.98, 1.00, 1.01]
    slow = [x * 1.10 for x in a]                       # b 10 % slower in every round
    return pd.DataFrame([
        _row("w1", "best", 1024, a), _row("w1", "best#2", 1024, a),
        _row("w1", "best", 2048, a), _row("w1", "best#2", 2048, slow),
        _row("w2", "best", 8192, a),                   # no control copy: left out
    ])


def test_control_table_pairs_by_round():
    ctl = method.control_table(_bench())
    assert list(ctl[["workload", "N"]].itertuples(index=False, name=None)) == [
        ("w1", 1024), ("w1", 2048)]
    same, slow = ctl.iloc[0], ctl.iloc[1]
    assert same["gap_pct"] == pytest.approx(0.0)
    assert not same["excludes_zero"]
    # best#2 is 10 % slower: its speed over best's is 1/1.1, minus 1.
    assert slow["gap_pct"] == pytest.approx(100 * (1 / 1.1 - 1))
    assert slow["excludes_zero"]
    assert slow["config"] == "64x128 occ=2"


def test_control_cells_are_workload_by_n_strings():
    wide = method.control_cells(method.control_table(_bench()))
    assert list(wide.columns) == ["1K", "2K"]
    assert wide.loc["w1", "1K"] == "+0.00 [+0.00, +0.00]"
    assert wide.loc["w1", "2K"].startswith("-9.09 [")


def test_host_table_in_microseconds_beside_the_kernel():
    b = pd.DataFrame([dict(workload="w", impl=i, Nq=1024, host_ms=h, median_ms=m)
                      for i, h, m in [("best", 0.1, 0.05), ("sdpa_cudnn", 0.02, 0.04)]])
    t = method.host_table(b, "w", callers={"best": "api", "sdpa_cudnn": "cudnn"})
    assert t.loc[1024, "api host µs"] == pytest.approx(100)
    assert t.loc[1024, "cudnn host µs"] == pytest.approx(20)
    assert t.loc[1024, "kernel µs (best, GPU time)"] == pytest.approx(50)


def _probe():
    rows = []
    for mode, scale, clk, pw in (("batch", 1.05, 1500, 690.0), ("gap", 1.0, 1980, 200.0)):
        a = [scale * x for x in (1.0, 1.02, 0.98, 1.01)]
        rows.append(dict(N=4096, mode=mode, inner=10 if mode == "batch" else 1,
                         samples={"A": a, "A#2": a, "cudnn": [0.95 * x for x in a]},
                         clocks={k: [clk, clk + 15, clk - 15, clk] for k in ("A", "A#2", "cudnn")},
                         powers={k: [pw] * 4 for k in ("A", "A#2", "cudnn")}))
    return dict(rounds=4, rows=rows)


def test_probe_frame_and_summary():
    df = method.probe_frame(_probe())
    assert len(df) == 2 * 3 * 4
    assert set(df.columns) >= {"N", "mode", "impl", "round", "ms", "clock_mhz", "power_w"}
    s = method.probe_summary(_probe())
    gap = s.loc[(4096, "gap")]
    assert gap["gap_pct"] == pytest.approx(0.0)
    assert gap["ratio"] == pytest.approx(0.95)            # cuDNN's time over ours, per round
    assert (gap["clock_min"], gap["clock_max"]) == (1965, 1995)
    assert s.loc[(4096, "batch"), "power_w"] == pytest.approx(690.0)
    assert s.loc[(4096, "batch"), "inner"] == 10


def test_regime_table_marks_separated_intervals():
    def rows(wl_ratio):
        out = []
        for N, (r, lo, hi) in wl_ratio.items():
            s = [1.0, 1.01, 0.99]
            out += [_row("w", "best", N, s, ratio_cudnn=r, ratio_cudnn_lo=lo, ratio_cudnn_hi=hi),
                    _row("w", "best#2", N, s)]
        return pd.DataFrame(out)
    idle = rows({1024: (0.95, 0.94, 0.96), 2048: (0.95, 0.94, 0.96)})
    sus = rows({1024: (0.96, 0.90, 1.00), 2048: (1.02, 0.99, 1.05)})
    t = method.regime_table(idle, sus, workload="w")
    assert list(t.index) == [1024, 2048]
    assert list(t["separated"]) == [False, True]
    assert t.loc[2048, "sustained"] == pytest.approx(1.02)
    assert t.loc[1024, "idle_control_pct"] == pytest.approx(0.0)


def test_plots_draw_on_synthetic_data():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig = method.plot_probe(_probe())
    assert len(fig.axes) == 1
    plt.close(fig)


# --- the recorded data (skipped where the repository does not carry it) ---------------------------
def _recorded():
    r = results.load("h200")
    if r.bench is None or r.bench.empty or "samples_ms" not in r.bench.columns:
        pytest.skip("no recorded bench data with samples")
    return r


def test_recorded_controls_cover_every_workload():
    r = _recorded()
    ctl = method.control_table(r.bench)
    with_control = {w for w in r.workloads
                    if (r.bench[r.bench["workload"] == w]["impl"] == "best#2").any()}
    assert set(ctl["workload"]) == with_control
    assert all(math.isfinite(x) for x in ctl["gap_pct"])


def test_recorded_probe_and_regimes_load():
    r = _recorded()
    try:
        doc = results.load_experiment_file("15-noise-probe", "noise_probe.json")
        sus = r.experiment("17-sustained")
    except FileNotFoundError:
        pytest.skip("experiment data not in this checkout")
    s = method.probe_summary(doc)
    assert set(s.index.get_level_values("mode")) == set(method.PROBE_MODES)
    reg = method.regime_table(r.bench, sus)
    assert len(reg) > 0 and reg["idle"].notna().all()
