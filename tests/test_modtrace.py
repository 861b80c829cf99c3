"""flashattn.modtrace: FlexAttention mods written in torch, as PyTorch's own tests write them
(``test/inductor/test_flex_attention.py``: its score and mask functions, rewritten here by
their description), traced into cuTile tile functions and a derivative.

Three levels, all in the interpreter on CPU (no GPU):
* every mod traces, or raises ModError naming why (``MODS``: the expected outcome);
* the generated tile function and derivative on 32 x 32 tiles equal the torch function and
  torch.autograd's derivative of it (``test_tile_values``);
* flashattn.flex_attention, forward against PyTorch's flex_attention (fp64) and backward against
  the dense fp64 reference with autograd, with the FlashAttention criterion.
"""
import math
import warnings

import numpy as np
import pytest
import torch
from torch.nn.attention.flex_attention import (AuxRequest, _identity, and_masks,
                                               create_block_mask, noop_mask, or_masks)
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from flashattn import interpret, mods, modtrace
from flashattn.flex import ModError, flex_attention

from criteria import assert_flash_criterion, seed_of
from flex_reference import flex_reference

warnings.filterwarnings("ignore", message=".*flex_attention.*")

B, H, S = 2, 4, 40          # the captured tensors' sizes (PyTorch's tests: B, H, S)
_G = torch.Generator().manual_seed(36)


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=_G).to(dtype)


# --- PyTorch's test mods, written as their tests write them (names as in that file) -----------
def times_two(score, b, h, m, n):
    return score * 2


def squared(score, b, h, m, n):
    return score * score


def causal(score, b, h, q, kv):
    return torch.where(q >= kv, score, float("-inf"))


def inverse_causal(score, b, h, m, n):
    return torch.where(m <= n, score, float("-inf"))


def rel_bias(score, b, h, q, kv):
    return score + (q - kv)


def rel_causal(score, b, h, q, kv):
    return torch.where(q >= kv, score + (q - kv), float("-inf"))


def alibi_bias(num_heads):
    def alibi(score, b, h, q, kv):
        slope = torch.exp2(-((h + 1) * 8.0 / num_heads))
        return score + (kv - q) * slope
    return alibi


def head_offset():
    offset = torch.rand(H, generator=_G)

    def score_mod(score, b, h, m, n):
        return score * offset[h]
    return score_mod


def trig(score, b, h, m, n):
    return torch.sin(torch.cos(score)) + torch.tan(b)


def trig2(score, b, h, m, n):
    c, s = torch.cos(score), torch.sin(score)
    return c * s + torch.tan(b)


def doc_mask_causal():
    doc = torch.arange(S) // 12

    def mod(score, b, h, q_idx, kv_idx):
        same = doc[q_idx] == doc[kv_idx]
        return torch.where((q_idx >= kv_idx) & same, score, -float("inf"))
    return mod


def index_multiple():
    bias = _rand(B, S)

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[b][q_idx]
    return mod


def index_weird1():
    bias = _rand(4, B, H, S)

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[0][b, h][q_idx]
    return mod


def index_weird2():
    bias = _rand(B, H, 4, S)
    which = torch.tensor(2)

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[b][h][which, q_idx]
    return mod


def skip_odd_keys(score, b, h, q, kv):
    return torch.where(kv % 2 == 0, score, float("-inf"))


def composed():
    def first(score, b, h, m, n):
        return score + (m - n)

    def second(score, b, h, m, n):
        return torch.where(m <= n, score, float("-inf"))

    def mod(score, b, h, m, n):
        return second(first(score, b, h, m, n), b, h, m, n)
    return mod


def captured_all_dims():
    hs, bs, ts = _rand(H), _rand(B), _rand(S)

    def mod(score, batch, head, tq, tkv):
        score = score + ts[tq]
        score = score + bs[batch]
        return score + hs[head]
    return mod


