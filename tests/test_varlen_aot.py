"""The varlen kernel compiles ahead of time for Hopper and Blackwell, on a machine with no GPU.

Compiled through ``aot.compile_spec`` with the configuration and constants the host module
launches with (``kernels.varlen_config`` / ``varlen_constants``), fp16, causal and not, for
every head dim; bf16 once. The configurations must keep every variant free of register spills,
and the K/V tiles of the sliced sequences must still go through TMA on Hopper.

    python -m pytest -o addopts="" -m slow tests/test_varlen_aot.py -s   # prints the table
"""
import pytest

from flashattn.aot import compile_spec, format_table
from flashattn.kernels import VARLEN_FWD, varlen_config, varlen_constants

pytestmark = pytest.mark.slow

ARCHS = ("sm_90", "sm_100", "sm_120")
HEAD_DIMS = (64, 128, 256)
CASES = [(a, d, c) for a in ARCHS for d in HEAD_DIMS for c in (True, False)]


@pytest.fixture(scope="module")
def reports():
    out = {}
    for arch, d, causal in CASES:
        cfg = varlen_config(arch, d)
        out[(arch, d, causal)] = compile_spec(
            VARLEN_FWD, arch, varlen_constants(cfg, head_dim=d, causal=causal),
            hints=cfg.hints(), dtype="float16",
            label=f"D={d} {'causal' if causal else 'full'} {cfg.label()}")
    print("\n" + format_table(list(out.values())))
    return out


@pytest.mark.parametrize("arch,d,causal", CASES,
                         ids=[f"{a}-d{d}-{'causal' if c else 'full'}" for a, d, c in CASES])
def test_varlen_kernel_compiles(reports, arch, d, causal):
    r = reports[(arch, d, causal)]
    assert not r.error, r.error
    assert r.registers > 0 and r.sass_lines > 50
    assert r.sass["STL"] == 0 and r.stack_bytes == 0, (r.config, r.stack_bytes)
    assert r.mma_ops > 0, "Q K^T and P V must run on tensor cores"


def test_sliced_sequences_still_load_through_tma_on_hopper(reports):
    # Array.slice with offsets read on the device: K and V tiles still go through TMA.
    r = reports[("sm_90", 128, True)]
    assert r.sass["UTMALDG"] > 0, r.sass


def test_bfloat16_compiles():
    cfg = varlen_config("sm_90", 128)
    r = compile_spec(VARLEN_FWD, "sm_90", varlen_constants(cfg, head_dim=128, causal=True),
                     hints=cfg.hints(), dtype="bfloat16")
    assert not r.error, r.error


def test_odd_head_dim_compiles_unaligned():
    # D = 80 is padded to TILE_D = 128; D = 59 leaves rows unaligned (align 1).
    for d, align in ((80, 8), (59, 1)):
        cfg = varlen_config("sm_90", d)
        r = compile_spec(VARLEN_FWD, "sm_90", varlen_constants(cfg, head_dim=d, causal=True),
                         hints=cfg.hints(), dtype="float16", align=align)
        assert not r.error, (d, r.error)


@pytest.mark.parametrize("arch", ARCHS)
def test_several_query_tiles_per_program_compile(arch):
    # Q_TILES > 1 (E22): the tile loop around the body, the sequence's views built once.
    cfg = varlen_config(arch, 128)
    r = compile_spec(VARLEN_FWD, arch, varlen_constants(cfg, head_dim=128, causal=True,
                                                        q_tiles=4),
                     hints=cfg.hints(), dtype="float16", label=f"Q_TILES=4 {cfg.label()}")
    assert not r.error, r.error
    assert r.mma_ops > 0
    if arch != "sm_120":         # sm_120's 64x64 tile spills 8 bytes with the loop: not used
        assert r.sass["STL"] == 0 and r.stack_bytes == 0, (r.config, r.stack_bytes)
