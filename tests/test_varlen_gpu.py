"""Packed variable-length prefill on the GPU (``flashattn.varlen.attention_varlen``, issue 12)
against an fp32 reference.

Pass criterion, as tests/test_kernels_gpu.py: the max error against the fp32 reference is at
most twice PyTorch's error computing the same attention in the inputs' precision, plus a small
floor (tests/criteria.py). Outputs are poisoned with NaN before each launch (``out=``): a row
the kernel forgets fails. The fp32 reference is computed on the GPU one sequence at a time
(``ref_fp32``), and checked once against ``flashattn.reference.varlen_attention`` (NumPy).

The matrix is sampled (every value of every axis, not every product): lengths 1..4097 mixed in
one batch (empty sequences too), equal and different query/key lengths (a prefill onto a
cache; more queries than keys, where causal rows see nothing), causal and not, GQA 1:1 to 8:1,
fp16 and bf16, head dims 64, 128, 256 (and 80, padded). Seeds come from the test id.

The backward (``attention_varlen`` through ``torch.autograd``, i.e.
``attention_varlen_backward``: the square kernels once per sequence) is held to the criterion of
tests/test_backward_gpu.py: each of dq, dk, dv against the fp64 reference
(``reference.varlen.varlen_attention_backward``), at most twice PyTorch's error with autograd
through fp16/bf16 math attention, plus a floor relative to the largest reference gradient.

    python -m pytest -o addopts="" -m gpu tests/test_varlen_gpu.py -n 8
"""
import math

import pytest
from criteria import assert_flash_criterion, seed_of

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

HEADS = ((8, 8), (8, 2), (16, 2), (4, 1))
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 256, 80)
LENGTHS = (                                     # (lens_q, lens_k or None: the same)
    ((1, 4097, 17, 256), None),
    ((1000, 999, 1, 513, 0), None),
    ((64, 128, 129, 2048), None),
    ((3, 300, 1), (300, 301, 2)),               # prefill onto a cache: len_q < len_k
    ((300, 20), (100, 20)),                     # more queries than keys: causal rows see none
    ((4096, 1, 33), (4096, 5, 0)),              # an empty key sequence: zeros
)
CASES_N = 24


