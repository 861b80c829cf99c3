"""The differentiable operator (flashattn.autograd) on a CPU: its schema, fake and meta
implementations, the autograd wiring, torch.compile(fullgraph=True) tracing, and the errors.
The kernels themselves are checked on the GPU (tests/test_autograd_gpu.py)."""
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import flashattn
import flashbook
from flashattn import autograd as A


def _meta(B=2, Hq=4, Hkv=2, Nq=33, Nk=40, D=64, dtype=torch.float16, grad=True):
    q = torch.empty(B, Hq, Nq, D, device="meta", dtype=dtype, requires_grad=grad)
    k = torch.empty(B, Hkv, Nk, D, device="meta", dtype=dtype, requires_grad=grad)
    v = torch.empty(B, Hkv, Nk, D, device="meta", dtype=dtype, requires_grad=grad)
    return q, k, v


def test_the_ops_are_registered_with_their_schemas():
    fwd = torch.ops.flashattn.attention_fwd.default
    bwd = torch.ops.flashattn.attention_bwd.default
    assert str(fwd._schema) == ("flashattn::attention_fwd(Tensor q, Tensor k, Tensor v, "
                                "bool causal, float? scale, SymInt input_pos, str step) -> "
                                "(Tensor, Tensor)")
    assert str(bwd._schema).startswith("flashattn::attention_bwd(Tensor dout, Tensor q, "
                                       "Tensor k, Tensor v, Tensor out, Tensor lse, bool causal")
    assert str(bwd._schema).endswith("-> (Tensor, Tensor, Tensor)")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal,input_pos", [(False, 0), (True, 0), (True, 7)])
def test_meta_forward_and_backward_shapes(dtype, causal, input_pos):
    q, k, v = _meta(dtype=dtype)
    out, lse = A.attention_fwd(q, k, v, causal, None, input_pos, "best")
    assert out.shape == q.shape and out.dtype == dtype and out.device.type == "meta"
    assert lse.shape == (2, 4, 33) and lse.dtype == torch.float32
    assert out.requires_grad and not lse.requires_grad       # the LSE carries no gradient
    out.sum().backward()
    for t in (q, k, v):                                      # dk, dv shaped as k, v (GQA)
        assert t.grad.shape == t.shape and t.grad.dtype == dtype


def test_fake_tensors_on_a_cuda_device():
    # What torch.compile traces with: fake CUDA tensors, no GPU needed.
    with FakeTensorMode():
        q = torch.empty(1, 8, 17, 80, device="cuda", dtype=torch.bfloat16)
        k = torch.empty(1, 2, 17, 80, device="cuda", dtype=torch.bfloat16)
        out, lse = A.attention_forward(q, k, k, causal=True)
        assert out.shape == q.shape and out.device.type == "cuda"
        assert lse.shape == (1, 8, 17) and lse.dtype == torch.float32
        dq, dk, dv = A.attention_bwd(out, q, k, k, out, lse, True, None, 0)
        assert dq.shape == q.shape and dk.shape == dv.shape == k.shape


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_traces_forward_and_backward(backend, dynamic):
    # fullgraph=True fails on any graph break: flashattn.attention and sdpa trace to one node.
    torch._dynamo.reset()

    def block(q, k, v):
        o = flashattn.attention(q, k, v, causal=True, input_pos=7)
        o2 = flashattn.sdpa(q, k, v, is_causal=False, enable_gqa=True, scale=0.2)
        return (o.float() * o2.float()).sum()

    q, k, v = _meta()
    loss = torch.compile(block, fullgraph=True, backend=backend, dynamic=dynamic)(q, k, v)
    loss.backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape


def test_torch_compile_counts_one_graph():
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    cnt = CompileCounter()
    q, k, v = _meta()
    f = torch.compile(lambda q, k, v: flashattn.attention(q, k, v).sum(), backend=cnt)
    f(q, k, v).backward()
    assert cnt.frame_count == 1
    assert cnt.op_count >= 2                                   # the op and the sum


@pytest.mark.parametrize("bad,err,match", [
    (dict(q_dtype=torch.float32), TypeError, "float16 or bfloat16"),
    (dict(Hq=3), ValueError, "multiple of key/value heads"),
    (dict(scale=-1.0), ValueError, "positive"),
    (dict(input_pos=50), ValueError, "input_pos"),
])
def test_bad_input_is_refused_while_tracing(bad, err, match):
    q, k, v = _meta(Hq=bad.get("Hq", 4))
    if "q_dtype" in bad:
        q = q.detach().to(bad["q_dtype"]).requires_grad_()
    with pytest.raises(err, match=match):
        A.attention_fwd(q, k, v, True, bad.get("scale"), bad.get("input_pos", 0), "best")
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: flashattn.attention(
        q, k, v, causal=True, scale=bad.get("scale"), input_pos=bad.get("input_pos", 0)),
        fullgraph=True, backend="eager")
    with pytest.raises(Exception, match=match):
        f(q, k, v)


