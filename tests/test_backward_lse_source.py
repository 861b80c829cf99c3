"""The forward kernel, LSE output included, run on a CPU by ``flashattn.interpret`` (issue 11):
every fused step writes the same output as the reference and, with WRITE_LSE, the natural-log
LSE of each row that the backward takes. Without WRITE_LSE the one-element stand-in Lse is never
touched. Then the chain: the forward kernel's output and LSE into the backward kernels (and their
emulation), against the exact gradients.

The launches are built as ``flashattn.launch.fmha_args`` builds them (``fmha_grid``,
``FMHA.args``, ``fmha_constants``), on CPU tensors; the persistent grid takes a small SM count so
that each program loops over several work items.
"""
import math

import pytest
import torch

from criteria import assert_close_to_reference, seed_of
from flashattn import interpret
from flashattn import reference as R
from flashattn.kernels import fmha_constants, fmha_grid, fmha_spec
from flashbook.steps import EXPERIMENTS, STEPS, Config, with_config
from test_backward_gpu import reference, torch_same_precision
from test_backward_kernels import assert_gradients, fp16_inputs, run_backward_kernels

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

FUSED = [n for n, s in {**STEPS, **EXPERIMENTS}.items() if s.kernel == "fmha"]


def run_forward(step_name, q, k, v, *, causal, scale, input_pos, config, write_lse, seed=0):
    """(out, lse) of fmha_kernel for one step at ``config``, run by the interpreter (programs
    shuffled) into NaN-poisoned outputs; without ``write_lse`` lse is the (1, 1, 1) stand-in."""
    step = with_config({**STEPS, **EXPERIMENTS}[step_name], config)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    out = torch.full(q.shape, math.nan, dtype=q.dtype)
    lse = torch.full((B, Hq, Nq) if write_lse else (1, 1, 1), math.nan, dtype=torch.float32)
    grid = fmha_grid(step, config, B=B, Hq=Hq, Nq=Nq, sm_count=3)
    spec = fmha_spec(step)
    args = spec.args(dict(Q=q, K=k, V=v, Out=out, Lse=lse),
                     dict(qk_scale=scale, input_pos=input_pos, num_heads=Hq,
                          group_size=Hq // Hkv, num_m_blocks=-(-Nq // config.TILE_M)),
                     fmha_constants(step, config, head_dim=D, causal=causal,
                                    even_k=Nk % config.TILE_N == 0, write_lse=write_lse))
    interpret.launch(grid, spec.kernel(), args, shuffle=True, seed=seed)
    return out, lse


CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal, input_pos)
    (1, 2, 1, 70, 100, 32, True, 30),       # GQA, a prefill after a cache, ragged tiles
    (2, 2, 2, 45, 45, 16, True, 0),         # ragged square
    (1, 2, 1, 50, 33, 32, False, 0),        # Nq > Nk, non-causal
    (1, 2, 2, 64, 64, 32, False, 0),        # whole tiles (UNCHECKED_KV's case)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("step", FUSED)
def test_forward_kernel_writes_the_lse(step, case, request):
    B, Hq, Hkv, Nq, Nk, D, causal, pos = case
    seed = seed_of(request.node.callspec.id)
    q, k, v, _ = fp16_inputs(B, Hq, Hkv, Nq, Nk, D, seed=seed)
    scale = 0.9 / math.sqrt(D)
    kw = dict(causal=causal, scale=scale, input_pos=pos)
    ref_lse = R.attention_lse(q.double(), k.double(), **kw)
    config = Config(16, 32)
    out, lse = run_forward(step, q, k, v, config=config, write_lse=True, seed=seed, **kw)
    assert_close_to_reference(out, q, k, v, seed=seed, **kw)
    assert torch.isfinite(lse).all(), f"{(~torch.isfinite(lse)).sum()} LSE rows unwritten"
    # exp2 approximations (exp_poly) and the lazy max (lazy_rescale) leave the LSE exact to
    # fp32 rounding of the row sums: well under the backward's needs.
    err = (lse.double() - ref_lse).abs().max().item()
    assert err < 2e-3 * max(1.0, ref_lse.abs().max().item()), err
    # Off: the same output, bit for bit, and the one-element stand-in untouched.
    out_off, stand_in = run_forward(step, q, k, v, config=config, write_lse=False,
                                    seed=seed + 1, **kw)
    assert torch.equal(out_off, out) and torch.isnan(stand_in).all()


def test_the_lse_feeds_the_backward():
    # The chain on a CPU: the forward kernel's out and LSE, then the backward kernels and their
    # emulation, against the exact gradients by the FlashAttention criterion.
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 40, 56, 32
    seed = 3
    q, k, v, dout = fp16_inputs(B, Hq, Hkv, Nq, Nk, D, seed=seed)
    kw = dict(causal=True, scale=0.2, input_pos=16)
    out, lse = run_forward("warp_groups", q, k, v, config=Config(16, 16), write_lse=True, **kw)
    _, _, exact = reference(q, k, v, dout, True, 0.2, 16)
    pt = torch_same_precision(q, k, v, dout, True, 0.2, 16)
    configs = {"bwd_dkdv": Config(16, 32), "bwd_dq": Config(32, 16)}
    got = run_backward_kernels(q, k, v, out, dout, lse, configs=configs, **kw)[:3]
    emu = R.emulate_backward(q, k, v, out, dout, lse, config=configs["bwd_dkdv"],
                             dq_config=configs["bwd_dq"], round_p=True, **kw)
    for grads in (got, [torch.from_numpy(g) for g in emu]):
        assert_gradients(grads, exact, pt, seed=seed)
