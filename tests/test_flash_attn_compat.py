"""flash-attn's own tests, rewritten around ``flashattn.flash_attn_interface``.

The families of flash-attention's ``tests/test_flash_attn.py`` (``test_flash_attn_output``,
``test_flash_attn_causal``, ``test_flash_attn_varlen_output``, ``test_flash_attn_varlen_causal``,
``test_flash_attn_kvcache``) and FlashAttention-3's FP8 rows (``hopper/test_flash_attn.py``,
``test_flash_attn_output`` with float8_e4m3fn), each with flash-attn's reference semantics
(``attention_ref`` below is written here: upcast fp32 attention with bottom-right causal and local
masks, ALiBi, softcap, padding masks) and its tolerance rule kept: the kernel's max error against
the fp32 reference is at most a multiple (2 or 3; FA3's FP8: 2 plus its ``fwd_atol``) of the
error of the same attention computed by PyTorch in the input dtype with the operations reordered.

Where it runs: the CPU interpreter at small shapes (each family's CPU rows), and ``-m gpu`` at
flash-attn's own shapes (the ``*_gpu`` tests). A case flashattn does not support (dropout,
``cache_leftpad``) is checked to raise NotImplementedError and then skipped with
``UNSUPPORTED`` in its reason, so ``pytest -rs`` counts them per family.
"""
import itertools
import math
from contextlib import nullcontext

import pytest
import torch

import flashattn
from flashattn import flash_attn_interface as fai

pytestmark = pytest.mark.usefixtures("one_thread")
UNSUPPORTED = "UNSUPPORTED by flashattn"


# --- the reference (flash-attn's semantics, written here) -------------------------------------
def padding_mask(max_len, batch, device, *, gen=None):
    """Random lengths in [max(1, max_len - 20), max_len], as flash-attn's "random" mode."""
    lengths = torch.randint(max(1, max_len - 20), max_len + 1, (batch, 1), device=device)
    return torch.arange(max_len, device=device)[None] < lengths


def effective_lengths(mask, full):
    return full if mask is None else mask.sum(-1).view(-1, 1, 1, 1)


def local_mask(sq, sk, window, q_mask=None, k_mask=None, device=None):
    """True where query row i may NOT see key j: flash-attn's local window, bottom-right."""
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(sk, device=device)
    lk, lq = effective_lengths(k_mask, sk), effective_lengths(q_mask, sq)
    pos = i + lk - lq
    left, right = int(window[0]), int(window[1])
    if left < 0:
        return j > pos + right
    hi = torch.minimum(pos + right, lk if k_mask is not None else torch.full_like(j, sk))
    return (j > hi) | (j < pos - left)


def alibi_bias(slopes, sq, sk, q_mask=None, k_mask=None, causal=False):
    s = slopes.view(*slopes.shape, 1, 1)
    if causal:      # a per-row constant away from -|i - j'|: softmax does not see it
        return torch.arange(-sk + 1, 1, device=slopes.device, dtype=torch.float32) * s
    i = torch.arange(sq, device=slopes.device).view(-1, 1)
    j = torch.arange(sk, device=slopes.device)
    rel = (i + effective_lengths(k_mask, sk) - effective_lengths(q_mask, sq) - j).abs()
    return -s * rel.to(torch.float32)


def attention_ref(q, k, v, q_mask=None, k_mask=None, bias=None, *, causal=False,
                  window=(-1, -1), softcap=0.0, upcast=True, reorder_ops=False,
                  descales=None, intermediate_dtype=None):
    """(B, Sq, H, D) attention with flash-attn's masks: fp32 when ``upcast``, else in the input
    dtype with the scale moved onto k (the "PyTorch" error estimate of flash-attn's tests)."""
    if causal:
        window = (int(window[0]), 0)
    dtype = q.dtype
    if upcast:
        q, k, v = q.float(), k.float(), v.float()
    if descales is not None:
        qd, kd, vd = descales
        g = q.shape[2] // k.shape[2]
        q = (q.float() * qd.repeat_interleave(g, 1)[:, None, :, None]).to(q.dtype)
        k = (k.float() * kd[:, None, :, None]).to(k.dtype)
        v = (v.float() * vd[:, None, :, None]).to(v.dtype)
    sq, sk = q.shape[1], k.shape[1]
    g = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(g, dim=2)
    v = v.repeat_interleave(g, dim=2)
    d = q.shape[-1]
    if reorder_ops:
        scores = torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(d))
    else:
        scores = torch.einsum("bthd,bshd->bhts", q / math.sqrt(d), k)
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if k_mask is not None:
        scores = scores.masked_fill(~k_mask[:, None, None, :], float("-inf"))
    lm = None
    if window[0] >= 0 or window[1] >= 0:
        lm = local_mask(sq, sk, window, q_mask, k_mask, q.device)
        scores = scores.masked_fill(lm, float("-inf"))
    if bias is not None:
        scores = scores + bias
    p = torch.softmax(scores, dim=-1).to(v.dtype)
    if lm is not None:
        p = p.masked_fill(lm.all(dim=-1, keepdim=True), 0.0)
    if q_mask is not None:
        p = p.masked_fill(~q_mask[:, None, :, None], 0.0)
    if intermediate_dtype is not None:
        p = p.to(intermediate_dtype).to(p.dtype)
    out = torch.einsum("bhts,bshd->bthd", p, v)
    if q_mask is not None:
        out = out.masked_fill(~q_mask[:, :, None, None], 0.0)
    return out.to(dtype)


def unpad(x, mask):
    """(B, S, ...) and a (B, S) mask -> (total, ...), cu_seqlens int32, max length, indices."""
    lengths = mask.sum(-1, dtype=torch.int32)
    idx = torch.nonzero(mask.flatten()).flatten()
    cu = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    return x.flatten(0, 1)[idx], cu, int(lengths.max()), idx


