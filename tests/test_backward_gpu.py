"""The backward kernels on the GPU against the fp64 reference (``pytest -m gpu``; issue 11).

Pass criterion, as flash-attention's own tests: each gradient's max error against the fp64
reference (``reference.attention_backward``) is at most twice PyTorch's error at the same
precision (autograd through fp16/bf16 math attention) plus a small floor. dQ, dK and dV are
poisoned with NaN before the launch, so an unwritten element fails.

The forward's output and LSE come from the fp64 reference (out rounded to the input dtype, the
LSE to fp32), so these tests measure the backward alone; ``test_with_the_forward_kernel`` and
``test_with_pytorchs_lse`` chain it with flashattn's forward and with PyTorch's LSE.

The matrix (issue 11): causal / non-causal x Hq:Hkv 1:1, 4:1, 8:1, 32:1 x fp16 / bf16 x D 64, 128,
80, 256, every product at lengths 1, 17 and 113; at 1023, 4097 and the Nq != Nk shapes every
(D, dtype) pair with heads and causality rotating. Run with ``-n 8`` (pytest-xdist): each new
set of constants costs seconds of tileiras.
"""
import math

import pytest

import flashbook

torch = pytest.importorskip("torch")

from criteria import seed_of  # noqa: E402

pytestmark = pytest.mark.gpu

CAUSAL = (False, True)
HEADS = ((8, 8), (8, 2), (8, 1), (32, 1))           # (Hq, Hkv): MHA, GQA 4:1, 8:1, MQA 32:1
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 80, 256)
SHORT = ((1, 1, 0), (17, 17, 0), (113, 113, 0))                      # (Nq, Nk, input_pos)
LONG = ((1023, 1023, 0), (4097, 4097, 0), (200, 333, 133), (50, 1000, 950), (300, 301, 0),
        (333, 200, 0))
FLOOR = {"float16": 1e-3, "bfloat16": 8e-3}         # relative to max(1, max |reference|)


def _case(b, hq, hkv, nq, nk, d, dtype, causal, pos):
    return pytest.param(b, hq, hkv, nq, nk, d, dtype, causal, pos,
                        id=f"b{b}-h{hq}:{hkv}-n{nq}:{nk}@{pos}-d{d}-{dtype[:2]}-"
                           f"{'causal' if causal else 'full'}")


