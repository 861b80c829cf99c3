"""The public API's contract that needs no GPU: validation, steps, sdpa's refusals."""
import math

import pytest
import torch

import flashattn
from flashattn.api import attention, sdpa, tile_d_for, validate
from flashattn.timing import attention_flops


def t(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def test_steps_in_book_order():
    assert flashattn.STEP_NAMES[:7] == ("naive", "baseline", "large_tiles", "fast_math",
                                        "loop_split", "remap", "autotune")
    for s in flashattn.STEPS.values():
        assert s.description and len(s.description.splitlines()) == 1
    assert set(flashattn.SEED_STEPS) >= {"naive", "baseline", "autotune"}


def test_unknown_step():
    with pytest.raises(ValueError, match="unknown step 'fastest'"):
        flashattn.get_step("fastest")


@pytest.mark.parametrize("d,tile", [(1, 16), (16, 16), (17, 32), (64, 64), (80, 128), (96, 128),
                                    (128, 128), (192, 256), (256, 256)])
def test_head_dim_padding(d, tile):
    assert tile_d_for(d) == tile


BAD = [
    (lambda: (t(2, 4, 8), t(2, 4, 8, 16), t(2, 4, 8, 16)), ValueError, "q must have 4 dim"),
    (lambda: (t(2, 4, 8, 16, dtype=torch.float32),) * 3, TypeError, "float16 or bfloat16"),
    (lambda: (t(2, 4, 8, 16).int(), t(2, 4, 8, 16), t(2, 4, 8, 16)), TypeError, "dtype"),
    (lambda: (t(2, 4, 8, 16), t(2, 4, 8, 16, dtype=torch.bfloat16),
              t(2, 4, 8, 16, dtype=torch.bfloat16)), TypeError, "share one dtype"),
    (lambda: (t(2, 4, 8, 16), t(3, 4, 8, 16), t(3, 4, 8, 16)), ValueError, "batch size"),
    (lambda: (t(2, 4, 8, 16), t(2, 4, 8, 32), t(2, 4, 8, 32)), ValueError, "head dim differs"),
    (lambda: (t(2, 4, 8, 16), t(2, 4, 9, 16), t(2, 4, 8, 16)), ValueError, "same shape"),
    (lambda: (t(2, 6, 8, 16), t(2, 4, 8, 16), t(2, 4, 8, 16)), ValueError, "multiple of"),
    (lambda: (t(1, 1, 8, 512), t(1, 1, 8, 512), t(1, 1, 8, 512)), ValueError, "between 1 and 256"),
    (lambda: (t(1, 2, 8, 16), t(1, 2, 0, 16), t(1, 2, 0, 16)), ValueError, "length 0"),
    (lambda: ([1.0], t(1, 2, 8, 16), t(1, 2, 8, 16)), TypeError, "torch.Tensor"),
    (lambda: (t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16)), ValueError, "CUDA GPU"),
]


@pytest.mark.parametrize("make,exc,msg", BAD)
def test_validation_errors(make, exc, msg):
    q, k, v = make()
    with pytest.raises(exc, match=msg):
        attention(q, k, v)


def test_cpu_tensors_point_to_reference():
    q = t(1, 2, 8, 16)
    with pytest.raises(ValueError, match="flashattn.reference.attention"):
        attention(q, q, q, causal=True)


@pytest.mark.parametrize("kw,exc,msg", [
    (dict(input_pos=-1, causal=True), ValueError, "input_pos must be in"),
    (dict(input_pos=9, causal=True), ValueError, "input_pos must be in"),
    (dict(input_pos=2, causal=False), ValueError, "only has a meaning"),
    (dict(input_pos=1.5, causal=True), TypeError, "input_pos must be an int"),
    (dict(input_pos=True, causal=True), TypeError, "input_pos must be an int"),
    (dict(scale="x"), TypeError, "scale must be a float"),
    (dict(scale=math.inf), ValueError, "finite"),
    (dict(scale=0.0), ValueError, "finite positive"),
    (dict(scale=-0.125), ValueError, "finite positive"),
])
def test_argument_errors(kw, exc, msg):
    q, k = t(1, 2, 4, 16), t(1, 2, 12, 16)
    with pytest.raises(exc, match=msg):
        validate(q, k, k, causal=kw.pop("causal", False), scale=kw.pop("scale", None),
                 input_pos=kw.pop("input_pos", 0))


def test_input_pos_kv_cache_range_ok():
    q, k = t(1, 2, 4, 16), t(1, 2, 12, 16)
    for pos in (0, 3, 8):
        with pytest.raises(ValueError, match="CUDA GPU"):  # everything but the device is fine
            validate(q, k, k, causal=True, scale=None, input_pos=pos)


def test_causal_must_be_bool():
    q = t(1, 2, 8, 16)
    with pytest.raises(TypeError, match="causal must be a bool"):
        attention(q, q, q, causal="yes")


def test_unknown_step_fails_before_work():
    q = t(1, 2, 8, 16)
    with pytest.raises(ValueError, match="CUDA GPU"):
        attention(q, q, q, step="baseline")


def test_sdpa_refuses_what_it_cannot_do():
    q = t(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sdpa(t(1, 4, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16))


def test_flops_convention():
    # The seed's convention: 4*B*H*N*N*D, halved for causal squares.
    assert attention_flops(4, 32, 1024, 1024, 128, False) == 4 * 4 * 32 * 1024 * 1024 * 128
    assert attention_flops(4, 32, 1024, 1024, 128, True) == 2 * 4 * 32 * 1024 * 1024 * 128
    # Nq != Nk counts visible pairs: a prefill of 2 after a cache of 2 sees 3 + 4 keys.
    assert attention_flops(1, 1, 2, 4, 1, True, input_pos=2) == 4 * 7
    assert attention_flops(1, 1, 4, 2, 1, True) == 4 * (1 + 2 + 2 + 2)


def test_source_diff_shows_each_change():
    from flashattn.source import config_diff, step_diff, step_source
    assert "flush_to_zero=True" in step_diff("fast_math")
    assert "j >= mask_start" in step_diff("loop_split")
    assert "num_m_blocks - 1 - ct.bid(0)" in step_diff("remap", causal=True)
    assert step_diff("large_tiles") == ""              # only the tiles change...
    assert config_diff("large_tiles") == {"TILE_M": (64, 256), "TILE_N": (64, 128)}
    base = step_source("baseline", causal=True, even_k=True)
    assert "if FAST_MATH" not in base and "if LAZY_RESCALE" not in base
    compile(base, "baseline", "exec")                  # folded source is still valid Python
    for name in flashattn.STEP_NAMES + tuple(flashattn.EXPERIMENTS):
        compile(step_source(name), name, "exec")
    assert "exp2_fma" in step_diff("exp_poly") and "check_bounds=False" in step_diff("unchecked_kv")
