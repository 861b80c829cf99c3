"""flashbook.measure.bench, flashattn.env and flashbook.measure.record: CPU tests, plus GPU runs
on a tiny shape. (The row schema: flashbook.data.schema; the registry of names: test_impls.py.)"""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashbook.steps import BEST_STEP
import torch

from flashbook import EXPERIMENTS, STEP_NAMES, impls
from flashattn import env
from flashattn.contract import parse_gqa
from flashbook.data import schema
from flashbook.data.schema import ROW_FIELDS, add_derived, make_row, to_frame, workload_name
from flashbook.measure import bench, record
from flashbook.measure.bench import DEFAULT_SEQLENS, parse_args
from flashattn.config import Config

REPO = Path(__file__).resolve().parent.parent
HAS_GPU = torch.cuda.is_available()


def _run(*args, **kw):
    e = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    module = "flashattn" if args and args[0] in ("compile", "info") else "flashbook"
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=300, **kw)


# --- command line --------------------------------------------------------------------------
def test_parse_defaults_are_the_seed_workload():
    a = parse_args([])
    assert a["steps"] == [*STEP_NAMES, *EXPERIMENTS, "best"]
    assert a["seqlens"] == list(DEFAULT_SEQLENS) == [1024, 2048, 4096, 8192, 16384]
    assert a["causal"] is True and a["dtype"] == "float16"
    assert (a["batch"], a["heads"], a["head_dim"], a["gqa"]) == (4, 32, 128, None)
    assert a["baselines"] == ["flash", "cudnn", "efficient", "math", "flex"]
    assert a["naive_max_n"] == 4096 and a["reps"] == 20
    assert (a["method"], a["rounds"], a["inner"]) == ("rounds", 30, 10)
    assert a["_json"] is False and a["_out"] is None


def test_parse_options():
    a = parse_args(["--steps", "baseline,autotune,best", "--seqlens", "256, 512", "--no-causal",
                    "--dtype", "bfloat16", "--gqa", "32:8", "--head-dim", "64", "--batch", "1",
                    "--baselines", "cudnn,flex", "--reps", "7", "--json", "--out", "x.json",
                    "--naive-max-n", "1024", "--quiet"])
    assert a["steps"] == ["baseline", "autotune", "best"]
    assert a["seqlens"] == [256, 512]
    assert a["causal"] is False and a["dtype"] == "bfloat16"
    assert a["gqa"] == (32, 8) and a["head_dim"] == 64 and a["batch"] == 1
    assert a["baselines"] == ["cudnn", "flex"] and a["reps"] == 7
    assert a["_json"] and a["_out"] == "x.json" and a["naive_max_n"] == 1024
    assert a["progress"] is False
    assert parse_args(["--causal"])["causal"] is True
    assert parse_args(["--baselines", "none"])["baselines"] == []
    assert parse_args(["--steps", "none"])["steps"] == []
    a = parse_args(["--steps", "arch_tuned,arch_tuned#2,arch_tuned@128x128:occ=1:nww=8",
                    "--method", "interleaved", "--rounds", "5", "--inner", "3"])
    assert a["steps"] == ["arch_tuned", "arch_tuned#2", "arch_tuned@128x128:occ=1:nww=8"]
    assert (a["method"], a["rounds"], a["inner"]) == ("interleaved", 5, 3)


@pytest.mark.parametrize("bad", [["--steps", "nope"], ["--baselines", "triton"],
                                 ["--seqlens", "1k"], ["--gqa", "32:5"], ["--gqa", "32"],
                                 ["--dtype", "float32"], ["--method", "events"],
                                 ["--steps", "baseline@64"], ["--steps", "baseline#x"],
                                 ["--steps", "nope@64x64"]])
def test_parse_errors(bad, capsys):
    with pytest.raises(SystemExit):
        parse_args(bad)


def test_parse_gqa():
    assert parse_gqa("32:8") == (32, 8) and parse_gqa("32x8") == (32, 8)
    assert parse_gqa((8, 1)) == (8, 1) and parse_gqa(None) is None
    with pytest.raises(ValueError):
        parse_gqa("8:3")


@pytest.mark.parametrize("kw, name", [
    (dict(), "fp16-causal-d128"),
    (dict(causal=False), "fp16-full-d128"),
    (dict(dtype="bfloat16"), "bf16-causal-d128"),
    (dict(Hq=32, Hkv=8), "fp16-causal-d128-gqa32x8"),
    (dict(head_dim=64), "fp16-causal-d64"),
    (dict(dtype=torch.bfloat16, causal=False, head_dim=64, Hq=8, Hkv=1), "bf16-full-d64-gqa8x1"),
    (dict(Hq=32, Hkv=32), "fp16-causal-d128"),
])
def test_workload_name(kw, name):
    assert workload_name(**kw) == name


def test_record_extra_workload_names():
    assert [record._extra_name(w, 32) for w in record.EXTRA_WORKLOADS] == [
        "fp16-full-d128", "bf16-causal-d128", "fp16-causal-d128-gqa32x8", "fp16-causal-d64", "fp16-causal-d256"]
    # baseline, then the steps from autotune on (the seed's last step and the book's).
    assert record.EXTRA_STEPS[0] == "baseline" and record.EXTRA_STEPS[-1] == record.CONTROL
    assert STEP_NAMES[-1] in record.EXTRA_STEPS and "best" in record.EXTRA_STEPS
    assert record.CONTROL in record.MAIN_STEPS and "remap@64x128:occ=2" in record.MAIN_STEPS
    assert {"autotune", "arch_tuned"} <= set(record.EXTRA_STEPS)
    assert "remap" not in record.EXTRA_STEPS
    assert record.EXTRA_WORKLOADS[0]["seqlens"] == (1024, 2048, 4096, 8192, 16384)


