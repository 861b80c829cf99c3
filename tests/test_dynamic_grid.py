"""E28's dynamic persistent grid (experiments/dynamic_grid.py) on a CPU, in the interpreter:
every variant gives arch_tuned's bits in any program order, the counter is back at zero after
each launch (the next launch in the stream needs it), and the scripts refuse to run without a
GPU. The timing is experiments/data/39-dynamic-grid/."""
import importlib
import sys
from pathlib import Path

import pytest
import torch

import flashbook

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dyn():
    pytest.importorskip("cuda.tile")
    sys.path.insert(0, str(REPO))
    try:
        yield importlib.import_module("experiments.dynamic_grid")
    finally:
        sys.path.remove(str(REPO))


@pytest.mark.parametrize("causal", (True, False))
def test_variants_equal_arch_tuned(dyn, causal):
    import flashattn
    from flashattn import interpret
    from flashattn.config import Config
    g = torch.Generator().manual_seed(3 + causal)
    q = torch.randn(2, 4, 150, 64, generator=g, dtype=torch.float16)
    k, v = (torch.randn(2, 2, 150, 64, generator=g, dtype=torch.float16) for _ in range(2))
    with interpret.enabled("sm_90"):
        want = flashbook.attention(q, k, v, causal=causal, step="arch_tuned")
        for variant in dyn.VARIANTS:
            got = dyn.attention_dynamic(q, k, v, causal=causal, config=Config(64, 128),
                                        programs=3, variant=variant)
            assert torch.equal(got, want), variant
            assert dyn.counter(q.device).tolist() == [0, 0]


def test_shuffled_programs_take_every_item_once(dyn):
    from flashattn import interpret
    from flashattn.config import Config
    cfg = Config(64, 128)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 3, 130, 64, generator=g, dtype=torch.float16) for _ in range(3))
    out = torch.full_like(q, float("nan"))
    lse = torch.empty((1, 1, 1))
    counter = torch.zeros(2, dtype=torch.int32)
    args = dyn.DYNAMIC.args(
        dict(Q=q, K=k, V=v, Out=out, Lse=lse, Counter=counter),
        dict(qk_scale=0.125, input_pos=0, num_heads=3, group_size=1, num_m_blocks=3),
        dyn.constants(cfg, head_dim=64, causal=True, even_k=False, PREFETCH=True, LPT=True))
    interpret.launch((4, 1, 1), dyn.DYNAMIC.kernel(), args, shuffle=True, seed=5)
    assert not torch.isnan(out).any()                     # every (tile, head) written
    assert counter.tolist() == [0, 0]
    from flashattn.reference import attention
    ref = attention(q, k, v, causal=True, scale=0.125)
    assert (out.float() - ref.float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("script,args", (("dynamic_grid", ["--out", "x.json"]),
                                         ("pdl_sweep", ["--part", "decode", "--out", "x.json"])))
def test_scripts_need_a_gpu(dyn, script, args, capsys, monkeypatch, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    monkeypatch.chdir(tmp_path)
    mod = importlib.import_module(f"experiments.{script}")
    assert mod.main(args) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().err

