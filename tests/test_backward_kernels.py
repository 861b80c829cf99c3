"""The backward kernels (kernels/fmha_bwd.py) without a GPU: their specs, constants, grids and
configurations, the host launcher's argument lists and validation (CPU), the emulation of each
architecture's tiles, the kernels themselves run on a CPU by ``flashattn.interpret`` (against the
fp64 reference, by the FlashAttention criterion), and (``slow``) their ahead-of-time compilation
for Hopper and Blackwell.

    python -m pytest -o addopts="" -m slow tests/test_backward_kernels.py -s   # prints the table
"""
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from criteria import assert_flash_criterion, seed_of
from flashattn import interpret, kernels
from flashattn import reference as R
from flashattn.contract import tile_d_for
from flashattn.kernels import (BWD, BWD_CONFIGS, SPECS, KernelContractError, bwd_configs,
                               bwd_constants, bwd_grid)
from flashattn.launch_bwd import backward_launches, check_backward_tensors
from flashbook.steps import ARCHS, Config
from test_backward_gpu import reference, torch_same_precision
from scripts import load

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py: many small products

HEAD_DIMS = (16, 64, 80, 128, 200, 256)


# --- specs, constants, grids ----------------------------------------------------------------------
def test_the_backward_specs_are_in_specs_and_match_their_source():
    assert list(BWD) == ["bwd_preprocess", "bwd_dkdv", "bwd_dq"]        # launch order
    for name, spec in BWD.items():
        assert SPECS[name] is spec and spec.name == name
        assert spec.module == "flashattn.kernels.fmha_bwd"
        spec.check_signature()
        assert spec.source_params() == spec.params
    assert [a.name for a in BWD["bwd_dkdv"].arrays if a.dtype == "float32"] == ["LSE", "Delta"]


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("arch", [*ARCHS, "sm_121", None])
def test_configs_and_constants(arch, head_dim):
    cfgs = bwd_configs(arch, head_dim)
    assert set(cfgs) == set(BWD)
    for name, cfg in cfgs.items():
        for t in (cfg.TILE_M, cfg.TILE_N):
            assert t >= 16 and t & (t - 1) == 0
        for causal in (False, True):
            c = bwd_constants(name, cfg, head_dim=head_dim, causal=causal, even_k=False)
            assert list(c) == list(BWD[name].constants)
            assert c["TILE_D"] == tile_d_for(head_dim) and c["TILE_M"] == cfg.TILE_M
            if name != "bwd_preprocess":
                assert c["CAUSAL"] is causal and c["EVEN_K"] is False
                assert c["TILE_N"] == cfg.TILE_N
        if cfg.num_worker_warps is not None:
            assert cfg.num_worker_warps in (4, 8)      # what tileiras 13.4 accepts
    assert bwd_configs(arch, head_dim) == cfgs


def test_config_table_covers_every_head_dim():
    for arch, table in BWD_CONFIGS.items():
        assert max(table) == 256, arch
        for dkdv, dq in table.values():
            assert isinstance(dkdv, Config) and isinstance(dq, Config)
    assert bwd_configs("sm_90", 64)["bwd_dkdv"] == BWD_CONFIGS["sm_90"][128][0]
    assert bwd_configs("sm_90", 200)["bwd_dkdv"] == BWD_CONFIGS["sm_90"][256][0]
    assert bwd_configs("sm_75", 64) == bwd_configs("sm_80", 64)


def test_grids():
    c = Config(64, 128)
    kw = dict(B=2, Hq=8, Hkv=2, Nq=1000, Nk=300)
    assert bwd_grid("bwd_preprocess", c, **kw) == (16, 16, 1)
    assert bwd_grid("bwd_dq", c, **kw) == (16, 16, 1)
    assert bwd_grid("bwd_dkdv", c, **kw) == (3, 4, 1)            # per key tile, kv head
    with pytest.raises(ValueError, match="unknown backward kernel"):
        bwd_grid("bwd_dk", c, **kw)
    with pytest.raises(ValueError, match="unknown backward kernel"):
        bwd_constants("fmha", c, head_dim=64, causal=True, even_k=True)


