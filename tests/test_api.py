"""The public API's contract that needs no GPU: validation, steps, sdpa's refusals."""
import math

import pytest
import torch

import flashattn
import flashbook
from flashattn import api
from flashattn.api import attention, sdpa
from flashattn.contract import check_tensors, tile_d_for


def t(*shape, dtype=torch.float16):
    return torch.randn(*shape).to(dtype)


def test_steps_in_book_order():
    assert flashbook.STEP_NAMES[:7] == ("naive", "baseline", "large_tiles", "fast_math",
                                        "loop_split", "remap", "autotune")
    for s in flashbook.STEPS.values():
        assert s.description and len(s.description.splitlines()) == 1
    assert set(flashbook.SEED_STEPS) >= {"naive", "baseline", "autotune"}


def test_the_public_entry_points_take_no_step():
    # Issue 35: a step of the book runs through flashbook.attention(..., step=NAME).
    import inspect
    for fn in (flashattn.attention, flashattn.sdpa):
        assert "step" not in inspect.signature(fn).parameters, fn.__name__
    with pytest.raises(TypeError, match="step"):
        flashattn.attention(t(1, 2, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16), step="baseline")


def test_unknown_step():
    with pytest.raises(ValueError, match="unknown step 'fastest'"):
        flashbook.get_step("fastest")


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
        check_tensors(q, k, k, causal=kw.pop("causal", False), scale=kw.pop("scale", None),
                 input_pos=kw.pop("input_pos", 0))


def test_input_pos_kv_cache_range_ok():
    q, k = t(1, 2, 4, 16), t(1, 2, 12, 16)
    for pos in (0, 3, 8):
        with pytest.raises(ValueError, match="CUDA GPU"):  # everything but the device is fine
            check_tensors(q, k, k, causal=True, scale=None, input_pos=pos)


def test_causal_must_be_bool():
    q = t(1, 2, 8, 16)
    with pytest.raises(TypeError, match="causal must be a bool"):
        attention(q, q, q, causal="yes")


def test_api_exports_only_the_entry_points():
    # The split: the input contract lives in flashattn.contract, the launch in flashattn.launch.
    assert not hasattr(api, "validate") and not hasattr(api, "fmha_constants")
    assert flashattn.attention is attention and flashattn.sdpa is sdpa


class _FakeCuda(torch.Tensor):
    """A CPU tensor that says it lives on a CUDA GPU: it passes ``check_tensors`` on a machine
    without one, so what ``attention`` does after validation can be tested here."""

    @property
    def device(self):
        return torch.device("cuda", 0)


class _WorkStarted(Exception):
    pass


@pytest.fixture
def no_work(monkeypatch):
    """Make resolving or launching a step raise ``_WorkStarted``, and keep ``attention``'s output
    allocation on the CPU; returns the list of what was attempted."""
    calls = []

    def refuse(what):
        def f(*a, **kw):
            calls.append(what)
            raise _WorkStarted(what)
        return f
    from flashattn import autotune, launch
    for mod in (api, autotune):         # api holds its own references to launch and resolve
        monkeypatch.setattr(mod, "resolve", refuse("resolve"))
    for mod in (api, launch, autotune):
        monkeypatch.setattr(mod, "launch", refuse("launch"))
    monkeypatch.setattr(autotune, "choose", refuse("autotune.choose"))
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **kw: empty(*a, **kw))
    return calls


@pytest.mark.parametrize("entry", ["run_step", "flashbook.attention"])
def test_unknown_step_fails_before_work(no_work, entry):
    q = t(1, 2, 8, 16).as_subclass(_FakeCuda)
    check_tensors(q, q, q, causal=True, scale=None, input_pos=0)    # the inputs are valid
    fn = (lambda q, k, v, causal, step: api.run_step(q, k, v, step, causal=causal)) \
        if entry == "run_step" else (lambda q, k, v, causal, step:
                                     flashbook.attention(q, k, v, causal=causal, step=step))
    with pytest.raises(ValueError, match="unknown step 'fastest'"):
        fn(q, q, q, causal=True, step="fastest")
    assert no_work == [], f"work started before the step name was checked: {no_work}"
    # The control: a known step gets past the name check and reaches resolve.
    with pytest.raises(_WorkStarted):
        fn(q, q, q, causal=True, step="baseline")
    assert no_work == ["resolve"]


def test_invalid_tensors_fail_before_the_step_name(no_work):
    # A step validates the tensors first, then the step name: both are errors before work.
    q = t(1, 2, 8, 16)
    with pytest.raises(ValueError, match="CUDA GPU"):
        flashbook.attention(q, q, q, step="fastest")
    assert no_work == []


def test_sdpa_refuses_what_it_cannot_do():
    q = t(1, 2, 8, 16)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sdpa(t(1, 4, 8, 16), t(1, 2, 8, 16), t(1, 2, 8, 16))


def test_source_diff_shows_each_change():
    from flashbook.source import config_diff, step_diff, step_source
    assert "flush_to_zero=True" in step_diff("fast_math")
    assert "j >= mask_start" in step_diff("loop_split")
    assert "num_m_blocks - 1 - ct.bid(0)" in step_diff("remap", causal=True)
    assert step_diff("large_tiles") == ""              # only the tiles change...
    assert config_diff("large_tiles") == {"TILE_M": (64, 256), "TILE_N": (64, 128)}
    base = step_source("baseline", causal=True, even_k=True)
    assert "if FAST_MATH" not in base and "if LAZY_RESCALE" not in base
    compile(base, "baseline", "exec")                  # folded source is still valid Python
    for name in flashbook.STEP_NAMES + tuple(flashbook.EXPERIMENTS):
        compile(step_source(name), name, "exec")
    assert "exp2_fma" in step_diff("exp_poly") and "check_bounds=False" in step_diff("unchecked_kv")
