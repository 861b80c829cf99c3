"""flashbook.chapter.decode: the recorded decode data, the launch arithmetic and the tables of
chapter 12 (CPU only: the recorded H200 dataset and the kernels' launch rules)."""
import math

import numpy as np
import pandas as pd
import pytest

from flashbook.chapter import decode


@pytest.fixture(scope="module")
def d():
    return decode.load("h200")


def test_intensity_is_group_size_times_new_tokens():
    assert decode.intensity(G=4, Nq=1) == 4.0
    assert decode.intensity(G=4, Nq=4, D=64, Nk=1000) == 16.0
    assert decode.intensity(G=1, Nq=1, with_q=True) < 1.0
    assert math.isclose(decode.ridge(989.0, 4.8), 989.0 / 4.8)


def test_gqa_bytes_counts_one_read_per_group():
    g = decode.gqa_bytes(8, 32, 8, 32768, 128)
    assert g["packed"] == 2 * 8 * 8 * 32768 * 128 * 2
    assert g["per query head"] == 4 * g["packed"] and g["ratio"] == 4


def test_split_plan_follows_the_kernels_rule():
    # The examples of decode_num_splits' docstring (132 SMs, GQA 32:8, Nq=1, D=128).
    assert decode.split_plan(1, 131072, 1)["splits"] == 16
    p8 = decode.split_plan(8, 32768, 1)
    assert p8["splits"] == 2 and p8["programs"] == 128 and p8["base"] == 64
    assert decode.split_plan(64, 32768, 1)["splits"] == 1
    p = decode.split_plan(1, 4096, 1)
    assert p["tiles_per_split"] * p["splits"] >= p["tiles"]
    assert decode.split_plan(8, 32768, 1, page_size=16)["TILE_N"] == 16


def test_load_reads_every_part(d):
    assert {"decode", "decode_paged16", "decode_paged64", "square_best", "sdpa_flash",
            "sdpa_cudnn"} <= set(d.ok["impl"])
    assert set(d.crossover["Nq"]) == {1, 4, 16}
    assert len(d.varlen) == 8 and len(d.host) >= 4
    assert d.peak_tbps == 4.8 and d.sm_count == 132 and d.gpu == "H200"
    # sdpa_efficient has no kernel for these inputs: recorded as errors, not in ok.
    assert "sdpa_efficient" not in set(d.ok["impl"])
    with pytest.raises(KeyError, match="no recorded decode row"):
        d.row("decode", 3, 1024, 1)


def test_results_table_and_bandwidth_agree(d):
    t = decode.results_table(d)
    row = t.loc[(64, "32K", 1, "decode")]
    assert math.isclose(row["GB/s"] / 4800, row["% peak"] / 100, rel_tol=0.01)
    assert set(t.index.get_level_values("impl")) <= {"decode", "decode_paged64", "square_best",
                                                     "sdpa_flash", "sdpa_cudnn"}


def test_targets_cover_every_shape_and_call_each_correctly(d):
    tg = decode.targets(d)
    t1 = tg[tg.target.str.startswith("decode ≥ 1.0")]
    assert len(t1) == len(d.ok[d.ok.impl == "decode"])
    assert ((t1.value >= 1.0) == (t1.status == "met")).all()
    t2 = tg[tg.target.str.contains("80 %")]
    assert set(t2.B) == {8} and (t2.Nk >= 32768).all()
    assert ((t2.value >= 0.8) == (t2.status == "met")).all()
    t3 = tg[tg.target.str.startswith("varlen")]
    assert list(t3["shape"]) == ["equal_8x4096", "equal_32x1024"]
    s = decode.target_summary(tg)
    assert (s["met"] + s["not met"] == s["shapes"]).all()


def test_varlen_table_slowdown_is_packed_over_padded(d):
    vt = decode.varlen_table(d)
    assert vt.loc["equal_8x4096", "padding %"] == 0.0
    r = vt.loc["skewed"]
    assert math.isclose(r["slowdown %"], 100 * (r["packed ms"] / r["padded ms"] - 1), abs_tol=0.2)
    assert r["speed-up"] > 1


