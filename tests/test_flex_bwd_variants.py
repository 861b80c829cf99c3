"""The flex backward's A/B variants (flashbook.ladder.flex_variants, out of the library): the plan
(pure), and dQ, dK, dV of every variant in the interpreter against a dense fp64 reference with
the FlashAttention criterion: ragged shapes with small blocks, and sm_90's table tiles with
BlockMask blocks of 128 (sub-tiles per block, a block past the end). No GPU."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

import flashattn.dispatch as dispatch
from flashattn import interpret, mods
from flashattn.flex import FLEX_BWD_CONFIGS, flex_attention as library_flex
from flashbook.ladder.flex_variants import VARIANTS, bwd_plan, flex_attention

from criteria import assert_flash_criterion, seed_of
from flex_reference import flex_reference
from test_flex import _case

warnings.filterwarnings("ignore", message=".*flex_attention.*")

OTHERS = [v for v in VARIANTS if v != "t-all"]      # "t-all", the library's: test_flex_backward.py


def test_the_plan_of_each_variant():
    kw = dict(B=1, Hq=4, Hkv=2, Nq=1000, Nk=1000, D=128, block_size=(128, 128), has_full=True,
              mask=mods.causal(), arch="sm_90")
    p = bwd_plan("mn", **kw)
    assert (p["delta"], p["dq"]["kind"], p["dkdv"]["kind"]) == ("torch", "mn", "mn")
    p = bwd_plan("t", **kw)
    assert (p["delta"], p["dq"]["kind"], p["dkdv"]["kind"]) == ("kernel", "t", "t")
    ps = bwd_plan("t", **kw, score=mods.softcap(20.0))
    assert (ps["dq"]["kind"], ps["dkdv"]["kind"]) == ("t", "mn")
    dkdv, dq = FLEX_BWD_CONFIGS["sm_90"][128]
    c = p["dkdv"]["constants"]
    assert (c["TILE_M"], c["TILE_N"]) == (64, 128)
    assert (c["Q_TILES_PER_BLOCK"], c["KV_TILES_PER_BLOCK"]) == (2, 1)
    assert p["dkdv"]["hints"] == dkdv.hints() and p["dkdv"]["grid"] == (8, 2, 1)
    # 1000 rows: the last block of 128 holds a sub-tile past the end, so not "even"
    assert (c["EVEN_K"], c["EVEN_M"]) == (False, False)
    assert p["dq"]["constants"]["EVEN_K"] is False
    p = bwd_plan("t", **dict(kw, Nq=1024, Nk=1024))
    assert p["dkdv"]["constants"]["EVEN_M"] and p["dq"]["constants"]["EVEN_K"]
    with pytest.raises(ValueError, match="variant"):
        bwd_plan("nope", **kw)
    q = torch.zeros(1, 1, 16, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="BWD_VARIANT"):         # not the library's any more
        with interpret.enabled():
            library_flex(q, q, q, kernel_options={"BWD_VARIANT": "t"})


def _check(variant, case, leaves, do, score, mask, bm, dtype, ko=None):
    with interpret.enabled(*(("sm_90",) if ko is None else ())):
        out = flex_attention(*leaves, score_mod=score, block_mask=bm, enable_gqa=True,
                             kernel_options=ko, variant=variant)
        out.backward(do)

    def ref(dt):
        ls = [t.detach().to(dt).requires_grad_() for t in leaves]
        o, _ = flex_reference(*ls, score, mask)
        o.backward(do.to(dt))
        return [t.grad for t in ls]
    for what, a, r, p in zip(("dq", "dk", "dv"), [t.grad for t in leaves], ref(torch.float64),
                             ref(torch.float32)):
        assert_flash_criterion(a, r.float(), p.to(dtype), 2e-3, seed=f"{case}-{what}")


@pytest.mark.parametrize("shape", [(37, 37, 4, 2), (20, 45, 2, 1)], ids=["37x37-GQA", "20x45-MQA"])
@pytest.mark.parametrize("name", ["none", "window", "document", "softcap", "alibi"])
@pytest.mark.parametrize("variant", OTHERS)
def test_small_blocks(variant, name, shape):
    Nq, Nk, Hq, Hkv = shape
    dtype = torch.float16
    case = f"bwdvar{variant}{name}{shape}"
    g = torch.Generator().manual_seed(seed_of(case))
    q, k, v, do = (torch.randn(2, h, n, 32, generator=g).to(dtype)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    score, mask = _case(name, Hq, Nq, Nk, True)
    bm = create_block_mask(mask, None, None, Nq, Nk, device="cpu", BLOCK_SIZE=(16, 32))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _check(variant, case, leaves, do, score, mask, bm, dtype, ko={"BLOCK_M": 16, "BLOCK_N": 16})


@pytest.mark.parametrize("name", ["causal", "softcap"])
@pytest.mark.parametrize("variant", OTHERS)
def test_sm90_tiles_with_blocks_of_128(variant, name, monkeypatch):
    Nq = Nk = 200                      # the second block of 128 ends past the sequence
    Hq, Hkv, D, dtype = 4, 2, 64, torch.float16
    case = f"bwdvar128{variant}{name}"
    g = torch.Generator().manual_seed(seed_of(case))
    q, k, v, do = (torch.randn(1, h, n, D, generator=g).to(dtype)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    score = mods.softcap(20.0) if name == "softcap" else None
    mask = mods.causal()
    bm = create_block_mask(mask, None, None, Nq, Nk, device="cpu", BLOCK_SIZE=128)
    grids = []
    launch = dispatch.launch_kernel
    monkeypatch.setattr(dispatch, "launch_kernel", lambda dev, grid, *a, **kw: (
        grids.append(grid), launch(dev, grid, *a, **kw))[1])
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    _check(variant, case, leaves, do, score, mask, bm, dtype)
    plan = bwd_plan(variant, B=1, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, block_size=(128, 128),
                    has_full=True, score=score, mask=mask, arch="sm_90")
    expect = [plan["dq"]["grid"], plan["dkdv"]["grid"]]
    if plan["delta"] == "kernel":
        expect.insert(0, (-(-Nq // 64), Hq, 1))
    assert grids[-len(expect):] == expect



@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_library_backward_compiles_without_spills(arch):
    """The library's one pair at its tables, causal, softcap + causal and ALiBi + causal
    (BlockMask 128, D=128): no local memory, except sm_120's dK/dV with a score function (no
    tile found without)."""
    from flashattn.flex import compile_flex_bwd
    for kw in (dict(mask=mods.causal()), dict(score=mods.softcap(50.0), mask=mods.causal()),
               dict(score=mods.alibi(mods.alibi_slopes(32)), mask=mods.causal())):
        for r in compile_flex_bwd(arch, **kw):
            assert not r.error, (r.kernel, r.error)
            if arch == "sm_120" and "score" in kw and r.kernel == "flex_dkdv":
                continue
            assert r.stack_bytes == 0, (arch, r.kernel, r.config, r.stack_bytes)


def test_t_all_is_the_library():
    from flashattn.flex import flex_bwd_plan
    kw = dict(B=1, Hq=4, Hkv=2, Nq=1000, Nk=1000, D=128, block_size=(128, 128), has_full=True,
              mask=mods.causal())
    for arch in ("sm_90", "sm_100", "sm_120", None):
        for score in (None, mods.softcap(20.0)):
            ours, lib = bwd_plan("t-all", **kw, arch=arch, score=score), \
                flex_bwd_plan(**kw, arch=arch, score=score)
            for name in ("dq", "dkdv"):
                assert {k: v for k, v in ours[name].items() if k != "kind"} == lib[name]
