"""The loaders of flashbook.data.results beyond the bench/profile/compile parts: the tile-shape
grid, experiment runs and the seed's quoted B200 numbers. On the repository's recorded data
(read-only) and on synthetic documents written to a temporary folder."""
import json
import re
from pathlib import Path

import pandas as pd
import pytest

from flashbook.data import results
from flashbook.data.schema import ROW_FIELDS, add_derived, make_row, write_json
from flashbook.impls import IMPLS, base_name
from flashattn.config import Config

REPO = Path(__file__).resolve().parents[1]
SEED_TEXT = sorted((REPO.parent / "shared" / "seeds").glob("000_*.txt"))
RUNS = {"01-first-sweep": 48, "02-hopper-experiments": 84, "04-persistent": 30}


@pytest.fixture(scope="module")
def r():
    return results.load("h200")


# --- compile data: one home, results/<gpu>/compile/ -------------------------------------------
def test_one_home_for_compile_data():
    assert not (REPO / "results" / "compile").exists()
    assert (REPO / "results" / "h200" / "compile" / results.TILE_GRID_FILE).is_file()


def test_tile_grid(r):
    g, meta = r.tile_grid, r.tile_grid_meta
    n = len(meta["steps"]) * len(meta["archs"]) * len(meta["tile_m"]) * len(meta["tile_n"])
    assert len(g) == n == 24
    assert set(g.TILE_M) == set(meta["tile_m"]) and set(g.TILE_N) == set(meta["tile_n"])
    assert set(g.arch) == {"sm_90", "sm_100"} and set(g.step) == {"baseline", "fast_math"}
    for c in ("registers", "stack_bytes", "shared_bytes", "sass_STL", "sass_HGMMA", "error"):
        assert c in g.columns
    assert g.sass_STL.dtype.kind == "i"
    assert (g.config == [f"{m}x{n}" for m, n in zip(g.TILE_M, g.TILE_N)]).all()
    # chapter 5's numbers: 256x128 spills on Hopper, not on Blackwell with fast math
    hop = g[(g.arch == "sm_90") & (g.step == "baseline")].set_index(["TILE_M", "TILE_N"])
    assert hop.loc[(256, 128), "stack_bytes"] > 0 and hop.loc[(64, 64), "stack_bytes"] == 0


def test_tile_grid_is_not_an_arch_report(r):
    assert set(r.compile_meta) == {"sm_90", "sm_100"}
    assert "TILE_M" not in r.compile.columns


def test_missing_tile_grid_loads_empty(tmp_path):
    (tmp_path / "g" / "bench").mkdir(parents=True)
    m = results.load("g", root=tmp_path, experiments=tmp_path / "none")
    assert m.tile_grid.empty and m.tile_grid_meta == {}
    assert m.experiments == []


# --- experiment runs: experiments/data/<run>/<workload>.json -----------------------------------
def test_experiment_runs_are_bench_documents(r):
    assert set(RUNS) <= set(r.experiments)
    for name in r.experiments:                            # every run in experiments/data/
        df = r.experiment(name)
        assert set(ROW_FIELDS) <= set(df.columns) and len(df), name
    for name, n in RUNS.items():
        df = r.experiment(name)
        assert len(df) == n
        assert set(df.workload) == set(df.document) == {"fp16-causal-d128", "fp16-full-d128"}
        assert (df.causal == (df.workload == "fp16-causal-d128")).all()
        assert (df.Nq == df.Nk).all() and set(df.B) == {4} and set(df.D) == {128}
        assert df.error.isna().all() and df.tflops.notna().all()
        cudnn = df[df.impl == "sdpa_cudnn"]
        assert (cudnn.ratio_cudnn == 1.0).all()
        assert df.groupby(["impl", "Nq", "causal"]).size().max() == 1


def test_experiment_runs_use_current_names(r):
    for name in RUNS:
        df = r.experiment(name)
        meta = results.load_experiment_meta(name)
        renamed = meta["fp16-causal-d128"]["converted"]["renamed"]
        assert not any("hopper_hints" in i for i in df.impl)
        assert set(renamed.values()) <= set(df.impl)
        for impl in df.impl.unique():
            step, _, cfg = impl.partition("@")
            base = step.split("+")[0]                  # "+FLAG=V": a flag the run changed
            assert base_name(base) in IMPLS, impl
            if cfg:
                assert Config.parse(cfg).label() == cfg, impl
                assert set(df[df.impl == impl].config) == {cfg}, impl