def pad(x, idx, batch, seqlen):
    out = x.new_zeros((batch * seqlen,) + tuple(x.shape[1:]))
    out = out.index_put((idx,), x)
    return out.view(batch, seqlen, *x.shape[1:])


def rotary_ref(x, cos, sin, offsets, interleaved):
    """flash-attn's apply_rotary_emb with seqlen_offsets (B,): position offsets[b] + t."""
    B, S = x.shape[:2]
    rd = 2 * cos.shape[1]
    if rd == 0:
        return x
    pos = offsets.long()[:, None] + torch.arange(S, device=x.device)
    c = cos[pos].float().unsqueeze(2)
    s = sin[pos].float().unsqueeze(2)
    xr = x[..., :rd].float()
    if interleaved:
        a, b = xr[..., 0::2], xr[..., 1::2]
        r = torch.stack([a * c - b * s, a * s + b * c], -1).flatten(-2)
    else:
        a, b = xr.chunk(2, dim=-1)
        r = torch.cat([a * c - b * s, a * s + b * c], -1)
    return torch.cat([r.to(x.dtype), x[..., rd:]], -1)


def check(out, ref, pt, mult, atol=0.0, what="output"):
    err = (out.float() - ref.float()).abs().max().item()
    bound = mult * (pt.float() - ref.float()).abs().max().item() + atol
    assert err <= bound, (f"{what}: max error {err:.3g} > {mult} x PyTorch's + {atol:.3g} = "
                          f"{bound:.3g}")


def _ctx(device):
    return flashattn.interpret.enabled() if device == "cpu" else nullcontext()


def _heads(mha_type, nheads):
    return nheads if mha_type == "mha" else (1 if mha_type == "mqa" else 2)


def _output_setup(seqlen_q, seqlen_k, d, dropout_p, local, mha_type, dtype, softcap, device,
                  batch_size, nheads):
    """flash-attn's output tests' common start: the skip, the seed, the heads, the window and
    q (scaled up under softcap), drawn in flash-attn's order."""
    if softcap > 0.0 and dropout_p > 0.0:
        pytest.skip("Softcap and dropout not supported together (as flash-attn)")
    torch.random.manual_seed(0)
    nheads = nheads if softcap == 0.0 else max(2, nheads - 2)
    nheads_k = _heads(mha_type, nheads)
    window = (-1, -1) if not local else torch.randint(0, seqlen_k, (2,))
    q = torch.randn(batch_size, seqlen_q, nheads, d, device=device, dtype=dtype)
    if softcap > 0:
        q = q * softcap
    return nheads, nheads_k, window, q


# --- test_flash_attn_output ----------------------------------------------------------------
def run_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, deterministic, mha_type,
               dtype, kvpacked, softcap, device, batch_size, nheads):
    nheads, nheads_k, window, q = _output_setup(seqlen_q, seqlen_k, d, dropout_p, local,
                                                mha_type, dtype, softcap, device, batch_size,
                                                nheads)
    q = q.detach().requires_grad_()
    if kvpacked:
        kv = torch.randn(batch_size, seqlen_k, 2, nheads_k, d, device=device, dtype=dtype,
                         requires_grad=True)
        k, v = kv[:, :, 0], kv[:, :, 1]
    else:
        k = torch.randn(batch_size, seqlen_k, nheads_k, d, device=device, dtype=dtype,
                        requires_grad=True)
        v = torch.randn(batch_size, seqlen_k, nheads_k, d, device=device, dtype=dtype,
                        requires_grad=True)
    slopes = torch.rand(batch_size, nheads, device=device) * 0.3 if alibi else None
    bias = alibi_bias(slopes, seqlen_q, seqlen_k, causal=causal) if alibi else None
    kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
              deterministic=deterministic, return_attn_probs=True)
    with _ctx(device):
        if dropout_p > 0.0:
            with pytest.raises(NotImplementedError, match="dropout"):
                fai.flash_attn_func(q, k, v, dropout_p, **kw)
            pytest.skip(f"{UNSUPPORTED}: dropout (NotImplementedError raised)")
        if kvpacked:
            out, lse, s_dmask = fai.flash_attn_kvpacked_func(q, kv, dropout_p, **kw)
        else:
            out, lse, s_dmask = fai.flash_attn_func(q, k, v, dropout_p, **kw)
        assert s_dmask is None and lse.shape == (batch_size, nheads, seqlen_q)
        ref = attention_ref(q, k, v, None, None, bias, causal=causal, window=window,
                            softcap=softcap)
        pt = attention_ref(q, k, v, None, None, bias, causal=causal, window=window,
                           softcap=softcap, upcast=False, reorder_ops=True)
        g = torch.randn_like(out)
        leaves = (q, kv) if kvpacked else (q, k, v)
        grads = torch.autograd.grad(out, leaves, g)
    grads_ref = torch.autograd.grad(ref, leaves, g)
    grads_pt = torch.autograd.grad(pt, leaves, g)
    check(out, ref, pt, 2)
    for name, a, b, c in zip(("dq", "dkv" if kvpacked else "dk", "dv"), grads, grads_ref,
                             grads_pt):
        check(a, b, c, 3, what=name)
    if not alibi and not local:
        # The LSE (natural log) against the fp32 reference's, where rows see a key.
        qf, kf = q.float(), k.float().repeat_interleave(nheads // nheads_k, 2)
        s = torch.einsum("bthd,bshd->bhts", qf / math.sqrt(d), kf)
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        if causal:
            s = s.masked_fill(local_mask(seqlen_q, seqlen_k, (-1, 0), device=device),
                              float("-inf"))
        lse_ref = torch.logsumexp(s, -1)
        seen = torch.isfinite(lse_ref)
        assert torch.allclose(lse[seen], lse_ref[seen], atol=2e-2, rtol=1e-3)
        assert (lse[~seen] == math.inf).all()


OUTPUT_CPU = [
    # (seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, deterministic, mha, dtype,
    #  kvpacked, softcap): every mask/score combination once, head types and dtypes rotated
    (sq, sk, d, 0.0, causal, local, alibi, False, mha, dt, kvp, softcap)
    for n, (causal, local, alibi, softcap) in enumerate(
        itertools.product([False, True], [False, True], [False, True], [0.0, 50.0]))
    for sq, sk, d, mha, dt, kvp in [
        ((113, 203, 59, "mha", torch.float16, False), (128, 80, 64, "gqa", torch.bfloat16, True),
         (77, 77, 32, "mqa", torch.float16, False))[n % 3]]
] + [(113, 203, 64, 0.17, False, False, False, False, "mha", torch.float16, False, 0.0),
     (113, 203, 64, 0.17, True, True, True, True, "gqa", torch.bfloat16, False, 0.0)]


@pytest.mark.parametrize("seqlen_q,seqlen_k,d,dropout_p,causal,local,alibi,deterministic,"
                         "mha_type,dtype,kvpacked,softcap", OUTPUT_CPU)
def test_flash_attn_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, deterministic,
                           mha_type, dtype, kvpacked, softcap):
    run_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, deterministic, mha_type,
               dtype, kvpacked, softcap, "cpu", batch_size=2, nheads=4)