# --- the host launcher, on a CPU --------------------------------------------------------------
def _tensors(B=2, Hq=8, Hkv=2, Nq=100, Nk=300, D=80, dtype=torch.float16):
    q = torch.zeros(B, Hq, Nq, D, dtype=dtype)
    k = torch.zeros(B, Hkv, Nk, D, dtype=dtype)
    lse = torch.zeros(B, Hq, Nq)
    return q, k, lse


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
@pytest.mark.parametrize("causal,pos", [(False, 0), (True, 0), (True, 200)])
def test_launches_pass_every_argument_by_name(arch, causal, pos):
    q, k, lse = _tensors()
    v, out, dout, dq, dk, dv = k + 1, q + 1, q + 2, q + 3, k + 4, k + 5
    delta = lse + 1
    launches = backward_launches(q, k, v, out, dout, lse, delta, dq, dk, dv, causal=causal,
                                 scale=0.1, input_pos=pos, arch=arch)
    assert [x.spec.name for x in launches] == list(BWD)
    cfgs = bwd_configs(arch, 80)
    for x in launches:
        by_name = dict(zip(x.spec.params, x.args))
        assert len(x.args) == len(x.spec.params)
        cfg = cfgs[x.spec.name]
        assert x.hints == cfg.hints()
        assert x.grid == bwd_grid(x.spec.name, cfg, B=2, Hq=8, Hkv=2, Nq=100, Nk=300)
        assert all(by_name[n] == v for n, v in x.constants.items())
        if x.spec.name == "bwd_preprocess":
            assert by_name["Out"] is out and by_name["dO"] is dout and by_name["Delta"] is delta
            assert by_name["num_heads"] == 8
            continue
        assert by_name["Q"] is q and by_name["K"] is k and by_name["V"] is v
        assert by_name["dO"] is dout and by_name["LSE"] is lse and by_name["Delta"] is delta
        assert by_name["qk_scale"] == 0.1 and isinstance(by_name["qk_scale"], float)
        assert by_name["input_pos"] == pos and by_name["group_size"] == 4
        assert by_name["CAUSAL"] is causal and by_name["TILE_D"] == 128
        assert by_name["EVEN_K"] is (300 % cfg.TILE_N == 0)
        if x.spec.name == "bwd_dkdv":
            assert by_name["dK"] is dk and by_name["dV"] is dv and by_name["num_kv_heads"] == 2
        else:
            assert by_name["dQ"] is dq and by_name["num_heads"] == 8


def test_launch_configs_override():
    q, k, lse = _tensors(Nk=256)
    launches = backward_launches(q, k, k, q, q, lse, lse, q, k, k, causal=True, scale=0.1,
                                 input_pos=0, arch="sm_90",
                                 configs={"bwd_dkdv": Config(32, 16)})
    dkdv = launches[1]
    assert dkdv.constants["TILE_N"] == 16 and dkdv.grid == (16, 4, 1) and dkdv.hints == {}
    assert dkdv.constants["EVEN_K"] is True
    assert launches[2].constants == bwd_constants("bwd_dq", bwd_configs("sm_90", 80)["bwd_dq"],
                                                  head_dim=80, causal=True,
                                                  even_k=256 % bwd_configs("sm_90", 80)[
                                                      "bwd_dq"].TILE_N == 0)
    with pytest.raises(KernelContractError):
        BWD["bwd_dq"].args({}, {}, launches[2].constants)


class _ExportCalled(Exception):
    pass


def test_launch_and_aot_pass_the_same_constants(monkeypatch, tmp_path):
    """What the launcher passes to ct.launch is what aot.compile_spec compiles."""
    pytest.importorskip("cuda.tile")
    import cuda.tile.compilation as cc

    from flashattn.aot import compile_spec
    exported = []

    def fake_export(kernel, signatures, out, **kw):
        exported.append(signatures[0])
        raise _ExportCalled()
    monkeypatch.setattr(cc, "export_kernel", fake_export)
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path))
    q, k, lse = _tensors()
    for x in backward_launches(q, k, k, q, q, lse, lse, q, k, k, causal=True, scale=0.1,
                               input_pos=0, arch="sm_90"):
        r = compile_spec(x.spec, "sm_90", x.constants, hints=x.hints, use_cache=False)
        assert r.error.startswith("_ExportCalled"), r.error
        sig = exported[-1]
        assert len(sig.parameters) == len(x.args) == len(x.spec.params)
        k_ = len(x.spec.constants)
        assert [p.value for p in sig.parameters[-k_:]] == list(x.args[-k_:])


