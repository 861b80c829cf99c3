"""flashbook.chapter.helpers: the helpers more than one chapter calls (CPU only)."""
import math

import numpy as np
import pytest

from flashbook import chapter
from flashbook.chapter import helpers
from flashbook.ladder import emulate
from flashattn.config import Config


def test_below_returns_the_bound():
    assert chapter.below(3e-16, "1e-15") == "1e-15"
    assert chapter.below(0.0, "1e-2") == "1e-2"


@pytest.mark.parametrize("err", [1e-15, 2e-15, float("nan"), float("inf")])
def test_below_refuses_an_error_that_is_not_below(err):
    with pytest.raises(AssertionError, match="not below 1e-15"):
        chapter.below(err, "1e-15")


def test_tile_kinds_of_the_split_loop():
    k = chapter.tile_kinds("loop_split", 256, Config(64, 64))
    expected = np.array([[2, 0, 0, 0],
                         [1, 2, 0, 0],
                         [1, 1, 2, 0],
                         [1, 1, 1, 2]])
    np.testing.assert_array_equal(k, expected)
    assert k.dtype.kind == "i"


def test_tile_kinds_of_the_baseline_mask_every_visited_tile():
    k = chapter.tile_kinds("baseline", 256, Config(64, 64))
    np.testing.assert_array_equal(k, 2 * np.tril(np.ones((4, 4), dtype=int)))


def test_tile_kinds_with_cached_keys():
    # 128 new queries at positions 128..255 against 256 keys: the first two key tiles are full.
    k = chapter.tile_kinds("loop_split", 128, Config(64, 64), input_pos=128)
    np.testing.assert_array_equal(k, [[1, 1, 2, 0],
                                      [1, 1, 1, 2]])


@pytest.mark.parametrize("step", ["baseline", "loop_split", "remap"])
@pytest.mark.parametrize("N, cfg", [(1000, Config(64, 128)), (4096, Config(256, 128)),
                                    (300, Config(128, 64))])
def test_tile_kinds_agree_with_tile_counts(step, N, cfg):
    k = chapter.tile_kinds(step, N, cfg)
    assert k.shape == (math.ceil(N / cfg.TILE_M), math.ceil(N / cfg.TILE_N))
    counts = emulate.tile_counts(step, N, N, causal=True, config=cfg)
    assert {"skipped": int((k == helpers.SKIPPED).sum()), "full": int((k == helpers.FULL).sum()),
            "masked": int((k == helpers.MASKED).sum())} == counts


def test_time_steps_times_each_step_at_the_pinned_config(monkeypatch):
    pytest.importorskip("torch")
    import flashattn.launch
    from flashattn import timing

    launched = []

    def fake_launch(q, k, v, out, step, config, *, causal, scale):
        launched.append((step.name, config, causal, scale, tuple(q.shape)))
        return out

    def fake_time_cuda(fn, *, warmup=3, reps=20, flush=True):
        fn()
        ms = {"fast_math": 2.0, "loop_split": 1.0}[launched[-1][0]]
        return timing.summarize([ms] * reps)

    monkeypatch.setattr(flashattn.launch, "launch", fake_launch)
    monkeypatch.setattr(timing, "time_cuda", fake_time_cuda)
    cfg = Config(64, 128, occupancy=2)
    df = chapter.time_steps(["fast_math", "loop_split"], cfg, N=256, B=1, H=2, D=64, reps=5,
                            device="cpu")
    assert list(df.columns) == ["step", "config", "N", "median_ms", "tflops"]
    assert list(df.step) == ["fast_math", "loop_split"]
    assert set(df.config) == {"64x128 occ=2"} and set(df.N) == {256}
    flops = timing.attention_flops(1, 2, 256, 256, 64, True)
    assert df.tflops.tolist() == [round(timing.tflops(flops, 2.0), 3),
                                  round(timing.tflops(flops, 1.0), 3)]
    assert {(c, causal, s, shape) for _, c, causal, s, shape in launched} == \
        {(cfg, True, 64 ** -0.5, (1, 2, 256, 64))}


