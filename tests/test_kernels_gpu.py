"""Every step on the GPU against the fp32 reference (``pytest -m gpu``).

Pass criterion, as flash-attention's own tests: the kernel's max error against an fp32
reference is at most twice PyTorch's error at the same precision, plus a small floor.
Outputs are poisoned with NaN before each launch, so an unwritten element fails.

Each new combination of compile-time constants costs seconds of tileiras, so the matrix
is sampled: every step sees every value of every axis, not every product (run with
``-n 8`` from pytest-xdist to compile in parallel).
"""
import math

import pytest

import flashattn
from flashattn.steps import EXPERIMENTS, STEP_NAMES

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

CAUSAL = (False, True)
HEADS = ((8, 8), (8, 2), (8, 1), (32, 1))           # (Hq, Hkv): MHA, GQA 4:1, 8:1, MQA 32:1
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 80)
LENGTHS = ((1, 1, 0), (17, 17, 0), (113, 113, 0), (1023, 1023, 0), (4097, 4097, 0),
           (200, 333, 133), (50, 1000, 950), (300, 301, 0))   # (Nq, Nk, input_pos)
CASES_PER_STEP = 8


def sampled_cases():
    cases = []
    for i, step in enumerate(STEP_NAMES + tuple(EXPERIMENTS)):
        for c in range(CASES_PER_STEP):
            nq, nk, pos = LENGTHS[(c + i) % len(LENGTHS)]
            causal = CAUSAL[c % 2] or pos > 0
            hq, hkv = HEADS[(c + i) % len(HEADS)]
            dtype = DTYPES[(c // 2 + i) % len(DTYPES)]
            d = HEAD_DIMS[(c + 2 * i) % len(HEAD_DIMS)]
            b = 1 if nq > 2000 else 2
            cases.append(pytest.param(step, b, hq, hkv, nq, nk, d, dtype, causal, pos,
                                      id=f"{step}-b{b}-h{hq}:{hkv}-n{nq}:{nk}@{pos}-d{d}-"
                                         f"{dtype[:2]}-{'causal' if causal else 'full'}"))
    return cases


def make_inputs(b, hq, hkv, nq, nk, d, dtype, *, seed=0, magnitude=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = (torch.randn(b, hq, nq, d, generator=g, device="cuda") * magnitude).to(dt)
    k = (torch.randn(b, hkv, nk, d, generator=g, device="cuda") * magnitude).to(dt)
    v = torch.randn(b, hkv, nk, d, generator=g, device="cuda").to(dt)
    return q, k, v


def torch_same_precision(q, k, v, causal, scale, input_pos):
    """PyTorch's attention computed in the inputs' precision (the error budget's yardstick)."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        nq, nk = q.shape[2], k.shape[2]
        rows = torch.arange(nq, device=q.device)[:, None] + input_pos
        s = s.masked_fill(torch.arange(nk, device=q.device)[None, :] > rows, -math.inf)
    return torch.softmax(s, dim=-1) @ v


def run_step(step, q, k, v, causal, scale, input_pos):
    """Launch through the same path as attention(), on a NaN-poisoned output."""
    from flashattn.api import launch, resolve
    out = torch.full_like(q, math.nan)
    s, cfg = resolve(step, q, k, causal)
    launch(q, k, v, out, s, cfg, causal=causal, scale=scale, input_pos=input_pos)
    torch.cuda.synchronize()
    return out, cfg


def check(out, q, k, v, causal, scale, input_pos, floor):
    from flashattn.reference import attention as ref_attention
    ref = ref_attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
    pt = torch_same_precision(q, k, v, causal, scale, input_pos)
    assert not torch.isnan(out).any(), f"{torch.isnan(out).sum().item()} elements unwritten/NaN"
    assert torch.isfinite(out).all()
    err = (out.float() - ref).abs().max().item()
    err_pt = (pt.float() - ref).abs().max().item()
    assert err <= 2 * err_pt + floor, f"max error {err:.3g} > 2 x torch {err_pt:.3g} + {floor}"
    return err, err_pt


@pytest.mark.parametrize("step,b,hq,hkv,nq,nk,d,dtype,causal,pos", sampled_cases())
def test_step_matches_reference(step, b, hq, hkv, nq, nk, d, dtype, causal, pos, record_property):
    q, k, v = make_inputs(b, hq, hkv, nq, nk, d, dtype, seed=hash((step, nq, d)) % 1000)
    scale = 1.0 / math.sqrt(d)
    out, cfg = run_step(step, q, k, v, causal, scale, pos)
    floor = 1e-3 if dtype == "float16" else 8e-3
    err, err_pt = check(out, q, k, v, causal, scale, pos, floor)
    record_property("err_ratio", err / max(err_pt, 1e-12))
    record_property("config", cfg.label())


@pytest.mark.parametrize("step", [s for s in STEP_NAMES + tuple(EXPERIMENTS) if s != "naive"])
def test_large_logits_stay_finite(step):
    # Logits of several hundred: exp overflows without the running max (chapter 2).
    q, k, v = make_inputs(1, 4, 4, 256, 256, 64, "float16", seed=7, magnitude=6.0)
    scale = 1.0 / math.sqrt(64)
    out, _ = run_step(step, q, k, v, True, scale, 0)
    from flashattn.reference import attention as ref_attention
    ref = ref_attention(q, k, v, causal=True, scale=scale)
    assert torch.isfinite(out).all()
    assert (out.float() - ref).abs().max().item() < 2e-2


def test_attention_wrapper_noncontiguous_and_scale():
    # (B, N, H, D) memory viewed as (B, H, N, D): not contiguous.
    dt = torch.float16
    q = torch.randn(2, 77, 8, 64, device="cuda", dtype=dt).transpose(1, 2)
    k = torch.randn(2, 90, 2, 64, device="cuda", dtype=dt).transpose(1, 2)
    v = torch.randn(2, 90, 2, 64, device="cuda", dtype=dt).transpose(1, 2)
    assert not q.is_contiguous()
    out = flashattn.attention(q, k, v, causal=True, scale=0.3, input_pos=13, step="baseline")
    check(out, q, k, v, True, 0.3, 13, 1e-3)


def test_attention_wrapper_empty():
    q = torch.randn(0, 4, 16, 64, device="cuda", dtype=torch.float16)
    assert flashattn.attention(q, q, q).shape == (0, 4, 16, 64)
    q = torch.randn(1, 4, 0, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 4, 5, 64, device="cuda", dtype=torch.float16)
    assert flashattn.attention(q, k, k, causal=True).shape == (1, 4, 0, 64)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_drop_in(causal):
    import torch.nn.functional as F
    q, k, v = make_inputs(2, 8, 2, 129, 129, 128, "bfloat16", seed=3)
    out = flashattn.sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert (out.float() - ref.float()).abs().max().item() < 2e-2


def test_best_step_and_autotune_search(monkeypatch, tmp_path):
    monkeypatch.setenv("FLASHATTN_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path))
    from flashattn import autotune
    autotune._memory.clear()
    q, k, v = make_inputs(1, 4, 4, 512, 512, 64, "float16", seed=11)
    out = flashattn.attention(q, k, v, causal=True, step="autotune")
    check(out, q, k, v, True, 1 / 8, 0, 1e-3)
    cached = list(tmp_path.glob("autotune-*.json"))
    assert cached, "the search result is cached per GPU"
    out = flashattn.attention(q, k, v, causal=True)  # step="best"
    check(out, q, k, v, True, 1 / 8, 0, 1e-3)
