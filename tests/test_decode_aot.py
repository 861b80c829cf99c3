"""The decoding kernels compile ahead of time for Hopper and Blackwell, on a machine with no GPU.

Compiled through ``aot.compile_spec`` with the constants the host module launches with
(``kernels.decode_split_constants`` / ``decode_combine_constants``), fp16, for every head dim,
three row tiles (GQA group x new tokens: 1x1 -> 16 rows, 4x8 -> 32, 8x16 -> 64 rows in two
blocks), paged caches of 64 and 128 tokens per page and the contiguous cache. The tile rules
must also keep every variant free of register spills.

    python -m pytest -o addopts="" -m slow tests/test_decode_aot.py -s   # prints the table
"""
import pytest

from flashbook.ladder import variants  # the fused merge: the book's ladder kernel
from flashattn.aot import compile_spec, format_table
from flashattn.kernels import (DECODE_COMBINE, DECODE_COMBINE_ROW, DECODE_SPLIT,
                               decode_combine_constants, decode_combine_row_constants,
                               decode_split_constants)

pytestmark = pytest.mark.slow

ARCHS = ("sm_90", "sm_100", "sm_120")
HEAD_DIMS = (64, 128, 256)
GROUPS = ((1, 1), (4, 8), (8, 16))          # (Hq // Hkv, Nq): rows 1, 32, 128
PAGES = (64, 128, None)                     # tokens per page; None: contiguous cache


def _cases():
    cases = []
    for arch in ARCHS:
        for d in HEAD_DIMS:
            for i, (g, nq) in enumerate(GROUPS):
                page = PAGES[(i + HEAD_DIMS.index(d)) % len(PAGES)]
                cases.append((arch, d, g, nq, page))
    return cases


CASES = _cases()


def _label(d, g, nq, page, c):
    return (f"D={d} G={g} Nq={nq} " + (f"page={page}" if page else "contiguous") +
            f" {c['TILE_M']}x{c.get('TILE_N', '-')}")


@pytest.fixture(scope="module")
def reports():
    out = {}
    for arch, d, g, nq, page in CASES:
        c = decode_split_constants(rows=g * nq, head_dim=d, page_size=page, arch=arch)
        out[("split", arch, d, g, nq, page)] = compile_spec(
            DECODE_SPLIT, arch, c, dtype="float16", label=_label(d, g, nq, page, c))
        # One split: the kernel stores the output itself (FINAL); compiled for every case too.
        cf = dict(c, FINAL=True)
        out[("final", arch, d, g, nq, page)] = compile_spec(
            DECODE_SPLIT, arch, cf, dtype="float16", label=_label(d, g, nq, page, c) + " final")
        # The merge fused into the split kernel (FUSED, E23); contiguous caches only (tileiras
        # 13.4.92 crashes on the paged variant): a paged case compiles the contiguous one.
        cu = dict(decode_split_constants(rows=g * nq, head_dim=d, page_size=None, arch=arch),
                  FUSED=True, PDL=False)
        out[("fused", arch, d, g, nq, page)] = compile_spec(
            variants.DECODE_SPLIT, arch, cu, dtype="float16",
            label=_label(d, g, nq, None, cu) + " fused")
        cr = decode_combine_row_constants(head_dim=d, num_splits=16)
        out[("combine_row", arch, d, g, nq, page)] = compile_spec(
            DECODE_COMBINE_ROW, arch, cr, dtype="float16", label=_label(d, g, nq, page, c) + " row")
        cc = decode_combine_constants(split_tile_m=c["TILE_M"], head_dim=d)
        out[("combine", arch, d, g, nq, page)] = compile_spec(
            DECODE_COMBINE, arch, cc, dtype="float16", label=_label(d, g, nq, page, cc))
    print("\n" + format_table(list(out.values())))
    return out


@pytest.mark.parametrize("arch,d,g,nq,page", CASES,
                         ids=[f"{a}-d{d}-g{g}-nq{n}-{p or 'contig'}" for a, d, g, n, p in CASES])
def test_decode_kernels_compile(reports, arch, d, g, nq, page):
    for kind in ("split", "final", "fused", "combine", "combine_row"):
        r = reports[(kind, arch, d, g, nq, page)]
        assert not r.error, f"{kind}: {r.error}"
        assert r.registers > 0 and r.sass_lines > 50
        # The tile rules (kernels.decode_tiles, decode_combine_constants) keep both kernels
        # within the register file: no local-memory spills. (Not the fused merge, which is
        # off by default: E23 found it slower, and it spills at some shapes.)
        if kind != "fused":
            assert r.sass["STL"] == 0 and r.stack_bytes == 0, (kind, r.config, r.stack_bytes)
    split = reports[("split", arch, d, g, nq, page)]
    assert split.mma_ops > 0, "Q K^T and P V must run on tensor cores"


def test_fused_merge_orders_its_count_on_hopper(reports):
    # The count of the fused merge is one atomic add at GPU scope after a GPU-wide memory
    # barrier (release: the partials are published first) and before an L1 invalidation
    # (acquire: the last program reads every split's partials from L2, not stale lines).
    r = compile_spec(variants.DECODE_SPLIT, "sm_90", dict(decode_split_constants(
        rows=4, head_dim=128, page_size=None, arch="sm_90"), FUSED=True, PDL=False), dtype="float16",
        keep_sass=True)
    lines = [ln.split("/*")[1].split("*/")[1].strip() if "*/" in ln else ln.strip()
             for ln in r.sass_text.splitlines()]
    adds = [i for i, ln in enumerate(lines) if "ATOMG.E.ADD.STRONG.GPU" in ln]
    assert adds, "no GPU-scope atomic add"
    for i in adds:
        assert any("MEMBAR.ALL.GPU" in ln for ln in lines[max(0, i - 6):i]), lines[i - 6:i]
        assert any("CCTL.IVALL" in ln for ln in lines[i + 1:i + 4]), lines[i + 1:i + 4]


def test_split_kernel_uses_tensor_memory_loads_on_hopper(reports):
    # The K/V tiles (the whole memory traffic of decoding) go through TMA on sm_90.
    r = reports[("split", "sm_90", 128, 1, 1, PAGES[1])]
    assert r.sass["UTMALDG"] > 0, r.sass


def test_bfloat16_compiles():
    for spec, c in ((DECODE_SPLIT, decode_split_constants(rows=4, head_dim=128, page_size=64,
                                                         arch="sm_90")),
                    (DECODE_COMBINE, decode_combine_constants(split_tile_m=16, head_dim=128))):
        r = compile_spec(spec, "sm_90", c, dtype="bfloat16")
        assert not r.error, r.error
