"""Ahead-of-time compilation of every step for Hopper and Blackwell, on a machine with no GPU.

These are the static facts the book's chapters 5 and 6 rest on: they must hold on any
machine, because the compiler is deterministic.
"""
import json

import pytest

from flashbook import EXPERIMENTS, STEP_NAMES
from flashattn.aot import compile_step, main
from flashattn.config import Config

pytestmark = pytest.mark.slow


ARCHS = ("sm_90", "sm_100", "sm_120")   # Hopper, datacenter and consumer Blackwell


@pytest.fixture(scope="module")
def reports():
    out = {}
    for arch in ARCHS:
        for step in STEP_NAMES:
            for r in compile_step(step, arch):
                out[(step, arch, r.kernel)] = r
    return out


@pytest.mark.parametrize("step", ["baseline", "arch_tuned"])
def test_ampere_compiles(step):
    for r in compile_step(step, "sm_80"):
        assert not r.error, r.error
        assert r.sass["HMMA"] > 0        # Ampere: warp-level mma.sync


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("step", STEP_NAMES)
def test_every_step_compiles(reports, step, arch):
    rs = [r for (s, a, _), r in reports.items() if s == step and a == arch]
    assert rs
    for r in rs:
        assert not r.error, r.error
        assert r.registers > 0 and r.sass_lines > 100
        if r.kernel in ("fmha", "naive_scores", "naive_pv"):
            assert r.mma_ops > 0, "the matrix products must run on tensor cores"


def test_hopper_uses_warpgroup_mma_and_blackwell_tensor_memory(reports):
    assert reports[("baseline", "sm_90", "fmha")].sass["HGMMA"] > 0
    assert reports[("baseline", "sm_100", "fmha")].sass["UTCHMMA"] > 0
    assert reports[("baseline", "sm_120", "fmha")].sass["HMMA"] > 0   # RTX 50: no tcgen05


def test_arch_tuned_does_not_spill_where_it_was_chosen(reports):
    # Chapter 10: the per-architecture spaces put a spill-free configuration first.
    for arch in ("sm_90", "sm_120"):
        r = reports[("arch_tuned", arch, "fmha")]
        assert r.stack_bytes == 0 and r.sass["STL"] == 0, (arch, r.config)


def test_large_tile_trap_is_a_spill_on_hopper_only(reports):
    # Chapter 5: the 256x128 fp32 accumulators overflow Hopper's 255 registers.
    base, big = reports[("baseline", "sm_90", "fmha")], reports[("large_tiles", "sm_90", "fmha")]
    assert base.stack_bytes == 0 and base.sass["STL"] == 0
    assert big.stack_bytes > 1000 and big.sass["STL"] > 100
    bw = reports[("large_tiles", "sm_100", "fmha")]
    assert bw.stack_bytes < big.stack_bytes / 10


def test_fast_math_removes_the_reciprocals(reports):
    # Chapter 6: approximate division is one MUFU.RCP per row, not a Newton iteration per element.
    exact, fast = reports[("large_tiles", "sm_90", "fmha")], reports[("fast_math", "sm_90", "fmha")]
    assert fast.sass["MUFU.RCP"] < exact.sass["MUFU.RCP"] / 5


def test_cli_json(capsys):
    assert main(["--arch", "sm_90", "--step", "baseline", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["meta"]["cuda_tile"] and doc["kernels"][0]["registers"] > 0


@pytest.mark.parametrize("step", list(EXPERIMENTS))
def test_every_experiment_compiles_for_hopper(step):
    # Chapter 10's experiments did not pay, but they stay compilable so the book can show them.
    for r in compile_step(step, "sm_90"):
        assert not r.error, r.error
        assert r.registers > 0 and r.sass["HGMMA"] > 0


def test_worker_warps_hint_compiles_and_is_reported():
    # num_worker_warps (a Config hint since the layout change): compiled for Hopper, and named
    # in the report, so the cubin cache keeps it apart from the unhinted kernel.
    c = Config(128, 128, occupancy=1, num_worker_warps=8)
    (r,) = compile_step("arch_tuned", "sm_90", config=c)
    assert not r.error, r.error
    assert r.config == "128x128 occ=1 nww=8" and r.registers > 0
    (plain,) = compile_step("arch_tuned", "sm_90", config=Config(128, 128, occupancy=1))
    assert not plain.error and plain.config == "128x128 occ=1"


# --- the forward's LSE output (issue 11) --------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("step", ["baseline", "warp_groups"])
@pytest.mark.parametrize("causal,even_k,head_dim", [(True, True, 128), (False, False, 80)])
def test_the_forward_with_its_lse_compiles(arch, step, causal, even_k, head_dim):
    # WRITE_LSE adds one log2 and one store per row: it must compile everywhere the step does,
    # without new spill space, in about as many instructions (tileiras 13.4: +150..230 SASS
    # lines of ~2000, the store's address code; sm_100's baseline, which already spills 32
    # bytes, adds one STL).
    from flashattn.aot import compile_spec
    from flashattn.kernels import constants_for, fmha_spec
    from flashbook.steps import get_step
    s = get_step(step)
    FMHA = fmha_spec(s)                 # the shipped kernel, or the book's ladder
    cfg = s.configs(arch)[0]
    reps = {}
    for write_lse in (False, True):
        c = constants_for(FMHA, s, cfg, head_dim=head_dim, causal=causal, even_k=even_k,
                          write_lse=write_lse)
        assert c["WRITE_LSE"] is write_lse
        reps[write_lse] = r = compile_spec(FMHA, arch, c, hints=cfg.hints(),
                                           align=8 if head_dim % 8 == 0 else 1,
                                           label=cfg.label(), step=step)
        assert not r.error, r.error
        assert r.registers > 0 and r.mma_ops > 0
    off, on = reps[False], reps[True]
    assert on.stack_bytes <= off.stack_bytes and on.sass["STL"] <= off.sass["STL"] + 2
    assert on.sass_lines - off.sass_lines < max(300, off.sass_lines // 5), \
        (on.sass_lines, off.sass_lines)
    assert on.sass["MUFU.EX2"] >= off.sass["MUFU.EX2"]
