"""BLASST (dynamic tile skipping), opt-in: off by default; with a threshold T a key tile whose row
maxima all fall more than T (log2 units) below the running maxima costs no exp, no V load and no
P.V (the trace shows fewer V than K loads); exact where nothing falls that far. No GPU."""
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from flashattn import interpret
from flashattn.flex import flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from flex_blasst import inputs  # noqa: E402

warnings.filterwarnings("ignore", message=".*flex_attention.*")
KO = {"BLOCK_M": 16, "BLOCK_N": 16}


def _run(q, k, v, t):
    with interpret.enabled(), interpret.trace() as tr:
        out = flex_attention(q, k, v, blasst_threshold=t, kernel_options=KO)
    return out, sum(tr.loads("K").values()), sum(tr.loads("V").values())


def test_off_by_default_and_exact_when_nothing_is_far():
    q, k, v = inputs("random", 128, d=32, h=1)
    out0, k0, v0 = _run(q, k, v, None)
    assert k0 == v0 == 64
    out1, k1, v1 = _run(q, k, v, 20.0)
    assert (k1, v1) == (64, 64) and torch.equal(out0, out1)


def test_sink_input_skips_most_tiles_at_no_cost():
    q, k, v = inputs("sink", 128, d=32, h=1)
    ref = torch_flex(q.double(), k.double(), v.double())
    out, kl, vl = _run(q, k, v, 12.0)
    assert vl < 0.5 * kl, (kl, vl)
    assert (out.double() - ref).abs().max() < 2e-3


def test_skips_grow_as_the_threshold_falls():
    q, k, v = inputs("local", 128, d=32, h=1)
    skipped = [1 - vl / kl for _, kl, vl in (_run(q, k, v, t) for t in (16.0, 6.0, 2.0))]
    assert skipped[0] <= skipped[1] <= skipped[2] and skipped[2] > 0, skipped


@pytest.mark.parametrize("t", [0.0, -1.0, float("inf"), True])
def test_bad_threshold(t):
    q, k, v = inputs("random", 16, d=16, h=1)
    with interpret.enabled(), pytest.raises(ValueError, match="blasst_threshold"):
        flex_attention(q, k, v, blasst_threshold=t)
