"""The forward's and varlen's pure plans (``kernels.fmha_fwd_spec.fmha_plan``,
``kernels.varlen_spec.varlen_plan``): the kernel, constants and grid from shapes alone, on the
CPU, without cuda.tile; and the registry that names the steps they plan for."""
import subprocess
import sys
from pathlib import Path

import pytest

from flashattn.config import Config
from flashattn.contract import VarlenDims
from flashattn.kernels import FMHA, SPECS, VARLEN_FWD
from flashattn.kernels.fmha_fwd_spec import (FMHA_LATENCIES, SEARCH_SPACE, WARP_GROUP_SPACE,
                                             FmhaPlan, fmha_plan)
from flashattn.kernels.varlen_spec import VARLEN_CONFIGS, varlen_plan
from flashattn.registry import Step, get_step, resolve_name

REPO = Path(__file__).resolve().parents[1]
SHAPE = dict(B=2, Hq=8, Hkv=2, Nq=1000, Nk=1000, head_dim=128, causal=True, scale=0.125)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", None])
def test_best_plans_the_shipped_kernel_at_its_first_configuration(arch):
    step = resolve_name("best", arch)
    cfg = step.configs(arch)[0]
    space = WARP_GROUP_SPACE.get(arch) or SEARCH_SPACE.get(arch, SEARCH_SPACE["sm_80"])
    assert cfg == space[0]
    plan = fmha_plan(step, cfg, **SHAPE)
    assert isinstance(plan, FmhaPlan) and plan.spec is FMHA and plan.config == cfg
    assert set(plan.constants) == set(FMHA.constants)
    assert plan.constants == dict(TILE_M=cfg.TILE_M, TILE_N=cfg.TILE_N, TILE_D=128, CAUSAL=True,
                                  EVEN_K=1000 % cfg.TILE_N == 0, WRITE_LSE=False,
                                  **FMHA_LATENCIES)
    assert plan.grid == (-(-1000 // cfg.TILE_M), 2 * 8, 1)
    assert plan.scalars == dict(qk_scale=0.125, input_pos=0, num_heads=8, group_size=4,
                                num_m_blocks=-(-1000 // cfg.TILE_M))


def test_the_plan_pads_the_head_dim_and_writes_the_lse_when_asked():
    step = get_step("arch_tuned")
    plan = fmha_plan(step, Config(64, 64), **dict(SHAPE, head_dim=72, Nk=96), write_lse=True,
                     input_pos=5)
    assert plan.constants["TILE_D"] == 128 and plan.constants["WRITE_LSE"] is True
    assert plan.constants["EVEN_K"] is False and plan.scalars["input_pos"] == 5


def test_a_book_step_plans_the_ladder_with_its_own_grid():
    import flashbook
    from flashbook.ladder import LADDER
    cfg = Config(64, 128, occupancy=2)
    pair = fmha_plan(flashbook.get_step("pair"), cfg, **SHAPE)
    assert pair.spec is LADDER and pair.constants["PAIR"] is True
    assert pair.grid == (8, 16, 1)                     # 16 query tiles: PAIR halves the axis
    with pytest.raises(ValueError, match="SM count"):
        fmha_plan(flashbook.get_step("persistent"), cfg, **SHAPE)
    persistent = fmha_plan(flashbook.get_step("persistent"), cfg, **SHAPE, sm_count=132)
    assert persistent.grid == (min(16 * 16, 132 * 2), 1, 1)        # work items, or SM slots
    few = fmha_plan(flashbook.get_step("persistent"), cfg, **SHAPE, sm_count=100)
    assert few.grid == (100 * 2, 1, 1)
    # Unchecked loads only where every K/V tile is in bounds.
    unchecked = flashbook.get_step("unchecked_kv")
    assert fmha_plan(unchecked, cfg, **dict(SHAPE, Nk=1024)).constants["UNCHECKED_KV"] is True
    assert fmha_plan(unchecked, cfg, **SHAPE).constants["UNCHECKED_KV"] is False
    # A book step with the shipped flags runs the library's kernel.
    assert fmha_plan(flashbook.get_step("remap"), cfg, **SHAPE).spec is FMHA


def test_a_step_runs_its_own_build_of_the_kernel_or_the_shipped_one():
    # Issue 35: the library knows no ladder flags; a step that carries a FusedKernel runs it.
    from flashbook.ladder import LADDER, LADDER_KERNEL, SHIPPED_FLAGS
    plain = Step("plain", "", "")
    assert plain.flags == FMHA_LATENCIES and fmha_plan(plain, Config(64, 64), **SHAPE).spec is FMHA
    off = Step("off", "", "", flags=dict(get_step("arch_tuned").flags, REMAP=False),
               fused=LADDER_KERNEL)
    assert fmha_plan(off, Config(64, 64), **SHAPE).spec is LADDER
    assert {f: v for f, v in get_step("warp_groups").flags.items() if f in SHIPPED_FLAGS} \
        == SHIPPED_FLAGS


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", "sm_89", None])
@pytest.mark.parametrize("D", [32, 64, 128, 256])
def test_varlen_plan_reads_its_table(arch, D):
    dims = VarlenDims(B=3, Hq=8, Hkv=2, D=D, total_q=3000, total_k=3000)
    plan = varlen_plan(dims, max_seqlen_q=1500, causal=True, arch=arch)
    table = VARLEN_CONFIGS.get(arch or "sm_80", VARLEN_CONFIGS["sm_80"])
    td = max(16, 1 << (D - 1).bit_length())
    assert plan["config"] == table[min(d for d in table if d >= td)]
    c = plan["constants"]
    assert set(c) == set(VARLEN_FWD.constants) and SPECS["varlen_fwd"] is VARLEN_FWD
    assert (c["K_LAT"], c["V_LAT"]) == (FMHA_LATENCIES["K_LAT"], FMHA_LATENCIES["V_LAT"])
    n_tiles = -(-1500 // plan["config"].TILE_M)
    assert plan["grid"] == (-(-n_tiles // c["Q_TILES"]), 8, 3)


def test_varlen_plan_pins_and_refuses_a_grid_too_large():
    dims = VarlenDims(B=2, Hq=4, Hkv=4, D=64, total_q=20, total_k=20)
    plan = varlen_plan(dims, max_seqlen_q=10, causal=False, config=Config(16, 32), q_tiles=1)
    assert plan["grid"] == (1, 4, 2) and plan["constants"]["Q_TILES"] == 1
    with pytest.raises(ValueError, match="65535"):
        varlen_plan(dims._replace(B=70000), max_seqlen_q=10, causal=False)


def test_the_plans_need_neither_a_gpu_nor_cuda_tile():
    code = ("import sys\n"
            "from flashattn.registry import resolve_name\n"
            "from flashattn.kernels.fmha_fwd_spec import fmha_plan\n"
            "s = resolve_name('best', 'sm_90')\n"
            "p = fmha_plan(s, s.configs('sm_90')[0], B=1, Hq=1, Hkv=1, Nq=16, Nk=16, "
            "head_dim=64, causal=False, scale=1.0)\n"
            "print(p.grid, 'cuda.tile' in sys.modules, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["(1,", "1,", "1)", "False", "False"]
