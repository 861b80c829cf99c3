"""flashattn.attention / sdpa differentiated on the GPU (``pytest -m gpu``; issue 11).

The chain a training step runs: the forward kernel with its LSE output (``WRITE_LSE``), then the
backward kernels through ``torch.autograd``. Gradients against the fp64 reference with the
FlashAttention criterion (each gradient's max error at most twice PyTorch's own same-precision
error plus a small floor; tests/test_backward_gpu.py's ``check``), the LSE against the
reference's, and torch.compile(fullgraph=True) against eager. Run with ``-n 8``.
"""
import math

import pytest

import flashbook

torch = pytest.importorskip("torch")

from criteria import assert_flash_criterion  # noqa: E402
from test_backward_gpu import (check, make_inputs, reference, seed_of,  # noqa: E402
                               torch_same_precision)

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1, 0), (17, 17, 0), (113, 113, 0), (1023, 1023, 0), (200, 333, 133),
          (300, 301, 0)]
HEADS = [(8, 8), (8, 2), (32, 1)]


def cases():
    out = []
    for i, (nq, nk, pos) in enumerate(SHAPES):
        for j, dtype in enumerate(("float16", "bfloat16")):
            for causal in (False, True):
                if pos and not causal:
                    continue
                hq, hkv = HEADS[(i + j) % len(HEADS)]
                d = (64, 128, 80)[(i + j + causal) % 3]
                out.append(pytest.param(hq, hkv, nq, nk, d, dtype, causal, pos,
                                        id=f"h{hq}:{hkv}-n{nq}:{nk}@{pos}-d{d}-{dtype[:2]}-"
                                           f"{'causal' if causal else 'full'}"))
    return out


def grads_of(q, k, v, dout, **kw):
    """flashattn.attention's output and (dq, dk, dv) through torch.autograd."""
    import flashattn
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = flashattn.attention(q, k, v, **kw)
    g = torch.autograd.grad(out, (q, k, v), dout)
    torch.cuda.synchronize()
    return out.detach(), g


