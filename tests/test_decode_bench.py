"""flashbook.measure.bench_decode (python -m flashbook decode-bench) on the CPU: the command
line, the sweep as data and its time estimate, the document's rows (schema.make_decode_row,
add_decode_derived, decode_frame, format_decode_table), and run_decode_bench's bookkeeping with
the GPU parts replaced by CPU fakes (as tests/test_bench.py does for bench)."""
import json
import math

import pytest

torch = pytest.importorskip("torch")

from flashbook.data import schema  # noqa: E402
from flashbook.data.schema import (DECODE_FIELDS, ROW_FIELDS, add_decode_derived,  # noqa: E402
                                   decode_frame, format_decode_table, kv_bytes, make_decode_row)
from flashbook.measure import bench_decode as bd  # noqa: E402


# --- command line ------------------------------------------------------------------------------
def test_parse_defaults():
    a = bd.parse_args([])
    assert a["parts"] == ["decode", "host"]
    assert a["batches"] == [1, 8, 64] and a["cache_lens"] == [1024, 4096, 16384, 32768, 131072]
    assert a["nqs"] == [1, 4] and a["gqa"] == (32, 8) and a["head_dim"] == 128
    assert a["dtype"] == "float16" and a["page_sizes"] == [16, 64] and a["impls"] is None
    assert (a["rounds"], a["inner"], a["flex"]) == (15, 10, "default")
    assert a["_plan"] is False and a["_out"] is None and a["_json"] is False


def test_parse_options():
    a = bd.parse_args(["--part", "crossover,varlen", "--batches", "2", "--cache-lens",
                       "512, 2048", "--nq", "1,16", "--gqa", "8:1", "--head-dim", "64",
                       "--dtype", "bfloat16", "--page-sizes", "none", "--impls",
                       "decode,decode_paged128,sdpa_math", "--flex", "none", "--rounds", "4",
                       "--inner", "2", "--varlen-mixes", "equal_4x1024,skewed",
                       "--varlen-total", "4096", "--out", "x.json", "--quiet", "--plan"])
    assert a["parts"] == ["crossover", "varlen"] and a["batches"] == [2]
    assert a["cache_lens"] == [512, 2048] and a["nqs"] == [1, 16] and a["gqa"] == (8, 1)
    assert a["page_sizes"] == [] and a["impls"] == ["decode", "decode_paged128", "sdpa_math"]
    assert a["varlen_mixes"] == ["equal_4x1024", "skewed"] and a["varlen_total"] == 4096
    assert a["progress"] is False and a["_plan"] and a["_out"] == "x.json"


@pytest.mark.parametrize("bad", [["--part", "prefill"], ["--nq", "17"], ["--nq", "0"],
                                 ["--cache-lens", "1k"], ["--page-sizes", "24"],
                                 ["--impls", "decode_paged24"], ["--impls", "fa3"],
                                 ["--gqa", "32:5"], ["--head-dim", "512"], ["--flex", "some"],
                                 ["--varlen-mixes", "equal_3x1000"], ["--rounds", "1"],
                                 ["--dtype", "float32"], ["--part", ""]])
def test_parse_errors(bad, capsys):
    with pytest.raises(SystemExit):
        bd.parse_args(bad)


def test_plan_flag_prints_the_sweep_without_a_gpu(capsys):
    assert bd.main(["--plan"]) == 0
    out = capsys.readouterr().out
    assert "decode: 28 shapes" in out and "host: 1 shapes" in out
    assert "B=64 Nk=131072" not in out and "B=8 Nk=131072 Nq=4" in out
    assert "estimated time on an H200" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answer")
