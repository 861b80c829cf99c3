"""flashbook.measure.bench_fp8 runs end to end on the CPU (``--dry-run``: tiny shapes in the
interpreter, wall-clock timing) and writes its JSON: the script the lead runs on the GPU."""
import importlib.util
import json
from pathlib import Path

import pytest


def _load():
    from flashbook.measure import bench_fp8
    return bench_fp8


def test_fp8_bench_dry_run(tmp_path, capsys):
    bench = _load()
    out = tmp_path / "fp8.json"
    assert bench.main(["--dry-run", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    impls = {(r["part"], r["impl"]) for r in data["rows"]}
    assert {("forward", n) for n in ("fp8", "fp8-vt", "fp8-vk", "fp16", "fp16#2")} <= impls
    assert {("decode", n) for n in ("decode-fp16", "decode-fp16#2", "decode-fp8")} <= impls
    # The alternative tiles (--configs; the dry run's 64x64) and the fused V^T quantisation.
    assert {("forward", n) for n in ("fp8-vt@64x64", "quant-v", "quant-vt")} <= impls
    assert {r["causal"] for r in data["rows"] if r["impl"] == "fp8-vt@64x64"} == {False, True}
    meta = data["meta"]
    assert meta["configs"] == ["64x64"] and meta["dry_run"] is True
    assert {"torch", "cuda_tile", "python", "date", "command"} <= set(meta)
    for r in data["rows"]:
        assert r["median_ms"] > 0 and r["max_err"] < 0.1, r
    dec = [r for r in data["rows"] if r["impl"] == "decode-fp8"]
    assert all(r["kv_bytes"] == 2 * r["B"] * 8 * r["L"] * 128 for r in dec)
    assert "wrote" in capsys.readouterr().out


def test_kv_bytes_arithmetic():
    bench = _load()
    # B=8, Hkv=8, D=128, 32K keys: K and V, 2 bytes each in fp16, 1 in fp8.
    assert bench.kv_bytes(8, 32768) == 1_073_741_824
    assert bench.kv_bytes(8, 32768, elem=1) == 536_870_912
    assert bench.attention_flops(1, 1, 4, 2, True) == pytest.approx(64.0)


def test_fp8_bench_rejects_bad_config(tmp_path):
    bench = _load()
    with pytest.raises(ValueError, match="configuration"):
        bench.main(["--dry-run", "--configs", "64by64", "--out", str(tmp_path / "x.json")])
