"""flashbook.chapter.summary (chapter 15) on the recorded dataset, and README's quoted numbers
against the data they quote (experiments/readme_figure.py prints them)."""
import math
import re
from pathlib import Path

import pytest

from flashbook.chapter import summary
from flashbook.data import results
from flashbook.steps import STEP_NAMES

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def r():
    return results.load("h200", root=ROOT / "results")


@pytest.fixture(scope="module")
def probe():
    return results.load_experiment_file(*summary.PROBE, root=ROOT / "experiments" / "data")


def test_every_step_has_its_chapter():
    assert set(summary.CHAPTER_OF) == set(STEP_NAMES)
    chapters = {int(p.name[:2]) for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")}
    assert set(summary.CHAPTER_OF.values()) <= chapters


def test_journey_table(r):
    t = summary.journey_table(r, (1024, 16384))
    assert list(t.index.get_level_values("step")) == list(summary.CHAPTER_OF)
    assert t.loc[(1, "naive"), ("16K", "TFLOPS")] == "–"          # not measured at 16K
    cell = t.loc[(10, "warp_groups"), ("16K", "× cuDNN [95 % CI]")]
    x, lo, hi = map(float, re.findall(r"[\d.]+", cell))
    assert lo <= x <= hi and 0.5 < x < 1.5


def test_ratio_is_paired_and_matches_the_row(r):
    x, lo, hi = summary.ratio(r, "best", 16384)
    row = r.row("best", 16384, summary.WORKLOAD)
    assert x == pytest.approx(row["ratio_cudnn"], rel=1e-6)
    assert lo == pytest.approx(row["ratio_cudnn_lo"], rel=1e-6)
    assert hi == pytest.approx(row["ratio_cudnn_hi"], rel=1e-6)


def test_control_gap_is_small(r):
    assert 0 <= summary.control_gap(r) < 0.02


def test_ladder_vs_seed(r):
    seed = results.seed_b200(root=ROOT / "results")
    t = summary.ladder_vs_seed(r, seed)
    assert list(t.index) == [c for c, *_ in summary.LADDER_PAIRS]
    assert math.isnan(t.loc["+ occupancy=2", ("16K", "B200 (seed's)")])      # not a seed step
    assert t.loc["+ fast math", ("16K", "B200 (seed's)")] == pytest.approx(
        seed.loc["fast_math", 16384] / seed.loc["large_tiles", 16384])
    assert t[[c for c in t.columns if c[1] == "H200 (ours)"]].notna().all().all()


def test_other_workloads(r):
    t = summary.other_workloads(r, 8192)
    assert "fp16 causal D=256" in t.index and "fp16 non-causal D=128" in t.index
    assert t["best"].dtype.kind == "f"
    assert t["best runs"].str.match(r"\d+x\d+").all()


def test_power_regimes(probe):
    t = summary.power_regimes(probe)
    assert set(t.index.get_level_values("mode")) == set(summary.PROBE_MODES)
    assert (t["ours / cuDNN"] > 0.5).all() and (t["median power W"] > 0).all()


def test_readme_quotes_the_data(r, probe):
    """Every number README.md quotes from the dataset is what the data give now."""
    readme = (ROOT / "README.md").read_text()
    nums = summary.readme_numbers(r, probe)
    missing = {k: v for k, v in nums.items() if v not in readme}
    assert not missing, (f"README.md does not quote these as the data give them (run "
                         f"python experiments/readme_figure.py): {missing}")


def test_journey_seqlens(r):
    short, long = summary.journey_seqlens(r)
    ns = r.bench[r.bench["workload"] == summary.WORKLOAD]["Nq"]
    assert (short, long) == (ns.min(), ns.max()) and short < long
    with pytest.raises(KeyError):
        summary.journey_seqlens(r, "no-such-workload")


def test_journey_points(r):
    short, long = summary.journey_seqlens(r)
    pts = summary.journey_points(r)
    assert list(dict.fromkeys(pts["step"])) == list(summary.CHAPTER_OF)
    assert set(pts["N"]) == {short, long} and len(pts) == 2 * len(summary.CHAPTER_OF)
    naive = pts[(pts["step"] == "naive") & (pts["N"] == long)].iloc[0]
    assert math.isnan(naive["tflops"]) and math.isnan(naive["ratio"])     # not run at 16K
    p = pts[(pts["step"] == "warp_groups") & (pts["N"] == long)].iloc[0]
    row = r.row("warp_groups", long, summary.WORKLOAD)
    assert p["tflops"] == row["tflops"]
    assert (p["ratio"], p["lo"], p["hi"]) == summary.ratio(r, "warp_groups", long)
    assert p["lo"] <= p["ratio"] <= p["hi"]


def test_journey_figure(r):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from flashbook.impls import IMPLS
    fig = summary.journey_figure(r)
    try:
        axes = fig.axes
        assert [ax.get_title(loc="left") for ax in axes] == [
            f"N = {summary.fmt_n(n)}" for n in summary.journey_seqlens(r)]
        for ax, N in zip(axes, summary.journey_seqlens(r)):
            bars = [p.get_width() for p in ax.patches]
            want = [r.row(s, N, summary.WORKLOAD) for s in summary.CHAPTER_OF]
            assert bars == [w["tflops"] for w in want
                            if w is not None and not math.isnan(w["tflops"])]
            lines = {l.get_color(): l.get_xdata()[0] for l in ax.get_lines()}
            for lib in summary.JOURNEY_LIBRARIES:          # libraries as reference lines
                assert lines[IMPLS[lib].color] == r.row(lib, N, summary.WORKLOAD)["tflops"]
            texts = " ".join(t.get_text() for t in ax.texts)
            ci = summary.fmt_ci(summary.ratio(r, "warp_groups", N))
            assert ci in texts                              # the ratio with its interval
        legend = [t.get_text() for t in fig.legends[0].get_texts()]
        assert legend == [IMPLS[lib].label for lib in summary.JOURNEY_LIBRARIES]
        fig.canvas.draw()
    finally:
        plt.close(fig)


def test_intro_numbers(r):
    nums = summary.intro_numbers(r)
    short, long = summary.journey_seqlens(r)
    assert (nums["n_short"], nums["n_long"]) == (summary.fmt_n(short), summary.fmt_n(long))
    assert nums["trap_tflops"] < nums["base_tflops"] < nums["final_tflops"]
    assert nums["final_gain"] == pytest.approx(nums["final_tflops"] / nums["base_tflops"])
    assert nums["final_lo"] <= nums["final_ratio"] <= nums["final_hi"]
    assert str(r.meta["driver"]) in nums["source"] and str(r.meta["date"])[:10] in nums["source"]
    assert nums["rounds"] == r.bench_meta[summary.WORKLOAD]["method"]["rounds"]
    for k, v in nums.items():                          # plain Python values: glue writes repr()
        assert type(v) in (int, float, str), (k, type(v))


def test_regime_numbers_say_what_the_data_show(r, probe):
    """The two power-regime measurements: the probe's back-to-back intervals lie above its
    idle-start ones at every N; the sustained whole-workload recording is below 1 at every N."""
    reg = summary.regime_numbers(r, probe)
    assert reg["probe_apart"] is True
    lo_busy = float(reg["probe_busy"].split("–")[0])
    hi_idle = float(reg["probe_idle"].split("–")[1])
    assert lo_busy > hi_idle
    assert reg["whole_below_one"] is True
    assert float(reg["whole_sustained"].split("–")[1]) < 1


# README's method paragraph: one row per dataset, with the rounds its metadata records.
README_DATASETS = {
    "`results/h200/bench/`": "bench/fp16-causal-d128.json",
    "`results/h200/bench-backward/fp16-*`": "bench-backward/fp16-causal-d128-bwd.json",
    "`results/h200/bench-backward/bf16-*`": "bench-backward/bf16-causal-d128-bwd.json",
    "`results/h200/decode/decode`": "decode/decode.json",
    "`results/h200/decode/host.json`": "decode/host.json",
}


@pytest.mark.parametrize("label", list(README_DATASETS))
def test_readme_states_the_rounds_of_each_dataset(label):
    from flashbook.data.schema import read_json
    meta = read_json(str(ROOT / "results" / "h200" / README_DATASETS[label]))["meta"]
    rounds = meta["method"]["rounds"]
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
               if ln.startswith("|") and label in ln)
    assert row.split("|")[2].strip() == str(rounds), (label, row, rounds)


def test_readme_states_the_varlen_backward_method():
    from flashbook.data.schema import read_json
    doc = read_json(str(ROOT / "experiments" / "data" / "34-final" / "varlen_bwd.json"))
    methods = {row["method"] for row in doc["rows"]}
    rounds = doc["meta"]["command"].split("--rounds ")[1].split()[0]
    row = next(ln for ln in (ROOT / "README.md").read_text().splitlines()
               if ln.startswith("|") and "varlen_bwd.json" in ln)
    assert row.split("|")[2].strip() == rounds and all(f"`{m}`" in row for m in methods)
