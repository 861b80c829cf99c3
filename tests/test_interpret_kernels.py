"""Every kernel's source, run in the interpreter on small awkward cases, against the fp64
reference with the FlashAttention criterion (issue 20's grid). No GPU."""
import sys
from pathlib import Path

import pytest
import torch

import flashattn
import flashbook
from flashattn import interpret, reference

from criteria import assert_close_to_reference, seed_of

ROOT = Path(__file__).resolve().parents[1]

ALL_STEPS = list(flashbook.STEP_NAMES) + list(flashbook.EXPERIMENTS)


def _qkv(case, B, Hq, Hkv, Nq, Nk, D, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed_of(case))
    return (torch.randn(B, Hq, Nq, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype),
            torch.randn(B, Hkv, Nk, D, generator=g).to(dtype))


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("step", ALL_STEPS)
def test_every_step_and_experiment(step, causal):
    """GQA 4:2, a ragged length and a head dim that is not a power of two."""
    q, k, v = _qkv(f"{step}{causal}", 1, 4, 2, 113, 113, 80)
    with interpret.enabled():
        out = flashbook.attention(q, k, v, causal=causal, step=step)
    assert_close_to_reference(out, q, k, v, causal=causal)


@pytest.mark.parametrize("N", [1, 17, 113, 200])
@pytest.mark.parametrize("D", [16, 80, 128, 256])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
def test_best_on_awkward_shapes(N, D, heads):
    Hq, Hkv = heads
    causal = (N + D) % 2 == 0 or N == 1
    q, k, v = _qkv(f"best{N}{D}{heads}", 1, Hq, Hkv, N, N, D)
    with interpret.enabled():
        out = flashattn.attention(q, k, v, causal=causal)
    assert_close_to_reference(out, q, k, v, causal=causal)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_80"])
def test_best_of_each_architecture(arch):
    q, k, v = _qkv(arch, 1, 2, 2, 200, 200, 128, torch.bfloat16)
    with interpret.enabled(arch):
        out = flashattn.attention(q, k, v, causal=True)
    assert_close_to_reference(out, q, k, v, causal=True)


@pytest.mark.parametrize("input_pos,Nq,Nk", [(100, 17, 117), (183, 17, 200), (0, 1, 200)])
def test_input_pos(input_pos, Nq, Nk):
    q, k, v = _qkv(f"pos{input_pos}", 1, 4, 2, Nq, Nk, 64)
    with interpret.enabled():
        out = flashbook.attention(q, k, v, causal=True, input_pos=input_pos, step="arch_tuned")
    assert_close_to_reference(out, q, k, v, causal=True, input_pos=input_pos)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("N,D", [(17, 80), (150, 64)])
def test_backward_variants(deterministic, causal, N, D):
    from flashattn import launch_bwd
    q, k, v = _qkv(f"bwd{deterministic}{causal}{N}", 1, 4, 2, N, N, D)
    g = torch.Generator().manual_seed(3)
    do = torch.randn(q.shape, generator=g).half()
    with interpret.enabled():
        out, lse = flashattn.autograd.attention_forward(q, k, v, causal=causal)[:2] \
            if hasattr(flashattn.autograd, "attention_forward") else (None, None)
        if out is None:
            pytest.skip("no attention_forward")
        dq, dk, dv = launch_bwd.attention_backward(q, k, v, out, do, lse, causal=causal,
                                                   deterministic=deterministic)[:3]
    ref = reference.attention_backward(q.double(), k.double(), v.double(), do.double(),
                                       causal=causal)
    pt = reference.attention_backward(q.float(), k.float(), v.float(), do.float(),
                                      causal=causal)
    for got, r, p in zip((dq, dk, dv), ref, pt):
        err, err_pt = (got.double() - r).abs().max().item(), (p.half().double() - r).abs().max()
        assert torch.isfinite(got).all() and err <= 2 * err_pt.item() + 1e-2, (err, err_pt)


def test_agreement_script_runs_its_cpu_side(tmp_path):
    """issue 25's script, the GPU parts skipped: every case meets the criterion here."""
    sys.path.insert(0, str(ROOT / "experiments"))
    import gpu_agreement
    assert gpu_agreement.main(["--cpu-only", "--out", str(tmp_path / "a.json")]) == 0
    import json
    doc = json.loads((tmp_path / "a.json").read_text())
    names = [r["case"] for r in doc["rows"]]
    for part in ("forward naive", "backward atomic", "decode fused", "decode paged",
                 "decode row", "decode block", "decode final", "varlen causal, an empty"):
        assert any(part in n for n in names), part
    assert all(r["interp_ok"] for r in doc["rows"])