def matrix():
    cases = []
    for causal in CAUSAL:
        for hq, hkv in HEADS:
            for dtype in DTYPES:
                for d in HEAD_DIMS:
                    for nq, nk, pos in SHORT:
                        cases.append(_case(2, hq, hkv, nq, nk, d, dtype, causal, pos))
    for li, (nq, nk, pos) in enumerate(LONG):
        for c in range(len(HEAD_DIMS) * len(DTYPES)):
            d, dtype = HEAD_DIMS[c % len(HEAD_DIMS)], DTYPES[c // len(HEAD_DIMS)]
            hq, hkv = HEADS[(c + li) % len(HEADS)]
            causal = bool((c + c // len(HEADS) + li) % 2) or pos > 0
            b = 1 if max(nq, nk) > 2000 else 2
            cases.append(_case(b, hq, hkv, nq, nk, d, dtype, causal, pos))
    return cases


def make_inputs(b, hq, hkv, nq, nk, d, dtype, *, seed, magnitude=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (torch.randn(b, hq, nq, d, generator=g, device="cuda") * magnitude).to(dt)
    k = (torch.randn(b, hkv, nk, d, generator=g, device="cuda") * magnitude).to(dt)
    v = torch.randn(b, hkv, nk, d, generator=g, device="cuda").to(dt)
    dout = torch.randn(b, hq, nq, d, generator=g, device="cuda").to(dt)
    return q, k, v, dout


def _head_chunks(q, k, budget=1 << 30):
    """(kv head, query-head slice) pairs, each slice within one GQA group and small enough
    that its fp64 (B, heads, Nq, Nk) scores take at most ``budget`` bytes."""
    B, Hq, Nq, _ = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    per_head = max(1, B * Nq * Nk * 8)
    n = max(1, min(G, budget // per_head))
    return [(h, slice(h * G + g0, h * G + min(g0 + n, G))) for h in range(Hkv)
            for g0 in range(0, G, n)]


def reference(q, k, v, dout, causal, scale, pos):
    """fp64 out, LSE and exact (dq, dk, dv), over chunks of query heads (bounded memory)."""
    from flashattn import reference as R
    f64 = [t.double() for t in (q, k, v, dout)]
    q64, k64, v64, do64 = f64
    out = torch.empty_like(q64)
    lse = torch.empty(q.shape[:3], dtype=torch.float64, device=q.device)
    dq, dk, dv = torch.empty_like(q64), torch.zeros_like(k64), torch.zeros_like(v64)
    kw = dict(causal=causal, scale=scale, input_pos=pos)
    for h, heads in _head_chunks(q, k):
        kh, vh = k64[:, h:h + 1], v64[:, h:h + 1]
        out[:, heads] = R.attention(q64[:, heads], kh, vh, **kw)
        lse[:, heads] = R.attention_lse(q64[:, heads], kh, **kw)
        gq, gk, gv = R.attention_backward(q64[:, heads], kh, vh, do64[:, heads], **kw)
        dq[:, heads] = gq
        dk[:, h:h + 1] += gk
        dv[:, h:h + 1] += gv
    return out, lse, (dq, dk, dv)


def torch_same_precision(q, k, v, dout, causal, scale, pos):
    """PyTorch's gradients computed in the inputs' precision: autograd through math attention
    in fp16/bf16 (the error budget's yardstick). Chunked like ``reference``; the group sums of
    dK and dV are accumulated in fp32 and rounded once, as autograd's expand backward does."""
    nq, nk = q.shape[2], k.shape[2]
    dq = torch.empty_like(q)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    for h, heads in _head_chunks(q, k):
        qc = q[:, heads].detach().requires_grad_()
        kc = k[:, h:h + 1].detach().requires_grad_()
        vc = v[:, h:h + 1].detach().requires_grad_()
        n = qc.shape[1]
        s = (qc @ kc.expand(-1, n, -1, -1).transpose(-1, -2)) * scale
        if causal:
            rows = torch.arange(nq, device=q.device)[:, None] + pos
            s = s.masked_fill(torch.arange(nk, device=q.device)[None, :] > rows, -math.inf)
        o = torch.softmax(s, dim=-1) @ vc.expand(-1, n, -1, -1)
        o.backward(dout[:, heads])
        dq[:, heads] = qc.grad
        dk[:, h:h + 1] += kc.grad.float()
        dv[:, h:h + 1] += vc.grad.float()
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def run_backward(q, k, v, out, dout, lse, causal, scale, pos, **kw):
    """attention_backward into NaN-poisoned gradients."""
    from flashattn.launch_bwd import attention_backward
    grads = tuple(torch.full_like(t, math.nan).contiguous() for t in (q, k, v))
    res = attention_backward(q, k, v, out, dout, lse, causal=causal, scale=scale,
                             input_pos=pos, grads=grads, **kw)
    torch.cuda.synchronize()
    assert all(r is g for r, g in zip(res, grads))
    return res


def check(grads, ref, pt, dtype, *, seed):
    """Each gradient: no NaN/inf, and max error <= 2 x PyTorch's + floor. Returns the ratios."""
    ratios = {}
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref, pt):
        nan = torch.isnan(g).sum().item()
        assert nan == 0, f"seed {seed}: {name} has {nan} NaN (unwritten?) elements"
        assert torch.isfinite(g).all(), f"seed {seed}: {name} has infinite elements"
        err = (g.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        floor = FLOOR[dtype] * max(1.0, r.abs().max().item())
        assert err <= 2 * err_pt + floor, \
            f"seed {seed}: {name} max error {err:.3g} > 2 x torch {err_pt:.3g} + {floor:.3g}"
        ratios[name] = err / max(err_pt, 1e-12)
    return ratios


@pytest.mark.parametrize("b,hq,hkv,nq,nk,d,dtype,causal,pos", matrix())
def test_backward_matches_reference(b, hq, hkv, nq, nk, d, dtype, causal, pos, request,
                                    record_property):
    seed = seed_of(request.node.callspec.id)
    q, k, v, dout = make_inputs(b, hq, hkv, nq, nk, d, dtype, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out, lse, ref = reference(q, k, v, dout, causal, scale, pos)
    grads = run_backward(q, k, v, out.to(q.dtype), dout, lse.float(), causal, scale, pos)
    pt = torch_same_precision(q, k, v, dout, causal, scale, pos)
    ratios = check(grads, ref, pt, dtype, seed=seed)
    record_property("seed", seed)
    for name, r in ratios.items():
        record_property(f"err_ratio_{name}", r)


def atomic_matrix():
    """The opt-in atomics variant: every Hq:Hkv, both dtypes, D 64/80/128/256, causal and not,
    at ragged lengths and one Nq != Nk shape."""
    cases = []
    for c, (hq, hkv) in enumerate(HEADS):
        for dtype in DTYPES:
            d = HEAD_DIMS[(c + len(dtype)) % len(HEAD_DIMS)]
            for causal in CAUSAL:
                cases.append(_case(2, hq, hkv, 113 + 900 * c % 1000, 113 + 900 * c % 1000, d,
                                   dtype, causal, 0))
    cases.append(_case(1, 8, 2, 200, 333, 128, "float16", True, 133))
    cases.append(_case(1, 8, 8, 4097, 4097, 128, "bfloat16", True, 0))
    return cases


@pytest.mark.parametrize("b,hq,hkv,nq,nk,d,dtype,causal,pos", atomic_matrix())
def test_atomic_dq_variant_matches_reference(b, hq, hkv, nq, nk, d, dtype, causal, pos,
                                             request, record_property):
    seed = seed_of(request.node.callspec.id)
    q, k, v, dout = make_inputs(b, hq, hkv, nq, nk, d, dtype, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out, lse, ref = reference(q, k, v, dout, causal, scale, pos)
    grads = run_backward(q, k, v, out.to(q.dtype), dout, lse.float(), causal, scale, pos,
                         deterministic=False)
    pt = torch_same_precision(q, k, v, dout, causal, scale, pos)
    ratios = check(grads, ref, pt, dtype, seed=seed)
    for name, r in ratios.items():
        record_property(f"err_ratio_{name}", r)


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits_stay_finite(causal):
    # Logits of several hundred: P is recomputed from the LSE, so it stays in [0, 1].
    seed = 7
    q, k, v, dout = make_inputs(1, 4, 2, 256, 256, 64, "float16", seed=seed, magnitude=6.0)
    scale = 1.0 / math.sqrt(64)
    out, lse, ref = reference(q, k, v, dout, causal, scale, 0)
    grads = run_backward(q, k, v, out.half(), dout, lse.float(), causal, scale, 0)
    pt = torch_same_precision(q, k, v, dout, causal, scale, 0)
    for g in grads:
        assert torch.isfinite(g).all(), f"seed {seed}: infinite gradients"
    check(grads, ref, pt, "float16", seed=seed)


def test_ragged_keys_with_very_negative_logits():
    # Every score very negative, so is the LSE: an unmasked padded key would give P = inf.
    seed = 8
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.full((1, 2, 40, 64), 2.0, device="cuda").half()
    k = (torch.randn(1, 2, 77, 64, generator=g, device="cuda") - 2.0).half()
    v = torch.randn(1, 2, 77, 64, generator=g, device="cuda").half()
    dout = torch.randn(1, 2, 40, 64, generator=g, device="cuda").half()
    out, lse, ref = reference(q, k, v, dout, False, 0.5, 0)
    assert lse.max().item() < -50
    grads = run_backward(q, k, v, out.half(), dout, lse.float(), False, 0.5, 0)
    pt = torch_same_precision(q, k, v, dout, False, 0.5, 0)
    check(grads, ref, pt, "float16", seed=seed)


def test_preprocess_writes_every_delta():
    import cuda.tile as ct

    from flashattn.kernels import hinted
    from flashattn.dispatch import device_arch
    from flashattn.launch_bwd import backward_launches
    q, k, v, dout = make_inputs(2, 4, 2, 77, 90, 80, "bfloat16", seed=9)
    out = torch.randn_like(q)
    lse = torch.zeros(q.shape[:3], device="cuda")
    delta = torch.full(q.shape[:3], math.nan, device="cuda")
    pre = backward_launches(q, k, v, out, dout, lse, delta, q, k, v, causal=False, scale=0.1,
                            input_pos=0, arch=device_arch(q.device))[0]
    assert pre.spec.name == "bwd_preprocess"
    ct.launch(torch.cuda.current_stream(), pre.grid, hinted(pre.spec.kernel(), pre.hints),
              pre.args)
    torch.cuda.synchronize()
    want = (out.double() * dout.double()).sum(-1)
    assert not torch.isnan(delta).any()
    assert (delta.double() - want).abs().max().item() < 1e-3 * max(1.0, want.abs().max().item())


def test_deterministic():
    q, k, v, dout = make_inputs(2, 8, 2, 300, 300, 128, "float16", seed=10)
    out, lse, _ = reference(q, k, v, dout, True, 128 ** -0.5, 0)
    a = run_backward(q, k, v, out.half(), dout, lse.float(), True, 128 ** -0.5, 0)
    b = run_backward(q, k, v, out.half(), dout, lse.float(), True, 128 ** -0.5, 0)
    for x, y in zip(a, b):
        assert torch.equal(x, y), "the backward is not bitwise deterministic"


def test_noncontiguous_inputs_and_scale():
    # (B, N, H, D) memory viewed as (B, H, N, D): not contiguous.
    seed = 11
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, dout = (torch.randn(2, 77, 8, 64, generator=g, device="cuda").half().transpose(1, 2)
               for _ in range(2))
    k, v = (torch.randn(2, 90, 2, 64, generator=g, device="cuda").half().transpose(1, 2)
            for _ in range(2))
    assert not q.is_contiguous()
    out, lse, ref = reference(q, k, v, dout, True, 0.3, 13)
    out = out.half().transpose(1, 2).contiguous().transpose(1, 2)         # also strided
    grads = run_backward(q, k, v, out, dout, lse.float(), True, 0.3, 13)
    pt = torch_same_precision(q, k, v, dout, True, 0.3, 13)
    check(grads, ref, pt, "float16", seed=seed)


def test_empty_inputs():
    from flashattn.launch_bwd import attention_backward
    q = torch.randn(1, 4, 0, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 2, 5, 64, device="cuda", dtype=torch.float16)
    lse = torch.zeros(1, 4, 0, device="cuda")
    dq, dk, dv = attention_backward(q, k, k, q, q, lse, causal=True)
    assert dq.shape == q.shape and dk.shape == k.shape
    assert (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("causal", [False, True])
def test_with_the_forward_kernel(causal):
    """The real chain: flashattn.attention's output (fp16), an fp32 LSE, the backward."""
    import flashattn
    seed = 12
    q, k, v, dout = make_inputs(2, 8, 2, 500, 500, 128, "float16", seed=seed)
    scale = 128 ** -0.5
    out = flashbook.attention(q, k, v, causal=causal, step="baseline")
    _, lse, ref = reference(q, k, v, dout, causal, scale, 0)
    grads = run_backward(q, k, v, out, dout, lse.float(), causal, scale, 0)
    pt = torch_same_precision(q, k, v, dout, causal, scale, 0)
    check(grads, ref, pt, "float16", seed=seed)


def test_with_pytorchs_lse():
    """The LSE convention is PyTorch's: its flash kernel's logsumexp works as ``lse``."""
    seed = 13
    q, k, v, dout = make_inputs(2, 4, 4, 256, 256, 64, "float16", seed=seed)
    try:
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False,
                                                                 scale=0.125)
    except (RuntimeError, AttributeError, TypeError) as e:   # not built with flash attention
        pytest.skip(f"PyTorch's flash attention is unavailable: {e}")
    out, lse = res[0], res[1]
    assert lse.shape == (2, 4, 256) and lse.dtype == torch.float32
    _, lse_ref, ref = reference(q, k, v, dout, True, 0.125, 0)
    assert (lse.double() - lse_ref).abs().max().item() < 1e-2
    grads = run_backward(q, k, v, out, dout, lse, True, 0.125, 0)
    pt = torch_same_precision(q, k, v, dout, True, 0.125, 0)
    check(grads, ref, pt, "float16", seed=seed)


@pytest.mark.parametrize("bad_lse", [-math.inf, math.inf])
def test_rows_that_see_no_key(bad_lse):
    """LSE -inf (or +inf) marks a row that sees no key: its dQ is 0 and it adds nothing to dK
    and dV, even with a NaN output row (the forward's 0 / 0)."""
    seed = 14
    q, k, v, dout = make_inputs(1, 4, 2, 200, 230, 64, "float16", seed=seed)
    out, lse, _ = reference(q, k, v, dout, True, 0.125, 30)
    out, lse = out.half(), lse.float()
    rows = [0, 63, 64, 199]
    lse[:, 1, rows] = bad_lse
    out[:, 1, rows] = math.nan
    do0 = dout.clone()
    do0[:, 1, rows] = 0
    _, _, ref = reference(q, k, v, do0, True, 0.125, 30)
    pt = torch_same_precision(q, k, v, do0, True, 0.125, 30)
    grads = run_backward(q, k, v, out, dout, lse, True, 0.125, 30)
    check(grads, ref, pt, "float16", seed=seed)
    assert (grads[0][:, 1, rows] == 0).all()
