"""Programmatic dependent launch (E27, the book's switches in flashbook/ladder/variants.py)
without a GPU: the switches reach the right kernels and launches, the interpreter gives the same bits with them on, and the compiled SASS has the
grid-dependency instructions only when asked (ACQBULK: the wait; PREEXIT: the early signal).
The GPU side is tests/test_pdl_gpu.py."""
import re
from contextlib import ExitStack
from unittest import mock

import pytest
import torch

from flashattn import interpret
from flashattn import kernels as library
from flashattn.contract import DecodeDims
from flashbook.ladder import variants as kernels
from flashbook.ladder.variants import backward_launches, decode, decode_plan


def _flags(**flags):
    stack = ExitStack()
    for k, v in flags.items():
        stack.enter_context(mock.patch.object(kernels, k, v))
    return stack


def _dims(paged=False, B=2):
    return DecodeDims(B=B, Hq=32, Hkv=8, Nq=1, D=128, paged=paged,
                      page_size=64 if paged else None, capacity=32768)


def test_defaults_are_off():
    assert kernels.DECODE_PDL is False and kernels.DECODE_PDL_TRIGGER is False
    assert kernels.BWD_PDL == 0
    plan = decode_plan(_dims(), num_splits=8, sm_count=132, arch="sm_90")
    assert plan["pdl"] is False and plan["split_constants"]["PDL"] is False
    assert plan["combine_constants"]["PDL"] is False


@pytest.mark.parametrize("paged", (False, True))
def test_decode_plan_switches(paged):
    with _flags(DECODE_PDL=True):
        plan = decode_plan(_dims(paged), num_splits=8, sm_count=132, arch="sm_90")
        assert plan["pdl"] and plan["combine_constants"]["PDL"]
        assert plan["split_constants"]["PDL"] is False          # no early signal by default
        one = decode_plan(_dims(paged), num_splits=1, sm_count=132, arch="sm_90")
        assert one["pdl"] is False                               # no combine to launch
        old = decode_plan(_dims(paged), num_splits=8, sm_count=108, arch="sm_80")
        assert old["pdl"] is False                               # griddepcontrol: sm_90+
    with _flags(DECODE_PDL=True, DECODE_PDL_TRIGGER=True):
        plan = decode_plan(_dims(paged), num_splits=8, sm_count=132, arch="sm_90")
        # tileiras 13.4.92 crashes compiling the signal in the paged kernel: contiguous only.
        assert plan["split_constants"]["PDL"] is (not paged)


@pytest.mark.parametrize("mode", (1, 2))
def test_backward_launch_switches(mode):
    q = torch.empty(1, 4, 130, 64, dtype=torch.float16)
    k = torch.empty(1, 2, 130, 64, dtype=torch.float16)
    lse = torch.empty(1, 4, 130)
    args = (q, k, k, q, q, lse, lse, q, k, k)
    with _flags(BWD_PDL=mode):
        got = backward_launches(*args, causal=True, scale=0.1, input_pos=0, arch="sm_90")
        assert [(l.spec.name, l.pdl, l.constants["PDL"]) for l in got] == [
            ("bwd_preprocess", False, mode), ("bwd_dkdv", True, mode), ("bwd_dq", True, mode)]
        old = backward_launches(*args, causal=True, scale=0.1, input_pos=0, arch="sm_80")
        assert all(not l.pdl and l.constants["PDL"] == 0 for l in old)
        atomic = backward_launches(*args, causal=True, scale=0.1, input_pos=0, arch="sm_90",
                                   deterministic=False)
        assert [(l.spec.name, l.pdl, l.constants.get("PDL")) for l in atomic] == [
            ("bwd_preprocess", False, None), ("bwd_dkdv_dq_atomic", False, None)]  # library's


def test_interpreter_same_bits():
    g = torch.Generator().manual_seed(7)
    with interpret.enabled("sm_90"):
        q = torch.randn(2, 8, 1, 64, generator=g, dtype=torch.float16)
        k, v = (torch.randn(2, 2, 700, 64, generator=g, dtype=torch.float16) for _ in range(2))
        lens = torch.tensor([700, 251], dtype=torch.int32)
        want = decode(q, k, v, lens, num_splits=4)
        with _flags(DECODE_PDL=True, DECODE_PDL_TRIGGER=True):
            assert torch.equal(decode(q, k, v, lens, num_splits=4), want)
        assert torch.equal(library_decode(q, k, v, lens, num_splits=4), want)
        from flashattn.autograd import attention_forward
        from flashattn.launch_bwd import attention_backward
        q, k, v, do = (torch.randn(1, h, 90, 64, generator=g, dtype=torch.float16)
                       for h in (4, 2, 2, 4))
        out, lse = attention_forward(q, k, v, causal=True)
        want = attention_backward(q, k, v, out, do, lse, causal=True)
        for mode in (0, 1, 2):
            with _flags(BWD_PDL=mode):
                got = variants_backward(q, k, v, out, do, lse, causal=True)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), mode


from flashattn.decoding import decode as library_decode  # noqa: E402
from flashbook.ladder.variants import attention_backward as variants_backward  # noqa: E402


def test_the_library_has_no_switches():
    for name in ("DECODE_FUSED_COMBINE", "DECODE_PDL", "DECODE_PDL_TRIGGER", "BWD_PDL",
                 "PDL_ARCHS"):
        assert not hasattr(library, name), name
    for spec in (*library.DECODE.values(), *library.BWD.values()):
        assert "PDL" not in spec.constants and "FUSED" not in spec.constants, spec.name


def _gdc(spec, constants, hints=None):
    from flashattn.aot import compile_spec
    rep = compile_spec(spec, "sm_90", constants, hints=hints or {}, keep_sass=True)
    assert not rep.error, rep.error
    text = rep.sass_text
    return (len(re.findall(r"\bACQBULK\b", text)), len(re.findall(r"\bPREEXIT\b", text)))


@pytest.mark.slow
def test_sass_has_the_instructions_only_when_asked():
    pytest.importorskip("cuda.tile")
    cc = library.decode_combine_constants(split_tile_m=16, head_dim=128)
    assert _gdc(library.DECODE_COMBINE, cc) == (0, 0)
    assert _gdc(kernels.DECODE_COMBINE, dict(cc, PDL=False)) == (0, 0)
    assert _gdc(kernels.DECODE_COMBINE, dict(cc, PDL=True)) == (1, 0)
    cfg = library.bwd_configs("sm_90", 64)["bwd_preprocess"]
    pc = library.bwd_constants("bwd_preprocess", cfg, head_dim=64, causal=True, even_k=True)
    assert _gdc(library.BWD_PREPROCESS, pc) == (0, 0)
    pre = kernels.BWD["bwd_preprocess"]
    assert _gdc(pre, dict(pc, PDL=1)) == (0, 0)   # signals at exit
    assert _gdc(pre, dict(pc, PDL=2)) == (0, 1)


def test_listings_show_the_shipped_code():
    """Chapters 12 and 13 list the backward and decoding kernels as they ship: the switch and
    its branches folded away, the parameter gone."""
    from flashbook.chapter import backward, decode as chapter_decode
    for name in ("bwd_preprocess_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel"):
        text = backward.listing(name)
        assert "PDL" not in text and "grid_dependency" not in text, name
    for name in ("decode_split_kernel", "decode_combine_kernel", "decode_combine_row_kernel"):
        text = chapter_decode.kernel_listing(name)
        assert "PDL" not in text and "grid_dependency" not in text, name
        assert text.startswith("@ct.kernel")
