"""Every figure of flashbook.chapter.plots, drawn from small synthetic DataFrames (no GPU, Agg)."""
import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from flashbook.chapter import plots  # noqa: E402

STEPS = ["baseline", "large_tiles", "fast_math", "remap", "autotune"]


@pytest.fixture
def bench():
    """Synthetic benchmark rows (made-up numbers) in the columns of results.load().bench."""
    rows = []
    base = {"baseline": 300, "large_tiles": 25, "fast_math": 30, "remap": 33, "autotune": 420,
            "cudnn": 540, "sdpa_flash": 330}
    for impl, tf in base.items():
        for n in (1024, 2048, 4096, 8192, 16384):
            t = tf * (0.7 + 0.3 * np.log2(n / 1024) / 4)
            ms = 4 * 4 * 32 * n * n * 128 / 2 / (t * 1e12) * 1e3
            rows.append(dict(impl=impl, kind="library" if impl in ("cudnn", "sdpa_flash")
                             else "step", config="64x64", B=4, Hq=32, Hkv=32, Nq=n, Nk=n,
                             D=128, dtype="float16", causal=True, median_ms=ms,
                             q1_ms=ms * 0.98, q3_ms=ms * 1.03, tflops=t, speedup_prev=np.nan,
                             ratio_cudnn=t / base["cudnn"], error="", workload="causal"))
    return pd.DataFrame(rows)


@pytest.fixture
def profile_long():
    """Synthetic long profile rows (step, kernel, metric, value, unit)."""
    rows = []
    for i, s in enumerate(STEPS):
        vals = {"launch__registers_per_thread": 255, "launch__grid_size": 64 * 128,
                "launch__shared_mem_per_block_static": 100_000 + i,
                "launch__waves_per_multiprocessor": 3.9,
                "sm__maximum_warps_per_active_cycle_pct": 12.5,
                "sm__warps_active.avg.pct_of_peak_sustained_active": 9 + i,
                "sm__throughput.avg.pct_of_peak_sustained_elapsed": 40 - 5 * i,
                "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": 5 + 7 * i,
                "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": 30,
                "dram__bytes_read.sum": 2e8 * (1 + i), "dram__bytes_write.sum": 1e8,
                "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": 1e6 * (s == "large_tiles"),
                "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": 5e5 * (s == "large_tiles"),
                "gpu__time_duration.sum": 1e6 * (1 + i)}
        rows += [dict(step=s, kernel="fmha_kernel", metric=m, value=v, unit="")
                 for m, v in vals.items()]
    return pd.DataFrame(rows)


def _save(fig, tmp_path, name):
    p = tmp_path / f"{name}.png"
    fig.savefig(p, dpi=60)
    assert p.stat().st_size > 1000
    matplotlib.pyplot.close(fig)


def test_tflops_vs_seqlen(bench, tmp_path):
    fig = plots.tflops_vs_seqlen(bench, meta={"gpu": "NVIDIA H200"})
    ax = fig.axes[0]
    assert len(ax.lines) == bench["impl"].nunique()
    libs = [ln for ln in ax.lines if ln.get_linestyle() != "-"]
    assert len(libs) == 2                                    # the two libraries, not solid
    assert len({ln.get_linestyle() for ln in libs}) == 2     # each its own dash (registry)
    assert len({ln.get_color() for ln in libs}) == 2
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1K", "2K", "4K", "8K", "16K"]
    assert "H200" in ax.get_title()
    _save(fig, tmp_path, "tflops")


def test_tflops_vs_seqlen_subset_on_given_axes(bench):
    fig, ax = matplotlib.pyplot.subplots()
    out = plots.tflops_vs_seqlen(bench, impls=["baseline", "cudnn"], ax=ax)
    assert out is fig and len(ax.lines) == 2


