"""flashattn as a transformers attention implementation (flashattn.integrations.transformers), on
CPU through the interpreter: tiny Llama, Mistral (sliding window), Gemma 2 (softcap + window) and
gpt-oss (sinks + window) models built from their config classes with random weights (nothing
downloaded), logits against the same weights run eagerly in float64, with the FlashAttention
criterion (PyTorch's own error: eager in the same dtype). Each feature is shown to bite: dropping
it breaks the criterion. Skipped without transformers."""
import copy
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import flex_transformers as ft  # noqa: E402

from flashattn import interpret, mods  # noqa: E402
from flashattn.integrations import transformers as fa_hf  # noqa: E402


def _bound(r):
    return 2 * r["err_pt"] + ft.FLOOR[getattr(torch, r["dtype"])]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind", ft.MODELS)
def test_logits_match_eager(kind, dtype, monkeypatch):
    dense = []
    real = mods.dense_mask
    monkeypatch.setattr(mods, "dense_mask", lambda *a: dense.append(1) or real(*a))
    r = ft.compare(kind, dtype)
    assert r["flex_calls"] == 2, r                      # both layers ran on flashattn
    assert not dense, "an unpadded causal/window mask took the dense-mask path"
    assert r["err"] <= _bound(r), r


@pytest.mark.parametrize("kind,dtype", [("llama", torch.float16), ("mistral", torch.bfloat16)])
def test_left_padding_through_the_dense_mask(kind, dtype, monkeypatch):
    dense = []
    real = mods.dense_mask
    monkeypatch.setattr(mods, "dense_mask", lambda *a: dense.append(1) or real(*a))
    r = ft.compare(kind, dtype, padded=True)
    assert dense and r["flex_calls"] == 2
    assert r["err"] <= _bound(r), r


@pytest.mark.parametrize("kind,drop", [("mistral", "sliding_window"), ("gemma2", "softcap"),
                                       ("gpt_oss", "s_aux")])
def test_each_feature_bites(kind, drop, monkeypatch):
    """The same comparison with the integration dropping one keyword fails the criterion (so
    the test above can fail, and the keyword is not a no-op on these inputs)."""
    real = fa_hf.attention_forward

    def dropped(module, q, k, v, attention_mask, **kw):
        kw.pop(drop, None)
        if drop == "sliding_window":
            attention_mask = None                # the mask carries the window too
        return real(module, q, k, v, attention_mask, **kw)
    monkeypatch.setattr(fa_hf, "attention_forward", dropped)
    r = ft.compare(kind, torch.float16, name="cutile_dropped")
    assert r["err"] > 5 * _bound(r), r


def _module(causal=True):
    return type("M", (), {"is_causal": causal})()


def _qkv(dtype=torch.float16, nq=20, nk=20):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 4, nq, 16, generator=g).to(dtype),
            torch.randn(1, 2, nk, 16, generator=g).to(dtype),
            torch.randn(1, 2, nk, 16, generator=g).to(dtype))


def test_structured_masks_recognised():
    """A boolean causal / sliding-window mask (query rows at the end of the keys) becomes the
    structured mask mod; anything else the dense one."""
    nq, nk = 5, 12
    pos = torch.arange(nq)[:, None] + nk - nq
    kv = torch.arange(nk)[None, :]
    causal = (kv <= pos)[None, None].expand(2, 1, nq, nk)
    m, per_batch = fa_hf._mask_mod(causal, B=2, Nq=nq, Nk=nk, causal=True, window=None)
    assert m.params == dict(left=-1, right=0, offset=nk - nq) and not per_batch
    win = causal & (pos - kv < 4)[None, None]
    m, _ = fa_hf._mask_mod(win, B=2, Nq=nq, Nk=nk, causal=True, window=4)
    assert m.params == dict(left=3, right=0, offset=nk - nq)
    pad = causal.clone()
    pad[1, :, :, :3] = False
    m, per_batch = fa_hf._mask_mod(pad, B=2, Nq=nq, Nk=nk, causal=True, window=None)
    assert m.name == "dense_mask" and per_batch
    assert torch.equal(m.tensors[0][1].bool(), pad[:, 0])
    add = torch.zeros(2, 1, nq, nk).masked_fill(~causal, torch.finfo(torch.float32).min)
    m, _ = fa_hf._mask_mod(add, B=2, Nq=nq, Nk=nk, causal=True, window=None)
    assert m.params["offset"] == nk - nq


def test_bad_input_is_refused():
    q, k, v = _qkv()
    with interpret.enabled():
        with pytest.raises(NotImplementedError, match="dropout"):
            fa_hf.attention_forward(_module(), q, k, v, None, dropout=0.1)
        with pytest.raises(TypeError, match="float16/bfloat16"):
            fa_hf.attention_forward(_module(), q.float(), k.float(), v.float(), None)
        bias = torch.zeros(1, 1, 20, 20)
        bias[..., 0] = 0.5
        with pytest.raises(ValueError, match="additive biases"):
            fa_hf.attention_forward(_module(), q, k, v, bias)
        heads = torch.ones(1, 4, 20, 20, dtype=torch.bool)
        heads[:, 1, :, 0] = False
        with pytest.raises(ValueError, match="head-dependent"):
            fa_hf.attention_forward(_module(), q, k, v, heads)
        with pytest.raises(ValueError, match="expected"):
            fa_hf.attention_forward(_module(), q, k, v, torch.ones(1, 1, 20, 7, dtype=bool))
        with pytest.raises(ValueError, match="s_aux"):
            fa_hf.attention_forward(_module(), q, k, v, None, s_aux=torch.zeros(3))
    with pytest.raises(ValueError, match="flash"):
        fa_hf.register("flashattn")


def test_output_layout_and_gradients():
    """(B, Nq, Hq, D) out, as transformers' SDPA integration; gradients reach q, k, v and sinks."""
    from flex_reference import flex_reference
    q, k, v = (t.clone().requires_grad_() for t in _qkv())
    sinks = torch.linspace(-1.0, 1.0, 4, requires_grad=True)
    with interpret.enabled():
        out, w = fa_hf.attention_forward(_module(), q, k, v, None, scaling=0.25, s_aux=sinks)
        out.float().sum().backward()
    assert w is None and out.shape == (1, 20, 4, 16)
    ref, _ = flex_reference(q.double(), k.double(), v.double(), mask=mods.causal(), scale=0.25,
                            sinks=sinks.double())
    assert (out.transpose(1, 2).double() - ref).abs().max() < 2e-3
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (q, k, v, sinks))


def test_library_does_not_import_transformers():
    import subprocess
    code = ("import sys, flashattn, flashattn.flex, flashattn.mods, flashattn.integrations; "
            "assert 'transformers' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
