"""The flex kernel ahead of time (tileiras, no GPU) for sm_90, sm_100 and sm_120: every shipped
mod compiles, and the kernel with no mod is the dense fmha kernel instruction for instruction at
the same configuration (no cost when unused). experiments/flex_sass.py prints the per-mod
costs (experiments/data/40-flex/sass.md)."""
import sys
from pathlib import Path

import pytest
import torch

from flashattn import mods
from flashattn.aot import compile_step
from flashattn.flex import FLEX_CONFIGS, compile_flex

pytestmark = pytest.mark.slow

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from flex_sass import cases, opcodes  # noqa: E402

ARCHS = ("sm_90", "sm_100", "sm_120")


@pytest.mark.parametrize("arch", ARCHS)
def test_identity_is_the_dense_kernel(arch):
    cfg = FLEX_CONFIGS[arch]
    dense = compile_step("arch_tuned", arch, config=cfg, causal=False, keep_sass=True)[0]
    ident = compile_flex(arch, block_size=None, keep_sass=True)
    assert not dense.error and not ident.error, (dense.error, ident.error)
    assert (ident.registers, ident.shared_bytes, ident.stack_bytes, ident.sass_lines) == \
        (dense.registers, dense.shared_bytes, dense.stack_bytes, dense.sass_lines)
    assert opcodes(ident.sass_text) == opcodes(dense.sass_text)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,name", [(k, n) for k, g in cases().items() for n in g])
def test_every_mod_compiles(arch, kind, name):
    kw = cases()[kind][name]
    r = compile_flex(arch, block_size=(128, 128) if kind == "mask" else None, **kw)
    assert not r.error, r.error
    assert r.mma_ops > 0 and r.sass_lines > 100


def test_a_mod_the_compiler_rejects_is_named():
    """A mod that runs in NumPy but not in cuTile's compiler: the report names it."""
    def float_index(score, b, h, q_idx, kv_idx):
        return score + ct_module().arange(7, dtype=ct_module().float32)[0]
    r = compile_flex("sm_90", score=mods.ScoreMod("float_index", float_index), block_size=None)
    assert r.error and "float_index" in r.step


def ct_module():
    import cuda.tile as ct
    return ct


@pytest.mark.parametrize("arch", ARCHS)
def test_backward_compiles(arch):
    from flashattn.flex import compile_flex_bwd
    for kw in (dict(block_size=None),
               dict(score=mods.softcap(30.0), mask=mods.sliding_window(256)),
               dict(score=mods.alibi(mods.alibi_slopes(32)),
                    mask=mods.document(torch.zeros(8192, dtype=torch.int32)))):
        for r in compile_flex_bwd(arch, **kw):
            assert not r.error, (r.kernel, r.error)
            assert r.mma_ops > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_a_window_costs_what_causal_costs(arch):
    """The sliding window's mask is one distance and one range test per score (the compiler
    folds the range into one compare): the lines it adds are at most 1.3 x the causal mask's
    (sm_90 576 vs 448, sm_100 1104 vs 1128, sm_120 320 vs 328 with cuda-tile 1.7), one select
    per score; the two-difference form it replaced added 2.1 x (960, 2232, 608)."""
    blocks = compile_flex(arch, block_size=(128, 128), keep_sass=True)
    causal = compile_flex(arch, block_size=(128, 128), mask=mods.causal(), keep_sass=True)
    for m in (mods.sliding_window(1024), mods.sliding_window(512, 512)):
        win = compile_flex(arch, block_size=(128, 128), mask=m, keep_sass=True)
        assert not win.error, win.error
        added, added_causal = (r.sass_lines - blocks.sass_lines for r in (win, causal))
        assert added <= 1.3 * added_causal, (m, added, added_causal)
        fsel = opcodes(win.sass_text)["FSEL"] - opcodes(blocks.sass_text)["FSEL"]
        assert fsel <= opcodes(causal.sass_text)["FSEL"] - opcodes(blocks.sass_text)["FSEL"]