def seq_masking():
    seq = torch.zeros(S, dtype=torch.bool)
    seq[S // 2:] = True

    def mod(score, b, h, q, kv):
        return torch.where(seq[q] == seq[kv], score, float("-inf"))
    return mod


def bias_seq_only():
    bias = _rand(S, S)

    def mod(score, b, h, q, kv):
        return score + bias[q, kv]
    return mod


def bias_seq_batch():
    bias = _rand(B, S, S)

    def mod(score, b, h, q, kv):
        return score + bias[b, q, kv]
    return mod


def bias_head_seq_batch():
    bias = _rand(B, H, S, S)

    def mod(score, b, h, q, kv):
        return score + bias[b, h, q, kv]
    return mod


def load_rel_bias():
    rel = _rand(2 * S)

    def mod(score, b, h, q, kv):
        return score + rel[(q - kv) + S]
    return mod


def dependent_causal_bidirectional():
    nbid = torch.randint(0, S, (B,), generator=_G, dtype=torch.int32)

    def mod(score, b, h, q, kv):
        n = nbid[b]
        video = (q <= n) & (kv <= n)
        return torch.where(video | (q >= kv), score, -float("inf"))
    return mod


def natten_2d():
    W, window = 8, 1

    def xy(i):
        return i / W, i % W

    def mod(score, b, h, q, kv):
        qx, qy = xy(q)
        kx, ky = xy(kv)
        near = ((qx - kx).abs() <= window) | ((qy - ky).abs() <= window)
        return torch.where(near, score, float("-inf"))
    return mod


def floor_div_sub(score, b, h, q, kv):
    return score - q // (1 + kv)


def silu_score(score, b, h, q, kv):
    return torch.nn.functional.silu(score)


def padded_dense_causal():
    seq_len = torch.arange(B, dtype=torch.int32) + 1

    def mod(qk, b, h, q, kv):
        return torch.where(qk <= seq_len[b], causal(qk, b, h, q, kv), -float("inf"))
    return mod


def captured_scale():
    scale = torch.ones((), dtype=torch.int32)

    def mod(qk, b, h, q, kv):
        return qk + scale
    return mod


def njt_causal():
    offsets = torch.tensor([0, 16, 24, S], dtype=torch.int32)
    seq_idx = torch.zeros(S, dtype=torch.int32)
    for i in range(len(offsets) - 1):
        seq_idx[offsets[i]:offsets[i + 1]] = i

    def mod(qk, b, h, q, kv):
        qn = q - offsets[seq_idx[q]]
        kn = kv - offsets[seq_idx[kv]]
        return causal(qk, b, h, qn, kn)
    return mod


def captured_reduction():
    scale = _rand(B, 8)

    def mod(qk, b, h, q, kv):
        return qk + scale[b].sum(dim=-1)
    return mod


def new_empty_score():
    mask = torch.ones(B, 1, S, S, dtype=torch.bool).tril()

    def mod(score, b, h, q_idx, kv_idx):
        h0 = h.new_zeros(h.shape)
        return score + mask[b, h0, q_idx, kv_idx]
    return mod


def autograd_function_in_score():
    class ApplyMask(torch.autograd.Function):
        generate_vmap_rule = True

        @staticmethod
        def forward(a, keep):
            return torch.where(keep, a, -float("inf"))

        @staticmethod
        def setup_context(ctx, inputs, output):
            ctx.mark_non_differentiable(inputs[1])

        @staticmethod
        def backward(ctx, g):
            return g, None

    def mod(score, b, h, q, kv):
        return ApplyMask.apply(score, q <= kv)
    return mod


# masks
def causal_mask(b, h, q, kv):
    return q >= kv


def inverse_causal_mask(b, h, q, kv):
    return q <= kv


def neg_causal_mask(b, h, q, kv):
    return q < kv


def sliding_window_mask(b, h, q, kv):
    return (q - kv) <= 12


def new_empty_mask():
    mask = torch.ones(B, 1, S, S, dtype=torch.bool).tril()

    def causal(b, h, q_idx, kv_idx):
        h0 = h.new_zeros(h.shape)
        return mask[b, h0, q_idx, kv_idx]
    return causal


def _plain(f):
    return lambda: f


# name -> (kind, factory, None if it compiles else the ModError it raises)
MODS = {
    "_identity": ("score", _plain(_identity), None),
    "_times_two": ("score", _plain(times_two), None),
    "_squared": ("score", _plain(squared), None),
    "_causal": ("score", _plain(causal), None),
    "_inverse_causal": ("score", _plain(inverse_causal), None),
    "_rel_bias": ("score", _plain(rel_bias), None),
    "_rel_causal": ("score", _plain(rel_causal), None),
    "_generate_alibi_bias(8)": ("score", lambda: alibi_bias(8), None),
    "_head_offset": ("score", head_offset, None),
    "_trig": ("score", _plain(trig), None),
    "_trig2": ("score", _plain(trig2), None),
    "test_doc_mask_sparse": ("score", doc_mask_causal, None),
    "test_index_multiple": ("score", index_multiple, None),
    "test_index_weird1": ("score", index_weird1, None),
    "test_index_weird2": ("score", index_weird2, None),
    "test_skip_odd_keys": ("score", _plain(skip_odd_keys), None),
    "test_function_composition": ("score", composed, None),
    "test_captured_buffers_all_dims": ("score", captured_all_dims, None),
    "test_seq_masking": ("score", seq_masking, None),
    "test_load_from_bias_seq_only": ("score", bias_seq_only, None),
    "test_load_from_bias_seq_batch": ("score", bias_seq_batch, None),
    "test_load_from_bias_head_seq_batch": ("score", bias_head_seq_batch, None),
    "test_load_rel_bias": ("score", load_rel_bias, None),
    "test_dependent_causal_bidirectional": ("score", dependent_causal_bidirectional, None),
    "test_natten_2d": ("score", natten_2d, None),
    "test_subgraph_respect_decompostion": ("score", _plain(floor_div_sub), None),
    "test_silu_on_score": ("score", _plain(silu_score), None),
    "test_padded_dense_causal": ("score", padded_dense_causal, None),
    "test_captured_scale": ("score", captured_scale, None),
    "test_njt_causal": ("score", njt_causal, None),
    "test_new_empty_mask_mod(score)": ("score", new_empty_score, None),
    # PyTorch marks this one expectedFailure too: a reduction over a captured tensor.
    "test_captured_reduction": ("score", captured_reduction,
                                r"index every dimension before using it \(.sum\)"),
    "test_autograd_function_in_score_mod": ("score", autograd_function_in_score,
                                            "cannot be traced"),
    "_causal_mask": ("mask", _plain(causal_mask), None),
    "_inverse_causal_mask": ("mask", _plain(inverse_causal_mask), None),
    "noop_mask": ("mask", _plain(noop_mask), None),
    "and_masks(causal, sliding_window)": ("mask", lambda: and_masks(causal_mask,
                                                                     sliding_window_mask), None),
    "or_masks(causal, neg_causal)": ("mask", lambda: or_masks(causal_mask, neg_causal_mask),
                                     None),
    "and_masks(causal, neg_causal)": ("mask", lambda: and_masks(causal_mask, neg_causal_mask),
                                      None),
    "test_new_empty_mask_mod(mask)": ("mask", new_empty_mask, None),
}
OK = [n for n, (_, _, e) in MODS.items() if e is None]
SCORES = [n for n in OK if MODS[n][0] == "score"]
MASKS = [n for n in OK if MODS[n][0] == "mask"]


def _compile(fn, kind):
    return modtrace.compile_mod(fn, {"score": mods.ScoreMod, "mask": mods.MaskMod}[kind])


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.mark.parametrize("name", list(MODS))
def test_traces_or_names_why(name):
    kind, make, err = MODS[name]
    fn = make()
    if err is None:
        m = _compile(fn, kind)
        assert m.kind == kind and m.tile.__module__.startswith("flashattn_mods_")
        if kind == "score":
            assert m.differentiable
    else:
        with pytest.raises(ModError, match=err):
            _compile(fn, kind)


# --- the generated functions against torch, on tiles ---------------------------------------
def _tile_run(f, kind, m, score, b, h, qs, ks):
    from flashattn.interpret import runner, shim
    from flashattn.interpret import tile as T
    from flashattn.interpret.rebind import rebound
    shim.module()
    arrays = [runner.Array(runner._Root(t, n), (slice(None),) * t.dim(), n)
              for n, t in m.tensors]
    args = (T.Tile(score.numpy(), T.float32),) if kind == "score" else ()
    r = rebound(f)(*args, T.Tile(np.int32(b), T.int32), T.Tile(np.int32(h), T.int32),
                   T.Tile(qs.numpy()[:, None].astype(np.int32), T.int32),
                   T.Tile(ks.numpy()[None, :].astype(np.int32), T.int32), *arrays)
    return torch.from_numpy(np.broadcast_to(r.a, (len(qs), len(ks))).copy())


@pytest.mark.parametrize("name", OK)
def test_tile_values(name):
    """The tile function equals the torch function (and the derivative torch.autograd's) on
    32 x 32 tiles, for several (b, h) and positions."""
    kind, make, _ = MODS[name]
    fn = make()
    m = _compile(fn, kind)
    qs, ks = torch.arange(0, 32), torch.arange(8, 40)
    for b, h in ((0, 0), (1, 3)):
        bt, ht = torch.tensor(b), torch.tensor(h)
        if kind == "mask":
            want = torch.broadcast_to(fn(bt, ht, qs[:, None], ks[None, :]), (32, 32))
            got = _tile_run(m.tile, kind, m, None, b, h, qs, ks)
            assert got.dtype == torch.bool and torch.equal(got, want), (name, b, h)
            continue
        g = torch.Generator().manual_seed(seed_of(name) + b)
        s = (torch.randn(32, 32, generator=g) * 3).double().requires_grad_()
        want = fn(s, bt, ht, qs[:, None], ks[None, :])
        want.sum().backward()
        got = _tile_run(m.tile, kind, m, s.detach().float(), b, h, qs, ks)
        torch.testing.assert_close(got.double(), want.detach().double().expand(32, 32),
                                   rtol=2e-5, atol=2e-5, msg=f"{name} value")
        if m.grad is not None:
            dg = _tile_run(m.grad, kind, m, s.detach().float(), b, h, qs, ks)
        else:
            assert m.additive
            dg = torch.ones(32, 32)
        torch.testing.assert_close(dg.double(), s.grad.double(), rtol=2e-5, atol=2e-5,
                                   msg=f"{name} derivative")


# --- through flashattn.flex_attention ------------------------------------------------------------
def _qkv(case, Nq, Nk, D=16, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed_of(case))
    return [torch.randn(B, H, n, D, generator=g).to(dtype) for n in (Nq, Nk, Nk, Nq)]


def _vmapped(fn, kind="score"):
    """``fn`` applied as FlexAttention applies it (torch.vmap over b, h, q_idx, kv_idx: each call
    sees 0-d values), for the dense reference: chained indexing (``bias[b][q_idx]``) needs it."""
    n = 5 if kind == "score" else 4

    def apply(*args):
        f = fn
        for d in range(n - 1, n - 5, -1):
            dims = [None] * n
            dims[d] = 0
            if kind == "score":
                dims[0] = 0
            f = torch.vmap(f, in_dims=tuple(dims))
        return f(*args[:n - 4], *(a.flatten() for a in args[n - 4:]))
    return apply


def _floor(ref):
    # dS is rounded to the inputs' dtype for its matrix products: its error scales with the
    # gradient (a score function with a large derivative, score ** 2, makes dS large).
    return max(2e-3, 1e-3 * ref.abs().max().item())


@pytest.mark.parametrize("name", SCORES)
def test_score_mod_forward_and_backward(name):
    """Forward against PyTorch's flex_attention (fp64), backward against the fp64 reference with
    autograd; PyTorch's own error (the inputs' dtype) sets the tolerance."""
    fn = MODS[name][1]()
    m = _compile(fn, "score")
    q, k, v, do = _qkv(name, S, S)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        out = flex_attention(*leaves, score_mod=m,
                             kernel_options={"BLOCK_M": 16, "BLOCK_N": 16})
        out.backward(do)
    ref = torch_flex(q.double(), k.double(), v.double(), score_mod=fn)
    pt = torch_flex(q, k, v, score_mod=fn)
    assert_flash_criterion(out.detach(), ref.float(), pt, 1e-3, seed=name)
    grads = []
    for dt in (torch.float64, torch.float32):
        ls = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = flex_reference(*ls, score=_vmapped(fn))
        o.backward(do.to(dt))
        grads.append([t.grad for t in ls])
    for what, a, r, p in zip(("dq", "dk", "dv"), (t.grad for t in leaves), *grads):
        assert_flash_criterion(a, r.float(), p.half(), _floor(r), seed=f"{name}-{what}")


@pytest.mark.parametrize("name", MASKS)
def test_mask_mod_forward_and_backward(name):
    fn = MODS[name][1]()
    q, k, v, do = _qkv(name, S, S)
    bm = create_block_mask(fn, None, None, S, S, device="cpu", BLOCK_SIZE=16)
    ours = create_block_mask(fn, None, None, S, S, device="cpu", BLOCK_SIZE=16)
    ours.mask_mod = _compile(fn, "mask")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        out, aux = flex_attention(*leaves, block_mask=ours, return_aux=AuxRequest(lse=True))
        out.backward(do)
    ref, raux = torch_flex(q.double(), k.double(), v.double(), block_mask=bm,
                           return_aux=AuxRequest(lse=True))
    rlse = raux.lse
    pt = torch_flex(q, k, v, block_mask=bm)
    assert_flash_criterion(out.detach(), ref.float(), pt, 1e-3, seed=name)
    assert torch.equal(torch.isneginf(aux.lse), torch.isneginf(rlse))

    mask = _vmapped(fn, "mask")
    grads = []
    for dt in (torch.float64, torch.float32):
        ls = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = flex_reference(*ls, mask=mask)
        o.backward(do.to(dt))
        grads.append([t.grad for t in ls])
    for what, a, r, p in zip(("dq", "dk", "dv"), (t.grad for t in leaves), *grads):
        assert_flash_criterion(a, r.float(), p.half(), _floor(r), seed=f"{name}-{what}")


# --- what the tracer refuses, by name -------------------------------------------------------------
def _refuses(fn, kind, match):
    with pytest.raises(ModError, match=match):
        _compile(fn, kind)


def test_refusals_name_the_operation():
    t = torch.randn(S)
    _refuses(lambda s, b, h, q, kv: s if q > 3 else -s, "score", "Python control flow")
    _refuses(lambda s, b, h, q, kv: s + math.exp(q), "score", "Python float")
    _refuses(lambda s, b, h, q, kv: torch.cumsum(s, 0), "score", "torch.cumsum is not supported")
    _refuses(lambda s, b, h, q, kv: s + t, "score", "used whole")
    t2 = torch.randn(S, S)
    _refuses(lambda s, b, h, q, kv: s + t2[:, q], "score", "slice")
    _refuses(lambda s, b, h, q, kv: s + t[q / 2], "score", "float expression")
    _refuses(lambda b, h, q, kv: q - kv, "mask", "returned an integer value")
    _refuses(lambda s, b, h, q, kv: s.softmax(-1), "score", "Tensor.softmax is not supported")


def test_same_graph_shares_one_function_and_changes_are_seen():
    flag = {"add": True}
    scale = torch.tensor(2.0)

    def mod(score, b, h, q, kv):
        if flag["add"]:
            return score + scale
        return score * scale
    a, b = _compile(mod, "score"), _compile(mod, "score")
    assert a.tile is b.tile and a.additive
    flag["add"] = False
    c = _compile(mod, "score")
    assert c.tile is not a.tile and c.grad is not None and not c.additive


def test_cutile_defs_are_not_traced():
    def tile_def(score, b, h, q_idx, kv_idx):
        return mods.ct.tanh(score)
    m = modtrace.to_mod(tile_def, mods.ScoreMod)
    assert m.tile is tile_def


def test_score_must_be_a_float_value():
    with pytest.raises(TypeError, match="returned a bool value"):
        _compile(lambda s, b, h, q, kv: s > 0, "score")
    with pytest.raises(TypeError, match="returned a float, not a tile"):
        _compile(lambda s, b, h, q, kv: 1.0, "score")


def test_derivatives_at_ties_follow_torch():
    """clamp (1 on the closed interval), relu (0 at 0), maximum/minimum (half on a tie), abs
    (0 at 0), where: torch.autograd's choices at the points where the rules differ."""
    def mod(score, b, h, q, kv):
        return (torch.clamp(score, -1.0, 1.0) + torch.relu(score) + score.abs()
                + torch.maximum(score, (kv - q) * 1.0) + torch.minimum(score, kv * 0.0))
    m = _compile(mod, "score")
    qs, ks = torch.arange(0, 32), torch.arange(0, 32)
    s = torch.tensor([-1.0, 0.0, 1.0, 2.0, -3.0, 0.5, 5.0, 4.0]).repeat(32, 4)
    s[:, :8] = (ks[:8] - qs[:, None]).double().clamp(-1, 1)        # ties with kv - q
    s = s.double().requires_grad_()
    mod(s, torch.tensor(0), torch.tensor(0), qs[:, None], ks[None, :]).sum().backward()
    dg = _tile_run(m.grad, "score", m, s.detach().float(), 0, 0, qs, ks)
    torch.testing.assert_close(dg.double(), s.grad, rtol=0, atol=1e-6)


def test_tensors_converted_once_and_updates_seen():
    half = torch.randn(S, dtype=torch.float16)
    f32 = torch.randn(S)

    def mod(score, b, h, q, kv):
        return score + half[q] + f32[kv]
    a, b = _compile(mod, "score"), _compile(mod, "score")
    assert a.tensors[0][1] is b.tensors[0][1]                  # fp16 -> fp32 copied once
    assert a.tensors[1][1].data_ptr() == f32.data_ptr()       # fp32 read in place
    half.add_(1.0)                                             # a new version: a new copy
    c = _compile(mod, "score")
    assert torch.equal(c.tensors[0][1], half.float())
    big = torch.tensor([2**40])
    with pytest.raises(ModError, match="outside int32"):
        _compile(lambda s, b, h, q, kv: s + big[b * 0], "score")


def test_a_traced_mod_under_torch_compile(monkeypatch):
    """Traced eagerly, the mod passes through torch.compile(fullgraph=True) like a shipped one
    (the tracer itself does not run inside Dynamo), forward and backward equal to eager."""
    m = _compile(rel_causal, "score")
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 32, 16, generator=g).half() for _ in range(4))
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    comp = [t.clone().requires_grad_() for t in (q, k, v)]

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=m)
    monkeypatch.setenv("FLASHATTN_INTERPRET", "1")           # the compiled graph runs later
    torch._dynamo.reset()
    f(*eager).backward(do)
    out = torch.compile(f, fullgraph=True)(*comp)
    out.backward(do)
    for a, b in zip(eager, comp):
        assert torch.equal(a.grad, b.grad)


