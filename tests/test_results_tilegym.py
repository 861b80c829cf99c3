"""The TileGym comparison reader (flashbook.data.results.tilegym_*) against the recorded files
in results/h200/tilegym/ and against a small document written here."""
from __future__ import annotations

import json

import pytest

from flashbook.data import results


def test_every_part_reads_with_ours_tilegym_and_cudnn():
    for part in results.TILEGYM_PARTS:
        t = results.tilegym_table(part, labels=False)
        assert {results.TILEGYM_OURS[part], "tilegym", "sdpa_cudnn"} <= set(t.index), part
        assert (t.loc["sdpa_cudnn"] == 1).all(), part
        assert t.index[0] == results.TILEGYM_OURS[part]


def test_range_is_the_rows_min_and_max():
    df = results.tilegym_frame("fwd_causal")
    d = df[df["impl"] == "tilegym"]["ratio_cudnn"]
    assert results.tilegym_range("fwd_causal") == (d.min(), d.max())
    lo, hi = results.tilegym_range("decode", "decode", value="speed_cudnn")
    assert 0 < lo <= hi
    assert results.tilegym_frame("bwd_causal").attrs["meta"]["build"]["commit"]


def test_bad_part_and_missing_impl_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown TileGym part"):
        results.tilegym_frame("fwd")
    with pytest.raises(FileNotFoundError, match="no TileGym recording"):
        results.tilegym_frame("fwd_causal", root=tmp_path)
    with pytest.raises(KeyError, match="no 'nope' rows"):
        results.tilegym_range("fwd_causal", "nope")


def test_a_written_document_gives_its_numbers(tmp_path):
    rows = [dict(impl=i, Nq=n, Nk=n, median_ms=t, ratio_cudnn=r, error=None)
            for i, n, t, r in (("best", 1024, 1.0, 0.9), ("tilegym", 1024, 2.0, 0.45),
                               ("sdpa_cudnn", 1024, 0.9, 1.0), ("best", 2048, 2.0, 0.8),
                               ("tilegym", 2048, 3.0, 0.5), ("sdpa_cudnn", 2048, 1.6, 1.0))]
    (tmp_path / "h200" / "tilegym").mkdir(parents=True)
    (tmp_path / "h200" / "tilegym" / "fwd_full.json").write_text(
        json.dumps({"meta": {"date": "2026-12-04"}, "rows": rows}))
    assert results.tilegym_range("fwd_full", root=tmp_path) == (0.45, 0.5)
    assert results.tilegym_range("fwd_full", "best", root=tmp_path) == (0.8, 0.9)
    t = results.tilegym_table("fwd_full", root=tmp_path)
    assert list(t.columns) == ["1K", "2K"] and t.loc["TileGym (cuTile)", "2K"] == 0.5


def test_tiles_come_from_the_log(tmp_path):
    tiles = results.tilegym_tiles()
    assert set(tiles) >= {"fwd_causal", "fwd_full", "bwd_causal"}
    d = tmp_path / "h200" / "tilegym"
    d.mkdir(parents=True)
    (d / "tilegym_bench.log").write_text(
        "==> /x/fwd_full.txt <==\n"
        "* namespace(TILE_M=128, TILE_N=64, num_ctas=1, occupancy=2): 1.0 us\n"
        "  namespace(TILE_M=256, TILE_N=128, num_ctas=1, occupancy=1): 2.0 us\n"
        "==> /x/bwd_causal.txt <==\n* namespace(TILE_M=64, TILE_N=32): 3.0 us\n")
    assert results.tilegym_tiles(root=tmp_path) == {"fwd_full": ["128x64 occ=2"],
                                                      "bwd_causal": ["64x32"]}
