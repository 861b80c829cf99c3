"""The flex backward's per-architecture tiles (flashattn.kernels.flex_spec.FLEX_BWD_CONFIGS, and
FLEX_BWD_SCORE_CONFIGS for dK/dV with a score function): the plan (pure), and the gradients in
the interpreter at the table's tiles, BlockMask blocks of 128 and 64. No GPU."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import flashattn.flex_launch as F
from flashattn import interpret, mods
from flashattn.flex import (BWD_CONFIG, FLEX_BWD_CONFIGS, FLEX_BWD_SCORE_CONFIGS, Config,
                            flex_attention, flex_bwd_plan)

from criteria import assert_flash_criterion, seed_of
from flex_reference import flex_reference

warnings.filterwarnings("ignore", message=".*flex_attention.*")


def _plan(arch, block, D=128, ko=None, N=1024, score=None):
    return flex_bwd_plan(B=1, Hq=4, Hkv=2, Nq=N, Nk=N, D=D, block_size=block, has_full=True,
                         mask=mods.causal(), arch=arch, kernel_options=ko, score=score)


def test_the_table_serves_blocks_of_128():
    for arch in ("sm_90", "sm_100"):
        dkdv, dq = FLEX_BWD_CONFIGS[arch][128]
        p = _plan(arch, (128, 128))
        for name, cfg in (("dkdv", dkdv), ("dq", dq)):
            c = p[name]["constants"]
            assert (c["TILE_M"], c["TILE_N"]) == (cfg.TILE_M, cfg.TILE_N), (arch, name)
            assert p[name]["hints"] == cfg.hints()
            per_block = (c["Q_TILES_PER_BLOCK"], c["KV_TILES_PER_BLOCK"])
            assert per_block == (128 // cfg.TILE_M, 128 // cfg.TILE_N)
        assert p["dq"]["grid"] == (1024 // dq.TILE_M, 4, 1)
        assert p["dkdv"]["grid"] == (1024 // dkdv.TILE_N, 2, 1)
    assert _plan("sm_90", (128, 128))["dq"]["hints"] == {"num_worker_warps": 8}
    assert _plan("sm_90", (128, 128), D=64)["dq"]["config"] == FLEX_BWD_CONFIGS["sm_90"][128][1]
    # A score function: dK/dV from FLEX_BWD_SCORE_CONFIGS where it has an entry, dQ unchanged.
    ps = _plan("sm_90", (128, 128), score=mods.softcap(20.0))
    assert ps["dkdv"]["config"] == FLEX_BWD_SCORE_CONFIGS["sm_90"][128]
    assert ps["dq"]["config"] == FLEX_BWD_CONFIGS["sm_90"][128][1]
    assert _plan("sm_120", (128, 128), score=mods.softcap(20.0))["dkdv"]["config"] == \
        FLEX_BWD_SCORE_CONFIGS["sm_120"][128]
    assert _plan("sm_120", (128, 128))["dkdv"]["config"] == FLEX_BWD_CONFIGS["sm_120"][128][0]


def test_tiles_that_do_not_divide_the_blocks_fall_back_to_64x64():
    for arch in ("sm_90", "sm_100", None):
        for block in ((64, 64),):
            p = _plan(arch, block)
            for name in ("dkdv", "dq"):
                c = p[name]["constants"]
                assert (c["TILE_M"], c["TILE_N"]) == (64, 64), (arch, block, name)
                assert p[name]["hints"] == {} and p[name]["config"] == BWD_CONFIG
    p = _plan("sm_90", (128, 128))                 # 128x64 divides (128, 128): kept, with hints
    assert p["dq"]["hints"] == {"num_worker_warps": 8}
    p = _plan("sm_90", (128, 128), ko={"BLOCK_M": 32, "BLOCK_N": 32})   # kernel_options win
    assert (p["dq"]["constants"]["TILE_M"], p["dq"]["constants"]["TILE_N"]) == (32, 32)
    assert p["dq"]["hints"] == {}
    p = _plan("sm_90", (32, 128))                  # no table tile divides: 64x64 shrinks
    assert (p["dkdv"]["constants"]["TILE_M"], p["dkdv"]["constants"]["TILE_N"]) == (32, 64)
    assert Config(128, 64, num_worker_warps=8).label() == "128x64 nww=8"


@pytest.mark.parametrize("name", ["causal", "softcap"])
@pytest.mark.parametrize("block", [128, 64])
def test_gradients_at_the_table_tiles(name, block, monkeypatch):
    Nq = Nk = 256
    Hq, Hkv, D, dtype = 4, 2, 64, torch.float16
    g = torch.Generator().manual_seed(seed_of(f"bwdtiles{name}{block}"))
    q, k, v, do = (torch.randn(1, h, n, D, generator=g).to(dtype)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    score = mods.softcap(20.0) if name == "softcap" else None
    mask = mods.causal()
    bm = create_block_mask(mask, None, None, Nq, Nk, device="cpu", BLOCK_SIZE=block)
    grids = []
    launch = F.launch_kernel
    monkeypatch.setattr(F, "launch_kernel", lambda dev, grid, *a, **kw: (
        grids.append(grid), launch(dev, grid, *a, **kw))[1])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled("sm_90"):
        out = flex_attention(*leaves, score_mod=score, block_mask=bm, enable_gqa=True)
        grids.clear()
        out.backward(do)
    dkdv, dq = FLEX_BWD_CONFIGS["sm_90"][128] if block == 128 else (BWD_CONFIG, BWD_CONFIG)
    if block == 128 and score is not None:
        dkdv = FLEX_BWD_SCORE_CONFIGS["sm_90"][128]
    assert grids == [(-(-Nq // 64), Hq, 1), (Nq // dq.TILE_M, Hq, 1), (Nk // dkdv.TILE_N, Hkv, 1)]

    def ref(dt):
        ls = [t.detach().to(dt).requires_grad_() for t in leaves]
        o, _ = flex_reference(*ls, score, mask)
        o.backward(do.to(dt))
        return [t.grad for t in ls]
    for what, a, r, p in zip(("dq", "dk", "dv"), [t.grad for t in leaves], ref(torch.float64),
                             ref(torch.float32)):
        assert_flash_criterion(a, r.float(), p.to(dtype), 2e-3, seed=f"{name}{block}-{what}")