# --- derived columns, frames, tables, files (synthetic doc) -----------------------------------
def _synthetic_doc():
    """A made-up document: TFLOPS are round numbers, not measurements."""
    sh = dict(B=1, Hq=2, Hkv=2, D=64, dtype="float16", causal=True)
    tf = {("naive", 256): 10.0, ("baseline", 256): 100.0, ("large_tiles", 256): 50.0,
          ("fast_math", 256): 75.0, ("remap", 256): 80.0, ("autotune", 256): 160.0,
          ("best", 256): 160.0, ("sdpa_cudnn", 256): 200.0, ("sdpa_flash", 256): 100.0,
          ("baseline", 512): 120.0, ("large_tiles", 512): 60.0, ("sdpa_cudnn", 512): 240.0}
    rows = []
    for (impl, n), t in tf.items():
        kind = "library" if impl.startswith("sdpa") else "step"
        rows.append(make_row(impl, kind, N=n, tflops=t, median_ms=1.0, **sh))
    rows.append(make_row("naive", "step", N=512, error=bench.SKIP_NAIVE, **sh))
    rows.append(make_row("sdpa_math", "library", N=512, error="RuntimeError: boom", **sh))
    meta = dict(gpu=None, workload=dict(name="fp16-causal-d64", B=1, Hq=2, Hkv=2, D=64,
                                        dtype="float16", causal=True, seqlens=[256, 512]))
    return dict(meta=meta, rows=add_derived(rows))


def test_derived_columns():
    doc = _synthetic_doc()
    by = {(r["impl"], r["Nq"]): r for r in doc["rows"]}
    assert by["naive", 256]["speedup_prev"] is None                     # first step
    assert by["baseline", 256]["speedup_prev"] == pytest.approx(10.0)
    assert by["large_tiles", 256]["speedup_prev"] == pytest.approx(0.5)
    assert by["fast_math", 256]["speedup_prev"] == pytest.approx(1.5)
    assert by["remap", 256]["speedup_prev"] is None                     # loop_split absent
    assert by["autotune", 256]["speedup_prev"] == pytest.approx(2.0)
    assert by["best", 256]["speedup_prev"] is None
    assert by["sdpa_flash", 256]["speedup_prev"] is None
    assert by["baseline", 512]["speedup_prev"] is None                  # naive skipped
    assert by["large_tiles", 512]["speedup_prev"] == pytest.approx(0.5)
    assert by["autotune", 256]["ratio_cudnn"] == pytest.approx(0.8)
    assert by["sdpa_flash", 256]["ratio_cudnn"] == pytest.approx(0.5)
    assert by["sdpa_cudnn", 512]["ratio_cudnn"] == pytest.approx(1.0)
    assert by["baseline", 512]["ratio_cudnn"] == pytest.approx(0.5)
    assert by["sdpa_math", 512]["ratio_cudnn"] is None
    # Shapes are matched exactly: another head count is another comparison.
    rows = [dict(r) for r in doc["rows"]]
    for r in rows:
        if r["impl"] == "sdpa_cudnn":
            r["Hkv"] = 1
    assert all(r["ratio_cudnn"] is None for r in add_derived(rows) if r["impl"] != "sdpa_cudnn")


def test_to_frame_and_table():
    doc = _synthetic_doc()
    df = to_frame(doc)
    assert list(df.columns) == ["workload", *ROW_FIELDS]
    assert len(df) == len(doc["rows"]) and (df["workload"] == "fp16-causal-d64").all()
    assert df["tflops"].dtype.kind == "f" and df["speedup_prev"].dtype.kind == "f"
    assert to_frame(dict(meta={}, rows=[])).empty
    table = schema.format_table(doc)
    lines = table.splitlines()
    assert lines[0].startswith("fp16-causal-d64")
    assert [ln.split()[0] for ln in lines[2:11]] == [
        "naive", "baseline", "large_tiles", "fast_math", "remap", "autotune", "best",
        "sdpa_flash", "sdpa_cudnn"]
    assert "skip" in table and "err" in table and "RuntimeError: boom" in table


def test_write_json_is_strict_and_atomic(tmp_path):
    doc = _synthetic_doc()
    doc["rows"][0]["max_abs_err"] = float("nan")
    p = schema.write_json(tmp_path / "sub" / "x.json", doc)
    assert json.loads(p.read_text())["rows"][0]["max_abs_err"] is None
    assert [f.name for f in p.parent.iterdir()] == ["x.json"]          # no temporary left


