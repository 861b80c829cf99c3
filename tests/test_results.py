"""flashbook.data.results on SYNTHETIC fixtures (tests/fixtures/results/synthetic: made-up
numbers)."""
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from flashbook.data import results
from flashbook.impls import ORDER as IMPL_ORDER

ROOT = Path(__file__).parent / "fixtures" / "results"
REPO = Path(__file__).resolve().parents[1]
GPU = "synthetic"


@pytest.fixture(scope="module")
def r():
    return results.load(GPU, root=ROOT)


def test_fixtures_are_labelled_synthetic():
    d = ROOT / GPU
    assert "SYNTHETIC" in (d / "README.md").read_text()
    files = list(d.rglob("*.json"))
    assert len(files) == 4
    for f in files:
        assert json.loads(f.read_text())["meta"]["synthetic"] is True, f


def test_available():
    assert results.available(ROOT) == [GPU]
    assert results.available(ROOT / "does-not-exist") == []


def test_default_root_and_env(monkeypatch):
    monkeypatch.delenv("FLASHATTN_RESULTS", raising=False)
    assert results.results_root() == REPO / "results"     # the repository's, wherever the reader is
    monkeypatch.setenv("FLASHATTN_RESULTS", str(ROOT))
    assert results.results_root() == ROOT
    assert results.available() == [GPU]
    assert not results.load(GPU).bench.empty


def test_bench_frame(r):
    assert set(r.workloads) == {"fp16-causal-d128", "fp16-full-d128"}
    assert set(r.bench["workload"]) == set(r.workloads)
    assert r.bench_meta["fp16-causal-d128"]["workload"]["B"] == 4
    for c in ("impl", "kind", "config", "Nq", "median_ms", "tflops", "speedup_prev",
              "ratio_cudnn", "max_abs_err", "error"):
        assert c in r.bench.columns
    skipped = r.bench[r.bench["error"].fillna("").str.startswith("skipped")]
    assert set(skipped["impl"]) == {"naive", "sdpa_math"}
    assert skipped["tflops"].isna().all()


def test_tflops_table_book_order(r):
    t = r.tflops_table("fp16-causal-d128")
    assert list(t.columns) == [1024, 4096]
    assert list(t.index) == ["naive", "baseline", "large_tiles", "autotune", "pair", "best",
                             "sdpa_flash", "sdpa_cudnn", "sdpa_math"]
    assert list(t.index) == sorted(t.index, key=IMPL_ORDER.index)
    assert t.loc["baseline", 1024] == 200.0
    assert t.loc["sdpa_cudnn", 4096] == 500.0
    assert math.isnan(t.loc["naive", 4096])          # skipped
    assert t.loc["sdpa_math"].isna().all()            # failed / skipped
    full = r.tflops_table("fp16-full-d128")
    assert list(full.index) == ["baseline", "autotune", "sdpa_cudnn"]
    assert list(full.columns) == [4096]


def test_ratio_table(r):
    q = r.ratio_table("fp16-causal-d128")
    assert q.loc["sdpa_cudnn"].tolist() == [1.0, 1.0]
    assert q.loc["autotune", 4096] == pytest.approx(0.8)
    assert q.loc["pair", 1024] == pytest.approx(0.8)
    assert q.loc["sdpa_flash", 1024] == pytest.approx(0.5)
    assert r.ratio_table("fp16-full-d128").loc["autotune", 4096] == pytest.approx(0.7)
    # The stored column agrees with the table.
    row = r.row("pair", 4096)
    assert row["ratio_cudnn"] == pytest.approx(q.loc["pair", 4096])


def test_stored_speedup_prev(r):
    assert r.row("large_tiles", 4096)["speedup_prev"] == pytest.approx(0.1)
    assert r.row("baseline", 1024)["speedup_prev"] == pytest.approx(10.0)   # over naive
    assert math.isnan(r.row("baseline", 4096)["speedup_prev"])             # naive skipped
    assert math.isnan(r.row("autotune", 4096)["speedup_prev"])             # remap not recorded
    assert math.isnan(r.row("best", 4096)["speedup_prev"])


def test_profile(r):
    p = r.profile
    assert list(p["step"]) == ["baseline", "large_tiles"]
    assert (p["kernel"] == "fmha_kernel").all()
    assert p.set_index("step").loc["large_tiles", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"] == 40.0
    assert p["launch__registers_per_thread"].tolist() == [255, 255]
    assert r.profile_units["gpu__time_duration.sum"] == "ns"
    assert list(r.rules.columns) == ["step", "kernel", "section", "rule", "type", "message"]
    assert len(r.rules) == 2


def test_compile(r):
    c = r.compile
    assert len(c) == 3
    assert "sass" not in c.columns
    assert c.set_index("step").loc["large_tiles", "sass_MUFU.EX2"] == 260
    assert c.set_index("step").loc["large_tiles", "stack_bytes"] == 5000
    assert c.set_index("step").loc["autotune", "error"].startswith("CompilerExecutionError")
    assert c.set_index("step").loc["autotune", "sass_HGMMA"] == 0
    assert set(r.compile_meta) == {"sm_90"}


def test_meta_and_source_line(r):
    assert r.meta["gpu"] == "Synthetic GPU"
    assert r.meta["results"] == GPU
    line = results.source_line(r.meta)
    assert line == ("Synthetic GPU (100 SMs), driver 000.00, CUDA 0.0, torch 0.0.0, "
                    "cuda-tile 0.0.0, tileiras 0.0.0, 2000-01-01")
    assert results.source_line(r) == line
    h200 = dict(gpu="NVIDIA H200", sm_count=132, driver="580.159", cuda="13.0", torch="2.11.0",
                cuda_tile="1.7.0", tileiras="13.4.92", date="2026-11-30T10:00:00Z")
    assert results.source_line(h200) == ("H200 (132 SMs), driver 580.159, CUDA 13.0, torch "
                                         "2.11.0, cuda-tile 1.7.0, tileiras 13.4.92, 2026-11-30")
    assert results.source_line({}).startswith("no GPU")


def test_missing_gpu_is_empty(tmp_path):
    m = results.load("nothing", root=tmp_path)
    for df in (m.bench, m.profile, m.rules, m.compile):
        assert isinstance(df, pd.DataFrame) and df.empty
    assert m.tflops_table().empty
    assert m.ratio_table().empty
    assert m.row("baseline", 1024) is None
    assert m.meta["gpu"] is None


def test_unknown_workload_and_missing_reference(r):
    assert r.tflops_table("bf16-causal-d128").empty
    assert r.ratio_table("fp16-causal-d128", ref="flex").empty


def test_partial_results(tmp_path):
    """Only a compile report (as from a CPU machine): bench and profile empty, compile loads."""
    d = tmp_path / "h200" / "compile"
    d.mkdir(parents=True)
    (d / "sm_100.json").write_text((ROOT / GPU / "compile" / "sm_90.json").read_text())
    (tmp_path / "h200" / "bench").mkdir()
    (tmp_path / "h200" / "bench" / "broken.json").write_text("{not json")
    m = results.load("h200", root=tmp_path)
    assert m.bench.empty and m.profile.empty and len(m.compile) == 3
    assert results.available(tmp_path) == ["h200"]