def test_main_without_a_gpu_says_so(capsys):
    assert bd.main(["--part", "host"]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err


# --- the sweep as data -------------------------------------------------------------------------
def test_default_decode_plan():
    plan = bd.plan_decode()
    shapes = {(s["B"], s["Nk"], s["Nq"]) for s in plan}
    assert len(plan) == 28
    assert (64, 131072, 1) not in shapes and (64, 32768, 4) in shapes   # B x Nk cap
    assert (1, 131072, 4) in shapes and (8, 1024, 1) in shapes
    for s in plan:
        assert s["impls"] == bd.default_impls()
        flex = (s["B"], s["Nk"], s["Nq"]) in bd.FLEX_SHAPES
        assert ("flex" in s["skip"]) is not flex
        assert all(v.startswith(schema.SKIPPED) for v in s["skip"].values())


def test_plan_skips_pages_that_do_not_divide_the_cache():
    (s,) = bd.plan_decode([1], [1000], [1], ["decode", "decode_paged16", "decode_paged64"],
                          flex="none")
    assert set(s["skip"]) == {"decode_paged16", "decode_paged64"}       # 1000 = 62.5 x 16
    (s,) = bd.plan_decode([1], [1008], [1], ["decode", "decode_paged16", "decode_paged64"])
    assert set(s["skip"]) == {"decode_paged64"}               # 1008 = 63 x 16
    assert bd.plan_decode([1], [4096], [1], ["flex"], flex="all")[0]["skip"] == {}
    with pytest.raises(ValueError, match="flex must be"):
        bd.plan_decode(flex="sometimes")
    with pytest.raises(ValueError, match="1 <= Nq <= 16"):
        bd.plan_decode([1], [1024], [17])
    with pytest.raises(ValueError, match="unknown decode implementation"):
        bd.plan_decode(impls=["decode", "vllm"])


def test_page_size_must_divide_for_paged_impls():
    (s,) = bd.plan_decode([1], [1000], [1], ["decode_paged16"], flex="none")
    assert "decode_paged16" in s["skip"] and "does not divide" in s["skip"]["decode_paged16"]


def test_crossover_host_and_varlen_plans():
    cross = bd.plan_crossover()
    assert {s["Nq"] for s in cross} == {1, 4, 16} and min(s["Nk"] for s in cross) == 128
    assert all(s["impls"] == ["decode", "square_best"] and s["B"] == 8 for s in cross)
    (h,) = bd.plan_host()
    assert (h["B"], h["Nk"], h["Nq"]) == (8, 32768, 1) and "decode_paged64" in h["impls"]
    for s in bd.plan_varlen():
        assert sum(s["lens"]) == bd.VARLEN_TOTAL and s["B"] == len(s["lens"])
        assert s["Nq"] == max(s["lens"]) and s["impls"] == ["varlen", "square_padded"]


@pytest.mark.parametrize("name", bd.VARLEN_MIXES)
def test_varlen_mixes_sum_to_the_total(name):
    lens = bd.varlen_mix(name)
    assert sum(lens) == bd.VARLEN_TOTAL and min(lens) >= 1 and max(lens) <= 8192
    assert bd.varlen_mix(name) == lens                        # seeded


def test_varlen_mix_errors():
    with pytest.raises(ValueError, match="!= total"):
        bd.varlen_mix("equal_3x1000")
    with pytest.raises(ValueError, match="unknown varlen mix"):
        bd.varlen_mix("bimodal")
    assert max(bd.varlen_mix("uniform_1_4096", 5000)) <= 4096


def test_the_default_sweep_is_estimated_under_eight_minutes():
    plans = bd._plans(list(bd.DEFAULT_PARTS), batches=bd.DEFAULT_BATCHES,
                      cache_lens=bd.DEFAULT_CACHE_LENS, nqs=bd.DEFAULT_NQ,
                      impls=bd.default_impls(), flex="default",
                      max_cache_tokens=bd.MAX_CACHE_TOKENS, varlen_mixes=bd.VARLEN_MIXES,
                      varlen_total=bd.VARLEN_TOTAL)
    est = bd.estimate_seconds(plans)
    assert 240 < est < 8 * 60, est
    # Each other part alone stays far under the 10-minute limit of one command.
    for part in ("crossover", "varlen"):
        p = bd._plans([part], batches=(), cache_lens=(), nqs=(), impls=(), flex="none",
                      max_cache_tokens=0, varlen_mixes=bd.VARLEN_MIXES,
                      varlen_total=bd.VARLEN_TOTAL)
        assert bd.estimate_seconds(p) < 5 * 60
    # More rounds, more time.
    assert bd.estimate_seconds(plans, rounds=30) > est


def test_input_sets():
    l2 = 50 << 20
    assert bd.input_sets_for(4 << 20, inner=10, l2_bytes=l2, free_bytes=100 << 30) == 10
    assert bd.input_sets_for(200 << 20, inner=10, l2_bytes=l2, free_bytes=100 << 30) == 1
    assert bd.input_sets_for(150 << 20, inner=10, l2_bytes=l2, free_bytes=100 << 30) == 10
    assert bd.input_sets_for(4 << 20, inner=10, l2_bytes=l2, free_bytes=20 << 20) == 3
    assert bd.input_sets_for(30 << 30, inner=10, l2_bytes=l2, free_bytes=40 << 30) == 0


def test_hbm_peaks_have_sources():
    assert bd.H200_HBM_PEAK_TBPS == 4.8
    assert bd.hbm_peak("NVIDIA H200")[0] == 4.8 and "datasheet" in bd.hbm_peak("NVIDIA H200")[1]
    assert bd.hbm_peak("NVIDIA H200 NVL")[0] == 4.8
    assert bd.hbm_peak("NVIDIA GeForce RTX 5090") == (None, None)
    for tbps, source in bd.HBM_PEAK_TBPS.values():
        assert tbps > 1 and source


# --- rows ----------------------------------------------------------------------------------------
SH = dict(B=8, Hq=32, Hkv=8, Nq=1, Nk=32768, D=128, dtype="float16")


def test_kv_bytes():
    assert kv_bytes(8, 8, 32768, 128) == 2 * 8 * 8 * 32768 * 128 * 2 == 1 << 30
    assert kv_bytes(1, 1, 10, 64, 4) == 2 * 10 * 64 * 4


def test_make_decode_row_has_every_field():
    r = make_decode_row("decode", "flashattn", part="decode", median_ms=0.5, **SH)
    assert tuple(r) == ROW_FIELDS + DECODE_FIELDS
    assert (r["Nq"], r["Nk"], r["part"], r["tflops"], r["causal"]) == (1, 32768, "decode", None,
                                                                       True)


def test_derived_bandwidth_fraction_and_ratio():
    kv = kv_bytes(8, 8, 32768, 128)
    rows = [make_decode_row("decode", "flashattn", part="decode", median_ms=0.25, kv_bytes=kv,
                            **SH),
            make_decode_row("sdpa_flash", "library", part="decode", median_ms=0.5, kv_bytes=kv,
                            **SH),
            make_decode_row("sdpa_math", "library", part="decode", median_ms=2.0, kv_bytes=kv,
                            **SH),
            make_decode_row("sdpa_cudnn", "library", part="decode", error="RuntimeError: no",
                            **SH),
            make_decode_row("decode", "flashattn", part="decode", median_ms=1.0, kv_bytes=kv,
                            **dict(SH, Nk=65536))]
    by = add_decode_derived(rows, peak_tbps=4.8)
    d = by[0]
    assert d["gbps"] == pytest.approx(kv / 0.25e-3 / 1e9)
    assert d["frac_peak"] == pytest.approx(d["gbps"] / 4800)
    assert d["ratio_best_torch"] == pytest.approx(2.0)          # 0.5 ms / 0.25 ms
    assert by[1]["ratio_best_torch"] == pytest.approx(1.0)
    assert by[3]["gbps"] is None and by[3]["ratio_best_torch"] is None
    assert by[4]["ratio_best_torch"] is None                    # no library at that shape
    assert add_decode_derived([dict(rows[0])], peak_tbps=None)[0]["frac_peak"] is None


def test_frame_and_table():
    rows = add_decode_derived([
        make_decode_row("decode", "flashattn", part="decode", median_ms=0.25,
                        kv_bytes=1 << 30, config="contiguous cache", **SH),
        make_decode_row("sdpa_cudnn", "library", part="decode",
                        error=f"{schema.SKIPPED}: not here", **SH),
        make_decode_row("decode", "flashattn", part="host", median_ms=0.25, host_ms=0.04,
                        wall_ms=0.31, overhead_ms=0.06, graph=True, **SH)], peak_tbps=4.8)
    doc = dict(meta=dict(gpu="NVIDIA H200", hbm_peak_tbps=4.8, hbm_peak_source="datasheet"),
               rows=rows)
    df = decode_frame(doc)
    assert list(df.columns) == list(ROW_FIELDS) + list(DECODE_FIELDS)
    assert df["gbps"].dtype.kind == "f" and df["overhead_ms"].dtype.kind == "f"
    assert decode_frame(dict(meta={}, rows=[])).empty
    table = format_decode_table(doc)
    assert "4.8 TB/s" in table and "contiguous cache" in table and "skip" in table
    assert "host 0.0400 ms, overhead 0.0600 ms" in table and "89%" in table
    json.loads(schema.dumps(doc))


# --- run_decode_bench with the GPU parts faked ----------------------------------------------------
@pytest.fixture
def cpu_fakes(monkeypatch):
    """The GPU parts replaced: CUDA reported present, the decode kernels by the reference,
    timing by fixed samples, host and wall times by constants, graphs by a stand-in."""
    import importlib

    from flashattn import timing
    from flashattn.reference import decode_attention, varlen_attention
    decode_mod = importlib.import_module("flashattn.decoding")
    varlen_mod = importlib.import_module("flashattn.varlen")

    def fake_decode(q, k, v, lens, *, block_table=None, out=None, **kw):
        o = decode_attention(q, k, v, lens, block_table=block_table).to(q.dtype)
        if out is not None:
            out.copy_(o)
            return out
        return o

    def fake_varlen(q, k, v, cu_q, cu_k, mq, mk, *, causal, scale, out, **kw):
        out.copy_(varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal, scale=scale))
        return out

    def fake_check(entry, ref_fn):
        with entry.ctx():
            o = entry.fns[0]()
        return dict(max_abs_err=ref_fn(o), est_ms=0.5)

    def fake_rounds(fns, *, rounds=30, inner=10, **kw):
        out = {}
        for i, (n, f) in enumerate(fns.items()):
            f()
            samples = [0.5 + 0.01 * ((r + i) % 3) for r in range(rounds)]
            t = timing.summarize(samples)
            out[n] = timing.Timing(t.median_ms, t.min_ms, t.max_ms, t.q1_ms, t.q3_ms,
                                   rounds * inner[n], samples=samples, ci_lo_ms=0.49,
                                   ci_hi_ms=0.52, method="graph")
        return out

    class FakeGraph:
        def __init__(self, fn):
            self.replay = fn

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 40, 1 << 40))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(decode_mod, "decode", fake_decode)
    monkeypatch.setattr(varlen_mod, "attention_varlen", fake_varlen)
    real_set = bd._decode_set
    monkeypatch.setattr(bd, "_decode_set", lambda *a, **kw: real_set(
        *a[:7], torch.device("cpu"), **kw))
    monkeypatch.setattr(bd, "_l2_bytes", lambda dev: 50 << 20)
    monkeypatch.setattr(bd, "_check", fake_check)
    monkeypatch.setattr(bd, "_wall_time", lambda fn, **kw: 0.75)
    monkeypatch.setattr(bd, "_graph_of", FakeGraph)
    monkeypatch.setattr(timing, "time_rounds", fake_rounds)
    monkeypatch.setattr(timing, "host_time", lambda fn, **kw: 0.25)
    monkeypatch.setattr(bd, "hbm_peak", lambda name: (4.8, "test peak"))


