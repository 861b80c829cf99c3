"""flashattn.flex_attention in the interpreter against PyTorch's flex_attention run eagerly on CPU
(in the inputs' dtype, and in fp64 as the exact reference), with the FlashAttention criterion:
every shipped mod x causal or not x GQA x lengths that are not multiples of the block, Nq != Nk,
fp16/bf16; empty rows and blocks; bad mods and masks. No GPU."""
import math
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import flashattn
from flashattn import interpret, mods
from flashattn.flex import ModError, flex_attention

from criteria import assert_flash_criterion, seed_of

warnings.filterwarnings("ignore", message=".*flex_attention.*")


def _qkv(case, B, Hq, Hkv, Nq, Nk, D, dtype):
    g = torch.Generator().manual_seed(seed_of(case))
    return (torch.randn(B, Hq, Nq, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype))


def _doc_ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(n - 1, generator=g)[:3].add(1).tolist())
    ids = torch.zeros(n, dtype=torch.int32)
    for c in cuts:
        ids[c:] += 1
    return ids


# Each case: (score_mod, mask_mod) from (Hq, Nq, Nk, causal); "causal" adds the causal mask to a
# score function, or picks the causal variant of a mask.
def _case(name, Hq, Nq, Nk, causal):
    n = max(Nq, Nk)
    c = mods.causal() if causal else None
    if name == "none":
        return None, c
    if name == "window":
        return None, mods.sliding_window(7) if causal else mods.sliding_window(5, 9)
    if name == "chunked":
        return None, mods.chunked(8, causal=causal) if Nq != 45 else mods.chunked(12,
                                                                                 causal=causal)
    if name == "prefix_lm":
        return None, mods.prefix_lm(11) if causal else mods.prefix_lm(torch.tensor([3, 20],
                                                                                   dtype=torch.int32))
    if name == "document":
        return None, mods.document(_doc_ids(n, Nq), causal=causal)
    if name == "softcap":
        return mods.softcap(2.0), c
    if name == "alibi":
        return mods.alibi(mods.alibi_slopes(Hq)), c
    if name == "relative_bias":
        g = torch.Generator().manual_seed(n)
        return mods.relative_bias(torch.randn(Hq, 2 * n - 1, generator=g)), c
    if name == "sink":
        return None, c
    raise KeyError(name)


MODS = ["none", "window", "chunked", "prefix_lm", "document", "softcap", "alibi", "relative_bias", "sink"]


def _run_pair(q, k, v, score, mask, *, block, sinks=None, gqa=True):
    """(ours, lse), torch in q's dtype, fp64 reference (out, lse)."""
    B, Hq, Nq, _ = q.shape
    Nk = k.shape[2]
    bm = None
    if mask is not None:
        bm = create_block_mask(mask, B if mask.tensors and mask.tensors[0][1].dim() == 1 and
                               mask.tensors[0][0] == "prefix_len" else None, None, Nq, Nk,
                               device="cpu", BLOCK_SIZE=block)
    with interpret.enabled():
        out, lse = flex_attention(q, k, v, score_mod=score, block_mask=bm, enable_gqa=gqa,
                                  return_lse=True, sinks=sinks,
                                  kernel_options=None if bm is not None else
                                  {"BLOCK_M": 16, "BLOCK_N": 32})
    ref, rlse = torch_flex(q.double(), k.double(), v.double(), score_mod=score, block_mask=bm,
                           enable_gqa=gqa, return_aux=AuxRequest(lse=True))
    rlse = rlse.lse
    pt = torch_flex(q, k, v, score_mod=score, block_mask=bm, enable_gqa=gqa)
    if sinks is not None:
        ref, rlse = mods.sink_reference(ref, rlse, sinks.double())
        pt32, lse32 = torch_flex(q.float(), k.float(), v.float(), score_mod=score,
                                 block_mask=bm, enable_gqa=gqa, return_aux=AuxRequest(lse=True))
        pt = mods.sink_reference(pt32, lse32.lse, sinks)[0].to(q.dtype)
    return out, lse, pt, ref, rlse


