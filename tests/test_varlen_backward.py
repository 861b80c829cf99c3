"""The backward of packed variable-length attention on the CPU (``flashattn.varlen``).

``attention_varlen_backward`` is a host loop over the sequences that calls the square forward
(``flashattn.autograd.attention_forward``) and backward (``flashattn.launch_bwd.
attention_backward``) per sequence. Here both are replaced by float64 CPU references built from
``flashattn.reference`` (the fakes also check that they get a valid square problem, and an output
and LSE consistent with it), the varlen checks by ``contract.check_varlen`` (the same checks minus
the CUDA device and the fp16/bf16 dtype), and dq, dk, dv are compared with float64 gradients from
torch autograd through a per-sequence softmax attention written here, with bottom-right causal
masking (and with ``reference.varlen.varlen_attention_backward``). The autograd path of
``attention_varlen`` runs end to end with the forward kernel emulated in NumPy.
"""
import math
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashattn import contract  # noqa: E402
from flashattn import reference as R  # noqa: E402
from flashattn import varlen as host  # noqa: E402
from flashattn.reference.varlen import varlen_attention_backward  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def packed(lens_q, lens_k=None, Hq=4, Hkv=2, D=8, dtype=torch.float64, seed=0):
    lens_k = lens_q if lens_k is None else lens_k
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), Hq, D, generator=g).to(dtype)
    k = torch.randn(sum(lens_k), Hkv, D, generator=g).to(dtype)
    v = torch.randn(sum(lens_k), Hkv, D, generator=g).to(dtype)
    dout = torch.randn(sum(lens_q), Hq, D, generator=g).to(dtype)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    return q, k, v, dout, cu_q, cu_k, max(lens_q), max(lens_k)