def test_validation_of_the_backward_tensors():
    q, k, lse = _tensors(B=1, Hq=4, Hkv=2, Nq=10, Nk=20, D=64)
    check_backward_tensors(q, q, q, lse)
    with pytest.raises(ValueError, match="out must have the shape of q"):
        check_backward_tensors(q, q[:, :, :5], q, lse)
    with pytest.raises(TypeError, match="dout must have q's dtype"):
        check_backward_tensors(q, q, q.float(), lse)
    with pytest.raises(ValueError, match=r"lse must have shape \(B, Hq, Nq\)"):
        check_backward_tensors(q, q, q, lse[..., None])
    with pytest.raises(TypeError, match="lse must be float32"):
        check_backward_tensors(q, q, q, lse.half())
    with pytest.raises(TypeError, match="torch.Tensor"):
        check_backward_tensors(q, q, q, lse.numpy())


def test_the_launcher_refuses_cpu_tensors_before_any_work(monkeypatch):
    from flashattn import launch_bwd

    def refuse(*a, **kw):
        raise AssertionError("work started before validation")
    monkeypatch.setattr(launch_bwd, "backward_launches", refuse)
    q, k, lse = _tensors(B=1, Hq=4, Hkv=2, Nq=10, Nk=20, D=64)
    with pytest.raises(ValueError, match="CUDA GPU"):
        launch_bwd.attention_backward(q, k, k, q, q, lse, causal=True)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        k3 = k[:, :1].expand(1, 3, 20, 64)
        launch_bwd.attention_backward(q, k3, k3, q, q, lse)
    with pytest.raises(TypeError, match="causal must be a bool"):
        launch_bwd.attention_backward(q, k, k, q, q, lse, causal="yes")


# --- each architecture's tiles, emulated ----------------------------------------------------------
@pytest.mark.parametrize("head_dim", [64, 80, 256])
@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_each_architectures_tiles_emulate_exactly(arch, head_dim):
    cfg = bwd_configs(arch, head_dim)
    rng = np.random.default_rng(head_dim)
    Nq, Nk, pos = 150, 190, 40
    q = rng.standard_normal((1, 4, Nq, head_dim)).astype(np.float32)
    k = rng.standard_normal((1, 1, Nk, head_dim)).astype(np.float32)
    v = rng.standard_normal((1, 1, Nk, head_dim)).astype(np.float32)
    do = rng.standard_normal((1, 4, Nq, head_dim)).astype(np.float32)
    kw = dict(causal=True, input_pos=pos)
    got = R.emulate_backward(q, k, v, None, do, None, config=cfg["bwd_dkdv"],
                             dq_config=cfg["bwd_dq"], **kw)
    want = R.attention_backward(q.astype(np.float64), k, v, do, **kw)
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 2e-5 * np.abs(w).max()


# --- the kernels themselves, run on a CPU by flashattn.interpret ------------------------------
# backward_launches builds the launches on the host without CUDA (it passes tensors through);
# each kernel then runs over its grid in the interpreter, in a shuffled program order (programs
# must not depend on one another), into NaN-poisoned outputs: an element left unwritten fails.
# The verdict is the FlashAttention criterion (tests/criteria.py): each gradient within twice
# PyTorch's own fp16 error of the fp64 reference, plus a floor.
FLOOR = 1e-3                               # fp16, relative to max(1, max |reference|)


