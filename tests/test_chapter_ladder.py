"""flashbook.chapter.ladder: the Hopper ladder's effect tables, calls and figure (CPU only)."""
from pathlib import Path

import pandas as pd
import pytest

from flashbook.chapter import ladder
from flashbook.data.results import Results, load

W = "fp16-causal-d128"


def _rows(impl, times, N=1024, config="64x128", tflops=100.0):
    return {"workload": W, "impl": impl, "Nq": N, "config": config, "tflops": tflops,
            "samples_ms": list(times)}


def _results(extra=()):
    base = [1.0 + 0.001 * (i % 3) for i in range(30)]
    rows = [_rows("baseline@64x128", [2 * t for t in base], tflops=50.0),
            _rows("fast_math@64x128", base, tflops=100.0),
            _rows("best", base, config="warp_groups: 64x128 occ=2"),
            _rows("best#2", base, config="64x128 occ=2"),
            _rows("arch_tuned", [t * 1.002 for t in base], config="64x128 occ=2"),
            *extra]
    return Results(gpu="test", path=Path("."), bench=pd.DataFrame(rows))


def test_rungs_follow_the_ladder():
    assert ladder.RUNGS[0] == "baseline@64x128"
    assert ladder.predecessor("fast_math@64x128") == "baseline@64x128"
    assert ladder.predecessor("remap@64x128:occ=2") == "remap@64x128"
    with pytest.raises(KeyError, match="first rung"):
        ladder.predecessor("baseline@64x128")
    with pytest.raises(KeyError, match="not a rung"):
        ladder.predecessor("fast_math")


def test_rungs_to_stops_at_the_chapter_step():
    assert ladder.rungs_to("baseline@64x128") == ("baseline@64x128",)
    assert ladder.rungs_to("loop_split@64x128") == ladder.RUNGS[:3]
    assert ladder.rungs_to(ladder.RUNGS[-1]) == ladder.RUNGS
    with pytest.raises(KeyError, match="not a rung"):
        ladder.rungs_to("remap")


def test_paired_ratio_is_speed_over_the_reference():
    r = _results()
    x, lo, hi = ladder.paired(r, "fast_math@64x128", "baseline@64x128", 1024, W)
    assert x == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)


@pytest.mark.parametrize("effect, control, res, call", [
    ((1.10, 1.09, 1.11), (1.0, 0.999, 1.001), 0.0, "faster"),
    ((0.90, 0.89, 0.91), (1.0, 0.999, 1.001), 0.0, "slower"),
    ((1.002, 1.0015, 1.003), (1.0, 0.999, 1.001), 0.0, "faster"),
    ((1.002, 1.0015, 1.003), (1.0, 0.999, 1.001), 0.003, ladder.NO_EFFECT),   # below resolution
    ((1.002, 1.0005, 1.003), (1.0, 0.999, 1.001), 0.0, ladder.NO_EFFECT),     # overlaps control
    ((1.001, 1.0005, 1.002), (0.998, 0.997, 0.999), 0.0, ladder.NO_EFFECT),   # smaller than gap
    ((float("nan"),) * 3, (1.0, 0.999, 1.001), 0.0, ladder.NO_EFFECT),
])
def test_call_effect(effect, control, res, call):
    assert ladder.call_effect(effect, control, res) == call


def test_resolution_is_the_largest_gap_between_copies():
    r = _results()
    assert ladder.copies(r, 1024, W) == ["arch_tuned", "best", "best#2"]
    gap, detail = ladder.resolution(r, W)
    assert gap == pytest.approx(0.002, rel=1e-6)
    assert set(detail.columns) >= {"N", "a", "b", "ratio", "gap"}


def test_effect_table_and_glue():
    r = _results()
    t = ladder.effect_table(r, "fast_math@64x128", workloads=(("causal", W),))
    assert list(t["N"]) == [1024] and t["call"].iloc[0] == "faster"
    assert t.attrs == {"step": "fast_math@64x128", "prev": "baseline@64x128"}
    shown = ladder.display_table(t)
    assert shown.loc[("causal", "1K"), "speed ratio [95 % CI]"] == "2.000 [2.000, 2.000]"
    got = {}
    out = ladder.glue_effects("t", t, glue=lambda n, v: got.__setitem__(n, v))
    assert out == got
    assert got["t_c1k"] == "2.000 [2.000, 2.000]" and got["t_c1k_pct"] == "+100.0"
    assert got["t_c_faster"] == "1" and got["t_c_n"] == "1" and got["t_c1k_call"] == "faster"


def test_missing_samples_raise():
    r = _results()
    with pytest.raises(KeyError, match="no samples for remap@64x128"):
        ladder.paired(r, "remap@64x128", "fast_math@64x128", 1024, W)


