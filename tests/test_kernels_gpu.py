"""Every step on the GPU against the fp32 reference (``pytest -m gpu``).

Pass criterion, as flash-attention's own tests: the kernel's max error against an fp32
reference is at most twice PyTorch's error at the same precision, plus a small floor.
Outputs are poisoned with NaN before each launch, so an unwritten element fails.

Each new combination of compile-time constants costs seconds of tileiras, so the matrix
is sampled: every step sees every value of every axis, not every product (run with
``-n 8`` from pytest-xdist to compile in parallel).

Inputs are seeded from the test case's id (``zlib.crc32``, the same in every process and run,
unlike ``hash``), and every failure message names the seed.
"""
import math

import pytest
from criteria import assert_flash_criterion, seed_of

import flashattn
import flashbook
from flashbook.steps import EXPERIMENTS, STEP_NAMES

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
    from flashattn.autotune import resolve
    from flashattn.launch import launch
    out = torch.full_like(q, math.nan)
    s, cfg = resolve(step, q, k, causal)
    launch(q, k, v, out, s, cfg, causal=causal, scale=scale, input_pos=input_pos)
    torch.cuda.synchronize()
    return out, cfg


def check(out, q, k, v, causal, scale, input_pos, floor, *, seed):
    from flashattn.reference import attention as ref_attention
    ref = ref_attention(q, k, v, causal=causal, scale=scale, input_pos=input_pos)
    pt = torch_same_precision(q, k, v, causal, scale, input_pos)
    err, err_pt = assert_flash_criterion(out, ref, pt, floor, seed=seed)
    return err, err_pt


@pytest.mark.parametrize("step,b,hq,hkv,nq,nk,d,dtype,causal,pos", sampled_cases())
def test_step_matches_reference(step, b, hq, hkv, nq, nk, d, dtype, causal, pos, request,
                                record_property):
    seed = seed_of(request.node.callspec.id)
    q, k, v = make_inputs(b, hq, hkv, nq, nk, d, dtype, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out, cfg = run_step(step, q, k, v, causal, scale, pos)
    floor = 1e-3 if dtype == "float16" else 8e-3
    err, err_pt = check(out, q, k, v, causal, scale, pos, floor, seed=seed)
    record_property("seed", seed)
    record_property("err_ratio", err / max(err_pt, 1e-12))
    record_property("config", cfg.label())


# Configurations the steps' defaults do not reach: the num_worker_warps hint (warp-specialised
# kernels, chapter 10) and 128-row tiles, launched as bench runs a variant "STEP@CONFIG".
VARIANTS = ["arch_tuned@128x128:occ=1:nww=8", "arch_tuned@128x128:occ=1:nww=4",
            "baseline@64x128:occ=2"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_config_variants_match_reference(variant, causal, request):
    from flashattn.launch import launch
    from flashbook.measure.bench import step_of
    seed = seed_of(request.node.callspec.id)
    step, cfg = step_of(variant, None)
    assert cfg is not None and cfg.label() == variant.split("@")[1].replace(":", " ")
    q, k, v = make_inputs(2, 8, 2, 300, 300, 128, "float16", seed=seed)
    out = torch.full_like(q, math.nan)
    launch(q, k, v, out, step, cfg, causal=causal, scale=128 ** -0.5)
    torch.cuda.synchronize()
    check(out, q, k, v, causal, 128 ** -0.5, 0, 1e-3, seed=seed)


@pytest.mark.parametrize("step", [s for s in STEP_NAMES + tuple(EXPERIMENTS) if s != "naive"])
def test_large_logits_stay_finite(step):
    # Logits of several hundred: exp overflows without the running max (chapter 2).
    seed = 7
    q, k, v = make_inputs(1, 4, 4, 256, 256, 64, "float16", seed=seed, magnitude=6.0)
    scale = 1.0 / math.sqrt(64)
    out, _ = run_step(step, q, k, v, True, scale, 0)
    from flashattn.reference import attention as ref_attention
    ref = ref_attention(q, k, v, causal=True, scale=scale)
    assert torch.isfinite(out).all(), f"seed {seed}: infinite outputs"
    err = (out.float() - ref).abs().max().item()
    assert err < 2e-2, f"seed {seed}: max error {err:.3g}"


def test_attention_wrapper_noncontiguous_and_scale():
    # (B, N, H, D) memory viewed as (B, H, N, D): not contiguous.
    dt = torch.float16
    seed = 5
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(2, 77, 8, 64, generator=g, device="cuda").to(dt).transpose(1, 2)
    k = torch.randn(2, 90, 2, 64, generator=g, device="cuda").to(dt).transpose(1, 2)
    v = torch.randn(2, 90, 2, 64, generator=g, device="cuda").to(dt).transpose(1, 2)
    assert not q.is_contiguous()
    out = flashbook.attention(q, k, v, causal=True, scale=0.3, input_pos=13, step="baseline")
    check(out, q, k, v, True, 0.3, 13, 1e-3, seed=seed)


def test_attention_wrapper_empty():
    q = torch.randn(0, 4, 16, 64, device="cuda", dtype=torch.float16)
    assert flashattn.attention(q, q, q).shape == (0, 4, 16, 64)
    q = torch.randn(1, 4, 0, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(1, 4, 5, 64, device="cuda", dtype=torch.float16)
    assert flashattn.attention(q, k, k, causal=True).shape == (1, 4, 0, 64)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_drop_in(causal):
    import torch.nn.functional as F
    seed = 3
    q, k, v = make_inputs(2, 8, 2, 129, 129, 128, "bfloat16", seed=seed)
    out = flashattn.sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    err = (out.float() - ref.float()).abs().max().item()
    assert err < 2e-2, f"seed {seed}: max error {err:.3g}"


def test_unknown_step_fails_before_work_on_gpu(monkeypatch):
    from flashattn import api, autotune, launch

    def refuse(*a, **kw):
        raise AssertionError("work started before the step name was checked")
    for mod in (api, autotune):
        monkeypatch.setattr(mod, "resolve", refuse)
    for mod in (api, launch, autotune):
        monkeypatch.setattr(mod, "launch", refuse)
    q = torch.randn(1, 2, 8, 16, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="unknown step 'fastest'"):
        flashbook.attention(q, q, q, step="fastest")


@pytest.fixture
def fresh_autotune(monkeypatch, tmp_path):
    """Autotune on, its disk cache in tmp_path, its memory cache empty before and after."""
    from flashattn import autotune
    monkeypatch.setenv("FLASHATTN_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path))
    autotune.forget()
    yield tmp_path
    autotune.forget()


def test_best_step_and_autotune_search(fresh_autotune):
    seed = 11
    q, k, v = make_inputs(1, 4, 4, 512, 512, 64, "float16", seed=seed)
    out = flashbook.attention(q, k, v, causal=True, step="autotune")
    check(out, q, k, v, True, 1 / 8, 0, 1e-3, seed=seed)
    cached = list(fresh_autotune.glob("autotune-*.json"))
    assert cached, "the search result is cached per GPU"
    out = flashbook.attention(q, k, v, causal=True)  # step="best"
    check(out, q, k, v, True, 1 / 8, 0, 1e-3, seed=seed)
