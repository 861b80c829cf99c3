"""The scripts in experiments/ on a CPU: sweep.py with a stand-in for the benchmark,
readme_figure.py on the recorded data, tile_grid.py with a stand-in compiler (and, marked
slow, with the real one on a one-kernel grid)."""
import json
from pathlib import Path

import pytest

from flashbook.data import results
from flashbook.data.schema import ROW_FIELDS, add_derived, make_row
from scripts import load

REPO = Path(__file__).resolve().parents[1]


def _script(name):
    mod = load(REPO / "experiments" / f"{name}.py", f"experiments_{name}")
    return mod


@pytest.fixture
def sweep():
    return _script("sweep")


@pytest.fixture
def fake_bench(monkeypatch):
    """run_bench without a GPU: synthetic rows in the bench schema; records its calls."""
    from flashbook.measure import bench
    calls = []

    def run_bench(steps=None, seqlens=None, *, causal=True, command=None, **kw):
        calls.append(dict(kw, steps=steps, seqlens=seqlens, causal=causal, command=command))
        impls = list(steps) + ["sdpa_" + b for b in kw.get("baselines", [])]
        rows = [make_row(i, "library" if i.startswith("sdpa_") else "step", B=4, Hq=32, Hkv=32,
                         N=n, D=128, dtype="float16", causal=causal, config="64x128 occ=2",
                         median_ms=1.0 + j, tflops=100.0 / (1 + j), method="rounds")
                for n in seqlens for j, i in enumerate(impls)]
        name = bench.workload_name("float16", causal, 128, 32, 32)
        meta = {"gpu": "NVIDIA H200", "command": command,
                "workload": {"name": name, "causal": causal, "seqlens": list(seqlens)}}
        return {"meta": meta, "rows": add_derived(rows)}

    monkeypatch.setattr(bench, "run_bench", run_bench)
    return calls


STEPS = "arch_tuned,arch_tuned#2,arch_tuned@128x128:occ=1:nww=8"


def test_sweep_writes_one_bench_document_per_workload(sweep, fake_bench, tmp_path, capsys):
    rc = sweep.main(["06-test", "--causal", "both", "--steps", STEPS, "--seqlens", "1024,4096",
                     "--baselines", "cudnn", "--data", str(tmp_path), "--prewarm", "3"])
    assert rc == 0
    assert [c["causal"] for c in fake_bench] == [True, False]
    for c in fake_bench:
        assert c["steps"] == STEPS.split(",") and c["seqlens"] == [1024, 4096]
        assert c["baselines"] == ["cudnn"] and c["prewarm_procs"] == 3
        assert c["command"].startswith("python experiments/sweep.py 06-test")
    files = sorted(p.name for p in (tmp_path / "06-test").iterdir())
    assert files == ["fp16-causal-d128.json", "fp16-full-d128.json"]
    assert "arch_tuned#2" in capsys.readouterr().out            # the bench table is printed
    df = results.load_experiment("06-test", tmp_path)
    assert set(ROW_FIELDS) <= set(df.columns) and len(df) == 2 * 2 * 4
    assert set(df.impl) == set(STEPS.split(",")) | {"sdpa_cudnn"}
    assert df[df.impl == "arch_tuned"].ratio_cudnn.tolist() == [4.0] * 4      # 100 / 25 TFLOPS
    r = results.load("h200", experiments=tmp_path)
    assert r.experiments == ["06-test"] and len(r.experiment("06-test")) == 16


def test_sweep_one_causal_setting(sweep, fake_bench, tmp_path):
    assert sweep.main(["r1", "--causal", "no", "--steps", "pair", "--seqlens", "2048",
                       "--data", str(tmp_path)]) == 0
    assert [c["causal"] for c in fake_bench] == [False]
    assert [p.name for p in (tmp_path / "r1").iterdir()] == ["fp16-full-d128.json"]
    doc = json.loads((tmp_path / "r1" / "fp16-full-d128.json").read_text())
    assert doc["meta"]["workload"]["causal"] is False


def test_sweep_keeps_recorded_runs(sweep, fake_bench, tmp_path, capsys):
    args = ["r2", "--causal", "yes", "--steps", "pair", "--seqlens", "2048", "--data",
            str(tmp_path)]
    assert sweep.main(args) == 0
    assert sweep.main(args) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert len(fake_bench) == 1
    assert sweep.main(args + ["--force"]) == 0
    assert len(fake_bench) == 2


