"""The FP8 chapter's readers (flashbook/chapter/fp8.py): the formats, the recorded accuracy and
compile data, the bandwidth arithmetic. CPU only, a few seconds."""
import pytest

from flashbook.chapter import fp8


def test_formats_come_from_torch():
    f = fp8.formats()
    assert f.loc["e4m3", "max"] == 448 and f.loc["e5m2", "max"] == 57344
    assert (f.loc["e4m3", "exponent bits"], f.loc["e4m3", "mantissa bits"]) == (4, 3)
    assert (f.loc["e5m2", "exponent bits"], f.loc["e5m2", "mantissa bits"]) == (5, 2)
    assert f.loc["e5m2", "exponent bits"] == f.loc["fp16", "exponent bits"]
    with pytest.raises(ValueError, match="unknown format"):
        fp8.formats(("float8_e8m0",))


def test_accuracy_record_is_read_and_averaged():
    a = fp8.accuracy()
    assert a.attrs["meta"]["seeds"] == 2
    assert set(a.index.get_level_values("method")) == {"fp16", "e4m3", "e4m3+inc", "e5m2",
                                                       "e5m2+inc"}
    # fp16 is far more accurate than fp8; the rotation helps on outliers only
    assert a.loc[("random", "full", "fp16"), "user_rmse"] < a.loc[("random", "full", "e4m3"),
                                                                  "user_rmse"] / 10
    assert fp8.incoherent_gain(a, "e4m3", "outliers") > 1.2
    assert abs(fp8.incoherent_gain(a, "e4m3", "random") - 1) < 0.05


def test_compile_report_transpose_table():
    t = fp8.transpose_table(fp8.compile_report(), D=128, causal=False)
    vt, vn = t.loc[("sm_90", "V^T (D, N)")], t.loc[("sm_90", "V (N, D)")]
    assert vt["MMAs"] > 0 and vn["MMAs"] > 0 and vn["PRMT"] > vt["PRMT"]
    assert vt["registers"] == vn["registers"]
    assert (t["spills (B)"] == 0).all()
    with pytest.raises(KeyError):
        fp8.forward_rows(fp8.compile_report(), "sm_90", D=96)


def test_decode_bytes_halve():
    b = fp8.decode_bytes(8, 8, 32768, 128)
    assert b["fp16"] == 2 * 8 * 8 * 32768 * 128 * 2
    assert b["fp8"] == b["fp16"] // 2 + 2 * 8 * 8 * 4
    assert 1.99 < b["ratio"] < 2


def test_p_cast_shift_fits_and_helps():
    pc = fp8.p_cast_table()
    assert bool(pc.loc[8, "fits"]) and not bool(pc.loc[9, "fits"])
    assert pc.loc[8, "rounded to zero (%)"] == 0 < pc.loc[0, "rounded to zero (%)"]
    assert pc.loc[8, "above u (%)"] < pc.loc[0, "above u (%)"]


def test_kernel_error_case_within_bound():
    c = fp8.kernel_error_case(N=64, D=64)
    assert 0 < c["err"] <= c["bound"]


def test_bench_forward_speed_table():
    b = fp8.bench()
    assert b.attrs["meta"]["gpu"] and b.attrs["meta"]["rounds"] > 0
    t = fp8.forward_speed_table(b)
    assert list(t.columns) == list(fp8.FORWARD_IMPLS.values())
    assert list(t.index.get_level_values("mask").unique()) == ["full", "causal"]
    # V given transposed pays everywhere; the host pass costs at the shortest length
    vt, host = t["fp8, Vᵀ given"], t["fp8, host transpose"]
    assert (vt > 1).all() and (host <= vt + 1e-9).all()
    assert host.loc["full"].iloc[0] < 1 < host.loc["full"].iloc[-1]
    assert not t.isna().any().any()


