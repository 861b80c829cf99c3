"""flashbook.measure.bench_flex on CPU (tiny shapes, the interpreter, eager torch flex, fake
timing): the GPU benchmark's plumbing (forward, backward, bf16, BLASST) works and writes its JSON;
the BLASST skip count it reports is the kernel's own (checked against the interpreter's trace);
`record`'s flex/blasst/fp8/profile parts call it with the recorded arguments. No GPU."""
import json
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from flashattn import interpret, mods
from flashattn.flex import flex_attention
from flashbook.measure import bench_flex, record, target

warnings.filterwarnings("ignore", message=".*flex_attention.*")


def test_dry_run_quick(tmp_path):
    assert bench_flex.main(["--dry-run", "--quick", "--n", "128", "--rounds", "1",
                            "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "flex_bench.json").read_text())
    assert [r["workload"] for r in d["rows"]] == ["causal", "sliding_window_1K", "document_8",
                                                  "softcap_50"]
    for r in d["rows"]:
        assert not r["errors"], r["errors"]
        assert r["pass"] == "fwd" and r["dtype"] == "float16"
        assert {"flashattn.flex", "flashattn.flex#2", "torch.flex"} <= set(r["impls"])
        assert r["impls"]["torch.flex"]["max_diff_vs_ours"] < 5e-3
        assert r["impls"]["flashattn.flex#2"]["max_diff_vs_ours"] == 0.0
    assert "dry run" in d["meta"]["device"]


def test_dry_run_backward_bf16(tmp_path):
    assert bench_flex.main(["--dry-run", "--quick", "--n", "128", "--rounds", "1",
                            "--pass", "bwd", "--dtype", "bfloat16", "--name", "b.json",
                            "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "b.json").read_text())
    assert d["meta"]["passes"] == ["bwd"] and d["meta"]["dtypes"] == ["bfloat16"]
    for r in d["rows"]:
        assert not r["errors"], r["errors"]
        assert r["pass"] == "bwd" and r["dtype"] == "bfloat16"
        # the backward counts 2.5x the forward's FLOPs over the visited blocks
        assert r["visited_flops"] == 2.5 * 4 * r["B"] * r["H"] * r["D"] * r["blocks"] * 64 * 64
        assert r["impls"]["flashattn.flex#2"]["max_diff_vs_ours"] == 0.0
        assert r["impls"]["flashattn.flex"]["median_ms"] > 0


def _interpreted_skips(q, k, v, T, bm, tm, tn):
    with interpret.enabled(), interpret.trace() as tr:
        flex_attention(q, k, v, block_mask=bm, blasst_threshold=T,
                       kernel_options={"BLOCK_M": tm, "BLOCK_N": tn})
    kl, vl = sum(tr.loads("K").values()), sum(tr.loads("V").values())
    return kl, kl - vl


@pytest.mark.parametrize("kind", bench_flex.BLASST_KINDS)
@pytest.mark.parametrize("causal", [False, True])
def test_blasst_skipped_is_the_kernels_count(kind, causal):
    N = 256
    q, k, v = bench_flex.blasst_inputs(kind, 1, 2, N, 32, dtype=torch.float16, device="cpu")
    bm = (create_block_mask(mods.causal(), None, None, N, N, device="cpu", BLOCK_SIZE=64)
          if causal else None)
    for T in (8.0, 2.0):
        visited, skipped = _interpreted_skips(q, k, v, T, bm, 32, 16)
        got = bench_flex.blasst_skipped(q, k, T, bm, tile_m=32, tile_n=16)
        assert (got["visited"], got["skipped"]) == (visited, skipped), (kind, causal, T)


def test_blasst_skipped_can_disagree():
    """The replay is not a constant: the sink inputs skip most tiles, the random ones none."""
    q, k, _ = bench_flex.blasst_inputs("sink", 1, 1, 256, 32, dtype=torch.float16, device="cpu")
    assert bench_flex.blasst_skipped(q, k, 8.0, tile_m=32, tile_n=16)["fraction"] > 0.5
    q, k, _ = bench_flex.blasst_inputs("random", 1, 1, 256, 32, dtype=torch.float16,
                                       device="cpu")
    assert bench_flex.blasst_skipped(q, k, 8.0, tile_m=32, tile_n=16)["fraction"] == 0.0
    with pytest.raises(ValueError, match="kind"):
        bench_flex.blasst_inputs("flat", 1, 1, 16, 16, dtype=torch.float16, device="cpu")


def test_dry_run_blasst(tmp_path):
    assert bench_flex.main(["--dry-run", "--quick", "--blasst", "--n", "128", "--rounds", "1",
                            "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "blasst_bench.json").read_text())
    rows = d["rows"]
    assert {r["impl"] for r in rows} == {"off", "off#2", "T=16", "T=8"}
    assert {r["causal"] for r in rows} == {False, True}
    for r in rows:
        assert 0.0 <= r["skipped_fraction"] <= 1.0 and r["median_ms"] > 0
        if r["impl"].startswith("off"):
            assert r["skipped_fraction"] == 0.0 and r["max_diff_vs_off"] == 0.0


def test_record_parts_call_the_benchmarks(monkeypatch, tmp_path):
    assert {"flex", "flex-backward", "blasst", "fp8", "profile-flex-fp8"} <= set(record.PARTS)
    calls = []
    monkeypatch.setattr(bench_flex, "main", lambda args: calls.append(args) or 0)
    from flashbook.measure import bench_fp8, ncu
    monkeypatch.setattr(bench_fp8, "main", lambda args: calls.append(args) or 0)
    monkeypatch.setattr(ncu, "record_profiles",
                        lambda out, steps, N, causal, **kw: calls.append((out, steps, N)) or out)
    assert record.record_flex(tmp_path)[0] == tmp_path / "flex" / "flex_bench.json"
    assert record.record_flex(tmp_path, passes=("bwd",), dtypes=("float16",))[0].name == \
        "flex_bench_backward.json"
    assert record.record_flex(tmp_path, passes=("bwd",), dtypes=("bfloat16",))[0].name == \
        "flex_bench_backward_bf16.json"
    record.record_blasst(tmp_path)
    record.record_fp8(tmp_path)
    record.record_profile_flex_fp8(tmp_path)
    fwd, bwd, bwd16, bl, fp8, prof = calls
    assert fwd[fwd.index("--pass") + 1] == "fwd" and bwd[bwd.index("--pass") + 1] == "bwd"
    dtypes = (lambda args: [args[i + 1] for i, x in enumerate(args) if x == "--dtype"])
    assert dtypes(fwd) == ["float16", "bfloat16"]
    assert dtypes(bwd) == ["float16"] and dtypes(bwd16) == ["bfloat16"]
    assert bwd16[bwd16.index("--name") + 1] == "flex_bench_backward_bf16.json"
    assert "--blasst" in bl
    assert [fp8[i + 1] for i, x in enumerate(fp8) if x == "--d"] == ["64", "128", "256"]
    assert prof[1] == target.FLEX_FP8_TARGETS and prof[2] == 8192


def test_record_refuses_flex_parts_without_gpu(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert record.main(["--part", "flex", "--out", "/nonexistent"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_profile_targets_run_on_cpu_in_the_interpreter():
    """What `profile-flex-fp8` launches under ncu, run here through the interpreter."""
    q, k, v = (torch.randn(1, 2, 256, 64).half() for _ in range(3))
    with interpret.enabled():
        outs = {n: target._flex_go(n, q, k, v)() for n in ("flex_causal", "flex_window1k",
                                                            "flex_softcap")}
        o8 = target._fp8_go(q, k, v, causal=True)()
    assert all(o.shape == q.shape for o in outs.values()) and o8.shape == q.shape
    assert (outs["flex_causal"] - outs["flex_softcap"]).abs().max() > 0
    assert (o8.float() - outs["flex_causal"].float()).abs().max() < 0.25   # e4m3: 3 mantissa bits


def test_gpu_timers_go_through_the_shared_harness(monkeypatch):
    """On a GPU both benches time with harness.time_in_rounds (faked here): the launches per
    sample come from one call's estimate, and a timing failure is an error, not a row."""
    from flashattn.timing import Timing
    from flashbook.measure import bench_fp8, harness
    seen = {}
    monkeypatch.setattr(harness, "check_once", lambda f, errors, ctx=None: {"est_ms": 0.25})

    def fake_rounds(calls, *, rounds, inner, seed):
        seen.update(inner)
        return {n: Timing(1.0, 0.9, 1.1, 0.95, 1.05, rounds, samples=[1.0] * rounds,
                          ci_lo_ms=0.98, ci_hi_ms=1.02, method="graph") for n in calls}, ""
    monkeypatch.setattr(harness, "time_in_rounds", fake_rounds)
    res = bench_flex._timer(False)({"a": lambda: None}, rounds=3)
    assert res["a"]["median_ms"] == 1.0 and res["a"]["method"] == "graph" and seen["a"] == 5
    res = bench_fp8.Timer(torch.device("cuda")).rounds({"b": lambda: None}, 4)
    assert res["b"]["ci_hi_ms"] == 1.02 and res["b"]["inner"] == seen["b"]
    monkeypatch.setattr(harness, "time_in_rounds", lambda calls, **kw: ({}, "RuntimeError: x"))
    with pytest.raises(RuntimeError, match="timing failed"):
        bench_flex._timer(False)({"a": lambda: None})