def test_crossover_and_the_decode_path(d):
    from flashattn.api import DECODE_PATH_MAX_NQ, DECODE_PATH_MIN_NK
    x = decode.crossover_table(d)
    assert list(x.index) == ["Nq=1", "Nq=4", "Nq=16"]
    # The constants of attention()'s decode path are where the recorded crossover says.
    big = [c for c in x.columns if int(c.rstrip("K")) * (1024 if c.endswith("K") else 1)
           >= DECODE_PATH_MIN_NK]
    assert (x.loc[["Nq=1", "Nq=4"], big] > 1).all().all()
    # Nq=16 stays with the square kernel: it wins at most lengths and at every one from 2K.
    long = [c for c in x.columns if int(c.rstrip("K")) * (1024 if c.endswith("K") else 1)
            >= 2048]
    assert (x.loc["Nq=16"] < 1).sum() > len(x.columns) / 2
    assert (x.loc["Nq=16", long] < 1).all()
    p = decode.path_table()
    assert p.loc[f"Nq={DECODE_PATH_MAX_NQ}", "32K"] == "decode"
    assert p.loc["Nq=16", "32K"] == "square"
    for col in p.columns:          # the path follows the length threshold for Nq <= MAX_NQ
        n = int(col.rstrip("K")) * (1024 if col.endswith("K") else 1)
        assert p.loc["Nq=1", col] == ("decode" if n >= DECODE_PATH_MIN_NK else "square")


def test_host_table_graph_cuts_overhead(d):
    h = decode.host_table(d)
    assert h.loc[("decode", True), "overhead µs"] < h.loc[("decode", False), "overhead µs"]


def test_paging_cost_is_positive(d):
    # Wherever the cache streams at a good fraction of the bandwidth (4K keys and up) the
    # paged cache costs time; at 1K the two layouts may take different split counts.
    pc = decode.paging_cost(d)
    assert len(pc) == len(d.ok[d.ok.impl == "decode"])
    assert (pc[pc.index.get_level_values("Nk") >= 4096] > 0).all()


def test_profile_frame(d):
    p = decode.profile_frame(d)
    assert list(p.columns) == list(decode.PROFILE_STEPS)
    assert p.loc["grid (programs)", "decode"] == decode.split_plan(8, 32768, 1)["programs"]
    assert p.loc["grid (programs)", "square_decode"] == 8 * 32
    empty = decode.DecodeData(*(pd.DataFrame(),) * 4, meta={})
    with pytest.raises(KeyError, match="no recorded decode profile"):
        decode.profile_frame(empty)


def test_merge_demo_is_exact_with_an_empty_split():
    m = decode.merge_demo()
    assert m["splits"][1][0] == m["splits"][1][1]          # the middle split is empty
    assert np.isneginf(m["lse_parts"][1])
    assert m["err"] < 1e-12 and m["lse_err"] < 1e-12


def test_kernel_listing_reads_the_kernel_source():
    src = decode.kernel_listing("decode_combine_kernel")
    assert src.startswith("@ct.kernel") and "def decode_combine_kernel" in src
    assert "decode_split_kernel" not in src.split("\n")[1]
    with pytest.raises(KeyError):
        decode.kernel_listing("nope")


def test_figures(d):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for fig in (decode.bandwidth_figure(d), decode.roofline_figure(d), decode.crossover_figure(d)):
        assert "H200" in (fig._suptitle.get_text() if fig._suptitle else fig.axes[0].get_title())
        plt.close(fig)


