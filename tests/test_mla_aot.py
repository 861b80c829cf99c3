"""The MLA decode kernels compile ahead of time for Hopper and Blackwell, on a machine with no GPU.

Compiled through ``aot.compile_spec`` with the constants and hints the host module launches
with (``mla_plan`` at DeepSeek-V3's shape: 128 query rows per cache head, pages of 64, latent
512 + rotary 64; ``MLA_HINTS``), bf16 queries: the split kernel over a bf16 and an FP8 cache,
causal, storing partials (several splits) and storing the output itself (one split: FINAL),
and the combine. On sm_90 the shipped tiles must keep the 512-wide accumulator in registers
(no stack); elsewhere the stack is reported, not asserted.

    python -m pytest -o addopts="" -m slow tests/test_mla_aot.py -s   # prints the table
"""
import re
from collections import Counter

import pytest

from flashattn.aot import compile_spec, format_table
from flashattn.kernels.mla_decode_spec import (MLA_COMBINE, MLA_HINTS, MLA_SPLIT, MLA_SPLIT_FP8,
                                               MlaDims, mla_plan)

pytestmark = pytest.mark.slow

ARCHS = ("sm_90", "sm_100", "sm_120")
# DeepSeek-V3's decode: Sq 1, Hq 128, one latent head of 512 + 64, pages of 64.
DIMS = MlaDims(B=64, Sq=1, Hq=128, Hkv=1, D=576, Dv=512, page_size=64, max_pages=512,
               num_pages=64 * 512)
KINDS = ("bf16", "bf16 final", "fp8", "fp8 final", "combine")
# The MMA instruction with its shape, as the SASS spells it (HGMMA.64x32x16.F32.BF16, ...).
MMA = re.compile(r"\b((?:HGMMA|HMMA|UTC\w*MMA)[.\w]*)")


def _compile(arch, kind):
    fp8 = kind.startswith("fp8")
    plan = mla_plan(DIMS, num_splits=1 if kind.endswith("final") else 4, causal=True, fp8=fp8,
                    arch=arch)
    if kind == "combine":
        c = plan["combine_constants"]
        return compile_spec(MLA_COMBINE, arch, c, dtype="bfloat16", keep_sass=True,
                            label=f"{c['TILE_M']} rows x {c['D_LAT']}")
    c = plan["split_constants"]
    hints = MLA_HINTS.get(arch, {})
    label = (f"{kind} {c['TILE_M']}x{c['TILE_N']} " +
             " ".join(f"{k}={v}" for k, v in hints.items())).strip()
    return compile_spec(MLA_SPLIT_FP8 if fp8 else MLA_SPLIT, arch, c, hints=hints,
                        dtype="bfloat16", keep_sass=True, label=label)


def mma_shapes(rep) -> dict:
    """MMA instructions by full name (shape and types) in a report's SASS."""
    return dict(Counter(m.group(1) for m in MMA.finditer(getattr(rep, "sass_text", "") or "")))


@pytest.fixture(scope="module")
def reports():
    out = {(arch, kind): _compile(arch, kind) for arch in ARCHS for kind in KINDS}
    print("\n" + format_table(list(out.values())))
    print("\nMMA instructions (name.shape.types: count)")
    for (arch, kind), r in out.items():
        shapes = ", ".join(f"{k}: {v}" for k, v in sorted(mma_shapes(r).items())) or "-"
        print(f"{arch:7} {kind:11} {shapes}")
    return out


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", KINDS)
def test_mla_kernels_compile(reports, arch, kind):
    r = reports[(arch, kind)]
    assert not r.error, r.error
    assert r.registers > 0 and r.sass_lines > 50
    if kind != "combine":
        assert r.mma_ops > 0, "Q K^T and P V must run on tensor cores"


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "combine"])
def test_sm90_shipped_tiles_do_not_spill(reports, kind):
    # The 64-row tile's 64 x 512 fp32 accumulator is 128 registers a thread over two
    # warpgroups: the shipped key tile must leave room for the scores without spilling.
    r = reports[("sm_90", kind)]
    assert r.stack_bytes == 0 and r.sass["STL"] == 0 and r.sass["LDL"] == 0, (r.config,
                                                                               r.stack_bytes)
    assert r.sass["HGMMA"] > 0, "the warpgroup MMA on Hopper"


def test_combine_does_not_spill(reports):
    for arch in ARCHS:
        r = reports[(arch, "combine")]
        assert r.stack_bytes == 0 and r.sass["STL"] == 0, (arch, r.stack_bytes)