@pytest.mark.gpu
@pytest.mark.parametrize("softcap", [0.0, 50.0])
@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(113, 203), (1023, 1024)])
@pytest.mark.parametrize("d", [59, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("mha_type", ["mha", "gqa"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kvpacked", [False])
def test_flash_attn_output_gpu(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, mha_type,
                               dtype, kvpacked, softcap):
    run_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, False, mha_type, dtype,
               kvpacked, softcap, "cuda", batch_size=4, nheads=6)


# --- test_flash_attn_causal ----------------------------------------------------------------
def run_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, dtype, device, batch_size, nheads):
    if swap_sq_sk:
        seqlen_q, seqlen_k = seqlen_k, seqlen_q
    torch.random.manual_seed(0)
    window = (-1, -1) if not local else torch.randint(0, seqlen_k, (2,))
    q, k, v = (torch.randn(batch_size, n, nheads, d, device=device, dtype=dtype,
                           requires_grad=True) for n in (seqlen_q, seqlen_k, seqlen_k))
    with _ctx(device):
        out = fai.flash_attn_func(q, k, v, 0.0, causal=True, window_size=window)
        g = torch.randn_like(out)
        grads = torch.autograd.grad(out, (q, k, v), g)
    ref = attention_ref(q, k, v, causal=True, window=window)
    pt = attention_ref(q, k, v, causal=True, window=window, upcast=False, reorder_ops=True)
    check(out, ref, pt, 2, 1e-5)
    for name, a, b, c in zip(("dq", "dk", "dv"), grads, torch.autograd.grad(ref, (q, k, v), g),
                             torch.autograd.grad(pt, (q, k, v), g)):
        check(a, b, c, 2, 1e-5, what=name)


@pytest.mark.parametrize("seqlen_q,seqlen_k,swap_sq_sk,d,local,dtype", [
    (1, 239, False, 64, False, torch.float16), (1, 239, True, 59, True, torch.bfloat16),
    (3, 99, True, 32, False, torch.float16), (127, 130, False, 64, True, torch.float16),
    (113, 203, True, 40, False, torch.bfloat16), (108, 256, False, 128, True, torch.float16)])
def test_flash_attn_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, dtype):
    run_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, dtype, "cpu", batch_size=2, nheads=3)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 239), (3, 799), (127, 512), (127, 513),
                                               (113, 203), (128, 217), (108, 256), (256, 512),
                                               (1023, 1024)])
@pytest.mark.parametrize("swap_sq_sk", [False, True])
@pytest.mark.parametrize("d", [40, 59, 128, 256])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attn_causal_gpu(seqlen_q, seqlen_k, swap_sq_sk, d, local, dtype):
    run_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, dtype, "cuda", batch_size=8, nheads=9)


# --- test_flash_attn_varlen_output --------------------------------------------------------------
def run_varlen_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, mha_type, dtype,
                      softcap, device, batch_size, nheads):
    nheads, nheads_k, window, q = _output_setup(seqlen_q, seqlen_k, d, dropout_p, local,
                                                mha_type, dtype, softcap, device, batch_size,
                                                nheads)
    k = torch.randn(batch_size, seqlen_k, nheads_k, d, device=device, dtype=dtype)
    v = torch.randn(batch_size, seqlen_k, nheads_k, d, device=device, dtype=dtype)
    qm = padding_mask(seqlen_q, batch_size, device)
    km = padding_mask(seqlen_k, batch_size, device)
    slopes = torch.rand(batch_size, nheads, device=device) * 0.3 if alibi else None
    bias = alibi_bias(slopes, seqlen_q, seqlen_k, qm, km, causal=causal) if alibi else None
    q_u, cu_q, max_q, idx_q = unpad(q, qm)
    k_u, cu_k, max_k, idx_k = unpad(k, km)
    v_u = unpad(v, km)[0]
    q_u, k_u, v_u = (t.detach().requires_grad_() for t in (q_u, k_u, v_u))
    kw = dict(causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes,
              return_attn_probs=True)
    with _ctx(device):
        if dropout_p > 0.0:
            with pytest.raises(NotImplementedError, match="dropout"):
                fai.flash_attn_varlen_func(q_u, k_u, v_u, cu_q, cu_k, max_q, max_k, dropout_p,
                                           **kw)
            pytest.skip(f"{UNSUPPORTED}: dropout (NotImplementedError raised)")
        out_u, lse, s_dmask = fai.flash_attn_varlen_func(q_u, k_u, v_u, cu_q, cu_k, max_q, max_k,
                                                         dropout_p, **kw)
        assert s_dmask is None and lse.shape == (nheads, q_u.shape[0])
        g_u = torch.randn_like(out_u)
        grads = torch.autograd.grad(out_u, (q_u, k_u, v_u), g_u)
    out = pad(out_u, idx_q, batch_size, seqlen_q)
    qr, kr, vr = (pad(t.detach(), i, batch_size, n).requires_grad_()
                  for t, i, n in ((q_u, idx_q, seqlen_q), (k_u, idx_k, seqlen_k),
                                  (v_u, idx_k, seqlen_k)))
    ref = attention_ref(qr, kr, vr, qm, km, bias, causal=causal, window=window, softcap=softcap)
    pt = attention_ref(qr, kr, vr, qm, km, bias, causal=causal, window=window, softcap=softcap,
                       upcast=False, reorder_ops=True)
    check(out, ref, pt, 2)
    g = pad(g_u, idx_q, batch_size, seqlen_q)
    for name, a, i, n, b, c in zip(("dq", "dk", "dv"), grads, (idx_q, idx_k, idx_k),
                                   (seqlen_q, seqlen_k, seqlen_k),
                                   torch.autograd.grad(ref, (qr, kr, vr), g),
                                   torch.autograd.grad(pt, (qr, kr, vr), g)):
        check(pad(a, i, batch_size, n), b, c, 3, what=name)


