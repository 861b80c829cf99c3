"""One public call checks its input once: the entry point runs its family's contract
(``flashattn.contract``), and the operators, routes and launches behind it trust what they are
given. Counted through the dtype rule every family applies to q, on CPU tensors in the
interpreter with its launches recorded, not run."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import contract, interpret  # noqa: E402


@pytest.fixture
def checks(monkeypatch):
    """How often q's dtype is checked (once per validation), launches recorded, not run."""
    monkeypatch.setenv("FLASHATTN_INTERPRET", "1")
    monkeypatch.delenv("FLASHATTN_INTERPRET_ARCH", raising=False)
    monkeypatch.setattr(interpret, "launch", lambda grid, kernel, args, **kw: None)
    seen = []
    real = contract.check_kernel_dtype

    def spy(name, t, *a, **kw):
        if name in ("q", "query"):                 # flex_attention names it query
            seen.append(name)
        return real(name, t, *a, **kw)
    monkeypatch.setattr(contract, "check_kernel_dtype", spy)
    from flashattn import flex
    monkeypatch.setattr(flex, "check_kernel_dtype", spy)     # imported by name there
    return seen


def dense(nq=64, nk=64, *, grad=False, device="cpu"):
    q = torch.randn(1, 4, nq, 16, device=device).half().requires_grad_(grad)
    k = torch.randn(1, 2, nk, 16, device=device).half()
    return q, k, k


def packed(*, grad=False, device="cpu"):
    q = torch.randn(10, 2, 16, device=device).half().requires_grad_(grad)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device=device)
    return q, q.detach(), q.detach(), cu, cu, 6, 6


CALLS = {
    "attention": lambda: flashattn.attention(*dense(), causal=True),
    "attention, the decode route": lambda: flashattn.attention(*dense(1, 1024), causal=True,
                                                               input_pos=1023),
    "attention, differentiable": lambda: flashattn.attention(*dense(grad=True)),
    "attention, meta": lambda: flashattn.attention(*dense(device="meta")),
    "sdpa": lambda: flashattn.sdpa(*dense(), enable_gqa=True),
    "autograd.attention_forward": lambda: flashattn.autograd.attention_forward(*dense()),
    "decode": lambda: flashattn.decode(dense(1)[0], *dense(1, 128)[1:],
                                       torch.tensor([128], dtype=torch.int32)),
    "attention_varlen": lambda: flashattn.attention_varlen(*packed(), causal=True),
    "attention_varlen, differentiable": lambda: flashattn.attention_varlen(*packed(grad=True)),
    "attention_varlen, meta": lambda: flashattn.attention_varlen(*packed(device="meta")),
    # window_size/softcap route to the flex kernels: the dense contract, not flex's again.
    "attention, window_size": lambda: flashattn.attention(*dense(), causal=True,
                                                          window_size=(8, 0)),
    "attention, softcap": lambda: flashattn.attention(*dense(), softcap=30.0),
    "attention, window_size, differentiable": lambda: flashattn.attention(
        *dense(grad=True), window_size=(16, 16)),
    "flex_attention": lambda: flashattn.flex_attention(*dense(), enable_gqa=True),
}


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
def test_a_public_call_checks_its_input_once(checks, call):
    CALLS[call]()
    assert len(checks) == 1, f"{call}: q checked {len(checks)} times"


def _backward(out):
    out.float().sum().backward()


def test_a_backward_checks_its_input_once(checks):
    # The dense backward checks q, k, v, out, dout and lse once; the varlen backward once for
    # the whole batch, not again for each sequence's square forward and backward.
    out = flashattn.attention(*dense(grad=True), causal=True)
    checks.clear()
    _backward(out)
    assert len(checks) == 1, f"attention's backward: q checked {len(checks)} times"
    out = flashattn.attention_varlen(*packed(grad=True), causal=True)
    checks.clear()
    _backward(out)
    assert len(checks) == 1, f"attention_varlen's backward: q checked {len(checks)} times"


def test_the_counter_sees_a_second_check(checks):
    # The test can fail: an entry point that checked again would be counted.
    q, k, v = dense()
    contract.check_tensors(q, k, v, causal=False, scale=None, input_pos=0, interpret=True)
    flashattn.attention(q, k, v)
    assert len(checks) == 2