@pytest.mark.parametrize("hq,hkv,nq,nk,d,dtype,causal,pos", cases())
def test_gradients_match_the_reference(hq, hkv, nq, nk, d, dtype, causal, pos, request,
                                       record_property):
    seed = seed_of(request.node.callspec.id)
    q, k, v, dout = make_inputs(2, hq, hkv, nq, nk, d, dtype, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out, grads = grads_of(q, k, v, dout, causal=causal, input_pos=pos)
    ref_out, _, ref = reference(q, k, v, dout, causal, scale, pos)
    pt = torch_same_precision(q, k, v, dout, causal, scale, pos)
    ratios = check(grads, ref, pt, dtype, seed=seed)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert torch.isfinite(out).all()
    for name, r in ratios.items():
        record_property(f"err_ratio_{name}", r)


def _fused_steps():
    from flashbook.steps import EXPERIMENTS, STEPS
    return [n for n, s in {**STEPS, **EXPERIMENTS}.items() if s.kernel == "fmha"]


@pytest.mark.parametrize("step", _fused_steps())
@pytest.mark.parametrize("causal", [False, True])
def test_lse_output_matches_the_reference(step, causal):
    # Every fused step writes the LSE with WRITE_LSE: natural log, fp32, finite.
    from flashattn.autograd import attention_forward
    seed = 21
    q, k, v, dout = make_inputs(2, 8, 2, 333, 333, 128, "float16", seed=seed, magnitude=2.0)
    scale = 128 ** -0.5
    out, lse = attention_forward(q, k, v, causal=causal, step=step)
    torch.cuda.synchronize()
    ref_out, ref_lse, _ = reference(q, k, v, dout, causal, scale, 0)
    assert lse.dtype == torch.float32 and lse.shape == (2, 8, 333)
    assert torch.isfinite(lse).all()
    err = (lse.double() - ref_lse).abs().max().item()
    assert err < 2e-3 * max(1.0, ref_lse.abs().max().item()), f"{step}: LSE error {err:.3g}"
    # The output is the inference kernel's, bit for bit: WRITE_LSE only adds the store.
    import flashattn
    assert torch.equal(out, flashbook.attention(q, k, v, causal=causal, step=step))


def test_sdpa_is_a_drop_in_for_training():
    import flashattn
    seed = 22
    q, k, v, dout = make_inputs(2, 8, 2, 257, 257, 64, "bfloat16", seed=seed)
    ref_out, _, ref = reference(q, k, v, dout, True, 0.125, 0)
    qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
    out = flashattn.sdpa(qs, ks, vs, is_causal=True, enable_gqa=True)
    got = torch.autograd.grad(out, (qs, ks, vs), dout)
    pt = torch_same_precision(q, k, v, dout, True, 0.125, 0)
    check(got, ref, pt, "bfloat16", seed=seed)
    pt_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                              enable_gqa=True)
    assert_flash_criterion(out.detach(), ref_out.float(), pt_out, 8e-3, seed=seed)


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph_matches_eager(dynamic):
    # A transformer-like block: projections around flashattn.attention, inductor for the rest.
    import flashattn
    torch._dynamo.reset()
    torch.manual_seed(23)
    B, N, H, Hkv, D = 2, 200, 8, 2, 64
    x = torch.randn(B, N, H * D, device="cuda", dtype=torch.bfloat16)
    wq = torch.randn(H * D, H * D, device="cuda", dtype=torch.bfloat16) * 0.05
    wkv = torch.randn(H * D, 2 * Hkv * D, device="cuda", dtype=torch.bfloat16) * 0.05

    def block(x, wq, wkv):
        q = (x @ wq).view(B, N, H, D).transpose(1, 2)
        k, v = (x @ wkv).view(B, N, 2, Hkv, D).unbind(2)
        o = flashattn.attention(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return o.transpose(1, 2).reshape(B, N, H * D).float().square().mean()

    def run(f):
        w = [t.detach().requires_grad_() for t in (x, wq, wkv)]
        loss = f(*w)
        loss.backward()
        return loss.detach(), [t.grad for t in w]

    eager = run(block)
    compiled = run(torch.compile(block, fullgraph=True, dynamic=dynamic))
    assert torch.allclose(eager[0], compiled[0], rtol=1e-2, atol=1e-4)
    for a, b in zip(eager[1], compiled[1]):
        assert torch.isfinite(b).all()
        assert (a.float() - b.float()).abs().max().item() <= \
            2e-2 * max(1e-3, a.float().abs().max().item())


def test_opcheck_on_the_gpu():
    from flashattn import autograd as A
    q, k, v, dout = make_inputs(1, 4, 2, 70, 90, 64, "float16", seed=24)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(A.attention_fwd, (q, k, v, True, None, 20, "best"))
    out, lse = A.attention_fwd(q, k, v, True, None, 20, "best")
    torch.library.opcheck(A.attention_bwd, (dout, q.detach(), k.detach(), v.detach(),
                                             out.detach(), lse, True, None, 20))


def test_deterministic_gradients():
    q, k, v, dout = make_inputs(2, 8, 2, 300, 300, 128, "float16", seed=25)
    a = grads_of(q, k, v, dout, causal=True)[1]
    b = grads_of(q, k, v, dout, causal=True)[1]
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_noncontiguous_inputs_and_gradient():
    seed = 26
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, 77, 8, 64, generator=g, device="cuda").half().transpose(1, 2)
    k, v = (torch.randn(2, 90, 2, 64, generator=g, device="cuda").half().transpose(1, 2)
            for _ in range(2))
    dout = torch.randn(2, 64, 77, 8, generator=g, device="cuda").half().permute(0, 3, 2, 1)
    assert not q.is_contiguous() and not dout.is_contiguous()
    out, grads = grads_of(q, k, v, dout, causal=True, scale=0.3, input_pos=13)
    _, _, ref = reference(q, k, v, dout, True, 0.3, 13)
    pt = torch_same_precision(q, k, v, dout, True, 0.3, 13)
    check(grads, ref, pt, "float16", seed=seed)


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits_stay_finite(causal):
    seed = 27
    q, k, v, dout = make_inputs(1, 4, 2, 256, 256, 64, "float16", seed=seed, magnitude=6.0)
    out, grads = grads_of(q, k, v, dout, causal=causal)
    _, _, ref = reference(q, k, v, dout, causal, 0.125, 0)
    pt = torch_same_precision(q, k, v, dout, causal, 0.125, 0)
    check(grads, ref, pt, "float16", seed=seed)


def test_empty_inputs():
    import flashattn
    q = torch.randn(1, 4, 0, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    k = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    out = flashattn.attention(q, k, k, causal=True)
    out.sum().backward()
    assert q.grad.shape == q.shape and (k.grad == 0).all()


def test_naive_step_has_no_backward():
    import flashattn
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.float16, requires_grad=True)
    with pytest.raises(ValueError, match="naive"):
        flashbook.attention(q, q, q, step="naive")