def _check(out, lse, pt, ref, rlse, q, case):
    floor = 1e-3 if q.dtype == torch.float16 else 8e-3
    err, err_pt = assert_flash_criterion(out, ref.float(), pt, floor, seed=case)
    # The LSE: -inf exactly where FlexAttention's is (rows with no key), else close.
    inf = torch.isneginf(rlse)
    assert torch.equal(torch.isneginf(lse), inf), case
    assert (lse[~inf].double() - rlse[~inf]).abs().max().item() < 1e-3 if (~inf).any() else True
    return err, err_pt


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(37, 37, 4, 2), (20, 45, 2, 2), (45, 29, 4, 1)],
                         ids=["37x37-GQA", "20x45-MHA", "45x29-MQA"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", MODS)
def test_mod_matches_flexattention(name, causal, shape, dtype):
    Nq, Nk, Hq, Hkv = shape
    case = f"{name}{causal}{shape}{dtype}"
    q, k, v = _qkv(case, 2, Hq, Hkv, Nq, Nk, 32, dtype)
    score, mask = _case(name, Hq, Nq, Nk, causal)
    sinks = torch.linspace(-1.0, 2.0, Hq) if name == "sink" else None
    block = (16, 32) if shape[0] != 45 else 32
    out, lse, pt, ref, rlse = _run_pair(q, k, v, score, mask, block=block, sinks=sinks)
    _check(out, lse, pt, ref, rlse, q, case)


def test_no_block_mask_dense_and_scale():
    q, k, v = _qkv("dense", 1, 2, 2, 33, 50, 80, torch.float16)
    with interpret.enabled():
        out = flex_attention(q, k, v, scale=0.3, kernel_options={"BLOCK_M": 16, "BLOCK_N": 16})
    ref = torch_flex(q.double(), k.double(), v.double(), scale=0.3)
    pt = torch_flex(q, k, v, scale=0.3)
    assert_flash_criterion(out, ref.float(), pt, 1e-3, seed=0)


def test_user_def_mods_plain_python():
    """A plain def written with Python operators is both a torch and a cuTile mod."""
    def bidir_band(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx <= 4) & (kv_idx - q_idx <= 4)

    def halve(score, b, h, q_idx, kv_idx):
        return score * 0.5

    q, k, v = _qkv("user", 1, 2, 2, 40, 40, 16, torch.float16)
    bm = create_block_mask(bidir_band, None, None, 40, 40, device="cpu", BLOCK_SIZE=16)
    with interpret.enabled():
        out = flex_attention(q, k, v, score_mod=halve, block_mask=bm)
    ref = torch_flex(q.double(), k.double(), v.double(), score_mod=halve, block_mask=bm)
    pt = torch_flex(q, k, v, score_mod=halve, block_mask=bm)
    assert_flash_criterion(out, ref.float(), pt, 1e-3, seed=1)


def test_empty_rows_and_blocks():
    """Rows with no key: output 0 and LSE -inf, as FlexAttention; query blocks with no key
    block at all (kv_num_blocks = 0)."""
    def first_rows(b, h, q_idx, kv_idx):
        return (q_idx < 10) & (kv_idx <= q_idx)

    q, k, v = _qkv("empty", 1, 2, 2, 50, 50, 16, torch.float16)
    bm = create_block_mask(first_rows, None, None, 50, 50, device="cpu", BLOCK_SIZE=16)
    assert (bm.kv_num_blocks[0, 0, 1:] == 0).all() and bm.full_kv_num_blocks.sum() == 0
    with interpret.enabled():
        out, aux = flex_attention(q, k, v, block_mask=bm, return_aux=AuxRequest(lse=True))
    ref, rlse = torch_flex(q.double(), k.double(), v.double(), block_mask=bm, return_lse=True)
    assert (out[:, :, 10:] == 0).all()
    assert torch.isneginf(aux.lse[:, :, 10:]).all()
    assert torch.isfinite(aux.lse[:, :, :10]).all()
    assert (out.double() - ref).abs().max() < 2e-3
    assert (aux.lse[:, :, :10].double() - rlse[:, :, :10]).abs().max() < 1e-3


def test_block_size_served_by_smaller_tiles_and_tail():
    """A 64 x 64 BlockMask served by 16 x 32 tiles (Q_TILES_PER_BLOCK = 4, KV_TILES_PER_BLOCK = 2),
    Nk not a multiple of the key block (the tail's tiles wholly past Nk are skipped)."""
    q, k, v = _qkv("tiles", 1, 2, 2, 70, 70, 16, torch.float16)
    bm = create_block_mask(mods.sliding_window(20), None, None, 70, 70, device="cpu",
                           BLOCK_SIZE=64)
    with interpret.enabled():
        out = flex_attention(q, k, v, block_mask=bm,
                             kernel_options={"BLOCK_M": 16, "BLOCK_N": 32})
    ref = torch_flex(q.double(), k.double(), v.double(), block_mask=bm)
    pt = torch_flex(q, k, v, block_mask=bm)
    assert_flash_criterion(out, ref.float(), pt, 1e-3, seed=2)


def test_per_batch_and_head_block_masks():
    """A BlockMask with batch and head axes (document ids per batch, a head-dependent window)."""
    ids = torch.stack([_doc_ids(40, 1), _doc_ids(40, 2)])
    m = mods.document(ids, causal=True)
    q, k, v = _qkv("bh", 2, 2, 2, 40, 40, 16, torch.bfloat16)
    bm = create_block_mask(m, 2, None, 40, 40, device="cpu", BLOCK_SIZE=16)

    def head_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= 3 + 20 * h)
    bm2 = create_block_mask(head_window, None, 2, 40, 40, device="cpu", BLOCK_SIZE=16)
    for b in (bm, bm2):
        with interpret.enabled():
            out = flex_attention(q, k, v, block_mask=b)
        ref = torch_flex(q.double(), k.double(), v.double(), block_mask=b)
        pt = torch_flex(q, k, v, block_mask=b)
        assert_flash_criterion(out, ref.float(), pt, 8e-3, seed=3)


