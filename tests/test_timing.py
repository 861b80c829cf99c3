"""flashattn.timing on the CPU: the FLOP convention, interleaving and quartiles."""
import pytest

from flashattn import timing
from flashattn.timing import attention_flops


def test_flops_convention():
    # The seed's convention: 4*B*H*N*N*D, halved for causal squares.
    assert attention_flops(4, 32, 1024, 1024, 128, False) == 4 * 4 * 32 * 1024 * 1024 * 128
    assert attention_flops(4, 32, 1024, 1024, 128, True) == 2 * 4 * 32 * 1024 * 1024 * 128
    # Nq != Nk counts visible pairs: a prefill of 2 after a cache of 2 sees 3 + 4 keys.
    assert attention_flops(1, 1, 2, 4, 1, True, input_pos=2) == 4 * 7
    assert attention_flops(1, 1, 4, 2, 1, True) == 4 * (1 + 2 + 2 + 2)


def test_time_interleaved_alternates_and_rotates(monkeypatch):
    calls = []

    def fake_event_times(fn, reps, flush=True):
        calls.append((fn.__name__, reps))
        return [1.0] * reps

    monkeypatch.setattr(timing, "event_times", fake_event_times)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def a():
        pass

    def b():
        pass
    res = timing.time_interleaved({"a": a, "b": b}, {"a": 8, "b": 3}, rounds=4)
    assert [n for n, _ in calls] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert res["a"].reps == 8 and res["b"].reps == 4     # b: ceil(3/4) = 1 per round
    assert res["a"].median_ms == 1.0


def test_summarize_quartiles():
    t = timing.summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (t.min_ms, t.median_ms, t.max_ms, t.reps) == (1.0, 3.0, 5.0, 5)
    assert t.q1_ms <= t.median_ms <= t.q3_ms
