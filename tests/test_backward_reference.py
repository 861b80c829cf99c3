"""The backward pass on the CPU (issue 11): exact gradients against torch.autograd, and the NumPy
emulation of the tiled kernels (kernels/fmha_bwd.py) against the exact gradients."""
import math
import zlib

import numpy as np
import pytest
import torch

from flashattn import reference as R
from flashattn.reference import backward as RB
from flashattn.config import Config


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


HEADS = {"1:1": (2, 2, 2), "4:1": (1, 4, 1), "8:1": (1, 8, 1)}             # (B, Hq, Hkv)
# (Nq, Nk, input_pos): single tokens, odd lengths, ragged tiles, Nq != Nk, a prefill after a
# cache (causal only), and more queries than keys.
SHAPES = [(1, 1, 0), (17, 17, 0), (113, 113, 0), (70, 200, 0), (70, 200, 130), (40, 17, 0)]
CASES = [(c, s) for c in (False, True) for s in SHAPES if c or not s[2]]
SMALL = Config(32, 16)     # many tiles even on short sequences, TILE_M != TILE_N
TALL = Config(16, 32)      # key tiles taller than query tiles
CONFIGS = {"64x64": (None, None), "32x16": (SMALL, None), "16x32+dq32x16": (TALL, SMALL)}


def case_id(x):
    return "x".join(map(str, x)) if isinstance(x, tuple) else ("causal" if x else "full")


def make(seed, B, Hq, Hkv, Nq, Nk, D, magnitude=1.0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Nq, D)) * magnitude
    k = rng.standard_normal((B, Hkv, Nk, D)) * magnitude
    v = rng.standard_normal((B, Hkv, Nk, D))
    do = rng.standard_normal((B, Hq, Nq, D))
    return tuple(t.astype(dtype) for t in (q, k, v, do))


def autograd_grads(q, k, v, do, **kw):
    """dQ, dK, dV of reference.attention by torch.autograd (float64)."""
    qt, kt, vt = (torch.tensor(t, dtype=torch.float64, requires_grad=True) for t in (q, k, v))
    R.attention(qt, kt, vt, **kw).backward(torch.tensor(do, dtype=torch.float64))
    return qt.grad.numpy(), kt.grad.numpy(), vt.grad.numpy()


def max_rel(a, b, floor=1e-30):
    """max |a - b| relative to max |b| (or to ``floor`` where b is all but zero)."""
    return np.abs(a - b).max() / max(np.abs(b).max(), floor)