def sampled_cases():
    cases = []
    for c in range(CASES_N):
        hq, hkv = HEADS[c % len(HEADS)]
        dtype = DTYPES[(c // 2) % len(DTYPES)]
        d = HEAD_DIMS[(c // 3) % len(HEAD_DIMS)]
        causal = bool(c % 2) ^ bool((c // 4) % 2)
        lens_q, lens_k = LENGTHS[c % len(LENGTHS)]
        cases.append(_case(hq, hkv, dtype, d, causal, lens_q, lens_k))
    return cases


def _case(hq, hkv, dtype, d, causal, lens_q, lens_k, prefix=""):
    """One parametrised case, its id naming heads, dtype, head dim, mask and lengths."""
    return pytest.param(hq, hkv, dtype, d, causal, lens_q, lens_k,
                        id=f"{prefix}h{hq}:{hkv}-{dtype[:2]}-d{d}-"
                           f"{'causal' if causal else 'full'}-"
                           f"q{'_'.join(map(str, lens_q))}"
                           + (f"-k{'_'.join(map(str, lens_k))}" if lens_k else ""))


def make_packed(lens_q, lens_k, hq, hkv, d, dtype, *, seed, magnitude=1.0):
    lens_k = lens_q if lens_k is None else lens_k
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (torch.randn(sum(lens_q), hq, d, generator=g, device="cuda") * magnitude).to(dt)
    k = (torch.randn(sum(lens_k), hkv, d, generator=g, device="cuda") * magnitude).to(dt)
    v = torch.randn(sum(lens_k), hkv, d, generator=g, device="cuda").to(dt)
    cu = [torch.tensor([0, *torch.tensor(x).cumsum(0).tolist()], dtype=torch.int32,
                       device="cuda") for x in (lens_q, lens_k)]
    return q, k, v, cu[0], cu[1], max(lens_q), max(lens_k)


def _attend(q, k, v, causal, scale, dtype):
    """One sequence, (len, H, D) -> (len_q, Hq, D), in ``dtype`` (P rounded to it, as kernels)."""
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    if lq == 0 or lk == 0:
        return out
    qh = q.transpose(0, 1).to(dtype)                                    # (Hq, lq, D)
    kh = k.transpose(0, 1).to(dtype).repeat_interleave(hq // hkv, 0)      # (Hq, lk, D)
    vh = v.transpose(0, 1).to(dtype).repeat_interleave(hq // hkv, 0)
    s = (qh @ kh.transpose(-1, -2)).float() * scale                      # (Hq, lq, lk)
    if causal:
        pos = lk - lq + torch.arange(lq, device=q.device)
        s = s.masked_fill(torch.arange(lk, device=q.device)[None, :] > pos[:, None], -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0).to(dtype)
    return (p @ vh).transpose(0, 1).to(dtype)


def per_sequence(q, k, v, cu_q, cu_k, causal, scale, dtype):
    out = torch.zeros(q.shape, dtype=dtype, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        out[cq[b]:cq[b + 1]] = _attend(q[cq[b]:cq[b + 1]], k[ck[b]:ck[b + 1]],
                                       v[ck[b]:ck[b + 1]], causal, scale, dtype)
    return out


def ref_fp32(q, k, v, cu_q, cu_k, causal, scale):
    return per_sequence(q, k, v, cu_q, cu_k, causal, scale, torch.float32)


def run(q, k, v, cu_q, cu_k, mq, mk, **kw):
    from flashattn.varlen import attention_varlen
    out = torch.full(q.shape, math.nan, dtype=q.dtype, device=q.device)
    attention_varlen(q, k, v, cu_q, cu_k, mq, mk, out=out, **kw)
    torch.cuda.synchronize()
    return out


def floor_of(dtype):
    return 1e-3 if dtype == "float16" else 8e-3


@pytest.mark.parametrize("hq,hkv,dtype,d,causal,lens_q,lens_k", sampled_cases())
def test_varlen_matches_reference(hq, hkv, dtype, d, causal, lens_q, lens_k, request,
                                  record_property):
    seed = seed_of(request.node.callspec.id)
    q, k, v, cu_q, cu_k, mq, mk = make_packed(lens_q, lens_k, hq, hkv, d, dtype, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out = run(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    ref = ref_fp32(q, k, v, cu_q, cu_k, causal, scale)
    pt = per_sequence(q, k, v, cu_q, cu_k, causal, scale, q.dtype)
    err, err_pt = assert_flash_criterion(out, ref, pt, floor_of(dtype), seed=seed)
    # Rows that see no key are exactly 0, as FlashAttention's.
    lk = lens_q if lens_k is None else lens_k
    cq = cu_q.tolist()
    for b, (nq, nk) in enumerate(zip(lens_q, lk)):
        empty = nq if nk == 0 else (max(0, nq - nk) if causal else 0)
        assert (out[cq[b]:cq[b] + empty] == 0).all(), f"seed {seed}: sequence {b} not 0"
    record_property("seed", seed)
    record_property("err_ratio", err / max(err_pt, 1e-12))


@pytest.mark.parametrize("q_tiles", [2, 3, 16])
@pytest.mark.parametrize("causal", [False, True])
def test_several_query_tiles_per_program_give_the_same_answer(q_tiles, causal, monkeypatch):
    # E22: Q_TILES tiles per program (views built once) must give bit for bit the answer of one
    # tile per program: the same tiles, the same arithmetic, only the grid differs.
    from flashattn.kernels import varlen_spec   # the table the plan reads
    lens_q, lens_k = (1, 0, 4097, 64, 65, 700, 2000), (1, 5, 4097, 64, 30, 1500, 2000)
    q, k, v, cu_q, cu_k, mq, mk = make_packed(lens_q, lens_k, 8, 2, 128, "float16", seed=7)
    monkeypatch.setattr(varlen_spec, "VARLEN_Q_TILES", {})
    one = run(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    monkeypatch.setattr(varlen_spec, "VARLEN_Q_TILES", {"sm_90": q_tiles, "sm_100": q_tiles,
                                                        "sm_120": q_tiles})
    several = run(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    assert torch.equal(one, several), (one.float() - several.float()).abs().max().item()
    assert not torch.isnan(one).any()


def test_gpu_reference_is_the_numpy_reference():
    from flashattn.reference import varlen_attention
    q, k, v, cu_q, cu_k, mq, mk = make_packed((5, 70, 0, 33), (9, 70, 4, 33), 4, 2, 64,
                                              "float16", seed=1)
    for causal in (False, True):
        ref = ref_fp32(q, k, v, cu_q, cu_k, causal, 0.125)
        np_ref = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal, scale=0.125)
        torch.testing.assert_close(ref, np_ref.float(), atol=2e-5, rtol=1e-4)


def test_equals_the_padded_square_kernel_on_equal_lengths():
    # B sequences of one length: the same answer as flashattn.attention on (B, H, N, D).
    from flashattn import attention
    from flashattn.reference import pack
    seed = 3
    g = torch.Generator(device="cuda").manual_seed(seed)
    qp, kp, vp = (torch.randn(3, h, 1000, 128, generator=g, device="cuda").half()
                  for h in (32, 8, 8))
    square = attention(qp, kp, vp, causal=True)
    (q, cu), (k, _), (v, _) = (pack(t, [1000] * 3) for t in (qp, kp, vp))
    out = run(q, k, v, cu, cu, 1000, 1000, causal=True)
    sq, _ = pack(square, [1000] * 3)
    err = (out.float() - sq.float()).abs().max().item()
    assert err < 2e-3, f"seed {seed}: varlen and the square kernel differ by {err:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_stay_finite(dtype):
    seed = 7
    q, k, v, cu_q, cu_k, mq, mk = make_packed((300, 77, 1), None, 8, 2, 64, dtype, seed=seed,
                                              magnitude=6.0)
    out = run(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    ref = ref_fp32(q, k, v, cu_q, cu_k, True, 0.125)
    assert torch.isfinite(out).all(), f"seed {seed}: infinite outputs"
    err = (out.float() - ref).abs().max().item()
    assert err < 3e-2, f"seed {seed}: max error {err:.3g}"


def test_bad_device_offsets_give_nan_for_their_sequences_only():
    seed = 11
    q, k, v, cu_q, cu_k, mq, mk = make_packed((256, 256, 256, 100), None, 8, 2, 64, "float16",
                                              seed=seed)
    good = run(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    bad_k = cu_k.clone()
    bad_k[2] = 100                        # sequence 1 ends before it starts; 2 is too long
    out = run(q, k, v, cu_q, bad_k, mq, mk, causal=True, check_values=False)
    assert torch.isnan(out[256:768]).all(), f"seed {seed}: a bad sequence gave numbers"
    assert torch.equal(out[:256], good[:256]) and torch.equal(out[768:], good[768:])
    with pytest.raises(ValueError, match="non-decreasing"):
        run(q, k, v, cu_q, bad_k, mq, mk, causal=True)


def test_non_contiguous_packed_inputs():
    # q, k, v as slices of one packed qkv tensor (as models produce them): strided rows.
    seed = 13
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = (100, 37)
    qkv = torch.randn(sum(lens), 8 + 2 + 2, 64, generator=g, device="cuda").half()
    q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    assert not q.is_contiguous()
    cu = torch.tensor([0, 100, 137], dtype=torch.int32, device="cuda")
    out = run(q, k, v, cu, cu, 100, 100, causal=True)
    ref = ref_fp32(q, k, v, cu, cu, True, 0.125)
    pt = per_sequence(q, k, v, cu, cu, True, 0.125, q.dtype)
    assert_flash_criterion(out, ref, pt, 1e-3, seed=seed)


# --- the backward, through torch.autograd ---------------------------------------------------------
BWD_LENGTHS = (                                  # (lens_q, lens_k or None: the same)
    ((1, 1100, 17, 0, 256), None),               # 1 .. 1100, an empty sequence
    ((3, 300, 1, 64), (300, 301, 2, 1100)),      # len_q < len_k: a prefill onto a cache
    ((300, 20, 7), (100, 20, 0)),                # len_q > len_k (causal rows see none), no keys
    ((0, 513, 1000, 1), (5, 129, 999, 1)),       # mixed; a sequence with keys but no query
)
BWD_HEADS = ((8, 8), (8, 2), (4, 1))
BWD_HEAD_DIMS = (64, 128, 80)


def backward_cases():
    """Every (lengths, causal, dtype) product once; heads and head dims rotate."""
    cases = []
    for c in range(len(BWD_LENGTHS) * 2 * len(DTYPES)):
        lens_q, lens_k = BWD_LENGTHS[c % len(BWD_LENGTHS)]
        causal = bool((c // len(BWD_LENGTHS)) % 2)
        dtype = DTYPES[c // (2 * len(BWD_LENGTHS))]
        hq, hkv = BWD_HEADS[c % len(BWD_HEADS)]
        d = BWD_HEAD_DIMS[(c // 2) % len(BWD_HEAD_DIMS)]
        cases.append(_case(hq, hkv, dtype, d, causal, lens_q, lens_k, prefix="bwd-"))
    return cases


def make_dout(q, *, seed):
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    return torch.randn(q.shape, generator=g, device="cuda").to(q.dtype)


def varlen_grads(q, k, v, cu_q, cu_k, mq, mk, dout, *, requires=(True, True, True), **kw):
    """attention_varlen's output and the gradients of the inputs that require grad."""
    from flashattn.varlen import attention_varlen
    leaves = [t.detach().requires_grad_(r) for t, r in zip((q, k, v), requires)]
    out = attention_varlen(*leaves, cu_q, cu_k, mq, mk, **kw)
    assert out.grad_fn is not None
    wanted = [t for t in leaves if t.requires_grad]
    grads = iter(torch.autograd.grad(out, wanted, dout))
    torch.cuda.synchronize()
    return out.detach(), tuple(next(grads) if t.requires_grad else None for t in leaves)


def ref_grads_fp64(q, k, v, dout, cu_q, cu_k, causal, scale):
    from flashattn.reference.varlen import varlen_attention_backward
    return varlen_attention_backward(q.double(), k.double(), v.double(), dout.double(), cu_q,
                                     cu_k, causal=causal, scale=scale)


def torch_grads_same_precision(q, k, v, dout, cu_q, cu_k, causal, scale):
    """PyTorch's gradients in the inputs' precision (the yardstick): autograd through math
    attention in fp16/bf16, one sequence and one GQA group at a time, over the rows that see a
    key (the others' gradients are 0)."""
    hq, hkv = q.shape[1], k.shape[1]
    G = hq // hkv
    dq = torch.zeros_like(q)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        lq, lk = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        if lq == 0 or lk == 0:
            continue
        skip = lq - lk if causal and lq > lk else 0
        n = lq - skip
        rows, keys = slice(cq[b] + skip, cq[b + 1]), slice(ck[b], ck[b + 1])
        for h in range(hkv):
            heads = slice(h * G, (h + 1) * G)
            qc = q[rows, heads].transpose(0, 1).detach().requires_grad_()      # (G, n, D)
            kc = k[keys, h].detach().requires_grad_()                           # (lk, D)
            vc = v[keys, h].detach().requires_grad_()
            s = (qc @ kc.expand(G, -1, -1).transpose(-1, -2)) * scale           # (G, n, lk)
            if causal:
                pos = lk - n + torch.arange(n, device=q.device)
                s = s.masked_fill(torch.arange(lk, device=q.device)[None, :] > pos[:, None],
                                  -math.inf)
            o = torch.softmax(s, dim=-1) @ vc.expand(G, -1, -1)
            o.backward(dout[rows, heads].transpose(0, 1))
            dq[rows, heads] = qc.grad.transpose(0, 1)
            dk[keys, h] += kc.grad.float()
            dv[keys, h] += vc.grad.float()
    return dq, dk.to(k.dtype), dv.to(v.dtype)


def assert_unseen_are_zero(grads, lens_q, lens_k, cu_q, cu_k, causal, *, seed):
    """dq rows that see no key, and dk/dv rows of sequences with no query, are exactly 0."""
    dq, dk, dv = grads
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        blind = nq if nk == 0 else (max(0, nq - nk) if causal else 0)
        assert (dq[cq[b]:cq[b] + blind] == 0).all(), f"seed {seed}: sequence {b}: dq not 0"
        if nq == 0:
            assert (dk[ck[b]:ck[b + 1]] == 0).all() and (dv[ck[b]:ck[b + 1]] == 0).all(), \
                f"seed {seed}: sequence {b} has no query but nonzero dk/dv"


@pytest.mark.parametrize("hq,hkv,dtype,d,causal,lens_q,lens_k", backward_cases())
def test_varlen_gradients_match_reference(hq, hkv, dtype, d, causal, lens_q, lens_k, request,
                                          record_property):
    from test_backward_gpu import check
    seed = seed_of(request.node.callspec.id)
    q, k, v, cu_q, cu_k, mq, mk = make_packed(lens_q, lens_k, hq, hkv, d, dtype, seed=seed)
    dout = make_dout(q, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out, grads = varlen_grads(q, k, v, cu_q, cu_k, mq, mk, dout, causal=causal)
    for g, t in zip(grads, (q, k, v)):
        assert g.shape == t.shape and g.dtype == t.dtype, f"seed {seed}: {g.shape} {g.dtype}"
    ref = ref_grads_fp64(q, k, v, dout, cu_q, cu_k, causal, scale)
    pt = torch_grads_same_precision(q, k, v, dout, cu_q, cu_k, causal, scale)
    ratios = check(grads, ref, pt, dtype, seed=seed)
    assert_unseen_are_zero(grads, lens_q, lens_q if lens_k is None else lens_k, cu_q, cu_k,
                           causal, seed=seed)
    # The output of the autograd path is the no-grad kernel's, bit for bit.
    assert torch.equal(out, run(q, k, v, cu_q, cu_k, mq, mk, causal=causal)), \
        f"seed {seed}: the autograd path's output differs from the no-grad path's"
    record_property("seed", seed)
    for name, r in ratios.items():
        record_property(f"err_ratio_{name}", r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_varlen_gradients_of_frozen_queries(dtype):
    """Only k and v require grad (q frozen): their gradients, and none for q."""
    from test_backward_gpu import FLOOR
    seed = 21
    lens_q, lens_k = (40, 1, 333), (100, 7, 333)
    q, k, v, cu_q, cu_k, mq, mk = make_packed(lens_q, lens_k, 8, 2, 128, dtype, seed=seed)
    dout = make_dout(q, seed=seed)
    scale = 128 ** -0.5
    _, (gq, gk, gv) = varlen_grads(q, k, v, cu_q, cu_k, mq, mk, dout, causal=True,
                                   requires=(False, True, True))
    assert gq is None
    ref = ref_grads_fp64(q, k, v, dout, cu_q, cu_k, True, scale)
    pt = torch_grads_same_precision(q, k, v, dout, cu_q, cu_k, True, scale)
    for name, g, r, p in (("dk", gk, ref[1], pt[1]), ("dv", gv, ref[2], pt[2])):
        err = (g.double() - r).abs().max().item()
        err_pt = (p.double() - r).abs().max().item()
        floor = FLOOR[dtype] * max(1.0, r.abs().max().item())
        assert err <= 2 * err_pt + floor, \
            f"seed {seed}: {name} max error {err:.3g} > 2 x torch {err_pt:.3g} + {floor:.3g}"


def test_varlen_gradients_of_a_packed_qkv():
    """q, k, v as slices of one packed qkv tensor that requires grad (as models produce them):
    strided inputs, and the gradients land in qkv.grad."""
    from test_backward_gpu import check
    from flashattn.varlen import attention_varlen
    seed = 22
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = (100, 37, 1, 640)
    qkv = torch.randn(sum(lens), 8 + 2 + 2, 64, generator=g, device="cuda").half()
    qkv.requires_grad_()
    q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    dout = make_dout(q, seed=seed)
    out = attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    out.backward(dout)
    torch.cuda.synchronize()
    grads = (qkv.grad[:, :8], qkv.grad[:, 8:10], qkv.grad[:, 10:])
    ref = ref_grads_fp64(q.detach(), k.detach(), v.detach(), dout, cu, cu, True, 0.125)
    pt = torch_grads_same_precision(q.detach(), k.detach(), v.detach(), dout, cu, cu, True,
                                    0.125)
    check(grads, ref, pt, "float16", seed=seed)


def test_the_no_grad_path_is_unaffected():
    """Without grad (inputs that do not require it, or torch.no_grad()) attention_varlen is the
    plain launch: no graph, out= works, no gradient appears; with grad, out= is refused."""
    from flashattn.varlen import attention_varlen
    seed = 23
    q, k, v, cu_q, cu_k, mq, mk = make_packed((5, 300, 0, 77), (9, 300, 4, 60), 8, 2, 64,
                                              "float16", seed=seed)
    plain = run(q, k, v, cu_q, cu_k, mq, mk, causal=True)          # out= NaN-poisoned
    assert plain.grad_fn is None and not plain.requires_grad
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.no_grad():
        buf = torch.full(q.shape, math.nan, dtype=q.dtype, device=q.device)
        o = attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True, out=buf)
        torch.cuda.synchronize()
    assert o is buf and o.grad_fn is None and torch.equal(o, plain)
    assert all(t.grad is None for t in leaves)
    with pytest.raises(RuntimeError, match="out= does not support automatic differentiation"):
        attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True, out=buf)
    out = attention_varlen(*leaves, cu_q, cu_k, mq, mk, causal=True)
    assert out.grad_fn is not None and torch.equal(out.detach(), plain)
    out.float().square().sum().backward()
    torch.cuda.synchronize()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in leaves)
    # The no-grad launch after a backward: the same output as before.
    assert torch.equal(run(q, k, v, cu_q, cu_k, mq, mk, causal=True), plain)
