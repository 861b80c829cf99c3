"""The references of flashattn.reference (CPU): exact attention and the online softmax."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from flashattn import reference as R


def randn(rng, *shape, scale=1.0):
    return rng.standard_normal(shape) * scale


# --- Online softmax (chapter 2) ---
@pytest.mark.parametrize("n", [1, 7, 64, 100])
@pytest.mark.parametrize("magnitude", [1.0, 1e4])
def test_streaming_equals_softmax(n, magnitude):
    rng = np.random.default_rng(n)
    x = randn(rng, n, scale=magnitude)                               # (n,)
    ref = R.softmax(x)
    np.testing.assert_allclose(R.online_softmax_streaming(x), ref, rtol=1e-12, atol=1e-300)
    assert np.isfinite(ref).all() and abs(ref.sum() - 1) < 1e-12


@pytest.mark.parametrize("block", [1, 3, 16, 50, 128, 1000])
@pytest.mark.parametrize("magnitude", [1.0, 1e4])
def test_blockwise_equals_softmax(block, magnitude):
    rng = np.random.default_rng(block)
    x = randn(rng, 5, 100, scale=magnitude)                          # (rows, N)
    with np.errstate(over="ignore", invalid="ignore"):
        naive = np.exp(x) / np.exp(x).sum(-1, keepdims=True)
    if magnitude > 1:
        assert not np.isfinite(naive).all()                          # why the max is subtracted
    np.testing.assert_allclose(R.online_softmax_blockwise(x, block), R.softmax(x),
                               rtol=1e-12, atol=1e-300)


def test_traces():
    x = np.array([1.0, 3.0, 2.0, 5.0, -1.0])
    trace = R.online_softmax_trace(x)
    assert len(trace) == len(x)
    assert [m for m, _ in trace] == [1.0, 3.0, 3.0, 5.0, 5.0]         # running max
    for j, (m, d) in enumerate(trace):
        assert d == pytest.approx(np.exp(x[:j + 1] - m).sum())
    m, l = R.blockwise_trace(x[None], 2)                              # blocks [1,3] [2,5] [-1]
    assert m.shape == l.shape == (1, 3)
    np.testing.assert_allclose(m[0], [3.0, 5.0, 5.0])
    np.testing.assert_allclose(l[0, -1], np.exp(x - 5).sum())
    with pytest.raises(ValueError, match="block"):
        R.blockwise_trace(x, 0)


@pytest.mark.parametrize("block", [1, 16, 33])
def test_online_softmax_attention(block):
    rng = np.random.default_rng(block)
    q, k, v = randn(rng, 20, 24), randn(rng, 70, 24), randn(rng, 70, 24)
    ref = R.attention(q[None, None], k[None, None], v[None, None])[0, 0]
    np.testing.assert_allclose(R.online_softmax_attention(q, k, v, block), ref, rtol=1e-10,
                               atol=1e-12)


# --- Exact attention against PyTorch ---
def sdpa64(q, k, v, **kw):
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                          **kw)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(2, 2), (4, 1), (6, 2)])
@pytest.mark.parametrize("N,D", [(1, 16), (17, 59), (113, 64)])
def test_attention_vs_sdpa(causal, heads, N, D):
    torch.manual_seed(N * D)
    Hq, Hkv = heads
    q = torch.randn(2, Hq, N, D, dtype=torch.float64)
    k, v = (torch.randn(2, Hkv, N, D, dtype=torch.float64) for _ in range(2))
    out = R.attention(q, k, v, causal=causal)
    assert out.dtype == torch.float64 and out.shape == q.shape
    torch.testing.assert_close(out, sdpa64(q, k, v, is_causal=causal), rtol=1e-12, atol=1e-12)


def test_attention_scale_noncausal_rectangular():
    torch.manual_seed(0)
    q = torch.randn(1, 2, 30, 32, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 50, 32, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(R.attention(q, k, v, scale=0.3), sdpa64(q, k, v, scale=0.3))


def test_attention_dtypes_and_numpy():
    rng = np.random.default_rng(0)
    q, k, v = (randn(rng, 1, 2, 9, 16) for _ in range(3))
    out64 = R.attention(q, k, v, causal=True)
    assert isinstance(out64, np.ndarray) and out64.dtype == np.float64
    out32 = R.attention(*(t.astype(np.float32) for t in (q, k, v)), causal=True)
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, out64, rtol=1e-5, atol=1e-6)
    th = R.attention(*(torch.from_numpy(t).half() for t in (q, k, v)), causal=True)
    assert th.dtype == torch.float32                                   # fp16 is upcast
    np.testing.assert_allclose(th.numpy(), out64, atol=5e-3)


def test_input_pos_is_a_prefill_after_a_cache():
    """Prefilling the last n tokens after a cache of Nk - n equals the last n rows of causal."""
    torch.manual_seed(1)
    Nk, n = 40, 13
    q = torch.randn(1, 4, Nk, 16, dtype=torch.float64)
    k, v = (torch.randn(1, 2, Nk, 16, dtype=torch.float64) for _ in range(2))
    full = R.attention(q, k, v, causal=True)
    part = R.attention(q[:, :, -n:], k, v, causal=True, input_pos=Nk - n)
    torch.testing.assert_close(part, full[:, :, -n:], rtol=1e-12, atol=1e-12)
    # input_pos = 0 with Nq < Nk: row i sees keys 0..i (top-left aligned, as sdpa).
    torch.testing.assert_close(R.attention(q[:, :, :n], k, v, causal=True),
                               full[:, :, :n], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shapes,kw,match", [
    (((1, 2, 4, 8), (1, 2, 4), (1, 2, 4)), {}, "4 dimensions"),
    (((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 5, 8)), {}, "same shape"),
    (((2, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {}, "batch size"),
    (((1, 2, 4, 8), (1, 2, 4, 16), (1, 2, 4, 16)), {}, "head dim differs"),
    (((1, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)), {}, "multiple of key/value heads"),
    (((1, 2, 4, 8), (1, 2, 0, 8), (1, 2, 0, 8)), {}, "sequence length 0"),
    (((1, 2, 4, 300), (1, 2, 4, 300), (1, 2, 4, 300)), {}, "between 1 and 256"),
    (((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)), dict(causal=True, input_pos=3), "input_pos"),
    (((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)), dict(input_pos=1), "causal=True"),
    (((1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)), dict(scale=math.inf), "finite"),
])
def test_validation(shapes, kw, match):
    q, k, v = (torch.randn(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        R.attention(q, k, v, **kw)


def test_reference_is_a_package_with_the_contract_checks():
    import importlib

    from flashattn import contract
    tiles, exact, online = (importlib.import_module(f"flashattn.reference.{m}")
                            for m in ("tiles", "exact", "online"))
    assert R.check_shapes is contract.check_shapes
    assert R.attention is exact.attention and R.softmax is online.softmax
    assert R.schedule is tiles.schedule and R.key_tiles is tiles.key_tiles
    for name in R.__all__:
        assert hasattr(R, name), name


def test_validation_types():
    q = torch.randn(1, 1, 2, 8)
    with pytest.raises(TypeError, match="torch.Tensor"):
        R.attention(q, [1], q)
    with pytest.raises(TypeError, match="floating"):
        R.attention(q.long(), q.long(), q.long())
    with pytest.raises(TypeError, match="input_pos"):
        R.attention(q, q, q, causal=True, input_pos=0.5)