def test_waterfall(bench, tmp_path):
    fig = plots.waterfall(bench, seqlen=16384)
    ax = fig.axes[0]
    assert len(ax.patches) == len(STEPS)                     # one bar per step
    # Every bar starts at x1: a slow-down hangs below the line, a gain stands on it.
    for bar in ax.patches:
        lo, hi = sorted((bar.get_y(), bar.get_y() + bar.get_height()))
        assert lo <= 1.0 <= hi
    line_ax = fig.axes[1]                                    # the running total: its own axis
    assert ax.get_shared_x_axes().joined(ax, line_ax) and not ax.lines[1:]
    labels = [t.get_text() for t in line_ax.get_xticklabels()]
    assert labels == STEPS                                   # book order, from baseline
    assert any("cudnn" in (ln.get_label() or "") for ln in line_ax.lines)
    assert ax.get_legend() is None and line_ax.get_legend() is None   # nothing covers the data
    _save(fig, tmp_path, "waterfall")
    with pytest.raises(ValueError):
        plots.waterfall(bench, seqlen=123)


def test_profile_table_and_bars(profile_long, tmp_path):
    t = plots.profile_table(profile_long, styled=False)
    assert list(t.columns) == STEPS
    assert t.loc["registers / thread", "baseline"] == 255
    assert t.loc["local memory (spill) bytes", "large_tiles"] == 1.5e6
    assert t.loc["duration (ms)", "remap"] == pytest.approx(4.0)
    styled = plots.profile_table(profile_long)
    assert "255" in styled.to_html()
    wide = profile_long.pivot_table(index=["step", "kernel"], columns="metric",
                                    values="value").reset_index()
    assert plots.profile_table(wide, steps=["baseline"], styled=False).shape[1] == 1
    fig = plots.profile_bars(profile_long)
    assert len([a for a in fig.axes if a.patches]) == 6
    _save(fig, tmp_path, "profile_bars")


def test_per_step_sums_kernels_of_one_step():
    rows = pd.DataFrame([dict(step="naive", kernel=k, metric=m, value=v, unit="")
                         for k, d in (("scores_kernel", 3.0), ("softmax_kernel", 10.0))
                         for m, v in (("gpu__time_duration.sum", d),
                                      ("launch__registers_per_thread", d * 10))])
    d = plots.per_step(rows)
    assert len(d) == 1 and d.loc[0, "gpu__time_duration.sum"] == 13.0
    assert d.loc[0, "launch__registers_per_thread"] == 100.0   # from the longest kernel


def test_roofline(bench, profile_long, tmp_path):
    fig = plots.roofline(bench, profile_long, seqlen=4096)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert len(ax.collections) == bench["impl"].nunique()
    _save(fig, tmp_path, "roofline")
    plots.roofline(bench, None, seqlen=4096)                  # minimal bytes only


def test_min_bytes():
    assert plots.min_bytes(1, 2, 2, 8, 8, 4) == 2 * 4 * (2 * 2 * 8 + 2 * 2 * 8)
    assert plots.min_bytes(1, 8, 2, 8, 8, 4) < plots.min_bytes(1, 8, 8, 8, 8, 4)   # GQA


def test_causal_tiles(tmp_path):
    n = 8
    kinds = np.tril(np.ones((n, n), dtype=int)) + np.eye(n, dtype=int)   # 2 on the diagonal
    fig = plots.causal_tiles(kinds, tile_m=64, tile_n=64)
    ax = fig.axes[0]
    assert ax.images and ax.get_legend() is not None
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "full: 28" in texts and "masked: 8" in texts and "skipped: 28" in texts
    _save(fig, tmp_path, "causal_tiles")
    with pytest.raises(ValueError):
        plots.causal_tiles(np.zeros(4))


def test_work_per_program(tmp_path):
    work = np.arange(1, 301)                                  # causal: program i has i+1 tiles
    fig = plots.work_per_program(work, order=work[::-1] - 1, sm_count=132, occupancy=1)
    ax = fig.axes[0]
    assert len(ax.patches) == 300
    assert ax.patches[0].get_height() == 300                  # the heaviest launched first
    boundaries = [ln for ln in ax.lines if ln.get_linestyle() == "--"]
    assert len(boundaries) == 2                               # after 132 and 264 programs
    _save(fig, tmp_path, "work")