def test_experiment_numbers_the_chapters_quote(r):
    s2 = r.experiment("02-hopper-experiments").set_index(["impl", "Nq", "causal"])
    assert s2.loc[("arch_tuned@64x128 occ=2", 4096, True), "tflops"] == pytest.approx(558, abs=0.5)
    assert s2.loc[("unchecked_kv", 4096, True), "tflops"] == pytest.approx(509, abs=0.5)
    assert s2.loc[("arch_tuned@64x128 occ=2 ctas=2", 16384, True), "tflops"] < 13
    s4 = r.experiment("04-persistent").set_index(["impl", "Nq", "causal"])
    assert s4.loc[("persistent", 16384, True), "ratio_cudnn"] == pytest.approx(0.72, abs=0.005)


def test_unknown_experiment(r):
    with pytest.raises(FileNotFoundError, match="no experiment run 'nope'.*02-hopper"):
        r.experiment("nope")


def _run(root, name, gpu, causal=True):
    rows = [make_row(i, "library" if i.startswith("sdpa") else "step", B=1, Hq=2, Hkv=2, N=n,
                     D=64, dtype="float16", causal=causal, tflops=t, median_ms=1.0)
            for i, t in (("sdpa_cudnn", 100.0), ("arch_tuned@64x64 occ=2", 50.0))
            for n in (128, 256)]
    wl = "fp16-causal-d64" if causal else "fp16-full-d64"
    doc = {"meta": {"gpu": gpu, "workload": {"name": wl}}, "rows": add_derived(rows)}
    write_json(root / name / f"{wl}.json", doc)


def test_experiment_of_another_gpu_is_refused(tmp_path):
    exp = tmp_path / "exp"
    _run(exp, "mine", "NVIDIA H200")
    _run(exp, "mine", "NVIDIA H200", causal=False)
    _run(exp, "theirs", "NVIDIA B200")
    (tmp_path / "res" / "h200" / "bench").mkdir(parents=True)
    r = results.load("h200", root=tmp_path / "res", experiments=exp)
    assert results.list_experiments(exp) == ["mine", "theirs"]
    assert r.experiments == ["mine"]
    df = r.experiment("mine")
    assert len(df) == 8 and set(df.workload) == {"fp16-causal-d64", "fp16-full-d64"}
    assert df[df.impl != "sdpa_cudnn"].ratio_cudnn.tolist() == [0.5] * 4
    with pytest.raises(ValueError, match="recorded on b200, not h200"):
        r.experiment("theirs")
    assert len(results.load_experiment("theirs", exp)) == 4      # the plain reader does not check


def test_experiments_root_env(monkeypatch, tmp_path):
    monkeypatch.delenv("FLASHATTN_EXPERIMENTS", raising=False)
    assert results.experiments_root() == REPO / "experiments" / "data"
    monkeypatch.setenv("FLASHATTN_EXPERIMENTS", str(tmp_path))
    assert results.experiments_root() == tmp_path
    assert results.list_experiments() == []


# --- the seed's B200 numbers: quoted, not measured ---------------------------------------------
def test_seed_b200_table():
    t = results.seed_b200()
    assert list(t.index) == ["baseline", "large_tiles", "fast_math", "loop_split", "remap"]
    assert list(t.columns) == [1024, 2048, 4096, 8192, 16384]
    assert t.index.name == "impl" and t.columns.name == "N"
    assert (t.dtypes == "int64").all()
    assert t.loc["baseline", 1024] == 330 and t.loc["remap", 16384] == 835
    meta = t.attrs["meta"]
    assert meta["quoted"] is True and meta["measured_by_us"] is False
    assert "shared/seeds/000_" in meta["source"] and meta["gpu"] == "NVIDIA B200"
    assert meta["workload"]["name"] == "fp16-causal-d128" and meta["workload"]["causal"] is True


