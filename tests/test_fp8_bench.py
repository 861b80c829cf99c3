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


def test_fp8_bench_decode_mma_dry_run(tmp_path, capsys):
    """The decode part alone with the FP8-MMA row (V cache transposed) beside the fp16 cache and
    the widening kernel: every row checked and timed, the ratios to both written."""
    bench = _load()
    out = tmp_path / "dec.json"
    assert bench.main(["--dry-run", "--part", "decode", "--batch", "1", "--batch", "3",
                       "--cache", "300", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["meta"]["complete"] is True          # written after every shape, then final
    assert {r["part"] for r in rows} == {"decode"}
    assert {(r["B"], r["L"]) for r in rows} == {(1, 300), (3, 300)}
    assert {r["impl"] for r in rows} == set(bench.DECODE_IMPLS)
    for r in rows:
        assert r["median_ms"] > 0 and r["max_err"] < 0.1, r
        assert r["vs_fp16"] > 0 and r["vs_fp8"] > 0
        assert r["kv_bytes"] == 2 * r["B"] * 8 * r["L"] * 128 * (1 if "fp8" in r["impl"] else 2)
    mma = [r for r in rows if r["impl"] == "decode-fp8-mma"]
    # q and P in e4m3: a larger error than the widening kernel's, inside the tolerance.
    assert all(1e-4 < r["max_err"] < 0.1 for r in mma)
    printed = capsys.readouterr().out
    assert "decode-fp8-mma" in printed and "fp8 err" in printed
    assert bench.main(["--dry-run", "--part", "decode", "--cache", "64", "--decode-impls",
                       "decode-fp16", "decode-fp8-mma", "--out", str(out)]) == 0
    assert {r["impl"] for r in json.loads(out.read_text())["rows"]} == {"decode-fp16",
                                                                      "decode-fp8-mma"}
