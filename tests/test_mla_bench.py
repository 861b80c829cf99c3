"""experiments/mla_bench.py on the CPU: its --dry-run runs every path of the H200 script (the
inputs, the SDPA probe, FlexAttention eagerly, the FP8 row, the JSON) through the interpreter at
tiny shapes, so the GPU run is known to work up to the GPU itself."""
import json
from pathlib import Path

import pytest

from scripts import load

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]


def _script():
    mod = load(REPO / "experiments" / "mla_bench.py", "experiments_mla_bench")
    return mod


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_dry_run_writes_every_row(tmp_path):
    bench = _script()
    out = tmp_path / "mla.json"
    assert bench.main([str(out), "--dry-run", "--rounds", "1"]) == 0
    doc = json.loads(out.read_text())
    assert doc["dry_run"] is True and "gpu" in doc["metadata"] and "build" in doc["metadata"]
    shapes = [(r["B"], r["cache_len"]) for r in doc["rows"]]
    assert shapes == [(b, n) for b in bench.DRY["batches"] for n in bench.DRY["cache_lens"]]
    # PyTorch's CPU math backend runs the latent attention; the refusals are recorded.
    assert doc["sdpa_choice"] is not None
    assert any("error" in v for v in doc["sdpa_probe"].values())
    for r in doc["rows"]:
        assert r["bytes"] == r["B"] * r["cache_len"] * bench.D * 2
        assert "flashattn" in r["timing"] and "sdpa" in r["timing"]
        assert r["max_err"]["sdpa"] < 1e-2           # the kernel agrees with PyTorch (bf16)
        assert "ms" not in r                         # no times from a dry run
    fp8 = [r for r in doc["rows"] if "flashattn_fp8" in r["timing"]]
    assert [(r["B"], r["cache_len"]) for r in fp8] == [tuple(bench.DRY["fp8_row"])]
    assert fp8[0]["max_err"]["fp8_vs_flashattn_bf16"] < 0.1      # e4m3 rounding of the cache
    assert any("flex" in r["timing"] for r in doc["rows"])
