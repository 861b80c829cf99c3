"""The helpers of chapter 13 (flashbook/chapter/flex.py) read the recorded CPU evidence the way
the note's tables print it, and the tile-visit check fails when a program loads a tile its
BlockMask row does not list. CPU, a few seconds."""
import warnings

import pytest
import torch

from flashbook.chapter import flex


def test_sass_frame_matches_the_recorded_table():
    f = flex.sass_frame()
    # experiments/data/40-flex/sass.md: "softcap(30) | identity | 128 | 2264 (+1160) | 1"
    assert f.loc["softcap(30)", "sm_90 +instr/tile"] == 1160
    assert f.loc["sink", "sm_90 +instr/tile"] == 8
    # sm_100 relative_bias: +2200 over 2 copies of the tile loop
    assert f.loc["relative_bias", "sm_100 +instr/tile"] == 1100
    assert f.loc["blasst(T=8)", "sm_100 REG"] == 255
    assert f.loc["blasst(T=8)", "sm_100 STL"] == 40
    assert (f.loc[f.kind == "mask"].index == ["causal", "sliding_window(1024)",
            "sliding_window(512,512)", "prefix_lm(1024)", "prefix_lm(tensor)", "document",
            "document_causal"]).all()


def test_errors_frame_separates_dtypes():
    f16, bf16 = flex.errors_frame("float16"), flex.errors_frame("bfloat16")
    e = flex.errors()["forward"]
    assert f16.loc["none", "ours vs fp64"] == max(e["none|causal|float16"]["vs_fp64"],
                                                  e["none|full|float16"]["vs_fp64"])
    assert (bf16["ours vs fp64"] > f16["ours vs fp64"]).all()


def test_factory_listing_parts():
    assert "call_mask(" in flex.factory_listing("mods")
    assert "FullIdx" in flex.factory_listing("blocks")
    with pytest.raises(ValueError, match="part"):
        flex.factory_listing("other")


def _bm(mask, n=64, block=16):
    from torch.nn.attention.flex_attention import create_block_mask
    return create_block_mask(mask, None, None, n, n, device="cpu", BLOCK_SIZE=block)


def test_visit_row_counts_and_catches_a_stray_load():
    import flashattn
    from flashattn import interpret, mods
    warnings.simplefilter("ignore")
    n, block = 64, 16
    q, k, v = (torch.randn(1, 1, n, 16, dtype=torch.float16) for _ in range(3))
    bm = _bm(mods.causal(), n, block)
    with interpret.enabled(), interpret.trace() as tr:
        flashattn.flex_attention(q, k, v, block_mask=bm)
    row = flex.visit_row(bm, tr)
    assert (row["partial (mask evaluated)"], row["full (no mask)"], row["dense"]) == (4, 6, 16)
    assert row["K tiles loaded"] == 10
    # The same trace against a sliding window of one block lists fewer tiles: it must fail.
    with pytest.raises(AssertionError, match="loaded K tiles"):
        flex.visit_row(_bm(mods.sliding_window(8), n, block), tr)


def test_blasst_figure_has_both_panels():
    fig = flex.blasst_figure()
    assert len(fig.axes) == 2 and fig.axes[1].get_yscale() == "log"


def _fake_bench():
    """Two workloads at one N; ours 1 ms, torch 1.5 ms, dense causal 0.9 ms."""
    def impl(ms, tf=None):
        return {"median_ms": ms, "tflops_visited": tf, "max_diff_vs_ours": 1e-3}
    rows = []
    for w, blocks, ours, ctl in (("causal", 10, 1.0, 1.0), ("sliding_window_256", 4, 0.5, 0.55)):
        flops = blocks * 1e9
        rows.append({"workload": w, "N": 4096, "blocks": blocks, "dense_blocks": 16,
                     "visited_flops": flops,
                     "impls": {"flashattn.flex": impl(ours, flops / (ours * 1e-3) / 1e12),
                               "flashattn.flex#2": impl(ctl),
                               "flashattn.causal": impl(0.9),
                               "torch.flex": impl(1.5 * ours)}})
    return {"meta": {"gpu": "X"}, "rows": rows}