VARLEN_CPU = [
    (sq, sk, d, 0.0, causal, local, alibi, mha, dt, softcap)
    for n, (causal, local, alibi, softcap) in enumerate(
        itertools.product([False, True], [False, True], [False, True], [0.0, 50.0]))
    for sq, sk, d, mha, dt in [((1, 147, 64, "mha", torch.float16),
                                (113, 203, 59, "gqa", torch.bfloat16),
                                (128, 80, 32, "mqa", torch.float16))[n % 3]]
] + [(113, 203, 64, 0.17, True, False, False, "mha", torch.float16, 0.0)]


@pytest.mark.parametrize("seqlen_q,seqlen_k,d,dropout_p,causal,local,alibi,mha_type,dtype,"
                         "softcap", VARLEN_CPU)
def test_flash_attn_varlen_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi,
                                  mha_type, dtype, softcap):
    run_varlen_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, mha_type, dtype,
                      softcap, "cpu", batch_size=3, nheads=4)


@pytest.mark.gpu
@pytest.mark.parametrize("softcap", [0.0, 50.0])
@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 147), (113, 203), (1023, 1024)])
@pytest.mark.parametrize("d", [128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("mha_type", ["mha", "gqa"])
@pytest.mark.parametrize("dtype", [torch.bfloat16])
def test_flash_attn_varlen_output_gpu(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi,
                                      mha_type, dtype, softcap):
    run_varlen_output(seqlen_q, seqlen_k, d, dropout_p, causal, local, alibi, mha_type, dtype,
                      softcap, "cuda", batch_size=4, nheads=6)


# --- test_flash_attn_varlen_causal (paged K/V included) -----------------------------------------
def block_kvcache(seqlen_k, page, batch, nheads_k, d, device, dtype):
    """A paged cache of random pages, its table, and the contiguous view of it."""
    num_blocks = math.ceil(seqlen_k / page) * batch * 3
    kp = torch.randn(num_blocks, page, nheads_k, d, device=device, dtype=dtype)
    vp = torch.randn(num_blocks, page, nheads_k, d, device=device, dtype=dtype)
    table = torch.randperm(num_blocks, dtype=torch.int32, device=device).view(batch, -1)
    flat = table.long().flatten()
    k = kp[flat].view(batch, -1, nheads_k, d)[:, :seqlen_k]
    v = vp[flat].view(batch, -1, nheads_k, d)[:, :seqlen_k]
    return k, v, table, kp, vp, num_blocks


def run_varlen_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, paged, dtype, device,
                      batch_size, nheads):
    if swap_sq_sk:
        seqlen_q, seqlen_k = seqlen_k, seqlen_q
    torch.random.manual_seed(0)
    window = (-1, -1) if not local else torch.randint(0, seqlen_k, (2,))
    q = torch.randn(batch_size, seqlen_q, nheads, d, device=device, dtype=dtype)
    if paged is None:
        k = torch.randn(batch_size, seqlen_k, nheads, d, device=device, dtype=dtype)
        v = torch.randn(batch_size, seqlen_k, nheads, d, device=device, dtype=dtype)
        table = None
    else:
        k, v, table, kp, vp, _ = block_kvcache(seqlen_k, paged, batch_size, nheads, d, device,
                                               dtype)
    qm = padding_mask(seqlen_q, batch_size, device)
    km = padding_mask(seqlen_k, batch_size, device)
    q_u, cu_q, max_q, idx_q = unpad(q, qm)
    k_u, cu_k, max_k, idx_k = unpad(k, km)
    v_u = unpad(v, km)[0]
    q_u, k_u, v_u = (t.detach().requires_grad_() for t in (q_u, k_u, v_u))
    with _ctx(device):
        out_u = fai.flash_attn_varlen_func(q_u, k_u if paged is None else kp,
                                           v_u if paged is None else vp, cu_q, cu_k, max_q,
                                           max_k, 0.0, causal=True, window_size=window,
                                           block_table=table)
        g_u = torch.randn_like(out_u)
        grads = torch.autograd.grad(out_u, (q_u, k_u, v_u), g_u) if paged is None else None
    out = pad(out_u, idx_q, batch_size, seqlen_q)
    qr, kr, vr = (pad(t.detach(), i, batch_size, n).requires_grad_()
                  for t, i, n in ((q_u, idx_q, seqlen_q), (k_u, idx_k, seqlen_k),
                                  (v_u, idx_k, seqlen_k)))
    ref = attention_ref(qr, kr, vr, qm, km, causal=True, window=window)
    pt = attention_ref(qr, kr, vr, qm, km, causal=True, window=window, upcast=False,
                       reorder_ops=True)
    check(out, ref, pt, 2, 1e-5)
    if grads is not None:
        g = pad(g_u, idx_q, batch_size, seqlen_q)
        for name, a, i, n, b, c in zip(("dq", "dk", "dv"), grads, (idx_q, idx_k, idx_k),
                                       (seqlen_q, seqlen_k, seqlen_k),
                                       torch.autograd.grad(ref, (qr, kr, vr), g),
                                       torch.autograd.grad(pt, (qr, kr, vr), g)):
            check(pad(a, i, batch_size, n), b, c, 2, 1e-5, what=name)


@pytest.mark.parametrize("seqlen_q,seqlen_k,swap_sq_sk,d,local,paged,dtype", [
    (1, 239, False, 64, False, None, torch.float16), (3, 99, True, 59, True, None, torch.bfloat16),
    (127, 130, False, 64, False, 256, torch.float16), (113, 203, True, 32, True, 256,
                                                        torch.float16),
    (108, 256, False, 128, True, None, torch.bfloat16)])
def test_flash_attn_varlen_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, paged, dtype):
    run_varlen_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, paged, dtype, "cpu",
                      batch_size=3, nheads=3)