def test_run_decode_bench_bookkeeping_on_cpu_with_fakes(cpu_fakes, monkeypatch):
    monkeypatch.setattr(torch, "device", lambda *a: "cpu")
    doc = bd.run_decode_bench(["decode"], batches=[2], cache_lens=[64], nqs=[1, 4],
                              gqa=(4, 2), head_dim=16, page_sizes=[16], rounds=3, inner=2,
                              flex="none", progress=False)
    json.loads(schema.dumps(doc))
    meta = doc["meta"]
    assert meta["hbm_peak_tbps"] == 4.8 and meta["parts"] == ["decode"]
    assert meta["method"]["rounds"] == 3 and meta["estimate_s"] > 0
    rows = doc["rows"]
    assert all(tuple(r) == ROW_FIELDS + DECODE_FIELDS for r in rows)
    by = {(r["impl"], r["Nq"]): r for r in rows}
    assert set(by) == {(n, nq) for n in bd.default_impls([16]) for nq in (1, 4)}
    for nq in (1, 4):
        for name in ("decode", "decode_paged16"):
            r = by[name, nq]
            assert r["error"] is None, r
            assert r["max_abs_err"] < 1e-2 and r["median_ms"] == pytest.approx(0.5, abs=0.02)
            assert r["kv_bytes"] == kv_bytes(2, 2, 64, 16)
            assert r["gbps"] == pytest.approx(r["kv_bytes"] / (r["median_ms"] * 1e-3) / 1e9)
            assert r["host_ms"] == 0.25 and r["part"] == "decode" and r["kind"] == "flashattn"
            assert r["page_size"] == (16 if name == "decode_paged16" else None)
        assert by["flex", nq]["error"].startswith(schema.SKIPPED)
        assert by["square_best", nq]["error"]               # no GPU to resolve a step on
        m = by["sdpa_math", nq]                             # runs on the CPU
        assert m["error"] is None and m["max_abs_err"] < 1e-2, m
        assert by["decode", nq]["ratio_best_torch"] == pytest.approx(
            m["median_ms"] / by["decode", nq]["median_ms"])
    assert "boolean mask" in by["sdpa_math", 4]["config"]
    assert "no mask" in by["sdpa_math", 1]["config"]