def run_backward_kernels(q, k, v, out, dout, lse, *, causal, scale, input_pos, configs,
                         deterministic=True, module=None, seed=0):
    """dq, dk, dv, delta from the backward kernels run by the interpreter (the atomics
    variant: dQ summed into a zeroed fp32 buffer, as ``attention_backward`` gives it).
    ``module``: take the kernels from it (a mutant of kernels/fmha_bwd.py) instead."""
    dq, dk, dv = (torch.full_like(t, math.nan) for t in (q, k, v))
    delta = torch.full(lse.shape, math.nan, dtype=torch.float32)
    if not deterministic:
        dq = torch.zeros(q.shape, dtype=torch.float32)
    for x in backward_launches(q, k, v, out, dout, lse, delta, dq, dk, dv, causal=causal,
                               scale=scale, input_pos=input_pos, arch=None, configs=configs,
                               deterministic=deterministic):
        kernel = x.spec.kernel() if module is None else getattr(module, x.spec.function)
        interpret.launch(x.grid, kernel, x.args, shuffle=True, seed=seed)
    return dq, dk, dv, delta


def fp16_inputs(B, Hq, Hkv, Nq, Nk, D, *, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(s, generator=g).half() for s in
                 ((B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D), (B, Hq, Nq, D)))


def assert_gradients(grads, ref, pt, *, seed):
    """The criterion for dq, dk, dv (any of them NaN or inf fails it)."""
    for name, g, r, p in zip(("dq", "dk", "dv"), grads, ref, pt):
        g = torch.as_tensor(g)
        try:
            assert_flash_criterion(g, r, p, FLOOR * max(1.0, r.abs().max().item()), seed=seed)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


SOURCE_CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal, input_pos)
    (1, 4, 1, 70, 100, 80, True, 30),       # GQA 4:1, prefill after a cache, padded head dim
    (2, 2, 2, 45, 45, 64, True, 0),         # ragged square
    (1, 2, 1, 50, 33, 16, False, 0),        # Nq > Nk, non-causal
    (1, 3, 1, 40, 21, 32, True, 0),         # Nq > Nk, causal: rows past Nk see every key
    (1, 2, 2, 1, 1, 64, True, 0),           # one token
    (1, 2, 1, 20, 100, 64, True, 5),        # keys past the last query: dK = dV = 0
]
SOURCE_CONFIGS = {"64x64": {}, "small": {"bwd_dkdv": Config(16, 32), "bwd_dq": Config(32, 16)},
                  "sm_90": bwd_configs("sm_90", 64), "sm_120": bwd_configs("sm_120", 64)}