def test_profile_rows():
    prof = pd.DataFrame({"step": ["a", "b", "b"], "kernel": ["k", "k", "k2"],
                         "gpu__time_duration.sum": [2.0, 1.0, 0.5],
                         "smsp__inst_executed.sum": [10.0, 5.0, 1.0]})
    t = ladder.profile_rows(prof, ["a", "b"], {"smsp__inst_executed.sum": "instructions"})
    assert t.loc["instructions", "a"] == 10.0 and t.loc["instructions", "b"] == 5.0
    assert t.loc["instructions", "ratio"] == 0.5
    with pytest.raises(KeyError, match="no recorded profile for c"):
        ladder.profile_rows(prof, ["a", "c"], {"smsp__inst_executed.sum": "i"})
    with pytest.raises(KeyError, match="metrics not recorded"):
        ladder.profile_rows(prof, ["a"], {"nope": "i"})


@pytest.fixture(scope="module")
def h200():
    r = load("h200")
    if r.bench is None or r.bench.empty or "fast_math@64x128" not in set(r.bench["impl"]):
        pytest.skip("the recorded H200 ladder is not in results/")
    return r


def test_recorded_ladder_has_every_rung_and_workload(h200):
    for label, workload in ladder.WORKLOADS:
        for rung in ladder.RUNGS[1:]:
            t = ladder.effect_table(h200, rung, workloads=((label, workload),))
            assert len(t) == 5 and t["ratio"].notna().all()
            assert (t["lo"] <= t["ratio"]).all() and (t["ratio"] <= t["hi"]).all()


def test_recorded_resolution_is_small(h200):
    for _, workload in ladder.WORKLOADS:
        gap, detail = ladder.resolution(h200, workload)
        assert 0 < gap < 0.01 and len(detail) >= 5


def test_figure_draws_a_panel_per_workload(h200):
    import matplotlib
    matplotlib.use("Agg")
    fig = ladder.figure(h200, "loop_split@64x128")
    assert len(fig.axes) == 4                      # TFLOPS and the effect, per workload
    labels = [line.get_label() for line in fig.axes[1].get_lines()]
    assert any(lbl.startswith("loop_split@64x128") for lbl in labels)
    assert "sdpa_cudnn (library)" in labels
    assert fig.axes[3].get_title().startswith("resolution")
    assert len(ladder.figure(h200, "loop_split@64x128", effect=False).axes) == 2
    assert len(ladder.figure(h200, "baseline@64x128").axes) == 2   # no predecessor
    # a chapter draws the rungs up to its own step: no later rung in the legend
    fig = ladder.figure(h200, "loop_split@64x128", rungs=ladder.rungs_to("loop_split@64x128"))
    drawn = {line.get_label().split(" (")[0] for ax in fig.axes for line in ax.get_lines()}
    assert drawn & set(ladder.RUNGS) == set(ladder.RUNGS[:3])


@pytest.mark.parametrize("name", ["06_fast_math", "07_loop_split", "08_remap"])
def test_chapters_draw_no_later_rung(name):
    """Chapters 7 and 8 draw the ladder only up to their own step (a later rung is a margin
    note's business, not a line of the figure)."""
    import json
    import re
    nb = json.loads((Path(__file__).resolve().parents[1] / "notebooks" / f"{name}.ipynb")
                    .read_text(encoding="utf-8"))
    calls = [m for c in nb["cells"] if c["cell_type"] == "code"
             for m in re.findall(r"ladder\.figure\(([^)]*\)?)\)", "".join(c["source"]))]
    assert calls, f"{name} draws no ladder figure"
    for args in calls:
        step = re.match(r'\s*r,\s*"([^"]+)"', args).group(1)
        assert f'rungs=ladder.rungs_to("{step}")' in args, (name, args)


def test_sm_activity_from_the_recorded_n1k_report():
    pytest.importorskip("ncu_report")
    report = Path(__file__).resolve().parents[1] / "results/h200/profiles/n1024/steps.ncu-rep.xz"
    if not report.exists():
        pytest.skip("no recorded N=1K report")
    d = ladder.sm_activity(report, ["loop_split@64x128", "remap@64x128"])
    assert list(d.index) == ["loop_split@64x128", "remap@64x128"]
    assert ((d["busy_min_pct"] <= d["busy_avg_pct"]) & (d["busy_avg_pct"] <= 100)).all()
    assert (d["busy_avg_pct"] > 50).all()
    with pytest.raises(KeyError, match="not in the report"):
        ladder.sm_activity(report, ["baseline"])


@pytest.mark.parametrize("ratio, text", [(1.0361, "+3.6"), (0.9802, "-2.0"), (0.99996, "+0.0"),
                                         (1.0, "+0.0")])
def test_pct_never_reads_minus_zero(ratio, text):
    assert ladder.pct(ratio) == text