def test_run_decode_bench_host_part_rows(cpu_fakes, monkeypatch):
    monkeypatch.setattr(torch, "device", lambda *a: "cpu")
    monkeypatch.setattr(bd, "HOST_SHAPE", dict(B=1, Nk=64, Nq=1))
    doc = bd.run_decode_bench(["host"], gqa=(4, 2), head_dim=16, rounds=3, inner=2,
                              progress=False)
    rows = [r for r in doc["rows"] if not r["error"]]
    graph = {r["impl"]: r for r in rows if r["graph"]}
    eager = {r["impl"]: r for r in rows if r["graph"] is False}
    assert set(graph) == {"decode", "decode_paged64"} and set(eager) >= set(graph)
    for r in rows:
        assert r["part"] == "host" and r["wall_ms"] == 0.75 and r["host_ms"] == 0.25
        assert r["overhead_ms"] == pytest.approx(0.75 - r["median_ms"])
    assert "CUDA graph" in graph["decode"]["config"]


def test_run_decode_bench_varlen_part(cpu_fakes, monkeypatch):
    monkeypatch.setattr(torch, "device", lambda *a: "cpu")
    doc = bd.run_decode_bench(["varlen"], gqa=(4, 2), head_dim=16, rounds=3, inner=2,
                              varlen_mixes=["equal_2x32", "uniform_1_40"], varlen_total=64,
                              progress=False)
    by = {(r["impl"], r["config"].split(":")[0]): r for r in doc["rows"]}
    v = by["varlen", "equal_2x32"]
    assert v["error"] is None and v["max_abs_err"] < 1e-2 and v["total_tokens"] == 64
    assert v["lens"] == [32, 32] and v["B"] == 2 and v["Nq"] == 32 and v["part"] == "varlen"
    from flashattn.timing import attention_flops, tflops
    assert v["tflops"] == pytest.approx(tflops(2 * attention_flops(1, 4, 32, 32, 16, True),
                                               v["median_ms"]))
    assert by["square_padded", "equal_2x32"]["error"]       # no GPU to resolve a step on
    u = by["varlen", "uniform_1_40"]
    assert sum(u["lens"]) == 64 and u["error"] is None