@pytest.mark.gpu
@pytest.mark.parametrize("paged", [None, 256])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 239), (3, 799), (127, 512), (127, 513),
                                               (113, 203), (128, 217), (108, 256), (256, 512),
                                               (1023, 1024)])
@pytest.mark.parametrize("swap_sq_sk", [False, True])
@pytest.mark.parametrize("d", [59, 128])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attn_varlen_causal_gpu(seqlen_q, seqlen_k, swap_sq_sk, d, local, paged, dtype):
    run_varlen_causal(seqlen_q, seqlen_k, swap_sq_sk, d, local, paged, dtype, "cuda",
                      batch_size=8, nheads=9)


# --- test_flash_attn_kvcache ---------------------------------------------------------------------
def run_kvcache(seqlen_q, seqlen_k, d, has_batch_idx, has_leftpad, paged, rotary_fraction,
                rotary_interleaved, seqlen_new_eq_seqlen_q, causal, local, alibi, new_kv,
                mha_type, num_splits, dtype, device, nheads=6):
    if seqlen_q > seqlen_k and new_kv:
        pytest.skip("as flash-attn: seqlen_q > seqlen_k with new keys")
    if not new_kv and rotary_fraction > 0.0:
        pytest.skip("as flash-attn: rotary only with new keys")
    if (has_batch_idx or has_leftpad) and paged is not None:
        pytest.skip("as flash-attn: batch index / left padding with a contiguous cache only")
    torch.random.manual_seed(0)
    batch_size = 2
    batch_cache = batch_size if not has_batch_idx else batch_size * 2
    rotary_dim = math.floor(int(rotary_fraction * d) / 16) * 16
    nheads_k = nheads if mha_type == "mha" else (1 if mha_type == "mqa" else 3)
    window = (-1, -1) if not local else torch.randint(0, seqlen_k, (2,))
    q = torch.randn(batch_size, seqlen_q, nheads, d, device=device, dtype=dtype)
    seqlen_new = seqlen_q if seqlen_new_eq_seqlen_q else torch.randint(1, seqlen_q + 1,
                                                                       (1,)).item()
    k = v = None
    if new_kv:
        k = torch.randn(batch_size, seqlen_new, nheads_k, d, device=device, dtype=dtype)
        v = torch.randn(batch_size, seqlen_new, nheads_k, d, device=device, dtype=dtype)
    if paged is None:
        k_cache = torch.randn(batch_cache, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        v_cache = torch.randn(batch_cache, seqlen_k, nheads_k, d, device=device, dtype=dtype)
        table = None
    else:
        k_cache, v_cache, table, kp, vp, num_blocks = block_kvcache(
            seqlen_k, paged, batch_size, nheads_k, d, device, dtype)
    hi = ((seqlen_k - (seqlen_q if (causal or local) and rotary_dim > 1 else seqlen_new) + 1)
          if new_kv else seqlen_k + 1)
    cache_seqlens = torch.randint(0 if new_kv else 1, hi, (batch_size,), dtype=torch.int32,
                                  device=device)
    leftpad = None
    if has_leftpad:
        leftpad = torch.zeros(batch_size, dtype=torch.int32, device=device)
    ar = torch.arange(seqlen_k, device=device)[None]
    lens = cache_seqlens[:, None]
    km = ar < lens + (seqlen_new if new_kv else 0)
    batch_idx = (torch.randperm(batch_cache, dtype=torch.int32, device=device)[:batch_size]
                 if has_batch_idx else None)
    slopes = torch.rand(batch_size, nheads, device=device) * 0.3 if alibi else None
    bias = alibi_bias(slopes, seqlen_q, seqlen_k, None, km, causal=causal) if alibi else None
    if rotary_dim > 0:
        n_ro = seqlen_k if paged is None else num_blocks * paged
        angle = torch.rand(n_ro, rotary_dim // 2, device=device) * 2 * math.pi
        cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
        if causal or local:
            q_ro = rotary_ref(q, cos, sin, cache_seqlens, rotary_interleaved)
        else:       # every query row at position cache_seqlens
            q_ro = rotary_ref(q.reshape(batch_size, 1, seqlen_q * nheads, d), cos, sin,
                              cache_seqlens, rotary_interleaved).view(q.shape)
        k_ro = rotary_ref(k, cos, sin, cache_seqlens, rotary_interleaved)
    else:
        cos = sin = None
        q_ro, k_ro = q, k
    sel = batch_idx.long() if has_batch_idx else slice(None)
    k_ref = k_cache[sel].clone()
    v_ref = v_cache[sel].clone()
    if new_kv:
        upd = (lens <= ar) & (ar < lens + seqlen_new)
        k_ref[upd] = k_ro.flatten(0, 1)
        v_ref[upd] = v.flatten(0, 1)
    kw = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens,
              cache_batch_idx=batch_idx, cache_leftpad=leftpad, block_table=table, causal=causal,
              window_size=window, rotary_interleaved=rotary_interleaved, alibi_slopes=slopes,
              num_splits=num_splits)
    kc, vc = (k_cache, v_cache) if paged is None else (kp, vp)
    with _ctx(device):
        if has_leftpad:
            with pytest.raises(NotImplementedError, match="cache_leftpad"):
                fai.flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
            pytest.skip(f"{UNSUPPORTED}: cache_leftpad (NotImplementedError raised)")
        out = fai.flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    g = nheads // nheads_k
    ref = attention_ref(q_ro, k_ref.repeat_interleave(g, 2), v_ref.repeat_interleave(g, 2), None,
                        km, bias, causal=causal, window=window)
    pt = attention_ref(q_ro, k_ref.repeat_interleave(g, 2), v_ref.repeat_interleave(g, 2), None,
                       km, bias, causal=causal, window=window, upcast=False, reorder_ops=True)
    if new_kv:
        if paged is None:
            k_sel, v_sel = k_cache[sel], v_cache[sel]
        else:
            flat = table.long().flatten()
            k_sel = kp[flat].view(batch_size, -1, nheads_k, d)[:, :seqlen_k]
            v_sel = vp[flat].view(batch_size, -1, nheads_k, d)[:, :seqlen_k]
        assert torch.allclose(k_sel, k_ref, rtol=1e-3, atol=1e-3)
        assert torch.equal(v_sel, v_ref)
    check(out, ref, pt, 3 if not alibi else 5, 1e-5)


KVCACHE_KEYS = ("seqlen_q,seqlen_k,d,has_batch_idx,has_leftpad,paged,rotary_fraction,"
                "rotary_interleaved,seqlen_new_eq_seqlen_q,causal,local,alibi,new_kv,mha_type,"
                "num_splits")
KVCACHE_CPU = [
    # decode-path rows (causal, no window/ALiBi), then each feature of the general path
    (1, 128, 64, False, False, None, 0.0, False, True, True, False, False, False, "mha", 0),
    (3, 100, 64, False, False, None, 0.5, True, True, True, False, False, True, "gqa", 1),
    (16, 256, 59, False, False, 256, 1.0, False, False, True, False, False, True, "mqa", 0),
    (1, 128, 32, True, False, None, 0.0, False, True, False, False, False, True, "gqa", 0),
    (3, 100, 64, False, False, None, 1.0, True, True, False, False, False, True, "mha", 0),
    (4, 64, 64, False, False, 256, 0.5, False, False, False, True, False, True, "gqa", 0),
    (3, 100, 64, False, False, None, 0.0, False, True, True, True, True, True, "mqa", 0),
    (16, 128, 64, True, False, None, 0.5, True, True, True, False, True, True, "gqa", 0),
    (64, 128, 32, False, False, None, 0.0, False, True, False, True, True, False, "mha", 0),
    (1, 128, 64, False, True, None, 0.0, False, True, True, False, False, True, "mha", 0),
]


@pytest.mark.parametrize(KVCACHE_KEYS, KVCACHE_CPU)
def test_flash_attn_kvcache(seqlen_q, seqlen_k, d, has_batch_idx, has_leftpad, paged,
                            rotary_fraction, rotary_interleaved, seqlen_new_eq_seqlen_q, causal,
                            local, alibi, new_kv, mha_type, num_splits):
    run_kvcache(seqlen_q, seqlen_k, d, has_batch_idx, has_leftpad, paged, rotary_fraction,
                rotary_interleaved, seqlen_new_eq_seqlen_q, causal, local, alibi, new_kv,
                mha_type, num_splits, torch.float16, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 339), (3, 1024), (64, 800), (16, 20000)])
