"""One public call asks where its launches run once: the entry point resolves a
``dispatch.Target`` (interpreted or not, the GPU's architecture, SM count and name) and passes it
down to the autotuner, the plan and the launches. Counted through ``interpret.active``, which
every fresh look at a CPU device reads, on CPU tensors in the interpreter, launches recorded."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import dispatch, interpret  # noqa: E402


def t(*shape, grad=False):
    return torch.randn(*shape).half().requires_grad_(grad)


CALLS = {
    "attention": lambda: flashattn.attention(t(1, 4, 64, 16), t(1, 2, 64, 16), t(1, 2, 64, 16),
                                             causal=True),
    "attention, the decode route": lambda: flashattn.attention(
        t(1, 4, 1, 16), t(1, 2, 1024, 16), t(1, 2, 1024, 16), causal=True, input_pos=1023),
    "attention, differentiable": lambda: flashattn.attention(
        t(1, 4, 64, 16, grad=True), t(1, 2, 64, 16), t(1, 2, 64, 16)),
    "attention_via_decode": lambda: flashattn.api.attention_via_decode(
        t(1, 4, 2, 16), t(1, 2, 64, 16), t(1, 2, 64, 16), causal=True, input_pos=62),
    "decode": lambda: flashattn.decode(t(1, 4, 1, 16), t(1, 2, 64, 16), t(1, 2, 64, 16),
                                       torch.tensor([64], dtype=torch.int32)),
}


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_a_public_call_asks_for_its_device_once(monkeypatch, call):
    asked = []
    real = interpret.active
    monkeypatch.setattr(interpret, "active", lambda: asked.append(1) or real())
    with interpret.enabled(), dispatch.record_launches(run=False) as seen:
        CALLS[call]()
    assert seen, f"{call}: nothing launched"
    assert len(asked) == 1, f"{call}: the device was asked about {len(asked)} times"


def test_a_target_answers_as_its_device():
    cpu = torch.device("cpu")
    with interpret.enabled("sm_100"):
        target = dispatch.target_of(cpu)
        assert dispatch.target_of(target) is target
        assert target.interpreting and dispatch.interpreting(target)
        assert (target.arch, target.sm_count) == ("sm_100", interpret.sm_count("sm_100"))
        assert dispatch.device_arch(target) == dispatch.device_arch(cpu) == "sm_100"
        assert dispatch.device_sm_count(target) == dispatch.device_sm_count(cpu)
        assert dispatch.device_name(target) == dispatch.device_name(cpu)
    assert not dispatch.target_of(cpu).interpreting       # asked afresh outside