# --- exact gradients ----------------------------------------------------------------------------
@pytest.mark.parametrize("D", [16, 80])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal,shape", CASES, ids=case_id)
def test_exact_gradients_are_autograds(causal, shape, heads, D):
    Nq, Nk, pos = shape
    B, Hq, Hkv = HEADS[heads]
    q, k, v, do = make(zlib.crc32(repr((causal, shape, heads, D)).encode()), B, Hq, Hkv, Nq,
                       Nk, D)
    kw = dict(causal=causal, input_pos=pos, scale=0.3 if D == 80 else None)
    got = R.attention_backward(q, k, v, do, **kw)
    want = autograd_grads(q, k, v, do, **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == np.float64, name
        assert max_rel(g, w) < 1e-12, (name, max_rel(g, w))


class _Attention(torch.autograd.Function):
    """reference.attention with reference.attention_backward as its backward."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, input_pos):
        ctx.save_for_backward(q, k, v)
        ctx.kw = dict(causal=causal, scale=scale, input_pos=input_pos)
        return R.attention(q, k, v, **ctx.kw)

    @staticmethod
    def backward(ctx, do):
        return (*R.attention_backward(*ctx.saved_tensors, do, **ctx.kw), None, None, None)


@pytest.mark.parametrize("causal,hq,hkv,nq,nk,pos", [(False, 2, 2, 3, 5, 0),
                                                     (True, 4, 2, 3, 5, 2),
                                                     (True, 4, 1, 4, 4, 0),
                                                     (False, 3, 1, 5, 2, 0)])
def test_gradcheck(causal, hq, hkv, nq, nk, pos):
    """Finite differences against the exact backward, float64."""
    g = torch.Generator().manual_seed(nq * 10 + nk)
    q = torch.randn(2, hq, nq, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, hkv, nk, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, hkv, nk, 6, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: _Attention.apply(q, k, v, causal, 0.7, pos),
                                    (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_lse_delta_and_the_recomputed_p():
    q, k, v, do = make(3, 2, 4, 2, 33, 50, 16)
    kw = dict(causal=True, input_pos=7, scale=0.25)
    lse = R.attention_lse(q, k, **kw)
    assert lse.shape == (2, 4, 33) and np.isfinite(lse).all()
    # P = exp(scale * S - lse) is the softmax, and delta = rowsum(dO o O) = rowsum(P o dP).
    kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
    s = 0.25 * q @ kr.swapaxes(-1, -2)
    s = np.where(R.causal_mask(33, 50, 7), s, -np.inf)
    p = np.exp(s - lse[..., None])
    assert np.allclose(p.sum(-1), 1.0, rtol=0, atol=1e-12)
    out = R.attention(q, k, v, **kw)
    assert np.allclose(p @ vr, out, rtol=0, atol=1e-12)
    delta = R.backward_delta(out, do)
    assert np.allclose(delta, (p * (do @ vr.swapaxes(-1, -2))).sum(-1), rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="one shape"):
        R.backward_delta(out, do[:, :, :5])


def test_dtypes_devices_and_validation():
    q, k, v, do = make(4, 1, 2, 1, 9, 12, 8, dtype=np.float32)
    got = R.attention_backward(q, k, v, do, causal=True, input_pos=3)
    assert all(isinstance(g, np.ndarray) and g.dtype == np.float32 for g in got)
    tq, tk, tv, tdo = (torch.from_numpy(t).half() for t in (q, k, v, do))
    got_t = R.attention_backward(tq, tk, tv, tdo, causal=True, input_pos=3)
    assert all(isinstance(g, torch.Tensor) and g.dtype == torch.float32 for g in got_t)
    want = R.attention_backward(*(t.astype(np.float64) for t in (q, k, v, do)), causal=True,
                                input_pos=3)
    for g, w in zip(got, want):
        assert max_rel(g, w) < 1e-5
    with pytest.raises(ValueError, match="dout must have the shape of q"):
        R.attention_backward(q, k, v, do[:, :, :3])
    with pytest.raises(ValueError, match="input_pos"):
        R.attention_backward(q, k, v, do, causal=True, input_pos=4)
    with pytest.raises(TypeError, match="floating"):
        R.attention_backward(q, k, v, do.astype(np.int32))


def test_empty_inputs():
    q, k, v, do = make(5, 1, 2, 2, 0, 7, 8)
    dq, dk, dv = R.attention_backward(q, k, v, do, causal=True)
    assert dq.shape == (1, 2, 0, 8) and (dk == 0).all() and (dv == 0).all()
    dq, dk, dv = R.emulate_backward(q, k, v, None, do, None, causal=True)
    assert dq.shape == (1, 2, 0, 8) and dk.shape == (1, 2, 7, 8) and (dk == 0).all()


# --- the schedules are the forward's ------------------------------------------------------------
def forward_pairs(Nq, Nk, causal, pos, config):
    """{(query tile, key tile): kind} the shipped forward visits."""
    out = {}
    for prog in R.schedule(Nq, Nk, causal=causal, input_pos=pos, config=config):
        for i, keys in zip(prog.query_tiles, prog.key_tiles):
            for j, kind in keys:
                out[(i, j)] = kind
    return out


SCHEDULE_SHAPES = [(nq, nk, pos) for nq in (1, 15, 16, 17, 64, 100) for nk in (1, 16, 33, 130)
                   for pos in sorted({0, max(0, nk - nq), max(0, nk - nq) // 2})]


@pytest.mark.parametrize("tm,tn", [(16, 16), (32, 16), (16, 64), (64, 64)])
def test_backward_schedules_are_the_forwards(tm, tn):
    config = Config(tm, tn)
    for nq, nk, pos in SCHEDULE_SHAPES:
        for causal in (False, True):
            if pos and not causal:
                continue
            fwd = forward_pairs(nq, nk, causal, pos, config)
            dkdv = {(i, p.key_tile): kind
                    for p in RB.dkdv_schedule(nq, nk, causal=causal, input_pos=pos, config=config)
                    for i, kind in p.query_tiles}
            dq = {(i, j): kind
                  for i, keys in RB.dq_schedule(nq, nk, causal=causal, input_pos=pos,
                                                config=config)
                  for j, kind in keys}
            assert dkdv == fwd, (nq, nk, pos, causal)
            assert dq == fwd, (nq, nk, pos, causal)
            # Each key tile's query tiles come in order, one program per key tile.
            progs = RB.dkdv_schedule(nq, nk, causal=causal, input_pos=pos, config=config)
            assert [p.key_tile for p in progs] == list(range(-(-nk // tn)))


@pytest.mark.parametrize("tm,tn", [(16, 16), (32, 16), (16, 64)])
def test_skipped_tiles_are_fully_masked_and_full_tiles_unmasked(tm, tn):
    """A tile the backward skips has no visible (query, key) pair; a tile it does not mask has
    no masked one (valid rows and keys only: padding is handled by the loads)."""
    config = Config(tm, tn)
    for nq, nk, pos in SCHEDULE_SHAPES:
        for causal in (False, True):
            if pos and not causal:
                continue
            visible = R.causal_mask(nq, nk, pos) if causal else np.ones((nq, nk), bool)
            pairs = forward_pairs(nq, nk, causal, pos, config)
            for i in range(-(-nq // tm)):
                for j in range(-(-nk // tn)):
                    tile = visible[i * tm:(i + 1) * tm, j * tn:(j + 1) * tn]
                    kind = pairs.get((i, j), "skipped")
                    if kind == "skipped":
                        assert not tile.any(), (nq, nk, pos, i, j)
                    elif kind == "full":
                        assert tile.all() and (j + 1) * tn <= nk, (nq, nk, pos, i, j)


# --- the emulation ------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("D", [16, 64, 80])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal,shape", CASES, ids=case_id)
def test_emulation_matches_exact(causal, shape, heads, D, config):
    Nq, Nk, pos = shape
    B, Hq, Hkv = HEADS[heads]
    seed = zlib.crc32(repr(("emu", causal, shape, heads, D, config)).encode())
    q, k, v, do = make(seed, B, Hq, Hkv, Nq, Nk, D, dtype=np.float32)
    dkdv_cfg, dq_cfg = CONFIGS[config]
    kw = dict(causal=causal, input_pos=pos)
    got = R.emulate_backward(q, k, v, None, do, None, config=dkdv_cfg, dq_config=dq_cfg, **kw)
    want = R.attention_backward(*(t.astype(np.float64) for t in (q, k, v, do)), **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == np.float32, name
        assert np.isfinite(g).all(), name
        # dQ is exactly 0 with one key: fp32 rounding is measured against 1.
        assert max_rel(g, w, 1.0) < 2e-5, (name, max_rel(g, w, 1.0))


def test_emulation_takes_the_forwards_out_and_lse():
    """With out and lse given (as the kernels get them), the same result as computing them."""
    q, k, v, do = make(8, 1, 4, 2, 50, 61, 32, dtype=np.float32)
    kw = dict(causal=True, input_pos=11, scale=0.2)
    out = R.attention(*(t.astype(np.float64) for t in (q, k, v)), **kw).astype(np.float32)
    lse = R.attention_lse(q.astype(np.float64), k.astype(np.float64), **kw).astype(np.float32)
    a = R.emulate_backward(torch.from_numpy(q), k, v, out, do, torch.from_numpy(lse),
                           config=SMALL, **kw)
    b = R.emulate_backward(q, k, v, None, do, None, config=SMALL, **kw)
    for x, y in zip(a, b):
        assert np.allclose(x, y, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="lse"):
        R.emulate_backward(q, k, v, out, do, lse[:, :, :3], **kw)


def test_unseen_keys_get_zero_gradients():
    """Causal with a short prefill at the start of a longer cache: keys past the last query's
    position are never seen, their programs visit no query tile, and dK = dV = 0 there."""
    q, k, v, do = make(9, 1, 4, 1, 20, 100, 16, dtype=np.float32)
    kw = dict(causal=True, input_pos=5)                       # keys 25..99 unseen
    progs = RB.dkdv_schedule(20, 100, config=SMALL, **kw)
    # The 32-row query tile reaches position 5 + 31 (rows past Nq included, as in the
    # forward): key tiles 0-2 (keys 0-47) are visited, 3-6 are not.
    assert [p.key_tile for p in progs if not p.query_tiles] == [3, 4, 5, 6]
    dq, dk, dv = R.emulate_backward(q, k, v, None, do, None, config=SMALL, **kw)
    ex = R.attention_backward(q, k, v, do, **kw)
    for g in (dk, dv, ex[1], ex[2]):
        assert (g[:, :, 25:] == 0).all()
    assert max_rel(dk, ex[1]) < 2e-5 and max_rel(dq, ex[0]) < 2e-5


def test_rows_that_see_nothing_of_a_masked_tile():
    """Key tiles taller than query tiles: in a diagonal tile, some query rows see none of the
    tile's keys. Their P is exp2(-inf - lse) = 0, not NaN."""
    q, k, v, do = make(10, 1, 2, 2, 40, 40, 16, dtype=np.float32)
    config = Config(16, 64)
    progs = RB.dkdv_schedule(40, 40, causal=True, config=config)
    assert progs[0].query_tiles == ((0, "masked"), (1, "masked"), (2, "masked"))
    got = R.emulate_backward(q, k, v, None, do, None, causal=True, config=config)
    want = R.attention_backward(q, k, v, do, causal=True)
    for g, w in zip(got, want):
        assert np.isfinite(g).all() and max_rel(g, w) < 2e-5


@pytest.mark.parametrize("causal", [False, True])
def test_large_logits_stay_finite(causal):
    """Logits in the hundreds: P recomputed from the LSE stays in [0, 1]; no NaN or inf."""
    q, k, v, do = make(11, 1, 4, 2, 77, 77, 64, magnitude=6.0)     # |scale * s| up to ~500
    kw = dict(causal=causal)
    want = R.attention_backward(q, k, v, do, **kw)
    assert all(np.isfinite(w).all() for w in want)
    want32 = R.attention_backward(*(t.astype(np.float32) for t in (q, k, v, do)), **kw)
    got = R.emulate_backward(*(t.astype(np.float32) for t in (q, k, v)), None,
                             do.astype(np.float32), None, config=SMALL, **kw)
    for name, g, w, w32 in zip(("dq", "dk", "dv"), got, want, want32):
        assert np.isfinite(g).all() and np.isfinite(w32).all(), name
        # fp32 scores of magnitude ~500 carry ~1e-4 absolute error into P: fp32's own error.
        assert max_rel(g, w) <= 2 * max_rel(w32, w) + 1e-4, name


def test_very_negative_logits_and_a_ragged_key_tile():
    """Every score very negative, so the LSE is too: an unmasked padded key (score 0) would give
    P = exp(0 - lse) = inf. The ragged last key tile is masked, as in the forward."""
    B, H, Nq, Nk, D = 1, 2, 20, 37, 16
    q = np.full((B, H, Nq, D), 4.0, np.float32)
    k = np.full((B, H, Nk, D), -4.0, np.float32)
    k += np.random.default_rng(12).standard_normal(k.shape).astype(np.float32)
    v = np.random.default_rng(13).standard_normal(k.shape).astype(np.float32)
    do = np.random.default_rng(14).standard_normal(q.shape).astype(np.float32)
    lse = R.attention_lse(q.astype(np.float64), k.astype(np.float64))
    assert lse.max() < -50
    got = R.emulate_backward(q, k, v, None, do, None, config=SMALL)
    want = R.attention_backward(*(t.astype(np.float64) for t in (q, k, v, do)))
    for g, w in zip(got, want):
        assert np.isfinite(g).all()
        assert np.abs(g - w).max() <= 1e-3 * max(np.abs(w).max(), 1.0)


@pytest.mark.parametrize("causal", [False, True])
def test_round_p_is_fp16_close(causal):
    q, k, v, do = make(15, 1, 4, 1, 100, 100, 64, dtype=np.float32)
    got = R.emulate_backward(q, k, v, None, do, None, causal=causal, round_p=True)
    want = R.attention_backward(q, k, v, do, causal=causal)
    for g, w in zip(got, want):
        assert max_rel(g, w) < 5e-3


def test_reexported_from_reference():
    for name in ("attention_backward", "attention_lse", "backward_delta", "emulate_backward",
                 "dkdv_schedule", "dq_schedule"):
        assert getattr(R, name) is getattr(RB, name)
    assert math.isclose(RB.INV_LOG_2, 1 / math.log(2))