@pytest.mark.parametrize("bad", [["--out", "x.json"], ["--no-causal"], ["--json"],
                                 ["--steps", "hopper_hints"], ["--steps", "arch_tuned@64x65"],
                                 ["--seqlens", "x"]])
def test_sweep_rejects_bad_options(sweep, fake_bench, tmp_path, bad):
    with pytest.raises(SystemExit):
        sweep.main(["r3", "--data", str(tmp_path), *bad])
    assert fake_bench == [] and not (tmp_path / "r3").exists()


def test_sweep_rejects_a_path_as_run_name(sweep, fake_bench, tmp_path):
    with pytest.raises(SystemExit):
        sweep.main(["../elsewhere", "--data", str(tmp_path)])


def test_sweep_without_gpu_says_so(sweep, monkeypatch, tmp_path, capsys):
    from flashbook.measure import bench

    def no_gpu(*a, **k):
        raise RuntimeError("run_bench needs a CUDA GPU (torch.cuda.is_available() is False)")
    monkeypatch.setattr(bench, "run_bench", no_gpu)
    assert sweep.main(["r4", "--steps", "pair", "--data", str(tmp_path)]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_readme_figure(tmp_path):
    out = _script("readme_figure").main(tmp_path / "fig.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def _fake_compile_step(step, arch, *, config=None, **kw):
    from flashattn.aot import KernelReport
    return [KernelReport(step=step, arch=arch, kernel="fmha", config=config.label(),
                         registers=255, stack_bytes=8 * config.TILE_M,
                         sass={"HGMMA": 4, "STL": config.TILE_N // 64})]


def test_tile_grid_format_roundtrips_through_the_reader(tmp_path, monkeypatch):
    import flashattn.aot
    monkeypatch.setattr(flashattn.aot, "compile_step", _fake_compile_step)
    grid = _script("tile_grid")
    assert grid.DEFAULT_OUT == REPO / "results" / "h200" / "compile" / "tiles.json"
    out = tmp_path / "gpu" / "compile" / "tiles.json"
    rc = grid.main(["--out", str(out), "--steps", "baseline", "--archs", "sm_90,sm_100",
                    "--tile-m", "64,128", "--tile-n", "64"])
    assert rc == 0
    r = results.load("gpu", root=tmp_path)
    assert r.compile.empty                               # tiles.json is not an arch report
    g = r.tile_grid
    assert len(g) == 4 and set(g.arch) == {"sm_90", "sm_100"}
    assert g.set_index(["arch", "TILE_M"]).loc[("sm_90", 128), "stack_bytes"] == 1024
    assert (g.sass_STL == 1).all()
    meta = r.tile_grid_meta
    assert meta["tile_m"] == [64, 128] and meta["tile_n"] == [64] and meta["steps"] == ["baseline"]
    assert meta["command"].startswith("python experiments/tile_grid.py --out")


@pytest.mark.slow
def test_tile_grid_compiles_one_kernel(tmp_path):
    pytest.importorskip("cuda.tile")
    out = tmp_path / "gpu" / "compile" / "tiles.json"
    rc = _script("tile_grid").main(["--out", str(out), "--steps", "baseline", "--archs", "sm_90",
                                    "--tile-m", "64", "--tile-n", "64"])
    assert rc == 0
    g = results.load("gpu", root=tmp_path).tile_grid
    assert len(g) == 1 and g.error.iloc[0] == ""
    assert g.registers.iloc[0] > 0 and g.sass_HGMMA.iloc[0] > 0
    recorded = results.load("h200").tile_grid.set_index(["arch", "step", "TILE_M", "TILE_N"])
    assert g.registers.iloc[0] == recorded.loc[("sm_90", "baseline", 64, 64), "registers"]


def test_tilegym_bwd_bench_dry_on_the_interpreter(capsys):
    # The GPU comparison's CPU path: each of our backward variants (and TileGym's backward, where
    # tilegym is installed) through the interpreter against the fp64 reference.
    bench = _script("tilegym_bwd_bench")
    assert bench.main(["--dry"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "fp64 reference" in ln]
    assert len(lines) >= len(bench.VARIANTS)
    # the split variant is its own kernel, not the library's under another name
    import dataclasses
    from flashattn.kernels import BWD
    split = dataclasses.replace(BWD["bwd_dkdv"], module=bench.VARIANT_MODULE)
    assert split.kernel() is not BWD["bwd_dkdv"].kernel()