@pytest.mark.parametrize("d", [128])
@pytest.mark.parametrize("paged", [None, 256])
@pytest.mark.parametrize("rotary_fraction,rotary_interleaved", [(0.0, False), (0.5, True),
                                                                (1.0, False)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("local", [False, True])
@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("new_kv", [False, True])
@pytest.mark.parametrize("mha_type", ["gqa"])
def test_flash_attn_kvcache_gpu(seqlen_q, seqlen_k, d, paged, rotary_fraction,
                                rotary_interleaved, causal, local, alibi, new_kv, mha_type):
    run_kvcache(seqlen_q, seqlen_k, d, False, False, paged, rotary_fraction,
                rotary_interleaved, True, causal, local, alibi, new_kv, mha_type, 0,
                torch.float16, "cuda")


# --- FlashAttention-3's FP8 rows -----------------------------------------------------------------
def run_fp8(seqlen_q, seqlen_k, d, causal, local, softcap, mha_type, v_colmajor, device,
            batch_size, nheads):
    if local or softcap:
        with _ctx(device):
            q8 = torch.zeros(1, 16, 2, d, device=device).to(torch.float8_e4m3fn)
            ones = torch.ones(1, 2, device=device)
            with pytest.raises(ValueError, match="FP8 forward"):
                fai.flash_attn_func(q8, q8, q8, window_size=(3, 3) if local else (-1, -1),
                                    softcap=softcap, q_descale=ones, k_descale=ones,
                                    v_descale=ones)
        pytest.skip(f"{UNSUPPORTED}: window/softcap with fp8 inputs (ValueError raised)")
    torch.random.manual_seed(0)
    dtype, dtype_ref = torch.float8_e4m3fn, torch.bfloat16
    nheads_kv = nheads if mha_type == "mha" else (2 if mha_type == "gqa" else 1)
    q_ref = torch.randn(batch_size, seqlen_q, nheads, d, device=device, dtype=dtype_ref)
    q_ref = q_ref.to(dtype).to(dtype_ref)
    k_ref = torch.randn(batch_size, seqlen_k, nheads_kv, d, device=device,
                        dtype=dtype_ref).to(dtype).to(dtype_ref)
    v_ref = torch.randn(batch_size, seqlen_k, nheads_kv, d, device=device,
                        dtype=dtype_ref).to(dtype).to(dtype_ref)
    descales = [torch.rand(batch_size, nheads_kv, device=device) * 2 for _ in range(3)]
    q, k, v = (t.to(dtype) for t in (q_ref, k_ref, v_ref))
    if v_colmajor:      # FA3's V_colmajor: the seqlen dimension contiguous (no transpose pass)
        v = v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    ref = attention_ref(q_ref, k_ref, v_ref, causal=causal, descales=descales)
    pt = attention_ref(q_ref, k_ref, v_ref, causal=causal, descales=descales, upcast=False,
                       reorder_ops=True, intermediate_dtype=dtype)
    with _ctx(device):
        out = fai.flash_attn_func(q, k, v, causal=causal, q_descale=descales[0],
                                  k_descale=descales[1], v_descale=descales[2])
    assert out.dtype == torch.bfloat16
    fwd_atol = 2 * (ref + 0.3 - 0.3 - ref).abs().max().item()
    check(out, ref, pt, 2, fwd_atol)


@pytest.mark.parametrize("seqlen_q,seqlen_k,d,causal,local,softcap,mha_type,v_colmajor", [
    (64, 128, 64, False, False, 0.0, "mha", False), (113, 203, 64, True, False, 0.0, "gqa", False),
    (128, 80, 128, True, False, 0.0, "mqa", True), (239, 1, 64, True, False, 0.0, "mha", False),
    (1, 1, 64, False, False, 0.0, "gqa", False), (113, 128, 64, False, False, 0.0, "mha", True),
    (64, 128, 64, False, True, 0.0, "mha", False), (64, 128, 64, True, False, 15.0, "mha", False)])
def test_flash_attn_output_fp8(seqlen_q, seqlen_k, d, causal, local, softcap, mha_type,
                               v_colmajor):
    run_fp8(seqlen_q, seqlen_k, d, causal, local, softcap, mha_type, v_colmajor, "cpu",
            batch_size=2, nheads=4)


@pytest.mark.gpu
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (64, 128), (256, 256), (239, 1),
                                               (799, 3), (113, 203), (108, 256), (640, 128),
                                               (1023, 1024), (4096, 4096)])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("local,softcap", [(False, 0.0), (True, 0.0), (False, 15.0)])