def test_returns_like_torch():
    q, k, v = _qkv("ret", 1, 2, 2, 16, 16, 16, torch.float16)
    with interpret.enabled():
        o1 = flex_attention(q, k, v)
        o2, lse = flex_attention(q, k, v, return_lse=True)
        o3, aux = flex_attention(q, k, v, return_aux=AuxRequest(lse=True))
    assert torch.equal(o1, o2) and torch.equal(o1, o3) and torch.equal(lse, aux.lse)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 16)
    assert flashattn.flex_attention is flex_attention


def test_kernel_compiled_once_per_mod_pair():
    from flashattn import flex
    a, b = mods.sliding_window(5), mods.sliding_window(5)
    assert a.tile is b.tile and mods.softcap(3.0).tile is mods.softcap(3.0).tile
    assert flex.flex_kernel(None, a) is flex.flex_kernel(None, b)
    assert flex.flex_kernel(None, a) is not flex.flex_kernel(None, mods.sliding_window(6))


# --- bad input ---------------------------------------------------------------------------------
def _bad(fn, exc, match):
    q, k, v = _qkv("bad", 1, 2, 2, 32, 32, 16, torch.float16)
    with interpret.enabled(), pytest.raises(exc, match=match):
        fn(q, k, v)


def test_bad_block_mask_shape():
    bm = create_block_mask(mods.causal(), None, None, 48, 48, device="cpu", BLOCK_SIZE=16)
    _bad(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), ValueError, "built for")


def test_bad_block_mask_device():
    bm = create_block_mask(mods.causal(), None, None, 32, 32, device="cpu", BLOCK_SIZE=16)
    bm = bm.to("meta")
    _bad(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), ValueError, "device")


def test_bad_block_size():
    bm = create_block_mask(mods.causal(), None, None, 32, 32, device="cpu", BLOCK_SIZE=24)
    _bad(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), ValueError,
         "block size 24 cannot be served")


def test_bad_block_mask_type():
    _bad(lambda q, k, v: flex_attention(q, k, v, block_mask=torch.ones(32, 32, dtype=bool)),
         TypeError, "BlockMask")