def test_bench_decode_speed_table():
    d = fp8.decode_speed_table()
    assert set(d.index.get_level_values("B")) == {1, 8, 64}
    # the speed-up is the fp16 time over the fp8 time, the same rounds
    ratio = d["fp16 cache (ms)"] / d["fp8 cache (ms)"]
    assert ((ratio - d["fp8 speed-up (×)"]).abs() < 0.02).all()
    assert (d["fp8 speed-up (×)"] < 1).all()          # the refuted prediction
    assert (d["fp8 (TB/s)"] < d["fp16 (TB/s)"]).all()


def test_bench_missing_and_empty(tmp_path):
    with pytest.raises(FileNotFoundError):
        fp8.bench(tmp_path / "nothing.json")
    (tmp_path / "empty.json").write_text('{"meta": {}, "rows": []}')
    with pytest.raises(ValueError, match="no rows"):
        fp8.bench(tmp_path / "empty.json")


def test_forward_speed_figure_has_both_masks():
    fig = fp8.forward_speed_figure()
    assert [ax.get_title() for ax in fig.axes] == ["not causal", "causal"]


def test_forward_speed_table_per_head_dim():
    b = fp8.bench()
    for D in (64, 128, 256):
        t = fp8.forward_speed_table(b, D)
        assert not t.isna().any().any()
    with pytest.raises(ValueError, match="head dimension 96"):
        fp8.forward_speed_table(b, 96)
    assert fp8.forward_speed_table(b, 64).iloc[0, 0] != fp8.forward_speed_table(b, 128).iloc[0, 0]


def test_head_dim_table_and_profile_card():
    b = fp8.bench()
    hd = fp8.head_dim_table(b)
    assert hd.attrs["N"] == int(b[b.part == "forward"].N.max())
    assert list(hd.index.get_level_values("D").unique()) == [64, 128, 256]
    assert hd["fp8 Vᵀ / FA2"].equals(hd["fp8, Vᵀ given"] / hd["FlashAttention-2 fp16"])
    card = fp8.profile_card()
    assert int(card.loc["fp8 forward (Vᵀ given)", "CTAs per SM"]) >= 1
    assert int(card.loc["fp16 forward", "threads per CTA"]) > 0


def test_shipped_forward_table_is_the_split_runs_shipped_column():
    st = fp8.forward_split_table()
    sf = fp8.shipped_forward_table(st)
    assert list(sf.index) == [64, 128, 256]
    for D in sf.index:
        for mask in ("full", "causal"):
            assert sf.loc[D, f"fp8, {mask} (×)"] == st.loc[(D, mask), "shipped (×)"]
            assert sf.loc[D, f"fp16, {mask} (ms)"] == st.loc[(D, mask), "fp16 (ms)"]
    assert sf.attrs["N"] == st.attrs["N"]


def test_group_rules_rule_each_new_group_only():
    import pandas as pd
    df = pd.DataFrame({"x": range(5)},
                      index=pd.MultiIndex.from_tuples([("a", 1), ("a", 2), ("b", 1), ("b", 2),
                                                       ("c", 1)], names=["g", "n"]))
    html = fp8.group_rules(df.style.set_uuid("t")).to_html()
    ruled = {int(m) for m in __import__("re").findall(r"#T_t_row(\d+)_col0", html)}
    assert ruled == {2, 4}                      # not above the first group
    flat = pd.DataFrame({"x": [1, 2]})
    sty = flat.style
    assert fp8.group_rules(sty) is sty


def test_chapters_13_and_14_store_their_figures_as_images():
    """A figure cell executed without an inline backend stores only "<Figure size ...>"."""
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    for name in ("13_beyond_causal", "14_fp8"):
        nb = json.loads((root / "notebooks" / f"{name}.ipynb").read_text())
        n_png = 0
        for cell in nb["cells"]:
            for o in cell.get("outputs", []):
                data = o.get("data", {})
                text = "".join(data.get("text/plain", ""))
                assert "image/png" in data or not text.startswith("<Figure size"), name
                n_png += "image/png" in data
        assert n_png >= 1, name