@pytest.mark.parametrize("mha_type", ["mha", "gqa"])
@pytest.mark.parametrize("v_colmajor", [False, True])
def test_flash_attn_output_fp8_gpu(seqlen_q, seqlen_k, d, causal, local, softcap, mha_type,
                                   v_colmajor):
    if v_colmajor and seqlen_k % 16:
        pytest.skip("as FA3: V_colmajor needs seqlen_k a multiple of 16")
    run_fp8(seqlen_q, seqlen_k, d, causal, local, softcap, mha_type, v_colmajor, "cuda",
            batch_size=9 if seqlen_k <= 2048 else 2, nheads=6)


# --- the entry points' contract ----------------------------------------------------------------
def _t(*shape, dtype=torch.float16):
    return torch.randn(*shape, dtype=dtype)


def test_contract_layout_and_heads():
    with flashattn.interpret.enabled():
        q, k = _t(1, 4, 40, 32), _t(1, 4, 24, 32)       # (B, H, N, D) given where (B, N, H, D) is
        with pytest.raises(ValueError, match="flash-attn's layout"):
            fai.flash_attn_func(q, k, k)
        with pytest.raises(ValueError, match="4 dimensions"):
            fai.flash_attn_func(_t(4, 40, 32), k, k)
        with pytest.raises(ValueError, match="same shape"):
            fai.flash_attn_func(_t(1, 8, 4, 32), _t(1, 8, 2, 32), _t(1, 9, 2, 32))
        with pytest.raises(ValueError, match="head dim"):
            fai.flash_attn_func(_t(1, 8, 4, 32), _t(1, 8, 2, 16), _t(1, 8, 2, 16))
        with pytest.raises(ValueError, match="batch size"):
            fai.flash_attn_func(_t(2, 8, 4, 32), _t(1, 8, 2, 32), _t(1, 8, 2, 32))


def test_contract_dtypes_devices_keywords():
    q = _t(1, 8, 2, 32)
    with pytest.raises(ValueError, match="FLASHATTN_INTERPRET"):
        fai.flash_attn_func(q, q, q)                     # CPU without the interpreter
    with flashattn.interpret.enabled():
        with pytest.raises(TypeError, match="float16 or"):
            fai.flash_attn_func(q.float(), q.float(), q.float())
        with pytest.raises(TypeError, match="one dtype"):
            fai.flash_attn_func(q, q.bfloat16(), q)
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            fai.flash_attn_func(q.numpy(), q, q)
        with pytest.raises(NotImplementedError, match="dropout"):
            fai.flash_attn_func(q, q, q, 0.1)
        with pytest.raises(TypeError, match="window_size"):
            fai.flash_attn_func(q, q, q, window_size=3)
        with pytest.raises(ValueError, match="softcap"):
            fai.flash_attn_func(q, q, q, softcap=-1.0)
        with pytest.raises(ValueError, match="alibi_slopes must have shape"):
            fai.flash_attn_func(q, q, q, alibi_slopes=torch.ones(3))
        with pytest.raises(TypeError, match="float32"):
            fai.flash_attn_func(q, q, q, alibi_slopes=torch.ones(2, dtype=torch.float16))
        with pytest.raises(TypeError, match="causal must be a bool"):
            fai.flash_attn_func(q, q, q, causal="yes")
        with pytest.raises(ValueError, match="fp8 inputs only"):
            fai.flash_attn_func(q, q, q, q_descale=torch.ones(1, 2))
        with pytest.raises(ValueError, match="scale"):
            fai.flash_attn_func(q, q, q, softmax_scale=-1.0)