# ---------------------------------------------------------------------------------------------
# E18 (experiments/data/26-decode-sweep): split count, combine, varlen grid and tile
# ---------------------------------------------------------------------------------------------
def test_split_sweep_marks_todays_rule():
    s = decode.split_sweep()
    ours = s[s["waves"].notna()]
    assert set(s["impl"]) >= {"waves1", "waves1_floor", "waves2", "sdpa_cudnn", "sdpa_flash"}
    for (B, Nk), g in s.groupby(["B", "Nk"]):
        rule = g[g["rule"]]
        assert len(rule) == 1
        r = rule.iloc[0]
        plan = decode.split_plan(B, Nk, 1)
        assert r.splits == plan["splits"] and r.waves == 1 and r.occupancy == 1
        assert r.programs == plan["programs"] <= 132      # one wave at most
        assert math.isclose(r.x_rule, 1.0)
        assert math.isclose(g.loc[g.impl == "sdpa_cudnn", "x_cudnn"].iloc[0], 1.0)
    # floor rows were timed only where the rounding changes the count: fewer splits than "up"
    for (B, Nk, w), g in ours[ours.occupancy == 1].groupby(["B", "Nk", "waves"]):
        if set(g.rounding) == {"up", "down"}:
            assert g[g.rounding == "down"].splits.iloc[0] < g[g.rounding == "up"].splits.iloc[0]
    assert (ours["programs"] == [decode.split_plan(b, n, 1)["base"] * k
                                 for b, n, k in zip(ours.B, ours.Nk, ours.splits)]).all()
    # The measured reason for the rule: at one program per SM no variant beat it.
    assert (ours[ours.occupancy == 1].x_rule >= 1.0).all()


def test_split_sweep_table_fills_deduped_floor_rows():
    t = decode.split_sweep_table()
    assert list(t.index.get_level_values("B").unique()) == [1, 8]
    assert t.loc[(8, "32K"), "rule: splits"] == 2
    assert t.loc[(8, "32K"), "1 wave ↑"].endswith("(3)")
    # B=1, 32K: two waves rounded down and up give the same dealt count, timed once
    assert t.loc[(1, "32K"), "2 waves ↓"] == t.loc[(1, "32K"), "2 waves ↑"]
    assert t.loc[(1, "4K"), "8 waves ↑"] == "–"            # capped by the key tiles: not timed


def test_split_sweep_without_the_rule_row_raises(tmp_path):
    import json
    from flashbook.data.results import load_experiment_file
    doc = load_experiment_file(decode.SWEEP_RUN, "splits.json")
    doc["rows"] = [r for r in doc["rows"] if not (r["B"] == 8 and r["Nk"] == 32768
                                                  and r["impl"] == "waves1_floor")]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "splits.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="B=8, Nk=32768"):
        decode.split_sweep("run", root=tmp_path)


def test_combine_sweep_ran_todays_split_count():
    c = decode.combine_sweep()
    assert (c.loc[c.impl == "sdpa_cudnn", "x_cudnn"] == 1.0).all()
    t = decode.combine_sweep_table(c)
    for (B, nk), r in t.iterrows():
        n = int(nk.rstrip("K")) * 1024
        assert r["splits"] == decode.split_plan(B, n, 1)["splits"]
    assert {"TILE_S splits per step", "one split per step"} <= set(t.columns)


def test_combine_run_comparison_counts_programs(d):
    cr = decode.combine_run_comparison(d)
    assert len(cr) == len(d.ok[d.ok.impl == "decode"])
    assert np.allclose(cr["one-row / final"], cr["one-row ms"] / cr["final ms"])
    B, Nq = cr.index.get_level_values("B"), cr.index.get_level_values("Nq")
    assert (cr["combine programs (one-row)"] == B * 32 * Nq).all()
    # no combine at one split (FINAL); otherwise one program per (sequence, K/V head) here
    assert ((cr["combine programs (final)"] == 0) == (cr["splits"] == 1)).all()
    multi = cr[cr["splits"] > 1]
    assert (multi["combine programs (final)"] == multi.index.get_level_values("B") * 8).all()


def test_kernel_times_of_the_profiles(d):
    k1 = decode.kernel_times(d, "decode-b1")
    assert k1.loc[("decode", "decode_split_kernel"), "programs"] == \
        decode.split_plan(1, 131072, 1)["programs"]
    # B=1: 16 splits, 4 rows a group: the one-row merge (E21), one program per packed row.
    assert k1.loc[("decode", "decode_combine_row_kernel"), "programs"] == 1 * 8 * 4
    k8 = decode.kernel_times(d, "decode")
    assert k8.loc[("decode", "decode_split_kernel"), "programs"] == \
        decode.split_plan(8, 32768, 1)["programs"]
    assert (k8["µs"] > 0).all()
    with pytest.raises(KeyError, match="no recorded profile"):
        decode.kernel_times(d, "nope")