def test_bench_frame_ratios():
    f = flex.bench_frame(_fake_bench()).set_index("workload")
    assert f.loc["causal", "speedup"] == pytest.approx(1.5)
    # causal: our 10 GF in 1 ms against the dense kernel's 10 GF in 0.9 ms
    assert f.loc["causal", "vs causal"] == pytest.approx(0.9)
    # the window: 4 GF in 0.5 ms against the same dense 10 GF in 0.9 ms
    assert f.loc["sliding_window_256", "vs causal"] == pytest.approx(8 / (10 / 0.9))
    assert f.loc["sliding_window_256", "visited %"] == pytest.approx(25)
    drift = flex.control_drift(_fake_bench())
    assert drift[4096] == pytest.approx(1 - 0.5 / 0.55)


def test_bench_table_and_figure_on_the_recorded_run():
    t = flex.bench_table()
    assert list(t.index[:1]) == ["causal"] and not t.isna().any().any()
    assert {"4K × torch", "16K × torch", "8K TF / causal"} <= set(t.columns)
    fig = flex.speedup_figure()
    ax = fig.axes[0]
    assert "torch.compile" in ax.get_xlabel() and len(ax.get_yticklabels()) == len(t)


def test_bench_frame_picks_a_dtype():
    data = _fake_bench()
    for r in data["rows"]:
        r["dtype"] = "float16"
    bf = [dict(r, dtype="bfloat16") for r in data["rows"]]
    data["rows"] += bf
    assert len(flex.bench_frame(data, "bfloat16")) == len(bf)
    with pytest.raises(ValueError, match="float32"):
        flex.bench_frame(data, "float32")
    rec = flex.bench()
    assert {r["dtype"] for r in rec["rows"]} == {"float16", "bfloat16"}
    assert not flex.bench_table(rec, "bfloat16").isna().any().any()


def test_backward_frame_on_the_recorded_run():
    f = flex.backward_frame()
    assert len(f) == f["workload"].nunique() * f["N"].nunique()
    # torch's time over ours and ours over the dense backward's, from the medians
    r = next(x for x in flex.bench(flex.BENCH_BWD)["rows"]
             if x["workload"] == "causal" and x["N"] == 8192 and x["dtype"] == "float16")
    im = r["impls"]
    row = f[(f["workload"] == "causal") & (f["N"] == 8192)].iloc[0]
    assert row["speedup"] == pytest.approx(im["torch.flex"]["median_ms"]
                                           / im["flashattn.flex"]["median_ms"])
    assert row["time vs causal"] == pytest.approx(im["flashattn.flex"]["median_ms"]
                                                  / im["flashattn.causal"]["median_ms"])
    t = flex.backward_table()
    assert list(t.index[:1]) == ["causal"] and not t.isna().any().any()


def test_backward_runs_bf16_and_the_first_run():
    # one file per dtype, the same workloads and lengths; the first run (64 x 64 tiles) beside
    b16 = flex.backward_frame(dtype="bfloat16")
    f16 = flex.backward_frame()
    assert set(zip(b16["workload"], b16["N"])) == set(zip(f16["workload"], f16["N"]))
    with pytest.raises(KeyError):
        flex.backward_path("float32")
    bt = flex.backward_tiles_table()
    assert len(bt) == f16["workload"].nunique() and not bt.isna().any().any()
    first = flex.bench(flex.BENCH_BWD_FIRST)["rows"]
    o = next(r for r in first if r["workload"] == "causal" and r["N"] == 8192)
    assert bt.loc["causal", "first run (ms)"] == o["impls"]["flashattn.flex"]["median_ms"]


def test_blasst_bench_and_figure():
    b = flex.blasst_bench()
    assert set(b["kind"]) == {"random", "local", "sink"}
    off = b[b["impl"] == "off"]
    assert len(off) == 6 and (off["speedup"].sub(1).abs() < 1e-9).all()
    assert b["skipped %"].between(0, 100).all()
    fig = flex.blasst_speed_figure(b)
    assert "skipped" in fig.axes[0].get_xlabel()


def test_profile_card_and_host_kernels():
    card = flex.profile_card({"flex_causal": "flex", "best": "dense"})
    assert list(card.index) == ["flex", "dense"]
    assert (card["duration (ms)"] > 0).all() and card["registers"].dtype.kind == "i"
    with pytest.raises(KeyError, match="nothing"):
        flex.profile_card({"nothing": "x"})
    hk = flex.host_kernels()
    assert set(hk.index) == {"flex_causal", "flex_softcap", "flex_window1k"}
    assert (hk["kernels"] > 0).all()
    assert flex.profile_shape()["D"] == 128
