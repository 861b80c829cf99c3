"""flashattn.flex_attention takes what PyTorch's flex_attention takes (flashattn.flex_inputs):
the empty BlockMask built for ``block_mask=None``, K/V of batch 1 broadcast over the query's
batch, a value head dim different from the query's; forward against PyTorch's flex_attention
(fp64) and backward against the dense fp64 reference, in the interpreter. No GPU."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import (_create_empty_block_mask, create_block_mask,
                                               noop_mask)
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from flashattn import interpret
from flashattn.flex import flex_attention
from flashattn.flex_inputs import is_empty_block_mask

from criteria import assert_flash_criterion, seed_of
from flex_reference import flex_reference

warnings.filterwarnings("ignore", message=".*flex_attention.*")


def rel_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.05


def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _run(case, q, k, v, *, score=None, block_mask=None, ref_mask=None, gqa=False):
    """Ours (forward and gradients) against PyTorch's forward (fp64) and the dense reference's
    gradients (fp64; fp32 for PyTorch's own error)."""
    g = torch.Generator().manual_seed(seed_of(case))
    do = torch.randn(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], generator=g).to(q.dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        out = flex_attention(*leaves, score_mod=score, block_mask=block_mask, enable_gqa=gqa,
                             kernel_options=None if block_mask is not None and ref_mask else
                             {"BLOCK_M": 16, "BLOCK_N": 16})
        out.backward(do)
    # PyTorch broadcasts K/V over the batch only with a block mask of the query's batch
    bm = create_block_mask(ref_mask or noop_mask, q.shape[0], None, q.shape[2], k.shape[2],
                           device="cpu", BLOCK_SIZE=16)
    ref = torch_flex(q.double(), k.double(), v.double(), score_mod=score, block_mask=bm,
                     enable_gqa=gqa)
    pt = torch_flex(q, k, v, score_mod=score, block_mask=bm, enable_gqa=gqa)
    assert out.shape == ref.shape
    assert_flash_criterion(out.detach(), ref.float(), pt, 1e-3, seed=case)
    grads = []
    for dt in (torch.float64, torch.float32):
        ls = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
        kk, vv = (x.expand(q.shape[0], -1, -1, -1) for x in ls[1:])
        o, _ = flex_reference(ls[0], kk, vv, score, ref_mask)
        o.backward(do.to(dt))
        grads.append([t.grad for t in ls])
    for what, a, r, p in zip(("dq", "dk", "dv"), (t.grad for t in leaves), *grads):
        assert a.shape == r.shape, what
        assert_flash_criterion(a, r.float(), p.half(), 2e-3, seed=f"{case}-{what}")


def _qkv(case, B, Bkv, Hq, Hkv, N, D, Dv):
    g = torch.Generator().manual_seed(seed_of(case))
    return (torch.randn(B, Hq, N, D, generator=g).half(),
            torch.randn(Bkv, Hkv, N, D, generator=g).half(),
            torch.randn(Bkv, Hkv, N, Dv, generator=g).half())


def test_the_empty_block_mask_is_no_block_mask():
    q, k, v = _qkv("empty", 2, 2, 2, 2, 37, 16, 16)
    bm = _create_empty_block_mask(q, k)
    assert is_empty_block_mask(bm)
    assert not is_empty_block_mask(create_block_mask(causal, None, None, 37, 37, device="cpu"))
    _run("empty", q, k, v, score=rel_bias, block_mask=bm)


@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=["GQA", "MHA"])
def test_kv_batch_broadcast(heads):
    Hq, Hkv = heads
    q, k, v = _qkv(f"bcast{heads}", 3, 1, Hq, Hkv, 33, 16, 16)
    _run(f"bcast{heads}", q, k, v, score=rel_bias, gqa=Hq != Hkv)


def test_kv_batch_broadcast_with_a_block_mask():
    q, k, v = _qkv("bcast-mask", 3, 1, 2, 2, 40, 16, 16)
    bm = create_block_mask(causal, None, None, 40, 40, device="cpu", BLOCK_SIZE=16)
    _run("bcast-mask", q, k, v, block_mask=bm, ref_mask=causal)


@pytest.mark.parametrize("dims", [(32, 16), (16, 32), (24, 8)], ids=["Dv<D", "Dv>D", "24-8"])
def test_value_head_dim_differs(dims):
    D, Dv = dims
    q, k, v = _qkv(f"dv{dims}", 2, 2, 2, 2, 29, D, Dv)
    _run(f"dv{dims}", q, k, v, score=rel_bias)


def test_value_head_dim_with_a_block_mask_and_broadcast():
    q, k, v = _qkv("dv-mask", 2, 1, 4, 2, 40, 32, 16)
    bm = create_block_mask(causal, None, None, 40, 40, device="cpu", BLOCK_SIZE=16)
    _run("dv-mask", q, k, v, block_mask=bm, ref_mask=causal, gqa=True)


def test_what_is_still_refused():
    q, k, v = _qkv("refused", 2, 2, 2, 2, 16, 16, 16)
    with interpret.enabled():
        with pytest.raises(ValueError, match="must have the same shape"):
            flex_attention(q, k[:1], v)                              # K batch 1, V batch 2
        with pytest.raises(ValueError, match="must have the same shape"):
            flex_attention(q, k[..., :8], v)                         # K's D != Q's D
        with pytest.raises(ValueError, match="batch size differs"):
            flex_attention(q[:1].expand(2, -1, -1, -1).contiguous()[:, :, :, :],
                           torch.cat([k, k]), torch.cat([v, v]))   # K/V batch 4, Q batch 2