# --- on the GPU (-m gpu): the generated code compiled by tileiras and run ------------------------
GPU_DEVICE = "cuda"
GPU_MODS = ["_times_two", "_squared", "_causal", "_generate_alibi_bias(8)", "_head_offset",
            "_trig2", "test_index_weird2", "test_seq_masking", "test_load_rel_bias",
            "test_natten_2d", "test_silu_on_score", "test_njt_causal"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_MODS)
def test_gpu_score_mod_forward_and_backward(name):
    """The traced mod compiled for the GPU: forward and gradients against the dense fp64
    reference (PyTorch's own error: the same reference in fp32, rounded to fp16)."""
    fn = MODS[name][1]()
    dev = GPU_DEVICE
    # the captured tensors move with the mod: trace a version of fn reading CUDA copies
    m = _compile(fn, "score").to(dev)
    g = torch.Generator().manual_seed(seed_of(name))
    q, k, v, do = (torch.randn(B, H, S, 64, generator=g).half().to(dev)
                   for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = flex_attention(*leaves, score_mod=m)
    out.backward(do)
    grads, outs = [], []
    for dt in (torch.float64, torch.float32):
        ls = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        o, _ = flex_reference(*ls, score=_vmapped(_on(fn, dev)))
        o.backward(do.to(dt))
        outs.append(o)
        grads.append([t.grad for t in ls])
    assert_flash_criterion(out.detach().float(), outs[0].float(), outs[1].half(), 1e-3,
                           seed=name)
    for what, a, r, p in zip(("dq", "dk", "dv"), (t.grad for t in leaves), *grads):
        assert_flash_criterion(a.float(), r.float(), p.half(), _floor(r), seed=f"{name}-{what}")


def _on(fn, dev):
    """``fn`` with the tensors it captures (closure cells) moved to ``dev``, for the reference."""
    import types
    cells = []
    for c in fn.__closure__ or ():
        v = c.cell_contents
        cells.append(types.CellType(v.to(dev) if isinstance(v, torch.Tensor) else v))
    return types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__,
                              tuple(cells) or None)