def test_run_decode_bench_refuses_bad_parts_and_no_gpu(monkeypatch):
    with pytest.raises(ValueError, match="unknown part"):
        bd.run_decode_bench(["prefill"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        bd.run_decode_bench(["host"])


def test_decode_reference_is_bottom_right_causal():
    from flashattn.reference import decode_attention
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((4, 3), (2, 40), (2, 40)))
    ref = bd.decode_reference(q, k, v, 0.25)
    exact = decode_attention(q, k, v, torch.tensor([40], dtype=torch.int32), scale=0.25)
    torch.testing.assert_close(ref, exact[0].float(), atol=1e-5, rtol=1e-5)
    assert not math.isnan(ref.sum().item())


def test_a_shape_whose_inputs_fail_becomes_error_rows(cpu_fakes, monkeypatch):
    monkeypatch.setattr(torch, "device", lambda *a: "cpu")

    def oom(*a, **kw):
        raise RuntimeError("CUDA out of memory. Tried to allocate 34.00 GiB")
    monkeypatch.setattr(bd, "_decode_set", oom)
    doc = bd.run_decode_bench(["decode"], batches=[1], cache_lens=[64], nqs=[1], gqa=(4, 2),
                              head_dim=16, page_sizes=[], rounds=3, inner=2, progress=False)
    assert doc["rows"] and all(r["error"].startswith("inputs: RuntimeError: CUDA out of memory")
                               for r in doc["rows"])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (1 << 10, 1 << 40))
    doc = bd.run_decode_bench(["decode"], batches=[1], cache_lens=[64], nqs=[1], gqa=(4, 2),
                              head_dim=16, page_sizes=[], rounds=3, inner=2, progress=False)
    assert all("do not fit" in r["error"] for r in doc["rows"])