def test_eager_calls_check_at_the_call():
    # Eager: the contract's messages, before any operator runs (CPU tensors: not a GPU).
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16, requires_grad=True)
    with pytest.raises(ValueError, match="CUDA GPU"):
        flashattn.attention(q, q, q)
    with pytest.raises(ValueError, match="CUDA GPU"):
        flashattn.sdpa(q, q, q)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flashattn.attention(q, q, q, causal=torch.tensor(True))
    with pytest.raises(NotImplementedError, match="dropout"):
        flashattn.sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="naive"):
        flashbook.attention(q, q, q, step="naive")           # no LSE, no backward
    with pytest.raises(ValueError, match="unknown step"):
        flashbook.attention(q, q, q, step="nope")
    with pytest.raises(TypeError, match="step must be a str"):
        flashbook.attention(q, q, q, step=3)


def test_inference_path_is_unchanged_without_grad(monkeypatch):
    # No input requires grad (or grad mode off): the inference kernel, not the operator.
    from flashattn import api
    called = []
    monkeypatch.setattr(A, "attention", lambda *a, **kw: called.append(1))
    q = torch.randn(1, 2, 8, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="CUDA GPU"):
        api.attention(q, q, q)
    qg = q.clone().requires_grad_()
    with torch.no_grad(), pytest.raises(ValueError, match="CUDA GPU"):
        api.attention(qg, q, q)
    assert called == []
    api.attention(qg, q, q)
    assert called == [1]


OPCHECK = textwrap.dedent('''
    import torch
    from flashattn import autograd as A, reference as R

    # CPU kernels from the fp32 reference stand in for the GPU ones: opcheck then compares the
    # fake implementations, the autograd registration and AOT dispatch with real outputs.
    @A.attention_fwd.register_kernel("cpu")
    def _fwd(q, k, v, causal, scale, input_pos, step):
        o = R.attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
        lse = R.attention_lse(q, k, causal=causal, scale=scale, input_pos=input_pos)
        return o.to(q.dtype), lse.float()

    @A.attention_bwd.register_kernel("cpu")
    def _bwd(dout, q, k, v, out, lse, causal, scale, input_pos):
        g = R.attention_backward(q, k, v, dout, causal=causal, scale=scale, input_pos=input_pos)
        return tuple(x.to(q.dtype) for x in g)

    torch.manual_seed(0)
    for (Hq, Hkv, Nq, Nk, causal, pos) in [(2, 2, 5, 5, False, 0), (4, 2, 3, 9, True, 6)]:
        q = torch.randn(1, Hq, Nq, 16, dtype=torch.float16, requires_grad=True)
        k = torch.randn(1, Hkv, Nk, 16, dtype=torch.float16, requires_grad=True)
        v = torch.randn(1, Hkv, Nk, 16, dtype=torch.float16, requires_grad=True)
        torch.library.opcheck(A.attention_fwd, (q, k, v, causal, None, pos, "best"))
        out, lse = A.attention_fwd(q, k, v, causal, None, pos, "best")
        dout = torch.randn_like(out)
        # No double backward: the backward's own inputs do not require grad.
        torch.library.opcheck(A.attention_bwd, (dout, q.detach(), k.detach(), v.detach(),
                                                 out.detach(), lse, causal, None, pos))
        # The registered backward is the reference's gradient.
        g = torch.autograd.grad(out, (q, k, v), dout)
        ref = R.attention_backward(q, k, v, dout, causal=causal, input_pos=pos)
        for a, b in zip(g, ref):
            assert a.shape == b.shape
            assert torch.allclose(a.float(), b, atol=2e-2), (a - b).abs().max()
    print("opcheck ok")
''')


def test_opcheck_with_reference_cpu_kernels():
    # In a subprocess: the CPU kernels registered there must not outlive the test.
    r = subprocess.run([sys.executable, "-c", OPCHECK], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "opcheck ok" in r.stdout, r.stderr[-3000:]


def test_meta_tensors_trace_through_the_public_api():
    # A model built on the meta device: flashattn.attention and sdpa give shapes, with or
    # without grad, and still refuse what the kernels refuse.
    q, k, v = _meta(grad=False)
    assert flashattn.attention(q, k, v, causal=True).shape == q.shape
    assert flashattn.sdpa(q, k, v, enable_gqa=True).device.type == "meta"
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        flashattn.attention(q[:, :3], k, v)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        flashattn.attention(q.float(), k, v)