def autograd_reference(q, k, v, dout, cu_q, cu_k, *, causal, scale=None, align="bottom"):
    """float64 (dq, dk, dv) by torch autograd through softmax attention, one sequence at a
    time; causal rows aligned to the bottom right (``align="top"``: the top left, to show the
    cases tell the two apart). A row that sees no key outputs 0."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    Hq, D = q.shape[1], q.shape[2]
    G = Hq // k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    cq, ck = cu_q.tolist(), cu_k.tolist()
    outs = []
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        qh = q[cq[b]:cq[b + 1]].transpose(0, 1)                                # (Hq, lq, D)
        kh = k[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(G, 0)         # (Hq, lk, D)
        vh = v[ck[b]:ck[b + 1]].transpose(0, 1).repeat_interleave(G, 0)
        s = (qh @ kh.transpose(-1, -2)) * scale                                # (Hq, lq, lk)
        mask = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            shift = lk - lq if align == "bottom" else 0
            mask = torch.arange(lk)[None, :] <= (shift + torch.arange(lq))[:, None]
        seen = mask.any(dim=1)[:, None]                                         # (lq, 1)
        s = s.masked_fill(~mask, -math.inf).masked_fill(~seen, 0.0)
        p = torch.softmax(s, dim=-1) * seen                                     # 0 rows: 0
        outs.append((p @ vh).transpose(0, 1))                                   # (lq, Hq, D)
    out = torch.cat(outs, 0)
    return torch.autograd.grad(out, (q, k, v), dout.double(), allow_unused=True)


@pytest.fixture
def square(monkeypatch):
    """The square kernels replaced by float64 references; every call recorded."""
    from flashattn import autograd, launch_bwd
    calls = []

    def fake_forward(q, k, v, *, causal=False, scale=None, input_pos=0, step="best",
                     config=None):
        assert q.ndim == 4 and q.shape[0] == 1 and all(t.is_contiguous() for t in (q, k, v))
        kw = dict(causal=causal, scale=scale, input_pos=input_pos)
        out = R.attention(q, k, v, **kw)                 # check_shapes: a valid input_pos
        calls.append(SimpleNamespace(kind="fwd", nq=q.shape[2], nk=k.shape[2], **kw))
        return out.to(q.dtype), R.attention_lse(q, k, **kw)

    def fake_backward(q, k, v, out, dout, lse, *, causal=False, scale=None, input_pos=0,
                      **extra):
        assert not extra
        kw = dict(causal=causal, scale=scale, input_pos=input_pos)
        # The output and LSE are the forward's of this very problem.
        torch.testing.assert_close(out, R.attention(q, k, v, **kw).to(q.dtype))
        torch.testing.assert_close(lse, R.attention_lse(q, k, **kw))
        assert dout.shape == q.shape and dout.is_contiguous()
        calls.append(SimpleNamespace(kind="bwd", nq=q.shape[2], nk=k.shape[2], **kw))
        return R.attention_backward(q, k, v, dout, **kw)

    monkeypatch.setattr(autograd, "forward_lse", fake_forward)
    monkeypatch.setattr(launch_bwd, "launch_backward", fake_backward)
    monkeypatch.setattr(host, "check_varlen_tensors",   # the CUDA-only rules off
                        lambda *a, interpret=False, **kw: contract.check_varlen(*a, **kw))
    return calls


CASES = {                                   # name: (lens_q, lens_k)
    "equal-with-0-and-1": ((5, 0, 1, 9, 3), None),
    "mixed": ((7, 1, 4, 0, 6, 2), (3, 5, 4, 2, 0, 9)),      # >, <, =, no query, no key, <
    "one-query-long-keys": ((1, 10), (12, 1)),
    "no-key-at-all": ((3, 2), (0, 0)),
    "no-query-at-all": ((0, 0), (3, 4)),
    "single": ((13,), (13,)),
}
HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (4, 1)}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", HEADS, ids=list(HEADS))
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_backward_matches_autograd(square, case, heads, causal):
    lens_q, lens_k = CASES[case]
    Hq, Hkv = HEADS[heads]
    q, k, v, dout, cu_q, cu_k, mq, mk = packed(lens_q, lens_k, Hq=Hq, Hkv=Hkv, seed=len(case))
    out = R.varlen_attention(q, k, v, cu_q, cu_k, causal=causal)
    grads = host.attention_varlen_backward(q, k, v, out, dout, cu_q, cu_k, mq, mk,
                                           causal=causal)
    want = autograd_reference(q, k, v, dout, cu_q, cu_k, causal=causal)
    exact = varlen_attention_backward(q, k, v, dout, cu_q, cu_k, causal=causal)
    for name, g, w, e, t in zip("qkv", grads, want, exact, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype and g.is_contiguous()
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-9, msg=f"d{name}")
        torch.testing.assert_close(e, w, atol=1e-10, rtol=1e-9, msg=f"reference d{name}")
    # One square forward and one square backward per sequence with a query and a key.
    lk_ = lens_q if lens_k is None else lens_k
    n = sum(1 for a, b in zip(lens_q, lk_) if a and b)
    assert [c.kind for c in square] == ["fwd", "bwd"] * n


def test_each_sequence_is_the_square_problem_it_should_be(square):
    lens_q, lens_k = (7, 1, 4, 0, 6, 2), (3, 5, 4, 2, 0, 9)
    q, k, v, dout, cu_q, cu_k, mq, mk = packed(lens_q, lens_k)
    out = R.varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    dq, dk, dv = host.attention_varlen_backward(q, k, v, out, dout, cu_q, cu_k, mq, mk,
                                                causal=True, scale=0.3)
    # len_q > len_k: the last len_k rows at input_pos 0; len_q <= len_k: bottom-right.
    want = [(3, 3, 0), (1, 5, 4), (4, 4, 0), (2, 9, 7)]
    assert [(c.nq, c.nk, c.input_pos) for c in square if c.kind == "fwd"] == want
    assert all(c.causal and c.scale == 0.3 for c in square)
    assert (dq[:4] == 0).all() and (dq[5:7] != 0).all()       # 4 rows see no key (row 4: one)
    assert (dq[12:18] == 0).all()                               # an empty key sequence
    assert (dk[12:14] == 0).all() and (dv[12:14] == 0).all()   # keys of a query-less sequence
    assert (dk[:12] != 0).all() and (dk[14:] != 0).all()
    square.clear()
    host.attention_varlen_backward(q, k, v, out, dout, cu_q, cu_k, mq, mk, causal=False)
    want = [(7, 3, 0), (1, 5, 0), (4, 4, 0), (2, 9, 0)]
    assert [(c.nq, c.nk, c.input_pos) for c in square if c.kind == "fwd"] == want


def test_the_cases_tell_the_alignments_apart(square):
    # The comparison can fail: top-left causal alignment gives other gradients here.
    q, k, v, dout, cu_q, cu_k, mq, mk = packed(*CASES["mixed"])
    out = R.varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    dq, _, _ = host.attention_varlen_backward(q, k, v, out, dout, cu_q, cu_k, mq, mk,
                                              causal=True)
    top = autograd_reference(q, k, v, dout, cu_q, cu_k, causal=True, align="top")
    assert (dq - top[0]).abs().max().item() > 1e-2
    full = autograd_reference(q, k, v, dout, cu_q, cu_k, causal=False)
    assert (dq - full[0]).abs().max().item() > 1e-2


def test_strided_inputs_and_gradients(square):
    # q, k, v slices of one packed qkv tensor; dout broadcast (stride 0, as from .sum()).
    lens = (5, 9)
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(sum(lens), 4 + 2 + 2, 8, generator=g, dtype=torch.float64)
    q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    out = R.varlen_attention(q, k, v, cu, cu, causal=True)
    dout = torch.ones(1, 1, 1, dtype=torch.float64).expand(out.shape)
    grads = host.attention_varlen_backward(q, k, v, out, dout, cu, cu, 9, 9, causal=True)
    want = autograd_reference(q, k, v, dout, cu, cu, causal=True)
    for got, w in zip(grads, want):
        torch.testing.assert_close(got, w, atol=1e-10, rtol=1e-9)


# --- attention_varlen through torch.autograd, the forward kernel emulated -------------------------
@pytest.fixture
def emulated(monkeypatch, square):
    """``attention_varlen`` on CPU float64 tensors: ``ct.launch`` runs the NumPy emulation of
    the varlen kernel (as tests/test_varlen_contract.py), the square kernels their references."""
    ct = pytest.importorskip("cuda.tile")
    from flashattn.kernels import VARLEN_FWD
    from flashattn.reference import emulate_varlen_kernel
    launched = []

    def fake_launch(stream, grid, kernel, args, **launch_options):
        assert kernel is VARLEN_FWD.kernel()
        emulate_varlen_kernel(grid, *[a.numpy() if isinstance(a, torch.Tensor) else a
                                      for a in args])
        launched.append(grid)

    monkeypatch.setattr(ct, "launch", fake_launch)
    from flashattn import dispatch
    monkeypatch.setattr(dispatch, "cuda_properties", lambda index: ("sm_120", 84))
    monkeypatch.setattr(host, "hinted", lambda kernel, hints: kernel)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **kw: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    return SimpleNamespace(launched=launched, calls=square)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_autograd_gradients(emulated, causal):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed(*CASES["mixed"], Hq=4, Hkv=2, seed=5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = host.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=causal, scale=0.4)
    assert out.grad_fn is not None and len(emulated.launched) == 1
    torch.testing.assert_close(out.detach(), R.varlen_attention(q, k, v, cu_q, cu_k,
                                                                causal=causal, scale=0.4))
    grads = torch.autograd.grad(out, leaves, dout)
    want = autograd_reference(q, k, v, dout, cu_q, cu_k, causal=causal, scale=0.4)
    for got, w in zip(grads, want):
        torch.testing.assert_close(got, w, atol=1e-10, rtol=1e-9)
    with torch.no_grad():
        plain = host.attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=causal, scale=0.4)
    assert torch.equal(plain, out.detach())


def test_only_the_inputs_that_require_grad_get_one(emulated):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed(*CASES["mixed"], seed=6)
    k = k.clone().requires_grad_()
    out = host.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    out.backward(dout)
    assert q.grad is None and v.grad is None
    want = autograd_reference(q, k, v, dout, cu_q, cu_k, causal=True)
    torch.testing.assert_close(k.grad, want[1], atol=1e-10, rtol=1e-9)


def test_loss_through_the_op_and_gradient_accumulation(emulated):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed((4, 6), (6, 6), seed=7)
    q = q.clone().requires_grad_()
    for _ in range(2):
        host.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True).square().sum().backward()
    out = R.varlen_attention(q.detach(), k, v, cu_q, cu_k, causal=True)
    want = autograd_reference(q, k, v, 2 * out, cu_q, cu_k, causal=True)[0]
    torch.testing.assert_close(q.grad, 2 * want, atol=1e-10, rtol=1e-9)


def test_the_no_grad_path_is_unchanged(emulated, monkeypatch):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed((4, 6), (6, 6), seed=8)

    def refuse():
        raise AssertionError("the operator was used on the no-grad path")

    monkeypatch.setattr(host, "_operator", refuse)
    out = host.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    assert out.grad_fn is None and not out.requires_grad
    qg = q.clone().requires_grad_()
    with torch.no_grad():
        o2 = host.attention_varlen(qg, k, v, cu_q, cu_k, mq, mk, causal=True)
    assert o2.grad_fn is None and torch.equal(o2, out)
    buf = torch.full_like(q, math.nan)
    with torch.no_grad():
        assert host.attention_varlen(qg, k, v, cu_q, cu_k, mq, mk, causal=True, out=buf) is buf
    assert torch.equal(buf, out)
    assert emulated.calls == []                   # no backward work on these paths


def test_out_with_grad_is_refused(emulated):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed((4, 6), (6, 6), seed=9)
    q.requires_grad_()
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        host.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, out=torch.empty_like(q.detach()))


def test_double_backward_is_refused(emulated):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed((4, 6), (6, 6), seed=10)
    q = q.clone().requires_grad_()
    out = host.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    (g,) = torch.autograd.grad(out, q, dout.requires_grad_(), create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


# --- bad inputs ---------------------------------------------------------------------------------
def _good(dtype=torch.float64):
    q, k, v, dout, cu_q, cu_k, mq, mk = packed((4, 6), (5, 6), dtype=dtype)
    return dict(q=q, k=k, v=v, out=torch.zeros_like(q), dout=dout, cu_seqlens_q=cu_q,
                cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk)


def _call(args, **kw):
    a = dict(args)
    return host.attention_varlen_backward(a.pop("q"), a.pop("k"), a.pop("v"), a.pop("out"),
                                          a.pop("dout"), a.pop("cu_seqlens_q"),
                                          a.pop("cu_seqlens_k"), a.pop("max_seqlen_q"),
                                          a.pop("max_seqlen_k"), **a, **kw)


def _bad_cu(t, i, x):
    t = t.clone()
    t[i] = x
    return t


BAD = [
    (lambda a: dict(a, out=a["out"][:-1]), ValueError, r"out must have the shape of q"),
    (lambda a: dict(a, dout=a["dout"][:, :2]), ValueError, r"dout must have the shape of q"),
    (lambda a: dict(a, dout=a["dout"].float()), TypeError, r"dout must have q's dtype"),
    (lambda a: dict(a, out=a["out"].numpy()), TypeError, r"out must be a torch.Tensor"),
    (lambda a: dict(a, dout=a["dout"].to("meta")), ValueError, r"dout is on meta"),
    (lambda a: dict(a, k=a["k"][:, :1].repeat(1, 3, 1), v=a["v"][:, :1].repeat(1, 3, 1)),
     ValueError, "multiple of key/value heads"),
    (lambda a: dict(a, v=a["v"][:-1]), ValueError, "same shape"),
    (lambda a: dict(a, cu_seqlens_k=a["cu_seqlens_k"].long()), TypeError, "int32"),
    (lambda a: dict(a, cu_seqlens_k=_bad_cu(a["cu_seqlens_k"], 2, 12)), ValueError,
     r"cu_seqlens_k\[-1\] = 12"),
    (lambda a: dict(a, cu_seqlens_q=_bad_cu(a["cu_seqlens_q"], 1, 11)), ValueError,
     "non-decreasing"),
    (lambda a: dict(a, cu_seqlens_q=_bad_cu(a["cu_seqlens_q"], 0, 1)), ValueError,
     r"cu_seqlens_q\[0\] must be 0"),
    (lambda a: dict(a, max_seqlen_k=5), ValueError, "more than max_seqlen_k = 5"),
    (lambda a: dict(a, max_seqlen_q=-1), ValueError, "max_seqlen_q must be >= 0"),
    (lambda a: dict(a, causal="yes"), TypeError, "causal must be a bool"),
    (lambda a: dict(a, scale=-1.0), ValueError, "finite positive"),
    (lambda a: dict(a, check_values=None), TypeError, "check_values must be True or False"),
]


@pytest.mark.parametrize("change,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_bad_inputs_are_refused_before_any_work(square, change, exc, match):
    args = change(_good())
    with pytest.raises(exc, match=match):
        _call(args)
    assert square == []


def test_bad_offsets_are_refused_even_without_check_values(square):
    args = _good()
    args["cu_seqlens_k"] = _bad_cu(args["cu_seqlens_k"], 1, 7)       # lengths 7, 4: max 6
    with pytest.raises(ValueError, match="more than max_seqlen_k"):
        _call(args, check_values=False)
    assert square == []


def test_the_kernel_contract_without_the_patches():
    # No fakes: the backward takes CUDA float16/bfloat16 tensors only.
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        _call(_good(torch.float32))
    with pytest.raises(ValueError, match="CUDA GPU"):
        _call(_good(torch.float16))


def test_the_reference_backward_rejects_a_bad_dout():
    q, k, v, dout, cu_q, cu_k, mq, mk = packed((4, 6))
    with pytest.raises(ValueError, match="dout must have the shape of q"):
        varlen_attention_backward(q, k, v, dout[1:], cu_q, cu_k)
    # NumPy in, NumPy out, float32 for float32 inputs.
    g = varlen_attention_backward(*(t.float().numpy() for t in (q, k, v, dout)), cu_q.numpy(),
                                  cu_k.numpy(), causal=True)
    assert all(isinstance(x, np.ndarray) and x.dtype == np.float32 for x in g)
