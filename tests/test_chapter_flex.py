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