def test_chapter_exports_the_helpers():
    for name in ("below", "tile_kinds", "time_steps"):
        assert getattr(chapter, name) is getattr(helpers, name)
        assert name in chapter.__all__
        assert getattr(helpers, name).__doc__


def test_tile_registers():
    s, p, acc = helpers.tile_registers(256, 128)
    assert (s, p, acc) == (256.0, 128.0, 256.0)          # 640 > 255: chapter 5's cliff
    assert sum(helpers.tile_registers(64, 64)) == 32.0 + 16.0 + 64.0
    assert helpers.tile_registers(128, 128, consumers=256)[0] == 64.0
    with pytest.raises(ValueError):
        helpers.tile_registers(0, 64)


# --- Tables for people (issue 22, item 4) ------------------------------------------------------

def test_fmt_value_counts_as_integers_and_no_nan():
    from flashbook.chapter import fmt_value, verdict
    assert fmt_value(501775908.0) == "501,775,908"
    assert fmt_value(128.0) == "128"
    assert fmt_value(np.int64(8192)) == "8,192"
    assert fmt_value(0.12345, 3) == "0.123"
    assert fmt_value(float("nan")) == "–" and fmt_value(None) == "–"
    assert fmt_value(True) == "yes" and fmt_value(np.bool_(False)) == "no"
    assert fmt_value(2.0, 2, integer=False) == "2.00"
    assert verdict(1 < 2) == "yes" and verdict(0, "holds", "fails") == "fails"


def test_table_formats_by_column_or_row_with_units_and_a_stable_id():
    pd = pytest.importorskip("pandas")
    pytest.importorskip("jinja2")
    from flashbook import chapter
    df = pd.DataFrame({"grid": [128.0, 2048.0], "time": [0.25, 2.0], "ok": [True, False],
                       "x": [np.nan, 1.5]}, index=["a", "b"])
    html = chapter.table(df, units={"time": "ms"}).to_html()
    for cell in (">128<", ">2,048<", ">0.25<", ">2.00<", ">yes<", ">no<", ">–<", ">1.50<",
                 "time (ms)"):
        assert cell in html, cell
    for bad in ("128.00", "True", "False", "nan"):
        assert bad not in html, bad
    assert html == chapter.table(df, units={"time": "ms"}).to_html()     # same id every time
    rows = pd.DataFrame({"s": [501775908.0, 21.73]}, index=["instructions", "XU %"])
    html = chapter.table(rows, by="row", decimals=1).to_html()
    assert ">501,775,908<" in html and ">21.7<" in html
    with pytest.raises(KeyError):
        chapter.table(df, units={"nope": "ms"})
    mixed = pd.DataFrame({"a": [501775908.0, 21.73], "ratio": [0.75, 1.03]}, index=["n", "%"])
    html = chapter.table(mixed, by="cell").to_html()
    assert ">501,775,908<" in html and ">21.73<" in html and ">0.75<" in html
    with pytest.raises(ValueError):
        chapter.table(df, by="value")


def test_table_prints_whole_percentages_as_integers():
    pd = pytest.importorskip("pandas")
    pytest.importorskip("jinja2")
    from flashbook import chapter
    rows = pd.DataFrame({"a": [25.0, 3.72], "b": [18.75, 3.73]},
                        index=["theoretical occupancy %", "duration (ms)"])
    html = chapter.table(rows, 2, by="row").to_html()
    assert ">25<" in html and ">18.75<" in html and "25.00" not in html
    assert ">3.72<" in html
    cols = pd.DataFrame({"occupancy %": [25.0, 12.5], "time": [2.0, 0.25]})
    html = chapter.table(cols, 1).to_html()
    assert ">25<" in html and ">12.5<" in html and ">2.0<" in html and "25.0<" not in html