def test_ref_heads():
    assert bench.ref_heads(32, 32, 1024) == 32
    assert 1 <= bench.ref_heads(32, 32, 16384) < 32
    assert bench.ref_heads(32, 8, 16384) % 4 == 0
    assert bench.ref_heads(32, 8, 1 << 17) == 4                         # one whole group


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hkv", [4, 2])
def test_reference_and_math_baseline_on_cpu(causal, hkv):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 37, 16, generator=g)
    k = torch.randn(1, hkv, 37, 16, generator=g)
    v = torch.randn(1, hkv, 37, 16, generator=g)
    scale = 16 ** -0.5
    ref = bench.reference_output(q, k, v, causal=causal, scale=scale)
    kk, vv = (t.repeat_interleave(4 // hkv, dim=1) for t in (k, v))
    s = (q @ kk.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(37, 37, dtype=torch.bool).triu(1), float("-inf"))
    expect = s.softmax(-1) @ vv
    assert ref.dtype == torch.float64                     # the check's yardstick is fp64
    torch.testing.assert_close(ref.float(), expect, atol=1e-5, rtol=1e-5)
    fn, ctx = bench.library_fn("sdpa_math", q, k, v, causal=causal, scale=scale)
    with ctx():
        torch.testing.assert_close(fn(), expect, atol=1e-5, rtol=1e-5)


def test_library_table_names():
    assert impls.LIBRARY_OPTIONS == {
        "flash": "sdpa_flash", "cudnn": "sdpa_cudnn", "efficient": "sdpa_efficient",
        "math": "sdpa_math", "flex": "flex", "tilegym": "tilegym"}
    # TileGym is timed when named: it is installed apart from PyTorch.
    assert bench.DEFAULT_BASELINES == ("flash", "cudnn", "efficient", "math", "flex")
    for opt, name in impls.LIBRARY_OPTIONS.items():
        i = impls.IMPLS[name]
        assert (i.kind, i.option) == ("library", opt)
        assert i.backend in ("flex", "tilegym") or \
            hasattr(torch.nn.attention.SDPBackend, i.backend), i


def test_make_row_fills_the_schema():
    r = make_row("baseline", "step", B=1, Hq=2, Hkv=1, N=64, D=16, dtype="float16", causal=1,
                 tflops=3.0)
    assert tuple(r) == ROW_FIELDS
    assert (r["Nq"], r["Nk"], r["causal"], r["tflops"], r["error"]) == (64, 64, True, 3.0, None)
    # bench writes rows with the schema's functions, not copies of them.
    assert bench.make_row is make_row and bench.add_derived is add_derived


# --- env -----------------------------------------------------------------------------------
def test_metadata_keys():
    m = env.metadata("python -m flashbook bench --seqlens 1024")
    for k in ("gpu", "sm_count", "compute_capability", "arch", "driver", "cuda", "torch",
              "cuda_tile", "tileiras", "python", "platform", "date", "command"):
        assert k in m
    assert m["command"] == "python -m flashbook bench --seqlens 1024"
    assert m["torch"] == torch.__version__
    assert len(m["date"]) == 20 and m["date"].endswith("Z") and m["date"][10] == "T"
    json.dumps(m)
    import platform
    assert platform.node() not in m["platform"] or not platform.node()


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU-only answers")
def test_metadata_without_gpu():
    m = env.metadata()
    assert m["gpu"] is None and m["sm_count"] is None and m["arch"] is None
    assert m["driver"] is None
    assert env.gpu_slug() == "cpu"


@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA GeForce RTX 5090", "rtx5090"), ("", "cpu"), (None, "cpu")])
def test_gpu_slug(name, slug):
    assert env.slug(name) == slug
    if name is not None:
        assert env.gpu_slug(name) == slug


def test_command_line():
    assert env.command_line(["/x/flashbook/__main__.py", "bench", "--seqlens", "1024"]) == \
        "python -m flashbook bench --seqlens 1024"
    assert env.command_line(["/x/flashattn/__main__.py", "compile", "--arch", "sm_90"]) == \
        "python -m flashattn compile --arch sm_90"
    assert env.command_line(["script.py", "a b"]) == "python script.py 'a b'"


def test_info_command():
    res = _run("info")
    assert res.returncode == 0, res.stderr
    assert "cuda-tile" in res.stdout and "torch" in res.stdout
    res = _run("info", "--json")
    assert res.returncode == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["command"] == "python -m flashattn info --json"
    assert m["torch"] == torch.__version__


@pytest.mark.skipif(HAS_GPU, reason="checks the answer without a GPU")
def test_bench_and_record_without_gpu(tmp_path, capsys):
    assert bench.main(["--seqlens", "256", "--quiet"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert record.main(["--out", str(tmp_path), "--part", "bench"]) == 1
    assert record.main(["--out", str(tmp_path), "--part", "profile"]) == 1
    with pytest.raises(RuntimeError):
        bench.run_bench(["baseline"], [256])


def test_record_rejects_unknown_workload():
    with pytest.raises(SystemExit):
        record.main(["--part", "bench-extra", "--workload", "fp32-causal-d128"])


@pytest.mark.slow
def test_record_compile_quick(tmp_path):
    """The compile part runs anywhere: tileiras + cuobjdump, no GPU (~10-30 s)."""
    pytest.importorskip("cuda.tile")
    try:
        from flashattn.aot import cuobjdump_path
        cuobjdump_path()
    except FileNotFoundError:
        pytest.skip("cuobjdump not installed")
    rc = record.main(["--out", str(tmp_path), "--part", "compile", "--quick"])
    assert rc == 0
    from flashbook.data import results
    r = results.load(tmp_path.name, root=tmp_path.parent)
    assert set(r.compile["arch"]) == {"sm_90", "sm_100"}
    assert (r.compile["step"] == "baseline").all()
    assert (r.compile["error"] == "").all()
    assert (r.compile["registers"] > 0).all()
    meta = r.compile_meta["sm_90"]
    assert meta["cuda_tile"] and meta["date"] and meta["command"].startswith(
        "python -m flashattn compile --arch sm_90")
    assert not list(tmp_path.rglob(".*tmp*")) and not list(tmp_path.rglob(".*aot*"))


# --- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_run_bench_tiny():
    doc = bench.run_bench(["baseline", "autotune"], [256], causal=True, batch=1, heads=2,
                          baselines=["cudnn", "flash"], reps=5, progress=False)
    json.loads(bench.dumps(doc))
    assert doc["meta"]["gpu"] and doc["meta"]["workload"]["name"] == "fp16-causal-d128"
    by = {r["impl"]: r for r in doc["rows"]}
    assert set(by) == {"baseline", "autotune", "sdpa_cudnn", "sdpa_flash"}
    for impl in ("baseline", "autotune"):
        r = by[impl]
        assert r["error"] is None, r["error"]
        assert r["tflops"] > 0 and r["median_ms"] > 0 and r["reps"] >= 5
        assert r["max_abs_err"] < 1e-2
        assert r["config"]
    assert by["autotune"]["speedup_prev"] is None          # its predecessor (remap) not run
    if by["sdpa_cudnn"]["error"] is None:
        from flashattn.stats import ratio_ci
        b, c = by["baseline"], by["sdpa_cudnn"]
        # Timed in the same rounds: the paired ratio (median over rounds of cuDNN / baseline),
        # close to the ratio of the medians, inside its interval.
        assert b["ratio_cudnn"] == pytest.approx(ratio_ci(c["samples_ms"], b["samples_ms"])[0])
        assert b["ratio_cudnn_lo"] <= b["ratio_cudnn"] <= b["ratio_cudnn_hi"]
        # Loose: the GPU suite runs tests in parallel on one GPU, so tiny kernels' medians move
        # by tens of percent; this only catches a ratio inverted or taken from the wrong rows.
        assert b["ratio_cudnn"] == pytest.approx(b["tflops"] / c["tflops"], rel=0.5)
        assert b["host_ms"] > 0
    df = to_frame(doc)
    assert len(df) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU")
def test_record_quick(tmp_path):
    rc = record.main(["--out", str(tmp_path), "--part", "bench", "--quick"])
    assert rc == 0
    rc = record.main(["--out", str(tmp_path), "--part", "bench-extra", "--quick",
                      "--workload", "fp16-causal-d128-gqa32x8"])
    assert rc == 0
    files = sorted(p.name for p in (tmp_path / "bench").glob("*.json"))
    assert files == ["fp16-causal-d128-gqa2x1-quick.json", "fp16-causal-d128-quick.json"]
    for f in (tmp_path / "bench").glob("*.json"):
        doc = json.loads(f.read_text())
        assert doc["meta"]["gpu"] and doc["rows"]
        assert all(math.isfinite(r["tflops"]) for r in doc["rows"] if not r["error"])
    from flashbook.data import results
    r = results.load(tmp_path.name, root=tmp_path.parent)
    assert not r.tflops_table("fp16-causal-d128-quick").empty


@pytest.fixture
def cpu_fakes(monkeypatch):
    """run_bench's GPU parts replaced by CPU fakes: the launch writes the fp32 reference, timing
    returns 1 ms. Returns the names ``autotune.resolve`` was asked for."""
    from flashattn import dispatch, launch
    from flashbook import steps
    from flashattn import timing
    resolved = []
    launches = {}      # name -> launches per sample that run_bench asked time_rounds for

    def fake_resolve(s, q, k, causal):
        resolved.append(s)
        if s == "large_tiles":
            raise RuntimeError("fake compile failure\nsecond line")
        return steps.get_step("pair" if s == "best" else s), steps.Config(64, 128, occupancy=2)

    def fake_launch(q, k, v, out, step, config, *, causal, scale, input_pos=0):
        out.copy_(bench.reference_output(q, k, v, causal=causal, scale=scale))
        return out

    def fake_check(fn, ref, hr, reps):        # bench._check without the CUDA events
        o = fn()
        d = o[:1, :hr].double() - ref
        return dict(max_abs_err=d.abs().max().item(),
                    rel_rms_err=(d.square().mean().sqrt() / ref.square().mean().sqrt()).item(),
                    reps=reps, est_ms=0.5)

    def fake_interleaved(fns, reps, **kw):
        for f in fns.values():
            f()
        return {n: timing.Timing(1.0, 1.0, 1.0, 1.0, 1.0, reps[n]) for n in fns}

    def fake_rounds(fns, *, rounds=30, inner=10, **kw):
        out = {}
        launches.update(inner if isinstance(inner, dict) else dict.fromkeys(fns, inner))
        for i, (n, f) in enumerate(fns.items()):
            for _ in range(3):
                f()                      # each call reads the next input set
            samples = [1.0 + 0.01 * ((r * 7 + i) % 5) for r in range(rounds)]
            t = timing.summarize(samples)
            out[n] = timing.Timing(t.median_ms, t.min_ms, t.max_ms, t.q1_ms, t.q3_ms,
                                   rounds * launches[n], samples=samples, ci_lo_ms=0.99,
                                   ci_hi_ms=1.03, method="graph")
        return out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 40, 1 << 40))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench, "_inputs", lambda B, Hq, Hkv, N, D, dt, dev, seed: (
        torch.randn(B, Hq, N, D), torch.randn(B, Hkv, N, D), torch.randn(B, Hkv, N, D)))
    monkeypatch.setattr(bench, "_check", fake_check)
    monkeypatch.setattr(timing, "time_interleaved", fake_interleaved)
    monkeypatch.setattr(timing, "time_rounds", fake_rounds)
    monkeypatch.setattr(timing, "host_time", lambda fn, **kw: 2.5)   # fn: flashattn.attention
    monkeypatch.setattr(dispatch, "device_arch", lambda device: "sm_90")
    from flashattn import autotune
    monkeypatch.setattr(autotune, "resolve", fake_resolve)
    monkeypatch.setattr(launch, "launch", fake_launch)
    return resolved


def test_run_bench_bookkeeping_on_cpu_with_fakes(cpu_fakes):
    """run_bench's loop, rows and derived columns, with the GPU parts replaced by CPU fakes."""
    from flashattn import timing
    doc = bench.run_bench(["naive", "baseline", "large_tiles", "best"], [32, 64], causal=True,
                          gqa="4:2", head_dim=16, batch=1, baselines=["math", "cudnn"], reps=3,
                          progress=True, naive_max_n=32, name="fake", method="interleaved")
    json.loads(bench.dumps(doc))
    assert doc["meta"]["workload"] == dict(name="fake", B=1, Hq=4, Hkv=2, D=16, dtype="float16",
                                           causal=True, seqlens=[32, 64])
    by = {(r["impl"], r["Nq"]): r for r in doc["rows"]}
    assert len(doc["rows"]) == 12 and all(set(r) == set(ROW_FIELDS) for r in doc["rows"])
    assert by["naive", 64]["error"] == bench.SKIP_NAIVE
    assert by["large_tiles", 32]["error"] == "RuntimeError: fake compile failure"
    assert by["sdpa_cudnn", 32]["error"]                    # no cuDNN attention on a CPU
    for key in (("naive", 32), ("baseline", 32), ("baseline", 64), ("best", 64),
                ("sdpa_math", 64)):
        r = by[key]
        assert r["error"] is None and r["max_abs_err"] < 1e-5, (key, r)
        assert r["tflops"] == pytest.approx(timing.tflops(
            timing.attention_flops(1, 4, key[1], key[1], 16, True), 1.0))
        assert r["kind"] == ("library" if key[0] == "sdpa_math" else "step")
    assert by["best", 32]["config"] == "pair: 64x128 occ=2"
    assert by["baseline", 32]["config"] == "64x128 occ=2" and by["sdpa_math", 32]["config"] == ""
    assert by["baseline", 32]["speedup_prev"] == pytest.approx(1.0)
    assert by["baseline", 64]["speedup_prev"] is None
    assert by["baseline", 32]["ratio_cudnn"] is None
    assert torch.is_grad_enabled()   # restored


def test_run_bench_variants_and_controls_on_cpu_with_fakes(cpu_fakes):
    """A control copy ("STEP#2") is resolved as its step and gets its own row; a variant
    ("STEP@config") runs pinned to its configuration, without resolving (no autotune)."""
    doc = bench.run_bench(["baseline", "baseline#2", "arch_tuned@128x128:occ=1:nww=8"], [32],
                          causal=True, head_dim=16, batch=1, heads=2, baselines=[], reps=3,
                          progress=False, method="interleaved")
    by = {r["impl"]: r for r in doc["rows"]}
    assert set(by) == {"baseline", "baseline#2", "arch_tuned@128x128:occ=1:nww=8"}
    assert all(r["error"] is None and r["max_abs_err"] < 1e-5 for r in by.values()), by
    assert by["baseline#2"]["config"] == by["baseline"]["config"] == "64x128 occ=2"
    assert by["arch_tuned@128x128:occ=1:nww=8"]["config"] == "128x128 occ=1 nww=8"
    assert cpu_fakes == ["baseline", "baseline"]       # the variant was not resolved


@pytest.mark.parametrize("name,step,pinned", [
    ("baseline", "baseline", None),
    ("baseline#3", "baseline", None),
    ("best", BEST_STEP["sm_90"], None),
    ("best#2", BEST_STEP["sm_90"], None),
    ("arch_tuned@128x128:occ=1:nww=8", "arch_tuned", Config(128, 128, 1, None, 8)),
    ("pair@64x64", "pair", Config(64, 64)),
    ("remap@256x128 occ=1#2", "remap", Config(256, 128, occupancy=1)),
])
def test_step_of(name, step, pinned):
    s, cfg = bench.step_of(name, "sm_90")
    assert s.name == step and cfg == pinned
    if pinned is not None:
        # with_config un-tunes the step: a variant never searches.
        assert not s.tuned and s.configs("sm_90") == [pinned] == s.configs("sm_100")


def test_run_bench_rounds_method_on_cpu_with_fakes(cpu_fakes):
    """The default method: per-round samples, their interval, the host time of a call, the
    fp64 check's relative RMS error, all in the row; the method in the document's meta."""
    doc = bench.run_bench(["baseline", "baseline#2"], [32], causal=False, head_dim=16, batch=1,
                          heads=2, baselines=["math"], rounds=6, inner=2, progress=False)
    json.loads(bench.dumps(doc))
    assert doc["meta"]["method"]["name"] == "rounds"
    assert (doc["meta"]["method"]["rounds"], doc["meta"]["method"]["inner"]) == (6, 2)
    by = {r["impl"]: r for r in doc["rows"]}
    assert set(by) == {"baseline", "baseline#2", "sdpa_math"}
    for r in by.values():
        assert r["error"] is None, r
        assert set(r) == set(ROW_FIELDS)
        assert r["method"] == "graph" and len(r["samples_ms"]) == 6
        assert 6 <= r["reps"] <= 12                      # 1 to `inner` launches per sample
        assert r["ci_lo_ms"] <= r["median_ms"] <= r["ci_hi_ms"]
        assert r["host_ms"] == 2.5
        assert r["max_abs_err"] < 1e-5 and r["rel_rms_err"] < 1e-5
    with pytest.raises(ValueError, match="method"):
        bench.run_bench(["baseline"], [32], method="events")


def test_add_derived_ratio_interval_from_samples():
    sh = dict(B=1, Hq=2, Hkv=2, D=64, dtype="float16", causal=True)
    rows = [make_row("sdpa_cudnn", "library", N=256, tflops=200.0, samples_ms=[1.0, 1.1, 0.9],
                     **sh),
            make_row("baseline", "step", N=256, tflops=100.0, samples_ms=[2.0, 2.2, 1.8], **sh),
            make_row("autotune", "step", N=256, tflops=150.0, **sh)]
    by = {r["impl"]: r for r in add_derived(rows)}
    b = by["baseline"]
    assert b["ratio_cudnn"] == pytest.approx(0.5)
    assert b["ratio_cudnn_lo"] <= 0.5 <= b["ratio_cudnn_hi"]
    assert by["autotune"]["ratio_cudnn"] == pytest.approx(0.75)
    assert by["autotune"]["ratio_cudnn_lo"] is None            # no samples, no interval


def test_a_control_copy_gets_its_twins_batch_size(cpu_fakes, monkeypatch):
    """Each batch starts after an L2 flush: a control timed with another batch size than its
    twin would read a systematic gap. bench gives "X#2" the launches per sample of "X"."""
    import itertools

    from flashattn import timing
    est = itertools.cycle([0.5, 30.0])          # the twin estimates fast, the copy slow
    real_check = bench._check
    monkeypatch.setattr(bench, "_check", lambda fn, ref, hr, reps: dict(
        real_check(fn, ref, hr, reps), est_ms=next(est)))
    seen = {}
    real_rounds = timing.time_rounds
    def spy(fns, *, inner, **kw):
        seen.update(inner)
        return real_rounds(fns, inner=inner, **kw)
    monkeypatch.setattr(timing, "time_rounds", spy)
    bench.run_bench(["baseline", "baseline#2"], [32], batch=1, heads=2, baselines=[],
                    rounds=4, inner=8, progress=False)
    assert seen["baseline#2"] == seen["baseline"], seen


# --- the backward (issue 11): bench --backward ---------------------------------------------------
from flashbook.measure import bench_bwd  # noqa: E402


def test_backward_parse_defaults_are_the_seed_workload():
    kw = bench_bwd.parse_args(["--backward"])
    assert kw["seqlens"] == [1024, 2048, 4096, 8192, 16384]
    assert (kw["batch"], kw["heads"], kw["head_dim"], kw["dtype"], kw["causal"]) == \
        (4, 32, 128, "float16", True)
    assert kw["baselines"] == ["flash", "cudnn", "efficient", "flex"]
    assert kw["passes"] == ["bwd", "fwd_bwd", "fwd"] and kw["fwd_step"] == "best"
    kw = bench_bwd.parse_args(["--backward", "--no-causal", "--dtype", "bfloat16", "--seqlens",
                               "1024,16384", "--baselines", "cudnn,flash", "--passes", "bwd",
                               "--fwd-step", "warp_groups", "--gqa", "32:8", "--rounds", "5"])
    assert kw["causal"] is False and kw["dtype"] == "bfloat16" and kw["seqlens"] == [1024, 16384]
    assert kw["baselines"] == ["cudnn", "flash"] and kw["passes"] == ["bwd"]
    assert kw["gqa"] == (32, 8) and kw["fwd_step"] == "warp_groups" and kw["rounds"] == 5
    assert bench_bwd.parse_args(["--backward", "--baselines", "none"])["baselines"] == []


@pytest.mark.parametrize("bad", [
    ["--passes", "forward"], ["--passes", ""], ["--baselines", "math"], ["--seqlens", "0"],
    ["--seqlens", "1k"], ["--fwd-step", "naive"], ["--fwd-step", "nope"], ["--steps", "baseline"],
    ["--method", "interleaved"], ["--gqa", "32:5"], ["--rounds", "0"], ["--dtype", "float32"],
])
def test_backward_parse_errors(bad, capsys):
    with pytest.raises(SystemExit):
        bench_bwd.parse_args(["--backward", *bad])
    assert "error" in capsys.readouterr().err


def test_backward_options_need_backward(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--passes", "bwd"])             # the forward bench does not take them
    with pytest.raises(SystemExit):
        parse_args(["--backward"])                  # main() hands --backward to bench_bwd
    assert bench.main(["--backward", "--seqlens", "256", "--quiet"]) == 1   # no GPU here
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_backward_flops_convention():
    f = bench.attention_flops(4, 32, 4096, 4096, 128, True)
    assert bench_bwd.backward_flops(4, 32, 4096, 128, True) == 2.5 * f
    assert bench_bwd.backward_flops(4, 32, 4096, 128, True, "fwd_bwd") == 3.5 * f
    assert bench_bwd.backward_flops(1, 1, 64, 64, False) == 2.5 * 4 * 64 * 64 * 64
    assert bench_bwd.backward_flops(4, 32, 4096, 128, True, "fwd") == f
    with pytest.raises(ValueError, match="pass"):
        bench_bwd.backward_flops(1, 1, 64, 64, False, "forward")


def test_backward_run_validates_before_the_gpu():
    with pytest.raises(ValueError, match="baseline"):
        bench_bwd.run_bench_backward([256], baselines=["math"])
    with pytest.raises(ValueError, match="passes"):
        bench_bwd.run_bench_backward([256], passes=["forward"])
    with pytest.raises(ValueError, match="seqlens"):
        bench_bwd.run_bench_backward([0])
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        bench_bwd.run_bench_backward([256])


def test_ref_group_and_grad_errs():
    assert bench_bwd.ref_group(32, 32, 16384) == (1, 1)
    assert bench_bwd.ref_group(32, 8, 1024) == (4, 1)           # the whole group fits
    assert bench_bwd.ref_group(32, 1, 16384)[0] < 32            # MQA at 16K: part of it
    g = [torch.zeros(1, 4, 3, 2), torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2)]
    ref = [torch.zeros(1, 4, 3, 2, dtype=torch.float64), torch.ones(1, 1, 3, 2).double(),
           torch.zeros(1, 1, 3, 2, dtype=torch.float64)]
    assert bench_bwd._grad_errs(g, ref, 4, False) == dict(dq=0.0, dk=1.0, dv=0.0)
    assert bench_bwd._grad_errs(g, ref, 4, True) == dict(dq=0.0)   # dK, dV need the group


def _math_attention(q, k, v, causal, scale):
    """Differentiable CPU attention (GQA by repetition): the fakes' forward."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v


@pytest.fixture
def bwd_fakes(monkeypatch):
    """run_bench_backward's GPU parts replaced by CPU fakes: every implementation is autograd
    through fp32 math attention (ours: its backward from the reference), timing fakes rounds."""
    from flashattn import api, autograd, autotune, dispatch, launch, launch_bwd
    from flashbook import steps
    from flashattn import reference as R
    from flashattn import timing
    seen = dict(rounds=[], backward=0)

    def fake_lib(impl, q, k, v, *, causal, scale):
        from flashbook.impls import IMPLS
        assert IMPLS[impl].kind == "library", impl      # the real one: KeyError for ours
        if impl == "sdpa_efficient":
            raise RuntimeError("fake: no kernel for this shape\nmore")
        return (lambda: _math_attention(q, k, v, causal, scale)), __import__("contextlib").nullcontext

    def fake_fwd(q, k, v, step="best", *, causal, scale, input_pos=0):
        return _math_attention(q, k, v, causal, scale)

    def fake_forward_lse(q, k, v, *, causal, scale, step="best", input_pos=0):
        return (_math_attention(q, k, v, causal, scale),
                R.attention_lse(q, k, causal=causal, scale=scale))

    def fake_backward(q, k, v, out, dout, lse, *, causal, scale, grads, input_pos=0,
                      deterministic=True):
        seen["backward"] += 1
        seen.setdefault("deterministic", set()).add(deterministic)
        for g, r in zip(grads, R.attention_backward(q, k, v, dout, causal=causal, scale=scale)):
            g.copy_(r)
        return grads

    def fake_check(fn, ref, hq, partial, ref_out=None):
        res = fn()
        errs = bench_bwd._out_errs(res, ref_out, hq) if ref_out is not None else \
            bench_bwd._grad_errs(res, ref, hq, partial)
        return dict(grad_errs=errs, max_abs_err=max(errs.values()), est_ms=2.0)

    def fake_rounds(fns, *, rounds=30, inner=10, **kw):
        seen["rounds"].append((sorted(fns), dict(inner)))
        out = {}
        for i, (n, f) in enumerate(sorted(fns.items())):
            for _ in range(3):
                f()
            samples = [1.0 + 0.1 * i + 0.01 * (r % 3) for r in range(rounds)]
            t = timing.summarize(samples)
            out[n] = timing.Timing(t.median_ms, t.min_ms, t.max_ms, t.q1_ms, t.q3_ms,
                                   rounds * inner[n], samples=samples, ci_lo_ms=t.median_ms * .99,
                                   ci_hi_ms=t.median_ms * 1.01, method="graph")
        return out

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(bench_bwd, "_inputs", lambda B, Hq, Hkv, N, D, dt, dev, seed: (
        torch.randn(B, Hq, N, D), torch.randn(B, Hkv, N, D), torch.randn(B, Hkv, N, D),
        torch.randn(B, Hq, N, D)))
    from flashbook.measure import libraries
    monkeypatch.setattr(libraries, "library_fn", fake_lib)
    monkeypatch.setattr(api, "run_step", fake_fwd)
    monkeypatch.setattr(autograd, "attention_forward", fake_forward_lse)
    monkeypatch.setattr(launch_bwd, "attention_backward", fake_backward)
    monkeypatch.setattr(bench_bwd, "_check_once", fake_check)
    monkeypatch.setattr(timing, "time_rounds", fake_rounds)
    monkeypatch.setattr(dispatch, "device_arch", lambda device: "sm_90")
    monkeypatch.setattr(autotune, "resolve", lambda s, q, k, causal: (
        steps.get_step("warp_groups"), Config(128, 128, occupancy=1, num_worker_warps=8)))
    return seen


@pytest.mark.parametrize("causal", [True, False])
def test_run_bench_backward_document_on_cpu_with_fakes(bwd_fakes, causal):
    doc = bench_bwd.run_bench_backward([16, 32], causal=causal, batch=1, heads=4, gqa=(4, 2),
                                       head_dim=16, baselines=["cudnn", "flash", "efficient"],
                                       rounds=6, progress=True, name="fake-bwd")
    wl = doc["meta"]["workload"]
    assert wl == dict(name="fake-bwd", B=1, Hq=4, Hkv=2, D=16, dtype="float16", causal=causal,
                      seqlens=[16, 32], passes=["bwd", "fwd_bwd", "fwd"], fwd_step="best")
    assert "2.5" in doc["meta"]["flops"] and doc["meta"]["method"]["name"] == "rounds"
    rows = doc["rows"]
    assert len(rows) == 2 * (5 + 4 + 5)                # N x (impls of bwd, fwd_bwd, fwd)
    by = {(r["impl"], r["pass"], r["Nq"]): r for r in rows}
    for n in (16, 32):
        # Pass fwd: the forward alone, ours with and without the LSE, checked on its output.
        for impl in ("fmha_fwd", "fmha_fwd_lse", "sdpa_cudnn", "sdpa_flash"):
            r = by[impl, "fwd", n]
            assert not r["error"] and set(r["grad_errs"]) == {"out"}
            assert r["max_abs_err"] < 1e-4
            assert r["tflops"] == pytest.approx(bench.attention_flops(1, 4, n, n, 16, causal)
                                                / (r["median_ms"] * 1e-3) / 1e12)
        lse_row = by["fmha_fwd_lse", "fwd", n]
        assert lse_row["ratio_no_lse_lo"] <= lse_row["ratio_no_lse"] <= lse_row["ratio_no_lse_hi"]
        assert lse_row["config"] == "warp_groups 128x128 occ=1 nww=8"
        assert by["sdpa_efficient", "fwd", n]["error"].startswith("RuntimeError: fake")
        for p in ("bwd", "fwd_bwd"):
            bad = by["sdpa_efficient", p, n]
            assert bad["error"] == "RuntimeError: fake: no kernel for this shape"
            ours = ("fmha_bwd", "fmha_bwd_atomic") if p == "bwd" else ("fmha_bwd",)
            for impl in (*ours, "sdpa_cudnn", "sdpa_flash"):
                r = by[impl, p, n]
                assert not r["error"], r["error"]
                assert set(ROW_FIELDS) <= set(r)
                assert r["kind"] == ("step" if impl in ours else "library")
                flops = bench_bwd.backward_flops(1, 4, n, 16, causal, p)
                assert r["tflops"] == pytest.approx(flops / (r["median_ms"] * 1e-3) / 1e12)
                assert set(r["grad_errs"]) == {"dq", "dk", "dv"}
                assert r["max_abs_err"] < 1e-4           # every fake computes exact gradients
                assert len(r["samples_ms"]) == 6
                # Each pass's ratio to cuDNN, paired by round, within the same pass only.
                assert r["ratio_cudnn"] is not None
                if impl == "sdpa_cudnn":
                    assert r["ratio_cudnn"] == pytest.approx(1.0)
                assert r["ratio_fa2_lo"] <= r["ratio_fa2"] <= r["ratio_fa2_hi"]
                if impl == "sdpa_flash":
                    assert r["ratio_fa2"] == pytest.approx(1.0)
    assert by["fmha_bwd", "bwd", 16]["config"] == "dkdv 64x128 nww=8, dq 128x64 nww=8"
    assert by["fmha_bwd_atomic", "bwd", 16]["config"] == "dkdv+dq atomic 64x128 nww=8"
    assert ("fmha_bwd_atomic", "fwd_bwd", 16) not in by    # the variant: backward pass only
    assert bwd_fakes["deterministic"] == {True, False}
    assert by["fmha_bwd", "fwd_bwd", 16]["config"].startswith("fwd warp_groups 128x128")
    # One time_rounds per N, every (impl, pass) that did not fail, in alternation.
    names, inner = bwd_fakes["rounds"][0]
    assert names == sorted([f"{i}|{p}" for i in ("fmha_bwd", "sdpa_cudnn", "sdpa_flash")
                            for p in ("bwd", "fwd_bwd")] + ["fmha_bwd_atomic|bwd"] +
                           [f"{i}|fwd" for i in ("fmha_fwd", "fmha_fwd_lse", "sdpa_cudnn",
                                                  "sdpa_flash")])
    assert set(inner.values()) == {2}                  # 5 ms samples of 2 ms calls
    assert bwd_fakes["backward"] > 0                   # ours: attention_backward, not autograd
    # The document round-trips through the schema's reader and writer.
    df = to_frame(doc)
    assert set(df["pass"]) == {"bwd", "fwd_bwd", "fwd"} and len(df) == len(rows)
    json.loads(schema.dumps(doc))
    table = bench_bwd.format_backward_table(doc)
    assert "pass bwd (2.5 x forward FLOPs)" in table and "pass fwd_bwd (3.5" in table
    assert "fmha_bwd" in table and "err" in table
    assert "pass fwd (1.0 x" in table and "writing the LSE" in table


def test_run_bench_backward_one_pass_no_baselines(bwd_fakes):
    doc = bench_bwd.run_bench_backward([16], batch=1, heads=2, head_dim=16, baselines="none",
                                       passes="bwd", rounds=3, progress=False)
    assert [(r["impl"], r["pass"]) for r in doc["rows"]] == [("fmha_bwd", "bwd"),
                                                             ("fmha_bwd_atomic", "bwd")]
    assert doc["rows"][0]["ratio_cudnn"] is None


def test_record_backward_part_quick_with_fakes(bwd_fakes, tmp_path, monkeypatch):
    monkeypatch.setattr(env, "metadata", env.metadata)
    files = record.record_bench_backward(tmp_path, quick=True)
    assert [f.name for f in files] == ["fp16-causal-d128-gqa2x2-bwd-quick.json".replace(
        "-gqa2x2", ""), "fp16-full-d128-bwd-quick.json"]
    for f in files:
        doc = json.loads(f.read_text())
        assert {r["pass"] for r in doc["rows"]} == {"bwd", "fwd_bwd", "fwd"}
        assert {r["impl"] for r in doc["rows"]} == {"fmha_bwd", "fmha_bwd_atomic", "fmha_fwd",
                                                    "fmha_fwd_lse",
                                                    "sdpa_cudnn"}
    assert "bench-backward" in record.PARTS and "bench-backward-bf16" in record.PARTS
    assert record.main(["--out", str(tmp_path), "--part", "bench-backward-bf16", "--quick"]) == 0
    assert (tmp_path / "bench-backward" / "bf16-causal-d128-bwd-quick.json").exists()


def test_batch_sizes_share_one_batch_near_the_fastest():
    from flashbook.measure.bench import SAMPLE_MS, batch_sizes
    est = {"best": 1.0, "best#2": 1.05, "arch_tuned": 1.2, "sdpa_cudnn": 0.95, "slow": 40.0}
    per = batch_sizes(est, inner=10)
    common = round(SAMPLE_MS / 0.95)
    assert per["best"] == per["arch_tuned"] == per["sdpa_cudnn"] == common
    assert per["best#2"] == per["best"]                  # a control copy gets its twin's
    assert per["slow"] == 1                              # a slow row: about SAMPLE_MS of its own
    assert batch_sizes({}, inner=10) == {}
    assert batch_sizes({"a": 1e-9}, inner=10) == {"a": 10}   # capped at inner