def test_seed_b200_is_not_a_gpu_of_ours():
    assert "quoted" not in results.available()
    doc = json.loads((REPO / "results" / results.SEED_B200_FILE).read_text())
    assert all(r["median_ms"] is None and r["kind"] == "step" for r in doc["rows"])


@pytest.mark.skipif(not SEED_TEXT, reason="the seed walkthrough (../shared/seeds/) is not here")
def test_seed_b200_matches_the_seed_text():
    """Every quoted number is in the seed's tables: one row per length, TFLOPS columns."""
    text = SEED_TEXT[0].read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        m = re.fullmatch(r"(\d{1,2},\d{3})\t(.*)", line.strip())
        if m:
            n = int(m.group(1).replace(",", ""))
            rows.setdefault(n, []).append([int(x) for x in re.findall(r"(?<![\d+-])\d+(?![\d%])",
                                                                       m.group(2))])
    # the tables in the seed's order: baseline; trap; fast math; loop split; remap
    t = results.seed_b200()
    for n in t.columns:
        tables = rows[n]
        assert tables[0] == [t.loc["baseline", n]]
        assert tables[1] == [t.loc["baseline", n], t.loc["large_tiles", n]]
        assert tables[2] == [t.loc["large_tiles", n], t.loc["fast_math", n]]
        assert tables[3] == [t.loc["fast_math", n], t.loc["loop_split", n]]
        assert tables[4] == [t.loc["loop_split", n], t.loc["remap", n]]


def test_seed_b200_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        results.seed_b200(root=tmp_path)


def test_loaders_return_dataframes(r):
    assert isinstance(r.experiment("04-persistent"), pd.DataFrame)
    assert isinstance(r.tile_grid, pd.DataFrame)
    assert isinstance(results.seed_b200(), pd.DataFrame)


def test_only_folders_of_bench_documents_are_runs(tmp_path):
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "summary.json").write_text(
        '{"meta": {}, "rows": [{"step": "a", "metric": "m", "value": 1}]}')
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "w.json").write_text(
        '{"meta": {"workload": {"name": "w"}}, "rows": [{"impl": "baseline", "Nq": 1}]}')
    assert results.list_experiments(tmp_path) == ["run"]
    assert results.is_bench_doc({"rows": [{"impl": "x"}]})
    assert not results.is_bench_doc({"rows": [{"step": "x"}]}) and not results.is_bench_doc(None)
    with pytest.raises(FileNotFoundError, match="known: run"):
        results.load_experiment("profiles", tmp_path)


# --- other records of experiment runs: profile summaries and tables -----------------------------
def test_experiment_profile_of_warp_groups():
    """Chapter 10 (E8): the profile of arch_tuned against warp_groups at D=128, N=8K."""
    p = results.load_experiment_profile("12-profiles", "d128-summary.json")
    assert list(p.step) == ["arch_tuned", "warp_groups"]            # book order
    assert set(p.kernel) == {"fmha_kernel"}
    s = p.set_index("step")
    assert s.loc["arch_tuned", "launch__block_size"] == 256
    assert s.loc["warp_groups", "launch__block_size"] == 384         # three warp groups
    assert s.loc["warp_groups", "launch__registers_per_thread"] == 168
    stall = "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
    assert s[stall].dtype.kind == "f"
    meta = p.attrs["meta"]
    assert meta["configs"] == {"arch_tuned": "64x128 occ=2", "warp_groups": "128x128 occ=1 nww=8"}
    assert meta["shape"]["N"] == 8192 and meta["shape"]["D"] == 128
    assert p.attrs["units"]["gpu__time_duration.sum"] == "ns"
    assert {"step", "rule", "message"} <= set(p.attrs["rules"].columns)


def test_experiment_table_crosscheck():
    t = results.load_experiment_table("13-timing-crosscheck", "timing-crosscheck.json")
    assert list(t.columns) == ["N", "method", "arch_tuned_ms", "cudnn_ms", "ratio"]
    assert set(t.method) == {"rounds", "do_bench", "do_bench_cudagraph"}
    assert sorted(t.N.unique()) == [1024, 2048, 4096, 8192, 16384]
    assert ((t.cudnn_ms / t.arch_tuned_ms - t.ratio).abs() < 1e-9).all()   # ratio = speed
    assert t.attrs["meta"]["gpu"] == "NVIDIA H200"