def test_compile_table():
    rows = []
    for s in ("large_tiles", "baseline"):
        for arch, reg in (("sm_90", 255), ("sm_100", 168), ("sm_80", 128)):
            rows.append({"step": s, "arch": arch, "kernel": "fmha", "config": "64x64",
                         "registers": reg, "stack_bytes": 5656 if s == "large_tiles" else 0,
                         "shared_bytes": 0, "mma_ops": 24, "sass_MUFU.EX2": 68,
                         "sass_MUFU.RCP": 68, "sass_LDL": 0, "sass_STL": 0, "error": ""})
    t = plots.compile_table(pd.DataFrame(rows))
    assert list(t.columns.get_level_values(0).unique()) == ["sm_90", "sm_100"]
    assert list(t.columns.get_level_values(1)[:7]) == ["REG", "STACK", "MMA", "EX2", "RCP",
                                                       "LDL", "STL"]
    assert [i[0] for i in t.index] == ["baseline", "large_tiles"]    # book order
    assert t.loc[("large_tiles", "fmha"), ("sm_90", "STACK")] == 5656


def test_palette_is_stable():
    assert plots.color_of("baseline") == plots.PALETTE["baseline"]
    assert plots.color_of("sdpa_cudnn_v9") == plots.PALETTE["sdpa_cudnn"]
    assert plots.color_of("cudnn") == plots.PALETTE["sdpa_cudnn"]            # an alias
    assert plots.color_of("something_new") == plots.color_of("something_new")


def test_palette_comes_from_the_registry():
    from flashbook.impls import IMPLS, color_of
    assert plots.PALETTE == {n: i.color for n, i in IMPLS.items()}
    for name in ("arch_tuned@128x128 occ=1", "arch_tuned#2", "flex", "something_new"):
        assert plots.color_of(name) == color_of(name)


@pytest.mark.parametrize("n,text", [(1024, "1K"), (16384, "16K"), (1000, "1000"), (512, "512"),
                                    (3072, "3K"), (1536, "1536")])
def test_fmt_n(n, text):
    assert plots.fmt_n(n) == text


def test_online_softmax_state_and_states(tmp_path):
    rng = np.random.default_rng(0)
    xs = rng.normal(0.0, 1.5, size=300) + np.linspace(0.0, 4.0, 300)
    fig = plots.online_softmax_state(xs, 64, 2)
    assert "after block 2 of 5" in fig.axes[0].get_title()
    _save(fig, tmp_path, "os_state")
    with pytest.raises(ValueError):
        plots.online_softmax_state(xs, 64, 6)
    fig = plots.online_softmax_states(xs, 64)
    assert len(fig.axes) == 3                      # blocks 1, 5 // 3 = 1, 3, 5: three panels
    _save(fig, tmp_path, "os_states")
    fig = plots.online_softmax_states(xs, 64, blocks=(1, 5))
    assert [a.get_title().split(":")[0] for a in fig.axes] == ["after block 1 of 5",
                                                               "after block 5 of 5"]
    _save(fig, tmp_path, "os_states2")


def test_tile_explorer(tmp_path):
    rows = []
    for arch, reg in (("sm_90", 255), ("sm_100", 168)):
        for tm, tn in ((64, 64), (128, 128), (256, 128)):
            rows.append(dict(step="baseline", arch=arch, TILE_M=tm, TILE_N=tn, registers=reg,
                             stack_bytes=(tm * tn // 10) if arch == "sm_90" else 0))
    grid = pd.DataFrame(rows)
    fig = plots.tile_explorer(grid)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks == ["64×64", "128×128", "256×128"]
    _save(fig, tmp_path, "tile_explorer")
    with pytest.raises(ValueError):
        plots.tile_explorer(grid, step="fast_math")
