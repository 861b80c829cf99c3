"""The flex backward in the interpreter: dQ, dK, dV (and the sink's gradient) for masks, block
masks and the shipped score functions with derivatives, against a dense fp64 reference with
autograd (PyTorch's flex_attention has no backward on CPU), with the FlashAttention criterion
(PyTorch's own error: the same reference run in the inputs' dtype). No GPU."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import flashattn
from flashattn import interpret, mods
from flashattn.flex import flex_attention

from criteria import assert_flash_criterion, seed_of
from flex_reference import flex_reference
from test_flex import _case, _doc_ids

warnings.filterwarnings("ignore", message=".*flex_attention.*")

MODS = ["none", "window", "prefix_lm", "document", "softcap", "alibi", "relative_bias", "sink"]


def _grads(case, name, causal, shape, dtype, block):
    Nq, Nk, Hq, Hkv = shape
    g = torch.Generator().manual_seed(seed_of(case))
    q, k, v, do = (torch.randn(2, h, n, 32, generator=g).to(dtype)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    score, mask = _case(name, Hq, Nq, Nk, causal)
    sinks = torch.linspace(-1.0, 2.0, Hq) if name == "sink" else None
    bm = None
    if mask is not None:
        bm = create_block_mask(mask, 2 if mask.name == "prefix_lm(tensor)" else None, None, Nq,
                               Nk, device="cpu", BLOCK_SIZE=block)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.clone().requires_grad_())
    with interpret.enabled():
        out = flex_attention(*leaves[:3], score_mod=score, block_mask=bm, enable_gqa=True,
                             sinks=leaves[3] if sinks is not None else None,
                             kernel_options=None if bm is not None else {"BLOCK_M": 16,
                                                                         "BLOCK_N": 32})
        out.backward(do)
    ours = [t.grad for t in leaves]

    def ref_grads(dt):
        ls = [t.detach().to(dt).requires_grad_() if t.is_floating_point() else t
              for t in leaves]
        o, _ = flex_reference(ls[0], ls[1], ls[2], score, mask,
                              sinks=ls[3] if sinks is not None else None)
        o.backward(do.to(dt))
        return [t.grad for t in ls]
    return ours, ref_grads(torch.float64), ref_grads(torch.float32), out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", [(37, 37, 4, 2), (20, 45, 2, 1)], ids=["37x37-GQA", "20x45-MQA"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", MODS)
def test_backward_matches_reference(name, causal, shape, dtype):
    case = f"bwd{name}{causal}{shape}{dtype}"
    ours, ref, ref32, _ = _grads(case, name, causal, shape, dtype, (16, 32))
    floor = 2e-3 if dtype == torch.float16 else 2e-2
    for what, a, r, p in zip(("dq", "dk", "dv", "dsinks"), ours, ref, ref32):
        # PyTorch's own error: the fp32 reference's gradient rounded to the inputs' dtype.
        pt = p.to(dtype) if what != "dsinks" else p
        assert_flash_criterion(a, r.float(), pt, floor * (4 if what == "dsinks" else 1),
                               seed=f"{case}-{what}")


def test_user_mod_with_a_derivative():
    def scaled(score, b, h, q_idx, kv_idx):
        return score * 0.5

    def d_scaled(score, b, h, q_idx, kv_idx):
        return score * 0.0 + 0.5
    m = mods.ScoreMod("scaled", scaled, grad=d_scaled)
    ours, ref, ref32, _ = _grads_with(m)
    for a, r, p in zip(ours, ref, ref32):
        assert_flash_criterion(a, r.float(), p.half(), 2e-3, seed="user")


def _grads_with(score):
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 33, 16, generator=g).half() for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        flex_attention(*leaves, score_mod=score,
                       kernel_options={"BLOCK_M": 16, "BLOCK_N": 16}).backward(do)

    def rg(dt):
        ls = [t.detach().to(dt).requires_grad_() for t in leaves]
        flex_reference(*ls, score).__getitem__(0).backward(do.to(dt))
        return [t.grad for t in ls]
    return [t.grad for t in leaves], rg(torch.float64), rg(torch.float32), None


def test_window_size_and_softcap_are_differentiable():
    g = torch.Generator().manual_seed(7)
    q, k, v, do = (torch.randn(1, 2, 40, 32, generator=g).half() for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        flashattn.attention(*leaves, causal=True, window_size=(8, 0), softcap=3.0).backward(do)
    m, s = mods.sliding_window(8, 0), mods.softcap(3.0)
    ls = [t.detach().double().requires_grad_() for t in leaves]
    flex_reference(*ls, s, m)[0].backward(do.double())
    for a, r in zip(leaves, ls):
        assert (a.grad.double() - r.grad).abs().max() < 1e-2


def test_blasst_and_grad_refused():
    q, k, v = (torch.randn(1, 2, 16, 16).half().requires_grad_() for _ in range(3))
    with interpret.enabled(), pytest.raises(NotImplementedError, match="blasst"):
        flex_attention(q, k, v, blasst_threshold=8.0)


def test_torch_compile_fullgraph_through_the_operator():
    """flashattn::flex_fwd / flex_bwd are torch.library operators: torch.compile(fullgraph=True)
    traces flex_attention with a BlockMask and a score function, forward and backward."""
    import os
    g = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(1, 2, 32, 16, generator=g).half() for _ in range(4))
    bm = create_block_mask(mods.causal(), None, None, 32, 32, device="cpu", BLOCK_SIZE=16)
    sc = mods.softcap(3.0)

    def f(q, k, v):
        return flex_attention(q, k, v, score_mod=sc, block_mask=bm)
    eager = [t.clone().requires_grad_() for t in (q, k, v)]
    comp = [t.clone().requires_grad_() for t in (q, k, v)]
    old = os.environ.get("FLASHATTN_INTERPRET")
    os.environ["FLASHATTN_INTERPRET"] = "1"            # the compiled graph runs later
    try:
        torch._dynamo.reset()
        f(*eager).backward(do)
        out = torch.compile(f, fullgraph=True)(*comp)
        out.backward(do)
    finally:
        if old is None:
            os.environ.pop("FLASHATTN_INTERPRET")
        else:
            os.environ["FLASHATTN_INTERPRET"] = old
    for a, b in zip(eager, comp):
        assert torch.equal(a.grad, b.grad)