def test_experiment_records_are_not_runs():
    """Folders with only profiles or tables are not experiment runs (no bench documents)."""
    runs = results.list_experiments()
    assert "12-profiles" not in runs and "13-timing-crosscheck" not in runs


def test_experiment_file_loaders_synthetic(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "t.json").write_text(
        '{"meta": {"m": 1}, "rows": [{"N": 1, "x": 2.0}, {"N": 2, "x": 3.0}]}')
    (tmp_path / "run" / "p.json").write_text(json.dumps({"meta": {"configs": {"a": "64x64"}},
        "rows": [{"step": "a", "kernel": "k", "metric": "m", "value": "1,234.5", "unit": "ns"},
                 {"step": "baseline", "kernel": "k", "metric": "m", "value": 2, "unit": "ns"}],
        "rules": []}))
    (tmp_path / "run" / "bad.json").write_text("not json")
    assert results.load_experiment_file("run", "t.json", tmp_path)["meta"] == {"m": 1}
    t = results.load_experiment_table("run", "t.json", tmp_path)
    assert t.x.tolist() == [2.0, 3.0] and t.attrs["meta"] == {"m": 1}
    p = results.load_experiment_profile("run", "p.json", tmp_path)
    assert p.step.tolist() == ["baseline", "a"] and p.m.tolist() == [2, 1234.5]
    assert p.attrs["units"] == {"m": "ns"} and p.attrs["rules"].empty
    with pytest.raises(FileNotFoundError, match="no file 'nope.json' in experiment 'run'"):
        results.load_experiment_file("run", "nope.json", tmp_path)
    with pytest.raises(ValueError, match="not JSON"):
        results.load_experiment_file("run", "bad.json", tmp_path)
    with pytest.raises(ValueError, match="not a profile summary"):
        results.load_experiment_profile("run", "t.json", tmp_path)
    (tmp_path / "run" / "norows.json").write_text('{"meta": {}}')
    with pytest.raises(ValueError, match="no list of rows"):
        results.load_experiment_table("run", "norows.json", tmp_path)


def test_experiment_log_table_d256():
    """Chapter 10 (E8): the D=256 profile, whose summary JSON did not come back, from its log."""
    t = results.load_experiment_log_table("12-profiles", "prof-d256.log")
    assert t.step.tolist() == ["arch_tuned", "warp_groups"]
    s = t.set_index("step")
    assert s.loc["arch_tuned", "registers"] == 255 and s.loc["warp_groups", "block"] == 384
    assert s.loc["warp_groups", "duration_ns"] < s.loc["arch_tuned", "duration_ns"]
    assert t["occ_theory_%"].dtype.kind == "f"
    # the D=128 log prints the same table as its summary JSON holds
    log = results.load_experiment_log_table("12-profiles", "prof-d128.log").set_index("step")
    js = results.load_experiment_profile("12-profiles", "d128-summary.json").set_index("step")
    assert (log["registers"] == js["launch__registers_per_thread"]).all()
    assert (log["duration_ns"] == js["gpu__time_duration.sum"]).all()


def test_experiment_log_table_synthetic(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "a.log").write_text("running: x\n\nstep  kernel  registers  sm_%\n"
                                            "a     k       128        1,234.5\n\nmore\n")
    (tmp_path / "run" / "b.log").write_text("nothing printed\n")
    (tmp_path / "run" / "c.log").write_text("step kernel x\na k\n")
    t = results.load_experiment_log_table("run", "a.log", tmp_path)
    assert t.to_dict("records") == [{"step": "a", "kernel": "k", "registers": 128, "sm_%": 1234.5}]
    with pytest.raises(ValueError, match="no printed profile table"):
        results.load_experiment_log_table("run", "b.log", tmp_path)
    with pytest.raises(ValueError, match="a row of 2 cells under 3 columns"):
        results.load_experiment_log_table("run", "c.log", tmp_path)
    with pytest.raises(FileNotFoundError):
        results.load_experiment_log_table("run", "d.log", tmp_path)