def test_mask_returning_float():
    def floaty(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).astype(flashattn.mods.ct.float32)
    bm = create_block_mask(mods.causal(), None, None, 32, 32, device="cpu", BLOCK_SIZE=16)
    bm.mask_mod = floaty
    _bad(lambda q, k, v: flex_attention(q, k, v, block_mask=bm), TypeError,
         "mask_mod 'floaty' returned a float32 tile")


def test_score_returning_bool_or_scalar():
    def boolish(score, b, h, q_idx, kv_idx):
        return score > 0

    def scalar(score, b, h, q_idx, kv_idx):
        return 1.0
    _bad(lambda q, k, v: flex_attention(q, k, v, score_mod=boolish), TypeError,
         "score_mod 'boolish' returned a bool")
    _bad(lambda q, k, v: flex_attention(q, k, v, score_mod=scalar), TypeError,
         "returned a float, not a tile")


def test_mod_that_cannot_run_on_tiles():
    def uses_torch(score, b, h, q_idx, kv_idx):
        return torch.cumsum(score, 0)       # torch code the tracer cannot express
    _bad(lambda q, k, v: flex_attention(q, k, v, score_mod=uses_torch), ModError,
         "score_mod 'uses_torch': torch.cumsum is not supported")


def test_lambda_and_wrong_kind():
    _bad(lambda q, k, v: flex_attention(q, k, v, score_mod=mods.causal()), TypeError,
         "is a mask mod")
    with pytest.raises(TypeError, match="lambda"):
        mods.ScoreMod("l", lambda s, b, h, qi, ki: s)


def test_mod_tensor_on_wrong_device():
    m = mods.alibi(mods.alibi_slopes(2)).to("meta")
    _bad(lambda q, k, v: flex_attention(q, k, v, score_mod=m), ValueError, "on meta")


def test_bad_options_and_arguments():
    _bad(lambda q, k, v: flex_attention(q, k, v, kernel_options={"num_warps": 4}), ValueError,
         "num_warps")
    _bad(lambda q, k, v: flex_attention(q, k[:, :1], v[:, :1]), ValueError, "enable_gqa")
    _bad(lambda q, k, v: flex_attention(q, k.float(), v), TypeError, "dtype")
    _bad(lambda q, k, v: flex_attention(q, k, v, sinks=torch.zeros(3)), ValueError, "sinks")
    _bad(lambda q, k, v: flex_attention(q, k, v, blasst_threshold=-1.0), ValueError, "blasst")
    def no_grad_mod(score, b, h, q_idx, kv_idx):
        return score * 2.0
    _bad(lambda q, k, v: flex_attention(q.requires_grad_(), k, v,
                                        score_mod=mods.ScoreMod("no_grad_mod", no_grad_mod)),
         NotImplementedError, "'no_grad_mod' has no derivative: it is forward-only")
    with pytest.raises(ValueError, match="sliding_window"):
        mods.sliding_window(-3)
    with pytest.raises(ValueError, match="softcap"):
        mods.softcap(0.0)


def test_chunked_mask_forward_and_backward_against_a_dense_mask():
    """mods.chunked: keys of the query's own chunk only (causal inside); gradients too."""
    N, C = 96, 32
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, N, 32, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    bm = create_block_mask(mods.chunked(C), None, None, N, N, device="cpu", BLOCK_SIZE=32)
    qh, kh, vh = (t.detach().half().requires_grad_() for t in (q, k, v))
    with interpret.enabled():
        out = flex_attention(qh, kh, vh, block_mask=bm)
        out.sum().backward()
    i = torch.arange(N)
    allowed = (i[:, None] // C == i[None, :] // C) & (i[:, None] >= i[None, :])
    s = (q @ k.transpose(-1, -2) / 32 ** 0.5).masked_fill(~allowed, -float("inf"))
    (torch.softmax(s, -1) @ v).sum().backward()
    assert (out.double() - torch.softmax(s, -1) @ v).abs().max() < 5e-3
    for a, b in ((qh, q), (kh, k), (vh, v)):
        assert (a.grad.double() - b.grad).abs().max() < 1e-2
    with pytest.raises(TypeError, match="chunk"):
        mods.chunked(0)
    with pytest.raises(TypeError, match="causal"):
        mods.chunked(8, causal=1)
