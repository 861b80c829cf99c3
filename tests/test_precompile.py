"""flashattn.precompile: the kernels a configuration enumerates (interpreter, no GPU) and an
actual compile of one small configuration into cuTile's disk cache (tileiras, no launch)."""
import pytest

import flashattn
from flashattn import precompiler as P

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = dict(head_dim=64, heads=(4, 2))


def names(rows):
    return sorted({r["kernel"].rsplit(".", 1)[-1] for r in rows})


@pytest.mark.parametrize("op,expected", [
    ("attention", ["fmha_kernel"]),
    ("attention_backward", ["bwd_dkdv_kernel", "bwd_dq_kernel", "bwd_preprocess_kernel",
                            "fmha_kernel"]),
    ("attention_varlen", ["varlen_fwd_kernel"]),
    ("attention_varlen_backward", ["bwd_dkdv_kernel", "bwd_dq_kernel", "bwd_preprocess_kernel",
                                   "fmha_kernel", "varlen_fwd_kernel"]),
    ("decode", ["decode_combine_kernel", "decode_combine_row_kernel", "decode_split_kernel"]),
    ("flash_attn_func", ["fmha_kernel"]),
])
def test_enumerates_the_kernels_of_each_operator(op, expected):
    rows = P.enumerate_kernels(dict(op=op, **SMALL))
    assert names(rows) == expected
    # The length classes: whole key tiles and not (EVEN_K both ways) for the square forward.
    if op == "attention":
        assert {dict(r["constants"])["EVEN_K"] for r in rows} == {True, False}
        assert {dict(r["constants"])["TILE_D"] for r in rows} == {64}


def test_enumerates_the_flex_kernel_for_windows_and_mods():
    rows = P.enumerate_kernels(dict(op="flash_attn_func", window_size=(64, 0), alibi=True,
                                    softcap=20.0, **SMALL), lengths=(256, 200), batches=(2,))
    assert names(rows) == ["flex_kernel"]
    c = dict(rows[0]["constants"])
    assert c["HAS_SCORE"] and c["HAS_MASK"]
    # Another window size is the same kernel (no new function, same constants).
    other = P.enumerate_kernels(dict(op="flash_attn_func", window_size=(500, 3), alibi=True,
                                     softcap=20.0, **SMALL), lengths=(256, 200), batches=(2,))
    assert [r["fn"] for r in other] == [r["fn"] for r in rows]
    assert [r["constants"] for r in other] == [r["constants"] for r in rows]


def test_configuration_errors():
    with pytest.raises(ValueError, match="op must be one of"):
        P.enumerate_kernels(dict(op="nope"))
    with pytest.raises(ValueError, match="unknown configuration keys"):
        P.enumerate_kernels(dict(op="attention", seqlen=128))
    with pytest.raises(ValueError, match="head dim"):
        P.enumerate_kernels(dict(op="attention", head_dim=512))
    with pytest.raises(TypeError, match="dict"):
        flashattn.precompile(["attention"])
    with pytest.raises(ValueError, match="how must be"):
        flashattn.precompile([dict(op="attention")], how="later")


def test_jit_signature_follows_the_array_classes():
    rows = P.enumerate_kernels(dict(op="attention", **SMALL), lengths=(256, 200), batches=(2,))
    sig = {n: P.jit_signature(r["kernel_obj"], r["args"]) for n, r in zip((256, 200), rows)}
    q256, q200 = sig[256].parameters[0], sig[200].parameters[0]
    assert q256.shape_divisible_by[2] == 16 and q200.shape_divisible_by[2] == 1
    assert q256.stride_constant[-1] == 1


@pytest.mark.slow
def test_compiles_one_small_configuration(tmp_path, monkeypatch):
    """One kernel through cuTile's compile path (tileiras) into a fresh disk cache; run again,
    it is found there (no tileiras: much faster)."""
    from cuda.tile._cext import default_tile_context
    monkeypatch.setattr(default_tile_context.config, "cache_dir", str(tmp_path))
    cfg = dict(op="attention", **SMALL)
    rows = flashattn.precompile([cfg], how="export", lengths=(256,), batches=(2,),
                                processes=1)
    assert len(rows) == 1 and rows[0]["error"] == "", rows
    assert names(rows) == ["fmha_kernel"]
    assert any(tmp_path.iterdir())
    again = flashattn.precompile([cfg], how="export", lengths=(256,), batches=(2,),
                                 processes=1)
    assert again[0]["error"] == "" and again[0]["seconds"] < rows[0]["seconds"]


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["attention", "decode", "attention_varlen"])
def test_jit_signature_is_the_one_cutile_derives_gpu(op):
    """On a GPU: the signature ``precompile(how="export")`` compiles for equals the one
    cuTile's JIT derives from device arrays of the same shapes (``from_kernel_args``), so the
    first call finds the exported cubin in the disk cache."""
    import torch
    from cuda.tile.compilation import KernelSignature
    for r in P.enumerate_kernels(dict(op=op, **SMALL), lengths=(256, 200), batches=(2,)):
        args = tuple(torch.zeros(a.shape, dtype=a.dtype, device="cuda").as_strided(
            a.shape, a.stride()) if isinstance(a, torch.Tensor) else a for a in r["args"])
        ours = P.jit_signature(r["kernel_obj"], r["args"])
        theirs = KernelSignature.from_kernel_args(r["kernel_obj"], args,
                                                  ours.calling_convention)
        for a, b in zip(ours.parameters, theirs.parameters):
            assert a == b, (r["kernel"], a, b)
        assert ours.calling_convention.code == theirs.calling_convention.code
