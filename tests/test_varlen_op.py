"""attention_varlen as torch.library operators (flashattn.varlen_op) on a CPU: the schemas, the
fake (meta) implementations, torch.compile(fullgraph=True) over the forward and the backward
against the eager call (the real kernels in the interpreter), and the errors while tracing."""
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import interpret  # noqa: E402


def packed(lens_q=(3, 0, 9), lens_k=(5, 2, 9), hq=2, hkv=1, d=16, *, device="cpu",
           dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                               device=device) for lens in (lens_q, lens_k))
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(device=device, dtype=dtype)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(device=device, dtype=dtype)
            for _ in range(2))
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


def test_the_ops_are_registered_with_their_schemas():
    from flashattn import varlen_op  # noqa: F401
    fwd = torch.ops.flashattn.attention_varlen_fwd.default
    bwd = torch.ops.flashattn.attention_varlen_bwd.default
    assert str(fwd._schema) == (
        "flashattn::attention_varlen_fwd(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, "
        "Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal, "
        "float? scale, bool check_values, str? config) -> Tensor")
    assert str(bwd._schema).endswith("-> (Tensor, Tensor, Tensor)")


def test_meta_tensors_give_shapes_forward_and_backward():
    q, k, v, cu_q, cu_k, mq, mk = packed(device="meta")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    assert out.shape == q.shape and out.device.type == "meta" and out.grad_fn is not None
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
    # A bad shape on meta is the contract's error, not a copy out of a meta tensor.
    q, k, v, cu_q, cu_k, mq, mk = packed(hq=3, hkv=2, device="meta")
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        flashattn.attention_varlen(q.requires_grad_(), k, v, cu_q, cu_k, mq, mk)


def _loss(q, k, v, cu_q, cu_k, mq, mk):
    o = flashattn.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, scale=0.3)
    return (o.float() * torch.arange(o.numel()).view(o.shape).sin()).sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_matches_the_eager_call(monkeypatch, backend):
    monkeypatch.setenv("FLASHATTN_INTERPRET", "1")
    monkeypatch.delenv("FLASHATTN_INTERPRET_ARCH", raising=False)
    q, k, v, cu_q, cu_k, mq, mk = packed()
    leaves = [[t.clone().requires_grad_() for t in (q, k, v)] for _ in range(2)]
    torch._dynamo.reset()
    compiled = torch.compile(_loss, fullgraph=True, backend=backend)
    eager_loss = _loss(*leaves[0], cu_q, cu_k, mq, mk)
    eager_loss.backward()
    loss = compiled(*leaves[1], cu_q, cu_k, mq, mk)
    loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    for a, b in zip(leaves[1], leaves[0]):
        assert a.grad is not None and torch.equal(a.grad, b.grad)


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_counts_one_graph(dynamic):
    # dynamic=True: max_seqlen_q/k and the packed totals reach the fake as symbolic ints.
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    cnt = CompileCounter()
    f = torch.compile(lambda *a: flashattn.attention_varlen(*a).sum(), backend=cnt,
                      fullgraph=True, dynamic=dynamic)
    for lens in ((3, 0, 9), (4, 2, 12)):
        q, k, v, cu_q, cu_k, mq, mk = packed(lens, lens, device="meta")
        q.requires_grad_()
        f(q, k, v, cu_q, cu_k, mq, mk).backward()
        assert q.grad.shape == q.shape
    # One graph per call (fullgraph); the contract's int() of the packed totals specialises
    # them, so a new length compiles again, dynamic or not.
    assert cnt.frame_count == 2 and cnt.op_count >= 2


@pytest.mark.parametrize("bad,err,match", [
    (dict(dtype=torch.float32), TypeError, "float16 or bfloat16"),
    (dict(hq=3, hkv=2), ValueError, "multiple of key/value heads"),
    (dict(scale=-1.0), ValueError, "positive"),
    (dict(causal="yes"), TypeError, "causal must be a bool"),
])
def test_bad_input_is_refused_while_tracing(bad, err, match):
    q, k, v, cu_q, cu_k, mq, mk = packed(hq=bad.get("hq", 2), hkv=bad.get("hkv", 1),
                                         dtype=bad.get("dtype", torch.float16), device="meta")
    torch._dynamo.reset()
    f = torch.compile(lambda *a: flashattn.attention_varlen(
        *a, causal=bad.get("causal", True), scale=bad.get("scale")), fullgraph=True,
        backend="eager")
    with pytest.raises(err, match=match):        # eager: the contract's own error
        flashattn.attention_varlen(q.requires_grad_(), k, v, cu_q, cu_k, mq, mk,
                                   causal=bad.get("causal", True), scale=bad.get("scale"))
    with pytest.raises(Exception, match=match):  # traced: dynamo may wrap it
        f(q, k, v, cu_q, cu_k, mq, mk)


def test_out_is_refused_under_compile():
    q, k, v, cu_q, cu_k, mq, mk = packed(device="meta")
    torch._dynamo.reset()
    f = torch.compile(lambda *a: flashattn.attention_varlen(*a, out=torch.empty_like(a[0])),
                      fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="out= is not supported under torch.compile"):
        f(q, k, v, cu_q, cu_k, mq, mk)