def test_varlen_profile_before_and_now(d):
    from flashattn.kernels import varlen_config, varlen_q_tiles
    vp = decode.varlen_profile(d)
    assert set(vp.index.get_level_values("recording")) == {"before", "now"}
    # 32 sequences of 1K, 32 heads: one program per (Q_TILES query tiles, head, sequence)
    c = varlen_config("sm_90", 128)
    qt = varlen_q_tiles(c, max_seqlen_q=1024, arch="sm_90", total_q=32 * 1024, B=32)
    assert qt == 4                                                    # E22's rule
    assert vp.loc[("now", "varlen"), "programs"] == 32 * 32 * (1024 // c.TILE_M // qt)
    # the padded square kernel is the control: its DRAM bytes did not change
    sq = vp.xs("varlen_square_padded", level="step")["DRAM read MB"]
    assert math.isclose(sq["before"], sq["now"], rel_tol=0.01)
    empty = decode.DecodeData(*(pd.DataFrame(),) * 4, meta={})
    with pytest.raises(KeyError):
        decode.varlen_profile(empty)


def test_varlen_tile_sweep_reads_json_and_log(tmp_path):
    t = decode.varlen_tile_sweep()
    assert len(t) == 8 and list(t.columns) == ["grid (tiles, B, Hq)", "grid (tiles, Hq, B)"]
    assert t.notna().all().all() and (t > 0).all().all()
    assert set(t.index.get_level_values("mix")) == {"equal_8x4096", "equal_32x1024"}
    import shutil
    from flashbook.data.results import experiments_root
    (tmp_path / "run").mkdir()
    shutil.copy(experiments_root() / decode.SWEEP_RUN / "varlen.json", tmp_path / "run")
    (tmp_path / "run" / "varlen-grid.log").write_text("# nothing timed\n")
    with pytest.raises(ValueError, match="no timing lines"):
        decode.varlen_tile_sweep("run", root=tmp_path)


def test_combine_kinds_rule_picks_the_row_merge_where_it_won():
    ck = decode.combine_kinds()
    assert set(ck.columns) == {"splits", "block", "row", "fused", "cuDNN", "rule"}
    assert (ck["block"] == 1.0).all()                     # the reference of each shape
    assert (ck.loc[ck.rule == "row", "row"] > 1).all()
    assert set(ck.rule) <= {"row", "block"}               # the fused merge is off
    assert ck.loc[(1, 1, "128K"), "splits"] == decode.split_plan(1, 131072, 1)["splits"]


def test_varlen_qtiles_table():
    qt = decode.varlen_qtiles()
    assert list(qt.columns) == [1, 2, 4, 8, 16]
    assert ("equal_32x1024", "causal") in qt.index and ("skewed", "full") in qt.index
    assert (qt > 0).all().all()


def test_varlen_backward_times_and_the_second_host_run():
    vb = decode.varlen_backward_times()
    assert set(vb.index) == {"equal_8x4096", "equal_32x1024", "uniform_1_4096", "skewed"}
    assert ((vb["lo"] <= vb["speed"]) & (vb["speed"] <= vb["hi"])).all()
    assert vb.loc["skewed", "speed"] > 1 > vb.loc["equal_32x1024", "speed"]
    h2 = decode.host_table(run=decode.FINAL_RUN)
    assert h2.loc[("decode", True), "overhead µs"] < h2.loc[("decode", False), "overhead µs"]


def test_varlen_qtiles_cfg_keeps_the_chosen_tile():
    from flashattn.kernels import varlen_config
    qc = decode.varlen_qtiles_cfg()
    assert list(qc.columns) == [1, 4, 8]
    cfg = varlen_config("sm_90", 128).label()
    for mix in ("equal_32x1024", "equal_8x4096"):
        assert qc.loc[mix].max().max() == qc.loc[(mix, cfg)].max()
