"""flashattn.chapter.summary (chapter 11) on the recorded dataset, and README's quoted numbers
against the data they quote (experiments/readme_figure.py prints them)."""
import math
import re
from pathlib import Path

import pytest

from flashattn.chapter import summary
from flashattn.data import results
from flashattn.steps import STEP_NAMES

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
