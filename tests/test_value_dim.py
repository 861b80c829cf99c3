"""A value head dim other than the query's (DeepSeek's unabsorbed MLA prefill: Q K^T over
192 = 128 + 64 rotary dims, P V over 128) through ``flashattn.attention`` and
``flashattn.attention_varlen``, in the interpreter, against float64 attention written from the
definition: causal and not, GQA, values wider than queries too, packed sequences, and the
gradients of q, k and v through autograd."""
import math

import pytest
import torch

import flashattn


def ref_attention(q, k, v, *, causal, scale=None):
    """(B, Hq, Nq, D) x (B, Hkv, Nk, D) x (B, Hkv, Nk, Dv) -> (B, Hq, Nq, Dv), float64;
    causal bottom-right (query i at position Nk - Nq + i)."""
    q, k, v = (t.double() for t in (q, k, v))
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:
        nq, nk = s.shape[-2:]
        keep = torch.arange(nk)[None] <= (nk - nq + torch.arange(nq))[:, None]
        s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, -1) @ v


def _tol(dtype):
    return 2e-2 if dtype == torch.bfloat16 else 3e-3


@pytest.mark.parametrize("D, Dv, causal, dtype, heads", [
    (192, 128, True, torch.bfloat16, (2, 1)),
    (192, 128, False, torch.float16, (2, 2)),
    (64, 128, True, torch.float16, (2, 1)),       # values wider than the queries
])
def test_dense_forward(D, Dv, causal, dtype, heads):
    g = torch.Generator().manual_seed(D + Dv + causal)
    Hq, Hkv = heads
    q = torch.randn(1, Hq, 70, D, generator=g).to(dtype)
    k = torch.randn(1, Hkv, 70, D, generator=g).to(dtype)
    v = torch.randn(1, Hkv, 70, Dv, generator=g).to(dtype)
    with flashattn.interpret.enabled():
        o = flashattn.attention(q, k, v, causal=causal)
    assert o.shape == (1, Hq, 70, Dv) and o.dtype == dtype and o.is_contiguous()
    err = (o.double() - ref_attention(q, k, v, causal=causal)).abs().max().item()
    assert err < _tol(dtype), err


def test_dense_backward_through_autograd():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 40, 192, generator=g).to(torch.float16).requires_grad_()
    k = torch.randn(1, 1, 40, 192, generator=g).to(torch.float16).requires_grad_()
    v = torch.randn(1, 1, 40, 128, generator=g).to(torch.float16).requires_grad_()
    do = torch.randn(1, 2, 40, 128, generator=g).to(torch.float16)
    with flashattn.interpret.enabled():
        o = flashattn.attention(q, k, v, causal=True)
        o.backward(do)
    ref = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref_attention(*ref, causal=True).backward(do.double())
    for name, t, r in zip("qkv", (q, k, v), ref):
        assert t.grad.shape == t.shape
        err = (t.grad.double() - r.grad).abs().max().item()
        assert err < 1e-2 * max(1.0, r.grad.abs().max().item()), (name, err)


def _packed(lens_q, lens_k, H, Hkv, D, Dv, dtype, g):
    q = torch.randn(sum(lens_q), H, D, generator=g).to(dtype)
    k = torch.randn(sum(lens_k), Hkv, D, generator=g).to(dtype)
    v = torch.randn(sum(lens_k), Hkv, Dv, generator=g).to(dtype)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, cu_q, cu_k


def _ref_varlen(q, k, v, cu_q, cu_k, causal):
    outs = []
    for b in range(len(cu_q) - 1):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        o = ref_attention(q[sq].transpose(0, 1)[None], k[sk].transpose(0, 1)[None],
                          v[sk].transpose(0, 1)[None], causal=causal)
        outs.append(o[0].transpose(0, 1))
    return torch.cat(outs)


def test_varlen_forward_and_backward():
    g = torch.Generator().manual_seed(5)
    lens_q, lens_k = (37, 1, 26), (37, 20, 30)
    q, k, v, cu_q, cu_k = _packed(lens_q, lens_k, 2, 1, 192, 128, torch.bfloat16, g)
    with flashattn.interpret.enabled():
        o = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                       causal=True)
    assert o.shape == (q.shape[0], 2, 128) and o.is_contiguous()
    ref = _ref_varlen(q, k, v, cu_q, cu_k, True)
    assert (o.double() - ref).abs().max().item() < _tol(torch.bfloat16)
    # out= (no grad): written in place
    buf = torch.full_like(o, float("nan"))
    with flashattn.interpret.enabled():
        r = flashattn.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                       causal=True, out=buf)
    assert r is buf and torch.equal(buf, o)
    # gradients through the varlen operator
    qs, ks, vs = (t.to(torch.float16).requires_grad_() for t in (q, k, v))
    do = torch.randn(o.shape, generator=g).to(torch.float16)
    with flashattn.interpret.enabled():
        flashattn.attention_varlen(qs, ks, vs, cu_q, cu_k, max(lens_q), max(lens_k),
                                   causal=True).backward(do)
    rq, rk, rv = (t.detach().double().requires_grad_() for t in (qs, ks, vs))
    _ref_varlen(rq, rk, rv, cu_q, cu_k, True).backward(do.double())
    for name, t, r in zip("qkv", (qs, ks, vs), (rq, rk, rv)):
        err = (t.grad.double() - r.grad).abs().max().item()
        assert err < 1e-2 * max(1.0, r.grad.abs().max().item()), (name, err)


def test_key_head_dim_must_match_the_query():
    q = torch.randn(1, 2, 8, 192, dtype=torch.float16)
    k = torch.randn(1, 1, 8, 128, dtype=torch.float16)
    with flashattn.interpret.enabled(), pytest.raises(ValueError, match="head dim"):
        flashattn.attention(q, k, k, causal=True)


def test_flash_attn_varlen_func_takes_mla_prefill_head_dims():
    """DeepSeek's unabsorbed prefill through flash-attn's packed call: Q K^T over 192 dims, P V
    over 128, causal, two sequences, forward and backward against float64."""
    import flashattn
    g = torch.Generator().manual_seed(3)
    cu = torch.tensor([0, 37, 117], dtype=torch.int32)
    q = torch.randn(117, 4, 192, generator=g).half().requires_grad_()
    k = torch.randn(117, 2, 192, generator=g).half().requires_grad_()
    v = torch.randn(117, 2, 128, generator=g).half().requires_grad_()
    with flashattn.interpret.enabled():
        o = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 80, 80, causal=True)
        o.float().sum().backward()
    assert o.shape == (117, 4, 128)
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    outs = []
    for s, e in ((0, 37), (37, 117)):
        qq = qd[s:e].transpose(0, 1)
        kk = kd[s:e].transpose(0, 1).repeat_interleave(2, 0)
        vv = vd[s:e].transpose(0, 1).repeat_interleave(2, 0)
        sc = qq @ kk.transpose(-1, -2) / 192 ** 0.5
        sc = sc.masked_fill(torch.ones(e - s, e - s).triu(1).bool(), float("-inf"))
        outs.append((sc.softmax(-1) @ vv).transpose(0, 1))
    ref = torch.cat(outs)
    ref.sum().backward()
    assert (o.double() - ref).abs().max().item() < 4e-3
    for got, want in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        assert (got.double() - want).abs().max().item() < 2e-2 * max(1.0, want.abs().max().item())
    with flashattn.interpret.enabled(), pytest.raises(ValueError, match="value head dim"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 80, 80, causal=True,
                                         window_size=(16, 0))