@pytest.mark.parametrize("configs", SOURCE_CONFIGS)
@pytest.mark.parametrize("case", SOURCE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernels_on_the_interpreter(case, configs, request):
    B, Hq, Hkv, Nq, Nk, D, causal, pos = case
    seed = seed_of(request.node.callspec.id)
    q, k, v, dout = fp16_inputs(B, Hq, Hkv, Nq, Nk, D, seed=seed)
    scale = 0.7 / math.sqrt(D)
    kw = dict(causal=causal, scale=scale, input_pos=pos)
    out64, lse64, exact = reference(q, k, v, dout, causal, scale, pos)
    out, lse = out64.half(), lse64.float()
    pt = torch_same_precision(q, k, v, dout, causal, scale, pos)
    cfg = {**bwd_configs(None, D), **SOURCE_CONFIGS[configs]}
    dq, dk, dv, delta = run_backward_kernels(q, k, v, out, dout, lse, configs=cfg, seed=seed,
                                             **kw)
    assert not torch.isnan(delta).any(), f"delta: {torch.isnan(delta).sum()} unwritten"
    assert torch.allclose(delta, (out.float() * dout.float()).sum(-1), rtol=1e-5, atol=1e-5)
    assert_gradients((dq, dk, dv), exact, pt, seed=seed)
    # The emulation of the same tiles (P and dS rounded to fp16, as the kernels round them)
    # agrees with the kernels to their fp16 output rounding: chapter 11 reads the emulation.
    emu = R.emulate_backward(q, k, v, out, dout, lse, config=cfg["bwd_dkdv"],
                             dq_config=cfg["bwd_dq"], round_p=True, **kw)
    for name, g, e, x in zip(("dq", "dk", "dv"), (dq, dk, dv), emu, exact):
        top = max(x.abs().max().item(), 1.0)
        err = np.abs(g.float().numpy() - e).max()
        assert err <= 2e-3 * top, (name, err)
    if pos + Nq < Nk:                                      # keys no query sees
        assert (dk[:, :, pos + Nq:] == 0).all() and (dv[:, :, pos + Nq:] == 0).all()
    # The atomics variant: the same dK and dV, bit for bit, and dQ (fp32, summed by atomic adds
    # in another program order) within fp16 rounding of the separate pass's.
    dqa, dka, dva, _ = run_backward_kernels(q, k, v, out, dout, lse, configs=cfg,
                                            deterministic=False, seed=seed + 1, **kw)
    assert dqa.dtype == torch.float32 and not torch.isnan(dqa).any()
    assert torch.equal(dka, dk) and torch.equal(dva, dv)
    top = max(exact[0].abs().max().item(), 1.0)
    assert (dqa - dq.float()).abs().max().item() <= 2e-3 * top
    assert_gradients((dqa.half(), dk, dv), exact, pt, seed=seed)


@pytest.mark.parametrize("causal", [False, True])
def test_kernels_mask_the_ragged_key_tile(causal):
    """Very negative scores make the LSE very negative: a padded key (score 0) left unmasked
    would give P = exp(0 - lse) = inf and dS x 0 = NaN in dQ. The ragged tile is masked."""
    B, H, Nq, Nk, D = 1, 2, 20, 37, 16
    seed = 21
    g = torch.Generator().manual_seed(seed)
    q = torch.full((B, H, Nq, D), 4.0).half()
    k = (torch.randn(B, H, Nk, D, generator=g) - 4.0).half()
    v = torch.randn(B, H, Nk, D, generator=g).half()
    dout = torch.randn(B, H, Nq, D, generator=g).half()
    pos = Nk - Nq if causal else 0
    out, lse, exact = reference(q, k, v, dout, causal, 0.25, pos)
    assert lse.max().item() < -40
    pt = torch_same_precision(q, k, v, dout, causal, 0.25, pos)
    for deterministic in (True, False):
        dq, dk, dv, _ = run_backward_kernels(q, k, v, out.half(), dout, lse.float(),
                                             configs=SOURCE_CONFIGS["small"], causal=causal,
                                             scale=0.25, input_pos=pos,
                                             deterministic=deterministic)
        assert_gradients((dq.half(), dk, dv), exact, pt, seed=seed)


@pytest.mark.parametrize("bad_lse", [-math.inf, math.inf])
def test_rows_that_see_no_key(bad_lse):
    """A row with LSE -inf (the forward's log 0 for a row that sees no key; +inf, FA2's way to
    say it) gets P = 0 and dS = 0: dQ 0, nothing added to dK or dV, even when its output is
    NaN (the forward's 0 / 0). The kernels and the emulation agree."""
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 40, 50, 32
    seed = 5
    q, k, v, dout = fp16_inputs(B, Hq, Hkv, Nq, Nk, D, seed=seed)
    kw = dict(causal=True, scale=0.2, input_pos=10)
    out, lse, _ = reference(q, k, v, dout, True, 0.2, 10)
    out, lse = out.half(), lse.float()
    rows = [0, 17, 39]
    lse[:, 1, rows] = bad_lse
    out[:, 1, rows] = math.nan
    # What remains: the gradients with those rows' upstream gradient taken away.
    do0 = dout.clone()
    do0[:, 1, rows] = 0
    _, _, want = reference(q, k, v, do0, True, 0.2, 10)
    pt = torch_same_precision(q, k, v, do0, True, 0.2, 10)
    cfg = {"bwd_dkdv": Config(16, 32), "bwd_dq": Config(16, 16)}
    got_kernels = run_backward_kernels(q, k, v, out, dout, lse, configs=cfg, **kw)[:3]
    got_atomic = run_backward_kernels(q, k, v, out, dout, lse, configs=cfg, deterministic=False,
                                      **kw)[:3]
    got_emu = [torch.from_numpy(g) for g in
               R.emulate_backward(q, k, v, out, dout, lse, config=cfg["bwd_dkdv"],
                                  dq_config=cfg["bwd_dq"], round_p=True, **kw)]
    for got in (got_kernels, got_atomic, got_emu):
        assert_gradients(got, want, pt, seed=seed)
        assert (got[0][:, 1, rows] == 0).all()


# Loads whose zero padding matters (the old NaN-in-P.V lesson of the forward): without it the
# interpreter reads the elements past a ragged length as NaN (a GPU reads whatever is there).
KERNEL_FILE = Path(kernels.__file__).parent / "fmha_bwd.py"
MUTATIONS = {
    # bwd_dq, K in the loop: the ragged key tile's padded keys, unmasked before the -inf mask.
    "dq-K": ("        k = ct.load(K, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, "
             "TILE_D),\n                    padding_mode=ct.PaddingMode.ZERO)"),
    # bwd_dq, V^T: dP's padded columns, times P = 0 there.
    "dq-Vt": ("                     order=(0, 1, 3, 2),\n"
              "                     padding_mode=ct.PaddingMode.ZERO)"),
    # bwd_dkdv, Q in the loop: the ragged query tile's padded rows, P^T = exp(NaN).
    "dkdv-Q": ("        q = ct.load(Q, index=(batch_idx, head_idx, i, 0), shape=(1, 1, TILE_M, "
               "TILE_D),\n                    padding_mode=ct.PaddingMode.ZERO)"),
}


def _without_padding(text: str) -> str:
    head, _, _ = text.rpartition(",\n")
    return head + ")"


@pytest.mark.parametrize("mutation", MUTATIONS)
def test_the_interpreter_catches_a_missing_padding_mode(mutation, tmp_path):
    """The kernel file with one ``padding_mode=ct.PaddingMode.ZERO`` taken out, run through
    the interpreter on ragged lengths, gives NaN gradients (or an InterpreterError); the
    unmutated kernels on the same inputs are exact (test_kernels_on_the_interpreter)."""
    src = KERNEL_FILE.read_text()
    old = MUTATIONS[mutation]
    assert src.count(old) == 1, f"the load of {mutation!r} is not in {KERNEL_FILE} as written"
    path = tmp_path / f"fmha_bwd_{mutation.replace('-', '_')}.py"
    path.write_text(src.replace(old, _without_padding(old)))
    interpret.install_shim()                              # no cuda.tile: the interpreter's
    mutant = load(path, path.stem)
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 45, 37, 32           # ragged tiles; D == TILE_D
    q, k, v, dout = fp16_inputs(B, Hq, Hkv, Nq, Nk, D, seed=3)
    kw = dict(causal=False, scale=0.2, input_pos=0, configs={"bwd_dkdv": Config(16, 16),
                                                             "bwd_dq": Config(16, 16)})
    out, lse, _ = reference(q, k, v, dout, False, 0.2, 0)
    args = (q, k, v, out.half(), dout, lse.float())
    good = run_backward_kernels(*args, **kw)[:3]
    assert not any(torch.isnan(g).any() for g in good)
    try:
        bad = run_backward_kernels(*args, module=mutant, **kw)[:3]
    except interpret.InterpreterError:
        return
    assert any(torch.isnan(g).any() for g in bad), f"{mutation}: the missing padding went unseen"


# --- ahead of time (slow) -------------------------------------------------------------------------
AOT_ARCHS = ("sm_90", "sm_100", "sm_120")
AOT_HEAD_DIMS = (64, 128)


@pytest.fixture(scope="module")
def aot_reports():
    from flashattn.aot import compile_spec
    out = {}
    for arch in AOT_ARCHS:
        for d in AOT_HEAD_DIMS:
            for name, cfg in bwd_configs(arch, d).items():
                c = bwd_constants(name, cfg, head_dim=d, causal=True, even_k=True)
                out[(arch, d, name)] = compile_spec(
                    BWD[name], arch, c, hints=cfg.hints(), dtype="float16",
                    label=f"D={d} {cfg.label()}", step="backward")
    return out


def format_backward_table(reports) -> str:
    cols = ["arch", "D", "kernel", "tiles", "REG", "STACK", "SHARED", "MMA", "EX2", "LDL",
            "STL", "s"]
    rows = []
    for (arch, d, name), r in reports.items():
        if r.error:
            rows.append([arch, d, name, r.config, "ERROR " + r.error[:60]] + [""] * 7)
            continue
        rows.append([arch, d, name, r.config.split(" ", 1)[1], r.registers, r.stack_bytes,
                     r.shared_bytes, r.mma_ops, r.sass.get("MUFU.EX2", 0),
                     r.sass.get("LDL", 0), r.sass.get("STL", 0), f"{r.compile_s:.1f}"])
    w = [max(len(str(c)), *(len(str(row[i])) for row in rows)) for i, c in enumerate(cols)]
    return "\n".join(["  ".join(str(c).ljust(w[i]) for i, c in enumerate(cols))] +
                     ["  ".join(str(v).ljust(w[i]) for i, v in enumerate(row)) for row in rows])


@pytest.mark.slow
@pytest.mark.parametrize("head_dim", AOT_HEAD_DIMS)
@pytest.mark.parametrize("arch", AOT_ARCHS)
def test_backward_kernels_compile(aot_reports, arch, head_dim, record_property):
    for name in BWD:
        r = aot_reports[(arch, head_dim, name)]
        assert not r.error, f"{name} for {arch} at D={head_dim}: {r.error}"
        assert r.registers > 0 and r.sass_lines > 50, name
        # Spills are allowed (recorded, not asserted): the report below prints them.
        record_property(f"{name}_registers", r.registers)
        record_property(f"{name}_stack_bytes", r.stack_bytes)
        record_property(f"{name}_STL", r.sass.get("STL", 0))
        if name != "bwd_preprocess":
            assert r.mma_ops > 0, f"{name}: the products must run on tensor cores"
            assert r.sass["MUFU.EX2"] > 0, f"{name}: P is recomputed with exp2"


@pytest.mark.slow
def test_backward_mma_kinds_and_report(aot_reports):
    assert aot_reports[("sm_90", 128, "bwd_dkdv")].sass["HGMMA"] > 0       # warpgroup MMA
    assert aot_reports[("sm_100", 128, "bwd_dkdv")].sass["UTCHMMA"] > 0    # tensor memory
    assert aot_reports[("sm_120", 128, "bwd_dkdv")].sass["HMMA"] > 0       # mma.sync
    print("\n" + format_backward_table(aot_reports))


# The variants the GPU suite compiles beyond the table: non-causal, a ragged last key tile,
# bf16, a padded head dim, D=256, and strides of no alignment (odd Nq: the LSE and Delta rows).
VARIANTS = [(64, False, False, "bfloat16", 8), (80, True, False, "float16", 8),
            (256, True, False, "float16", 8), (256, False, True, "bfloat16", 8),
            (64, True, False, "float16", 1)]


@pytest.mark.slow
@pytest.mark.parametrize("head_dim,causal,even_k,dtype,align", VARIANTS)
@pytest.mark.parametrize("arch", AOT_ARCHS)
def test_backward_variants_compile(arch, head_dim, causal, even_k, dtype, align,
                                   record_property):
    from flashattn.aot import compile_spec
    for name, cfg in bwd_configs(arch, head_dim).items():
        c = bwd_constants(name, cfg, head_dim=head_dim, causal=causal, even_k=even_k)
        r = compile_spec(BWD[name], arch, c, hints=cfg.hints(), dtype=dtype, align=align)
        assert not r.error, f"{name}: {r.error}"
        record_property(f"{name}_stack_bytes", r.stack_bytes)


def test_module_constants():
    from flashattn.reference.backward import INV_LOG_2
    assert math.isclose(INV_LOG_2, 1 / math.log(2))
    assert kernels.BWD_PREPROCESS_CONFIG.TILE_M == 64
