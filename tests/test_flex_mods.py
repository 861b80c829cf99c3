"""Mods that read any number of tensors, masks composed with and_masks/or_masks (forward and
backward in the interpreter against PyTorch's flex_attention and a dense fp64 reference), the
flex specs checked against their kernels' source, and no import side effect of flashattn.mods.
No GPU."""
import subprocess
import sys
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

import flashattn
from flashattn import interpret, mods
from flashattn.flex import flex_attention
from flashattn.kernels.flex_spec import FLEX_SPECS, mod_arrays, with_mod_arrays

from criteria import assert_flash_criterion, seed_of
from flex_reference import flex_reference

warnings.filterwarnings("ignore", message=".*flex_attention.*")

import cuda.tile as ct          # noqa: E402  (the tile functions below are cuTile code)


def _four_tile(b, h, q_idx, kv_idx, lo, hi, keep, shift):
    """Attend to keys within [q - lo[h], q + hi[h]], or where keep[kv] (+ shift[0]) is set."""
    d = kv_idx - q_idx
    near = (d >= -ct.gather(lo, (h,))) & (d <= ct.gather(hi, (h,)))
    return near | (ct.gather(keep, (kv_idx,)) + ct.gather(shift, (0 * h,)) > 0)


def _four_torch(b, h, q_idx, kv_idx, lo, hi, keep, shift):
    d = kv_idx - q_idx
    return ((d >= -lo[h]) & (d <= hi[h])) | (keep[kv_idx] + shift[0] > 0)


def _qkv(case, Hq, Hkv, Nq, Nk, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed_of(case))
    return [torch.randn(2, h, n, 32, generator=g).to(dtype)
            for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq))]


def _compare(case, score, mask, Nq=37, Nk=45, Hq=4, Hkv=2, backward=True):
    q, k, v, do = _qkv(case, Hq, Hkv, Nq, Nk)
    bm = create_block_mask(mask, None, None, Nq, Nk, device="cpu", BLOCK_SIZE=(16, 32))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        out = flex_attention(*leaves, score_mod=score, block_mask=bm, enable_gqa=True)
        if backward:
            out.backward(do)
    ref = torch_flex(q.double(), k.double(), v.double(), score_mod=score, block_mask=bm,
                     enable_gqa=True)
    pt = torch_flex(q, k, v, score_mod=score, block_mask=bm, enable_gqa=True)
    assert_flash_criterion(out.detach(), ref.float(), pt, 1e-3, seed=case)
    if not backward:
        return

    def grads(dt):
        ls = [t.detach().to(dt).requires_grad_() for t in leaves]
        o, _ = flex_reference(*ls, score, mask)
        o.backward(do.to(dt))
        return [t.grad for t in ls]
    for what, a, r, p in zip(("dq", "dk", "dv"), [t.grad for t in leaves], grads(torch.float64),
                             grads(torch.float32)):
        assert_flash_criterion(a, r.float(), p.to(q.dtype), 2e-3, seed=f"{case}-{what}")


def test_a_mask_reads_four_tensors():
    four = mods.MaskMod("four", _four_tile, _four_torch, (
        ("lo", torch.tensor([0, 3, 7, 1], dtype=torch.int32)),
        ("hi", torch.tensor([0, 0, 2, 5], dtype=torch.int32)),
        ("keep", (torch.arange(45) % 11 == 0).to(torch.int32)),
        ("shift", torch.tensor([0], dtype=torch.int32))))
    _compare("four-tensors", mods.alibi(mods.alibi_slopes(4)), four)


@pytest.mark.parametrize("op", ["and", "or"])
def test_masks_compose(op):
    ids = torch.arange(45, dtype=torch.int32) * 3 // 45
    parts = (mods.document(ids), mods.causal(), mods.sliding_window(9, 9))
    compose = mods.and_masks if op == "and" else mods.or_masks
    m = compose(*parts)
    assert isinstance(m, mods.MaskMod) and len(m.tensors) == 1
    # The same as PyTorch's own composition of the same mods (torch functions).
    from torch.nn.attention.flex_attention import and_masks, or_masks
    theirs = (and_masks if op == "and" else or_masks)(*parts)
    b, h = torch.zeros(1, 1, 1, 1, dtype=torch.int64), torch.zeros(1, 1, 1, 1, dtype=torch.int64)
    qi, ki = torch.arange(37).view(1, 1, 37, 1), torch.arange(45).view(1, 1, 1, 45)
    assert torch.equal(m(b, h, qi, ki), theirs(b, h, qi, ki))
    _compare(f"compose-{op}", mods.softcap(5.0) if op == "and" else None, m)
    # One tile function (one compiled kernel) per composition of the same mods.
    assert compose(*parts).tile is m.tile


def test_compose_plain_defs_and_errors():
    def even_keys(b, h, q_idx, kv_idx):
        return kv_idx % 2 == 0
    m = mods.and_masks(mods.causal(), even_keys)
    _compare("compose-def", None, m, backward=False)
    with pytest.raises(ValueError, match="at least one"):
        mods.or_masks()
    with pytest.raises(TypeError, match="score mod"):
        mods.and_masks(mods.causal(), mods.softcap(3.0))
    assert flashattn.and_masks is mods.and_masks and flashattn.or_masks is mods.or_masks


def test_flex_specs_match_their_kernels():
    for spec in FLEX_SPECS.values():
        spec.check_signature()
    doc = mods.document(torch.zeros(2, 8, dtype=torch.int32))
    s = with_mod_arrays(FLEX_SPECS["flex"], mods.alibi(torch.ones(4)), doc)
    tuples = {a.name: a.items for a in s.arrays if a.name in ("ST", "MT")}
    assert tuples == {"ST": mod_arrays(mods.alibi(torch.ones(4))), "MT": mod_arrays(doc)}
    assert [(a.ndim, a.dtype) for a in tuples["MT"]] == [(2, "int32")]


def test_importing_mods_registers_no_cuda_tile():
    """Where cuda-tile is missing, ``import flashattn.mods`` leaves ``cuda.tile`` unregistered
    (only the documented stand-in, ``flashattn.interpret.install_shim``, registers it)."""
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'cuda' or name.startswith('cuda.'):\n"
        "            raise ImportError('blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import flashattn.mods as m\n"
        "assert 'cuda.tile' not in sys.modules, 'registered'\n"
        "assert m.ct.__name__ == 'cuda.tile' and getattr(m.ct, '__interpreter_shim__', False)\n"
        "m.causal(); m.softcap(3.0)\n"
        "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.slow
def test_composed_and_four_tensor_masks_compile():
    """tileiras compiles a composed mask and a mask of four tensors (tuples of arrays, spread
    into the mod), forward and backward, without spills (sm_90, D = 128)."""
    from flashattn.flex import compile_flex, compile_flex_bwd
    ids = torch.arange(8192, dtype=torch.int32) // 1024
    composed = mods.and_masks(mods.document(ids), mods.causal())
    four = mods.MaskMod("four", _four_tile, _four_torch, (
        ("lo", torch.zeros(32, dtype=torch.int32)), ("hi", torch.zeros(32, dtype=torch.int32)),
        ("keep", torch.zeros(8192, dtype=torch.int32)),
        ("shift", torch.tensor([0], dtype=torch.int32))))
    reps = [compile_flex("sm_90", mask=composed), compile_flex("sm_90", mask=four),
            *compile_flex_bwd("sm_90", mask=composed, score=mods.alibi(mods.alibi_slopes(32)))]
    for r in reps:
        assert not r.error and r.stack_bytes == 0, (r.kernel, r.error, r.stack_bytes)
