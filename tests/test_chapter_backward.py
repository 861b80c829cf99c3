"""flashbook.chapter.backward: saved bytes, the recorded backward workloads, E14, the kernel
profiles, the training run and the GPU suite's error ratios of chapter 11 (CPU only)."""
import numpy as np
import pandas as pd
import pytest

from flashbook.chapter import backward as bw
from flashbook.chapter import page


# --- what autograd keeps ------------------------------------------------------------------------
def test_saved_bytes_counts_each_storage_once():
    import torch
    x = torch.randn(8, 8, requires_grad=True)
    # x * x saves x twice: one storage
    assert bw.saved_bytes(lambda t: t * t, x) == x.numel() * 4
    _, listed = bw.saved_tensors(lambda t: t * t, x)
    assert listed == [((8, 8), "float32", 256)]


def test_math_attention_saves_n_squared_and_flashattn_saves_linear():
    saved = bw.saved_by_n([64, 128, 256], B=1, H=1, D=16)
    a, b = bw.fit_n2_n(saved["N"], saved["math"])
    assert a >= 2                                        # P: at least fp16 per score
    pred = a * saved["N"] ** 2 + b * saved["N"]
    assert (abs(pred - saved["math"]) <= 1e-6 * saved["math"]).all()
    for n, m in zip(saved["N"], saved["flashattn"]):
        assert m == bw.flashattn_saved_formula(1, 1, n, 16)   # q, k, v, out (fp16) + lse (fp32)


def test_fit_n2_n_recovers_the_coefficients():
    ns = [10, 20, 40]
    assert bw.fit_n2_n(ns, [3 * n * n + 5 * n for n in ns]) == pytest.approx((3.0, 5.0))


def test_products_table_has_five_products_and_the_flop_ratio_is_five_halves():
    t = bw.products_table()
    assert len(t) == 5 and set(t.columns) == {"product", "shapes", "kernel"}
    assert bw.flops_ratio() == pytest.approx(2.5)


def test_listing_reads_the_kernel_source():
    src = bw.listing("bwd_dq_kernel")
    assert src.startswith("@ct.kernel") and "def bwd_dq_kernel(" in src
    assert bw.listing("dkdv_program").startswith("def dkdv_program(")
    with pytest.raises(KeyError):
        bw.listing("no_such_kernel")


# --- the recorded benchmarks --------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench():
    return bw.bench_frame()


def test_bench_frame_has_four_workloads_and_no_error_rows(bench):
    assert set(bench["workload"]) == set(bw.WORKLOADS.values())
    assert bench["median_ms"].notna().all()
    assert set(bench["pass"]) == {"bwd", "fwd_bwd", "fwd"}
    assert {bw.OURS, *bw.LIBS} <= set(bench["impl"])


def test_ratio_table_cells_are_ratios_with_intervals(bench):
    t = bw.ratio_table(bench, "bwd", "cudnn")
    assert list(t.columns) == ["1K", "2K", "4K", "8K", "16K"]
    assert len(t) == 4
    v, rest = t.iloc[0, 0].split(" [")
    lo, hi = (float(x) for x in rest.rstrip("]").split(", "))
    assert lo <= float(v) <= hi
    lo, hi = bw.ratio_range(bench, "bwd", "cudnn")
    assert 0 < lo <= hi < 1.5


def test_lse_cost_table(bench):
    t = bw.lse_cost(bench)
    assert set(t.index) == {"causal", "non-causal"} and t.shape[1] == 5


def test_tflops_figure_draws_four_panels(bench):
    import matplotlib.pyplot as plt
    fig = bw.tflops_figure(bench, "fp16", {"gpu": "H200"})
    assert len(fig.axes) == 4 and all(ax.lines for ax in fig.axes)
    plt.close(fig)


# --- E14 and the atomics row ----------------------------------------------------------------------
def test_sweep_current_is_fastest_and_atomics_slower():
    sweep, meta = bw.sweep_frame()
    t = bw.sweep_table(sweep)
    assert "current" in t.index and "atomic" in t.index and "sdpa_cudnn" not in t.index
    for (n, causal), g in sweep.groupby(["N", "causal"]):
        g = g[g["variant"] != "sdpa_cudnn"].set_index("variant")["ratio_cudnn"]
        assert g.idxmax() == "current"
        assert g["atomic"] < g["current"]
    assert meta["gpu"] == "NVIDIA H200"


def test_atomic_frame_has_the_atomics_row():
    at, meta = bw.atomic_frame()
    assert {bw.OURS, bw.ATOMIC, "sdpa_cudnn", "sdpa_flash"} <= set(at["impl"])
    assert meta["workload"]["causal"] is True


# --- schedules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_both_passes_visit_the_same_cells(causal):
    a, b = bw.visit_kinds(512, causal=causal)
    assert ((a > 0) == (b > 0)).all()
    i, j = np.indices(a.shape)                  # cells of 64 x 64: tiles of 128 span two
    if causal:
        assert (a[j <= i] > 0).all()               # every cell on or below the diagonal
        assert (a[j // 2 > i // 2] == 0).all()     # none in a tile above it
        assert (a[j // 2 == i // 2] == 2).all()    # the diagonal tiles are masked
    else:
        assert (a == 1).all()


# --- Nsight Compute -------------------------------------------------------------------------------
def test_kernel_names():
    assert bw.kernel_name("bwd_dq_kernel") == "bwd_dq"
    assert bw.kernel_name("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_x") == "cudnn_bwd"
    assert bw.kernel_name("at::elementwise_kernel") == "at::elementwise_kernel"


@pytest.fixture(scope="module")
def prof():
    return bw.kernel_profile(page.results(), "backward")[0]


def test_kernel_profile_names_are_unique(prof):
    assert prof["step"].is_unique
    assert {"bwd_preprocess", "bwd_dkdv", "bwd_dq", "cudnn_bwd", "fa2_bwd"} <= set(prof["step"])


def test_kernel_card_and_work_table(prof):
    card = bw.kernel_card(prof, ["bwd_dkdv", "cudnn_bwd"], styled=False)
    assert list(card.columns) == ["bwd_dkdv", "cudnn_bwd"]
    assert ("SpeedOfLight", "duration (ms)") in card.index
    assert bw.kernel_card(prof, ["bwd_dq"]).caption.startswith("Nsight Compute")
    with pytest.raises(KeyError):
        bw.kernel_card(prof, ["absent"])
    w = bw.work_table(prof)
    assert w.loc["kernels", "backward"] == 3
    per_backward, _ = bw.durations(prof)
    assert w.loc["duration (ms)", "backward"] == pytest.approx(per_backward["backward"])


# --- training and the GPU suite -----------------------------------------------------------------
def test_train_run_and_figure():
    import matplotlib.pyplot as plt
    doc = bw.train_run()
    steps, diff = bw.train_diff(doc)
    assert len(steps) == doc["meta"]["config"]["steps"]
    assert diff.max() == pytest.approx(doc["comparison"]["max_abs_diff_train"])
    fig = bw.train_figure(doc)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_suite_error_ratios():
    errs, totals = bw.suite_error_ratios()
    assert totals["tests"] > 0 and totals["failures"] == 0 and totals["errors"] == 0
    assert isinstance(errs, pd.DataFrame) and {"dq", "dk", "dv", "Nq", "Nk"} <= set(errs.columns)
    worst = bw.worst_ratios(errs)
    assert all(0 < v <= 2.0 for v in worst.values())          # the FlashAttention criterion
    assert errs[["dq", "dk", "dv"]].max().max() > 2.0         # the N=1 cases: PyTorch's error 0