def test_contract_varlen_and_kvcache():
    with flashattn.interpret.enabled():
        q, cu = _t(10, 2, 32), torch.tensor([0, 4, 10], dtype=torch.int32)
        with pytest.raises(TypeError, match="int32"):
            fai.flash_attn_varlen_func(q, q, q, cu.long(), cu, 6, 6)
        with pytest.raises(ValueError, match="end at the packed length"):
            fai.flash_attn_varlen_func(q, q, q, torch.tensor([0, 4, 9], dtype=torch.int32), cu,
                                       6, 6)
        with pytest.raises(ValueError, match="longer than max_seqlen"):
            fai.flash_attn_varlen_func(q, q, q, cu, cu, 5, 6)
        with pytest.raises(ValueError, match="3 dimensions"):
            fai.flash_attn_varlen_func(q[None], q, q, cu, cu, 6, 6)
        qd, kc = _t(2, 1, 4, 32), _t(2, 64, 2, 32)
        with pytest.raises(NotImplementedError, match="cache_leftpad"):
            fai.flash_attn_with_kvcache(qd, kc, kc, cache_leftpad=torch.zeros(2, dtype=torch.int32))
        with pytest.raises(ValueError, match="both k and v"):
            fai.flash_attn_with_kvcache(qd, kc, kc, k=_t(2, 1, 2, 32))
        with pytest.raises(ValueError, match="capacity"):
            fai.flash_attn_with_kvcache(qd, kc, kc, _t(2, 1, 2, 32), _t(2, 1, 2, 32),
                                        cache_seqlens=64)
        with pytest.raises(ValueError, match="sequences but q"):
            fai.flash_attn_with_kvcache(_t(3, 1, 4, 32), kc, kc)
        with pytest.raises(ValueError, match="rotary"):
            fai.flash_attn_with_kvcache(qd, kc, kc, rotary_cos=torch.ones(64, 8))


def test_exports():
    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        assert getattr(flashattn, name) is getattr(fai, name)


# --- the FP8 fast path from the front door ---------------------------------------------------
def test_attention_fp8_v_transposed_front_door(monkeypatch):
    """attention(q8, k8, v8t, v_transposed=True) hands V^T to the FP8 forward as it is (no
    transpose pass), and agrees with the host-transposed call; flash_attn_func with a V whose
    seqlen dimension is contiguous takes the same path."""
    from flashattn import fp8_attention
    torch.manual_seed(0)
    B, H, N, D = 1, 2, 40, 32
    q, k, v = (torch.randn(B, H, N, D) for _ in range(3))
    q8, qd = flashattn.quantize_fp8(q)
    k8, kd = flashattn.quantize_fp8(k)
    v8, vd = flashattn.quantize_fp8(v)
    v8t, vdt = flashattn.quantize_fp8(v, v_transposed=True)
    assert v8t.shape == (B, H, D, N) and torch.equal(vd, vdt)
    seen = []
    real = fp8_attention.attention_fp8

    def spy(*a, **kw):
        seen.append((kw.get("v_transposed"), a[2].data_ptr()))
        return real(*a, **kw)
    monkeypatch.setattr(fp8_attention, "attention_fp8", spy)
    with flashattn.interpret.enabled():
        o_t = flashattn.attention(q8, k8, v8t, causal=True, q_descale=qd, k_descale=kd,
                                  v_descale=vd, v_transposed=True)
        o_h = flashattn.attention(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd,
                                  v_descale=vd)
        o_fa = fai.flash_attn_func(q8.transpose(1, 2), k8.transpose(1, 2),
                                   v8t.permute(0, 3, 1, 2), causal=True, q_descale=qd,
                                   k_descale=kd, v_descale=vd)
    assert seen[0] == (True, v8t.data_ptr())         # V^T passed through, no copy
    assert seen[2][0] is True
    assert torch.equal(o_t, o_h)
    assert torch.equal(o_fa.transpose(1, 2), o_t)
    with flashattn.interpret.enabled():
        with pytest.raises(ValueError, match="fp8 inputs only"):
            flashattn.attention(q.half(), k.half(), v.half(), v_transposed=True)
        with pytest.raises(TypeError, match="v_transposed must be a bool"):
            flashattn.attention(q8, k8, v8t, v_transposed="yes")


def test_outputs_are_contiguous_in_flash_attn_layout():
    """As flash-attn's: out.view(B, N, H * D) works (models reshape it so)."""
    with flashattn.interpret.enabled():
        q, k = _t(2, 20, 4, 32), _t(2, 20, 2, 32)
        out = fai.flash_attn_func(q, k, k, causal=True)
        assert out.shape == (2, 20, 4, 32) and out.is_contiguous()
        out.view(2, 20, 128)
        kc = _t(2, 64, 2, 32)
        out = fai.flash_attn_with_kvcache(_t(2, 1, 4, 32), kc, kc, cache_seqlens=10, causal=True)
        assert out.shape == (2, 1, 4, 32) and out.is_contiguous()
        out = fai.flash_attn_with_kvcache(_t(2, 3, 4, 32), kc, kc, cache_seqlens=10, causal=True)
        assert out.is_contiguous()