def test_pytorch_paged_attention_mods_trace():
    """PagedAttention's converted score and mask mods (a page table read by kv_idx // page)."""
    from torch.nn.attention.experimental._paged_attention import PagedAttention
    pa = PagedAttention(8, 16, 2, device="cpu")
    for b in range(2):
        pa.reserve(torch.tensor(b), torch.tensor(48))
    bm = create_block_mask(causal_mask, 2, 1, 48, 48, device="cpu", BLOCK_SIZE=16)
    for fn, kind in ((pa.get_score_mod(rel_bias), "score"),
                     (pa.convert_logical_block_mask(bm).mask_mod, "mask")):
        m = _compile(fn, kind)
        qs, ks = torch.arange(0, 32), torch.arange(48, 80)      # pages of batch 1 and none
        for b in (0, 1):
            bt = torch.tensor(b)
            if kind == "mask":
                want = fn(bt, torch.tensor(0), qs[:, None], ks[None, :])
                assert torch.equal(_tile_run(m.tile, kind, m, None, b, 0, qs, ks), want)
            else:
                s = torch.randn(32, 32)
                want = fn(s, bt, torch.tensor(0), qs[:, None], ks[None, :])
                got = _tile_run(m.tile, kind, m, s, b, 0, qs, ks)
                torch.testing.assert_close(got, want.float())
