"""flashbook.measure.harness: the pieces bench, bench_bwd and bench_decode share (CPU only)."""
import pytest
import torch

from flashbook import impls
from flashbook.measure import bench, bench_bwd, bench_decode, harness


def test_error_text_keeps_the_first_line():
    e = ValueError("\n  first line\nsecond line")
    assert harness.error_text(e) == "ValueError: first line"
    assert len(harness.error_text(RuntimeError("x" * 1000))) == harness.ERROR_CHARS
    assert bench._err is bench_bwd._err is bench_decode._err is harness.error_text


def test_inputs_are_seeded_and_in_order():
    q, k, v = harness.qkv_inputs(1, 4, 2, 3, 5, 8, torch.float32, "cpu", seed=7)
    assert q.shape == (1, 4, 3, 8) and k.shape == v.shape == (1, 2, 5, 8)
    g = torch.Generator().manual_seed(7)
    assert torch.equal(q, torch.randn((1, 4, 3, 8), generator=g))
    assert torch.equal(k, torch.randn((1, 2, 5, 8), generator=g))
    # The forward's and the backward's inputs are the same q, k, v (dout after them).
    fq, fk, fv = bench._inputs(1, 4, 2, 6, 8, torch.float32, "cpu", seed=3)
    bq, bk, bv, do = bench_bwd._inputs(1, 4, 2, 6, 8, torch.float32, "cpu", seed=3)
    assert all(torch.equal(a, b) for a, b in ((fq, bq), (fk, bk), (fv, bv)))
    assert do.shape == fq.shape and not torch.equal(do, fq)


def test_error_measures():
    ref = torch.ones(4, dtype=torch.float64)
    out = torch.tensor([1.0, 1.0, 1.0, 3.0])
    assert harness.max_abs_err(out, ref) == 2.0
    assert harness.rel_rms_err(out, ref) == pytest.approx(1.0)
    assert harness.max_abs_err(torch.tensor([float("inf")]), ref[:1]) != \
        harness.max_abs_err(torch.tensor([float("inf")]), ref[:1])       # NaN, not inf


def test_rounds_per_sample_and_rotation():
    per = harness.rounds_per_sample({"fast": 0.01, "slow": 50.0, "mid": 1.0}, 10, 4)
    assert per == {"fast": 4, "slow": 1, "mid": 4}
    assert harness.rounds_per_sample({"mid": 1.0}, 10) == {"mid": 5}
    call = harness.rotating([lambda: 1, lambda: 2])
    assert [call(), call(), call()] == [1, 2, 1]


def test_time_in_rounds_reports_a_failure(monkeypatch):
    from flashattn import timing

    def boom(*a, **k):
        raise RuntimeError("graph capture refused\nmore")
    monkeypatch.setattr(timing, "time_rounds", boom)
    assert harness.time_in_rounds({"a": lambda: None}, rounds=2, inner=1, seed=0) == \
        ({}, "RuntimeError: graph capture refused")
    assert harness.time_in_rounds({}, rounds=2, inner=1, seed=0) == ({}, "")


def test_timed_values_and_method_meta():
    class T:
        def as_dict(self):
            return {"median_ms": 2.0, "reps": 3}
    v = harness.timed_values(T(), {"max_abs_err": 1e-3, "est_ms": 2.0, "grad_errs": {}},
                             flops=4e12, errors=("max_abs_err", "grad_errs"))
    assert v == {"median_ms": 2.0, "reps": 3, "max_abs_err": 1e-3, "grad_errs": {},
                 "tflops": pytest.approx(2000.0)}
    m = harness.method_meta(rounds=5, inner=2, what="w", input_sets=3)
    assert list(m) == ["name", "rounds", "inner", "input_sets", "order", "ci", "sample_ms",
                       "idle_ms", "what"]
    assert m["idle_ms"] == harness.IDLE_MS and "input_sets" not in harness.method_meta(
        rounds=5, inner=2, what="w")


def test_one_library_map_and_one_registry():
    assert harness.LIBRARIES == {n: impls.IMPLS[n].backend for n in impls.LIBRARY_IMPLS}
    assert bench_decode.LIBRARIES.items() <= harness.LIBRARIES.items()
    assert bench_decode.IDLE_MS == harness.IDLE_MS
    # Every row name the backward and decode benchmarks write has a label and a colour.
    for name in (*bench_decode.DECODE_IMPLS, *bench_decode.VARLEN_IMPLS, bench_bwd.OURS,
                 bench_bwd.OURS_ATOMIC, bench_bwd.OURS_FWD, bench_bwd.OURS_FWD_LSE):
        assert impls.label_of(name) != name or name in impls.IMPLS, name
        assert impls.color_of(name).startswith("#"), name
    assert impls.label_of("sdpa_flash", "decode") == "SDPA flash"
    assert impls.label_of("sdpa_flash") == impls.IMPLS["sdpa_flash"].label
    assert impls.label_of("no_such_impl") == "no_such_impl"
    assert not set(impls.PATHS) & set(impls.ORDER)       # the forward's order is unchanged
