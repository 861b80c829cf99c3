"""TileGym as a benchmark baseline (flashbook.measure.tilegym): its forward, backward and flash
decode are rows of the forward, backward and decode benchmarks, named, coloured and labelled in
the registry, timed only when asked for (``--baselines ...,tilegym``, ``--impls ...,tilegym``),
and an error row saying how to install it where it is missing. The wiring runs here on CPU
tensors through the interpreter (``flashattn.interpret.intercept``); the timing is the GPU's."""
import importlib.util
import math

import pytest
import torch

from flashattn import interpret
from flashbook import impls
from flashbook.measure import bench, bench_bwd, bench_decode, decode_plan
from flashbook.measure import tilegym as tg_mod
from flashbook.measure.libraries import library_fn

from criteria import assert_close_to_reference
from tilegym_setup import no_autotune, tilegym_or_skip

HAVE_CT = importlib.util.find_spec("cuda.tile") is not None


@pytest.fixture(scope="module")
def tilegym():
    if not HAVE_CT:
        pytest.skip("TileGym imports cuda.tile itself")
    mod = tilegym_or_skip()
    for _ in no_autotune():
        yield mod


def test_registered_as_a_library_timed_when_named():
    i = impls.IMPLS["tilegym"]
    assert (i.kind, i.option, i.backend) == ("library", "tilegym", "tilegym")
    assert impls.LIBRARY_OPTIONS["tilegym"] == "tilegym"
    assert impls.color_of("tilegym") == i.color and impls.label_of("tilegym") == i.label
    assert impls.label_of("tilegym", "decode") == "TileGym"
    assert "tilegym" not in bench.DEFAULT_BASELINES
    assert bench.parse_args(["--baselines", "cudnn,tilegym", "--steps", "none"])["baselines"] \
        == ["cudnn", "tilegym"]
    assert "tilegym" in bench_bwd.BWD_BASELINES and "tilegym" not in bench_bwd.BWD_DEFAULT
    assert bench_bwd.parse_args(["--backward", "--baselines", "tilegym"])["baselines"] == \
        ["tilegym"]
    decode_plan.check_decode_impl("tilegym")
    assert "tilegym" not in decode_plan.default_impls()


def test_decode_plan_skips_more_than_one_new_token():
    plan = decode_plan.plan_decode((1,), (4096,), (1, 4), ("decode", "tilegym"))
    skip = {p["Nq"]: p["skip"] for p in plan}
    assert "tilegym" not in skip[1] and skip[4]["tilegym"] == decode_plan.SKIP_TILEGYM_NQ


def test_missing_tilegym_is_an_error_saying_how_to_install(monkeypatch):
    def absent():
        raise ImportError("No module named 'tilegym'")
    monkeypatch.setattr(tg_mod, "_import", absent)
    monkeypatch.setattr(tg_mod, "_CACHE", {})
    why = tg_mod.available()
    assert "tilegym is not importable" in why and "pip install --no-deps tilegym==1.5.1" in why
    q = torch.zeros(1, 1, 16, 16, dtype=torch.float16)
    with pytest.raises(ImportError, match="pip install --no-deps tilegym"):
        library_fn("tilegym", q, q, q, causal=True, scale=0.25)
    from flashbook.measure.harness import error_text
    with pytest.raises(ImportError) as e:
        tg_mod.kernels()
    assert error_text(e.value).startswith("ImportError: tilegym is not importable")


def _qkv(B, Hq, Hkv, N, D, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, N, D, generator=g).half() for h in (Hq, Hkv, Hkv)]


@pytest.mark.parametrize("causal", [True, False])
def test_the_forward_row_runs_tilegyms_forward(tilegym, causal):
    q, k, v = _qkv(1, 4, 2, 128, 64, seed=11)
    scale = 1 / math.sqrt(64)
    fn, ctx = library_fn("tilegym", q, k, v, causal=causal, scale=scale)
    with interpret.intercept(), interpret.trace() as tr, ctx():
        o = fn()
    assert {e[0] for e in tr.events} == {"_fmha_kernel"}      # the inference forward
    assert_close_to_reference(o, q, k, v, causal=causal, seed=11)


def test_the_backward_row_runs_tilegyms_autograd(tilegym):
    # N a multiple of TileGym's key tile (128 on sm_90): its forward reads undetermined
    # padding past K otherwise (tests/test_interpret_tilegym.py)
    sets = [tuple(t.requires_grad_() for t in _qkv(1, 2, 2, 128, 64, seed=12))]
    dout = torch.randn(1, 2, 128, 64, generator=torch.Generator().manual_seed(13)).half()
    with interpret.intercept(), interpret.trace() as tr:
        fwds, ctx = bench_bwd.forward_thunks("tilegym", sets, causal=True, scale=0.125,
                                             fwd_step="best")
        with ctx():
            o = fwds[0]()
        o.backward(dout)
    assert "_fmha_fwd_kernel_with_lse" in {e[0] for e in tr.events}
    assert "_fmha_bwd_dq_kernel" in {e[0] for e in tr.events}
    from flashattn import reference
    q, k, v = (t.detach() for t in sets[0])
    want = reference.attention_backward(q.double(), k.double(), v.double(), dout.double(),
                                        causal=True, scale=0.125)
    for t, w in zip(sets[0], want):
        assert (t.grad.double() - w).abs().max() < 2e-2


def test_the_decode_row_runs_tilegyms_flash_decode(tilegym):
    s = bench_decode._decode_set(1, 16, 2, 1, 200, 64, torch.float16, torch.device("cpu"),
                                 seed=14, pages=())
    scale = 1 / math.sqrt(64)
    entries = bench_decode.decode_entries(["tilegym"], [s], scale=scale, skip={})
    e = entries["tilegym"]
    assert not isinstance(e, str), e
    with interpret.intercept(), interpret.trace() as tr:
        o = e.fns[0]()
    assert {ev[0] for ev in tr.events} == {"_attention_decode_kernel_grouped",
                                           "_splitk_reduce_kernel"}
    ref = bench_decode.decode_reference(s["q"], s["k"], s["v"], scale)
    assert (o[0].float() - ref).abs().max() < 2e-3
