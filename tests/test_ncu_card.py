"""chapter.plots.ncu_card: the Nsight Compute card every step chapter shows (CPU, recorded data)."""
import math

import pandas as pd
import pytest

from flashbook.chapter import plots
from flashbook.data.results import load


@pytest.fixture(scope="module")
def prof():
    return load("h200").profile


def test_card_has_the_three_sections_and_a_ratio(prof):
    t = plots.ncu_card(prof, "large_tiles", "baseline", styled=False)
    assert list(t.columns) == ["baseline", "large_tiles", "ratio"]
    assert {"LaunchStats", "Occupancy", "SpeedOfLight"} <= set(t.index.get_level_values(0))
    regs = t.loc[("LaunchStats", "registers / thread")]
    assert regs["baseline"] == prof[prof.step == "baseline"]["launch__registers_per_thread"].iloc[0]
    dur = t.loc[("SpeedOfLight", "duration (ms)")]
    assert math.isclose(dur["ratio"], dur["large_tiles"] / dur["baseline"])


def test_card_without_predecessor_and_styled(prof):
    t = plots.ncu_card(prof, "baseline", styled=False)
    assert list(t.columns) == ["baseline"]
    html = plots.ncu_card(prof, "fast_math", "large_tiles",
                          highlight=("local memory (spill) bytes",)).to_html()
    assert "fff3b0" in html and "Nsight Compute: fast_math beside large_tiles" in html


def test_card_refuses_what_it_cannot_show(prof):
    with pytest.raises(KeyError, match="no recorded profile for nope"):
        plots.ncu_card(prof, "nope", "baseline")
    with pytest.raises(KeyError, match="highlight names no row"):
        plots.ncu_card(prof, "fast_math", "large_tiles", highlight=("registers",))


def test_stall_rows_appear_only_when_recorded():
    rows = []
    for step, lsb in (("a", 3.0), ("b", 1.8)):
        for m, v in (("launch__registers_per_thread", 128), ("gpu__time_duration.sum", 1e6),
                     ("smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
                      lsb)):
            rows.append(dict(step=step, kernel="fmha_kernel", metric=m, value=v, unit=""))
    t = plots.ncu_card(pd.DataFrame(rows), "b", "a", styled=False)
    assert ("WarpStateStats", "stall: waiting for memory (long scoreboard)") in t.index
    assert ("WarpStateStats", "stall: barrier") not in t.index


def test_card_html_is_the_same_every_time(prof):
    """nbval compares a cell's HTML and git stores it: no random table id."""
    html = [plots.ncu_card(prof, "remap", "loop_split", highlight=("grid (programs)",)).to_html()
            for _ in range(2)]
    assert html[0] == html[1]
    assert 'id="T_ncu-card-remap-loop_split"' in html[0]
    alone = plots.ncu_card(prof, "baseline").to_html()
    assert 'id="T_ncu-card-baseline"' in alone


def test_card_prints_a_whole_percentage_as_an_integer(prof):
    """Two programs per SM give a theoretical occupancy of exactly 25 %: "25", not "25.0"."""
    t = plots.ncu_card(prof, "autotune", "remap", styled=False)
    assert t.loc[("Occupancy", "theoretical occupancy %"), "autotune"] == 25.0
    html = plots.ncu_card(prof, "autotune", "remap").to_html()
    assert ">25<" in html and ">25.0<" not in html and ">12.5<" in html
