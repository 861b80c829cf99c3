"""The kernels' contracts (flashattn.kernels, CPU only): every KernelSpec is its kernel's
signature, arguments go in by name, and the launch and the ahead-of-time compiler build the
same constants.

A spec caches a successful ``check_signature``; a spec derived with ``dataclasses.replace``
starts unchecked (the cache is not an init field).
"""
import ast
import dataclasses
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from flashattn import kernels
from flashattn.contract import tile_d_for
from flashattn.kernels import (FMHA, NAIVE, SPECS, KernelContractError,
                               KernelSpec, constants_for, fmha_constants, fmha_grid, fmha_spec,
                               kernels_of, naive_constants)
from flashbook.ladder import LADDER, SHIPPED_FLAGS
from flashbook.steps import ARCHS, EXPERIMENTS, STEPS, Config

ALL_STEPS = {**STEPS, **EXPERIMENTS}
FUSED = [n for n, s in ALL_STEPS.items() if s.kernel == "fmha"]
# (head_dim, causal, even_k): a power of two, a padded head dim, a ragged last K tile.
SHAPES = [(128, True, True), (128, False, False), (80, True, True), (64, False, True),
          (256, True, False), (16, False, False)]


def fresh(spec: KernelSpec, **changes) -> KernelSpec:
    """A copy of ``spec`` with ``changes`` that has not been checked yet."""
    return dataclasses.replace(spec, **changes)


def swapped(seq: tuple, a: str, b: str) -> tuple:
    out = list(seq)
    i, j = out.index(a), out.index(b)
    out[i], out[j] = out[j], out[i]
    return tuple(out)


# --- specs against the kernels' source --------------------------------------------------------
@pytest.mark.parametrize("name", SPECS)
def test_every_spec_matches_its_kernel(name):
    spec = fresh(SPECS[name])
    spec.check_signature()
    assert spec.source_params() == spec.params
    SPECS[name].check_signature()      # the shared objects too (cached or not)


def _ct_kernels(module: str) -> set[str]:
    """The functions decorated with ``@ct.kernel`` in a module's source."""
    path = Path(importlib.util.find_spec(module).origin)
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                d = d.func if isinstance(d, ast.Call) else d
                if ast.unparse(d) in ("ct.kernel", "kernel", "cuda.tile.kernel"):
                    out.add(node.name)
    return out


def test_every_kernel_has_a_spec():
    # Every module of flashattn/kernels/ that defines a @ct.kernel, and every kernel in it.
    kdir = Path(importlib.util.find_spec("flashattn.kernels").origin).parent
    modules = {f"flashattn.kernels.{p.stem}" for p in kdir.glob("*.py")
               if _ct_kernels(f"flashattn.kernels.{p.stem}")}
    assert {"flashattn.kernels.fmha", "flashattn.kernels.naive"} <= modules
    assert modules == {s.module for s in SPECS.values()}
    found = {(m, f) for m in modules for f in _ct_kernels(m)}
    assert found == {(s.module, s.function) for s in SPECS.values()}
    assert SPECS["fmha"] is FMHA and all(SPECS[n] is s for n, s in NAIVE.items())
    assert all(name == spec.name for name, spec in SPECS.items())


@pytest.mark.parametrize("spec_name,field,a,b", [
    ("ladder", "constants", "FAST_MATH", "SPLIT_LOOP"),
    ("fmha", "constants", "TILE_M", "TILE_N"),
    ("fmha", "constants", "K_LAT", "V_LAT"),
    ("fmha", "constants", "CAUSAL", "WRITE_LSE"),
    ("ladder", "constants", "CAUSAL", "PERSISTENT"),
    ("naive_scores", "constants", "TILE_M", "TILE_N"),
    ("naive_pv", "constants", "TILE_N", "TILE_D"),
])
def test_swapped_constants_are_refused(spec_name, field, a, b):
    spec = LADDER if spec_name == "ladder" else SPECS[spec_name]
    bad = fresh(spec, **{field: swapped(getattr(spec, field), a, b)})
    with pytest.raises(KernelContractError, match=rf"{a}.*{b}|{b}.*{a}"):
        bad.check_signature()
    assert bad._checked == []                  # a failure is not cached
    with pytest.raises(KernelContractError):
        bad.kernel()                           # nothing is imported or launched with it
    with pytest.raises(KernelContractError):
        bad.args({}, {}, {})


def test_swapped_scalars_and_arrays_are_refused():
    bad = fresh(FMHA, scalars=tuple(reversed(FMHA.scalars)))
    with pytest.raises(KernelContractError, match="qk_scale"):
        bad.check_signature()
    arrays = list(FMHA.arrays)
    arrays[1], arrays[2] = arrays[2], arrays[1]
    with pytest.raises(KernelContractError, match="'V' vs kernel 'K'"):
        fresh(FMHA, arrays=tuple(arrays)).check_signature()


def test_a_missing_or_unknown_kernel_parameter_is_refused():
    with pytest.raises(KernelContractError, match="spec has 26 parameters, kernel 27.*only in kernel: \\['PIPELINE'\\]"):
        fresh(LADDER, constants=LADDER.constants[:-1]).check_signature()
    with pytest.raises(KernelContractError, match="spec has 28 parameters, kernel 27"):
        fresh(LADDER, constants=(*LADDER.constants, "NUM_STAGES")).check_signature()
    with pytest.raises(KernelContractError, match="'NUM_STAGES' vs kernel 'TILE_M'"):
        fresh(LADDER, constants=("NUM_STAGES", *LADDER.constants)).check_signature()
    with pytest.raises(KernelContractError, match="no function"):
        fresh(LADDER, function="fmha_kernel_v2").check_signature()
    with pytest.raises(KernelContractError, match="not found"):
        fresh(LADDER, module="flashattn.kernels.nothing_here").check_signature()


def test_a_derived_spec_is_checked_afresh():
    FMHA.check_signature()                        # the original passes and remembers it
    bad = dataclasses.replace(FMHA, constants=swapped(FMHA.constants, "TILE_M", "TILE_N"))
    with pytest.raises(KernelContractError):
        bad.check_signature()


# --- arguments by name ------------------------------------------------------------------------
def _fmha_values(step="baseline", config=Config(64, 64)):
    arrays = dict(Q="q", K="k", V="v", Out="out", Lse="lse")  # stand-ins: passed through
    scalars = dict(qk_scale=0.125, input_pos=0, num_heads=8, group_size=2, num_m_blocks=3)
    constants = fmha_constants(ALL_STEPS[step], config, head_dim=128, causal=True, even_k=True,
                               spec=LADDER)
    return arrays, scalars, constants


def test_args_are_positional_in_signature_order():
    arrays, scalars, constants = _fmha_values("pair", Config(64, 128, occupancy=2))
    args = LADDER.args(arrays, scalars, constants)
    assert len(args) == len(LADDER.params) == len(LADDER.source_params())
    by_name = dict(zip(LADDER.source_params(), args))
    assert [by_name[n] for n in ("Q", "K", "V", "Out", "Lse")] == ["q", "k", "v", "out", "lse"]
    assert by_name["WRITE_LSE"] is False
    assert by_name["qk_scale"] == 0.125 and isinstance(by_name["qk_scale"], float)
    assert by_name["num_m_blocks"] == 3 and isinstance(by_name["num_m_blocks"], int)
    assert by_name["PAIR"] is True and by_name["TILE_N"] == 128
    assert all(by_name[n] == v for n, v in constants.items())
    # Given in any order, the arguments come out the same.
    assert LADDER.args(dict(reversed(arrays.items())), dict(reversed(scalars.items())),
                     dict(reversed(constants.items()))) == args


@pytest.mark.parametrize("what,edit,names", [
    ("constants", lambda d: d.update(FASTMATH=d.pop("FAST_MATH")), ["FAST_MATH", "FASTMATH"]),
    ("constants", lambda d: d.pop("PERSISTENT"), ["missing", "PERSISTENT"]),
    ("constants", lambda d: d.update(NUM_STAGES=2), ["unknown", "NUM_STAGES"]),
    ("constants", lambda d: d.update(TILE_K=d.pop("TILE_D")), ["TILE_D", "TILE_K"]),
    ("scalars", lambda d: d.update(scale=d.pop("qk_scale")), ["qk_scale", "scale"]),
    ("scalars", lambda d: d.pop("input_pos"), ["missing", "input_pos"]),
    ("arrays", lambda d: d.update(O=d.pop("Out")), ["Out", "'O'"]),
    ("arrays", lambda d: d.update(LSE="lse"), ["unknown", "LSE"]),
])
def test_args_name_what_is_wrong(what, edit, names):
    arrays, scalars, constants = _fmha_values()
    values = dict(arrays=arrays, scalars=scalars, constants=constants)
    edit(values[what])
    with pytest.raises(KernelContractError) as e:
        LADDER.args(values["arrays"], values["scalars"], values["constants"])
    msg = str(e.value)
    assert "'fmha'" in msg and what in msg
    for n in names:
        assert n in msg, msg


@pytest.mark.parametrize("name", NAIVE)
def test_naive_args_by_name(name):
    spec = NAIVE[name]
    arrays = {a.name: a.name.lower() for a in spec.arrays}
    scalars = {n: 1 for n, _ in spec.scalars}
    constants = naive_constants(name, Config(64, 32), head_dim=80, causal=True)
    args = spec.args(arrays, scalars, constants)
    assert args[-len(spec.constants):] == tuple(constants[n] for n in spec.constants)
    constants["TILE_X"] = 1
    with pytest.raises(KernelContractError, match="TILE_X"):
        spec.args(arrays, scalars, constants)


def test_signature_refuses_wrong_constants():
    pytest.importorskip("cuda.tile")
    _, _, constants = _fmha_values()
    sig = LADDER.signature(dtype="float16", constants=constants)
    assert len(sig.parameters) == len(LADDER.params)
    assert [p.value for p in sig.parameters[-len(LADDER.constants):]] == \
        [constants[n] for n in LADDER.constants]
    del constants["EVEN_K"]
    with pytest.raises(KernelContractError, match="EVEN_K"):
        LADDER.signature(dtype="float16", constants=constants)


# --- the constants of every step ----------------------------------------------------------------
@pytest.mark.parametrize("head_dim,causal,even_k", SHAPES)
@pytest.mark.parametrize("step", FUSED)
def test_fmha_constants_are_exactly_the_kernels(step, head_dim, causal, even_k):
    s = ALL_STEPS[step]
    flags = s.flag_values()
    for arch in ARCHS:
        for config in s.configs(arch):
            c = fmha_constants(s, config, head_dim=head_dim, causal=causal, even_k=even_k)
            spec = fmha_spec(s)
            assert list(c) and set(c) == set(spec.constants) and len(c) == len(spec.constants)
            assert (c["TILE_M"], c["TILE_N"]) == (config.TILE_M, config.TILE_N)
            assert c["TILE_D"] == tile_d_for(head_dim) >= head_dim
            assert c["CAUSAL"] is causal and c["EVEN_K"] is even_k
            assert c["WRITE_LSE"] is False       # inference: the LSE block folds away
            assert fmha_constants(s, config, head_dim=head_dim, causal=causal, even_k=even_k,
                                  write_lse=True) == dict(c, WRITE_LSE=True)
            for f, v in flags.items():
                if f != "UNCHECKED_KV" and f in c:
                    assert c[f] == v and type(c[f]) is type(v), f
                elif f not in c:                 # folded into the shipped kernel
                    assert spec is FMHA and SHIPPED_FLAGS[f] == v, f
            # Unchecked loads only where every K/V tile is provably in bounds.
            if "UNCHECKED_KV" in c:
                assert c["UNCHECKED_KV"] == (flags["UNCHECKED_KV"] and even_k
                                             and tile_d_for(head_dim) == head_dim)
            assert constants_for(spec, s, config, head_dim=head_dim, causal=causal,
                                 even_k=even_k) == c


def test_fmha_constants_for_naive_step_is_not_its_kernels():
    # The naive step launches the three naive kernels, each with its own constants.
    s = STEPS["naive"]
    assert kernels_of(s) == [NAIVE["naive_scores"], NAIVE["naive_softmax"], NAIVE["naive_pv"]]
    for spec in kernels_of(s):
        c = constants_for(spec, s, Config(64, 32), head_dim=80, causal=True, even_k=False)
        assert set(c) == set(spec.constants)
        assert c == naive_constants(spec.name, Config(64, 32), head_dim=80, causal=True)
    assert naive_constants("naive_scores", Config(64, 32), head_dim=80, causal=True)["TILE_D"] \
        == 128


@pytest.mark.parametrize("step", FUSED)
def test_fused_steps_launch_the_fused_kernel(step):
    s = ALL_STEPS[step]
    shipped = all(s.flag_values()[f] == v for f, v in SHIPPED_FLAGS.items())
    assert kernels_of(s) == [FMHA if shipped else LADDER]


def test_the_best_steps_run_the_shipped_kernel():
    for name in ("remap", "autotune", "arch_tuned", "warp_groups"):
        assert kernels_of(ALL_STEPS[name]) == [FMHA], name
    for name in ("baseline", "fast_math", "loop_split", "lazy_rescale", "persistent"):
        assert kernels_of(ALL_STEPS[name]) == [LADDER], name


def test_the_ladder_spec_matches_its_source():
    LADDER.check_signature()
    assert set(LADDER.constants) - set(FMHA.constants) == set(SHIPPED_FLAGS)


def test_fmha_grid():
    base, pair, persistent = STEPS["baseline"], EXPERIMENTS["pair"], EXPERIMENTS["persistent"]
    c = Config(64, 128, occupancy=2)
    assert fmha_grid(base, c, B=2, Hq=8, Nq=1000) == (16, 16, 1)
    assert fmha_grid(pair, c, B=2, Hq=8, Nq=1000) == (8, 16, 1)
    assert fmha_grid(pair, c, B=2, Hq=8, Nq=960) == (8, 16, 1)      # 15 tiles: 8 programs
    assert fmha_grid(persistent, c, B=2, Hq=8, Nq=1000, sm_count=132) == (256, 1, 1)
    assert fmha_grid(persistent, c, B=4, Hq=32, Nq=4096, sm_count=132) == (264, 1, 1)
    with pytest.raises(ValueError, match="SM count"):
        fmha_grid(persistent, c, B=2, Hq=8, Nq=1000)


# --- the launch and the compiler build the same arguments -------------------------------------
class _ExportCalled(Exception):
    pass


@pytest.fixture
def captured(monkeypatch, tmp_path):
    """Run ``launch.launch`` and ``aot.compile_step`` on a CPU, stopping where each hands its
    arguments to cuTile: ``ct.launch`` (its argument tuples recorded) and ``export_kernel``
    (its KernelSignature recorded)."""
    ct = pytest.importorskip("cuda.tile")
    import cuda.tile.compilation as cc
    import torch
    got = SimpleNamespace(launched=[], exported=[])

    def fake_launch(stream, grid, kernel, args, **launch_options):
        got.launched.append((grid, args))

    def fake_export(kernel, signatures, out, **kw):
        got.exported.append(signatures[0])
        raise _ExportCalled()

    monkeypatch.setattr(ct, "launch", fake_launch)
    monkeypatch.setattr(cc, "export_kernel", fake_export)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **kw: None)
    from flashattn import dispatch                 # the one place the GPU is asked
    monkeypatch.setattr(dispatch, "cuda_properties", lambda index: ("sm_90", 132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path))
    return got


@pytest.mark.parametrize("head_dim,causal,even_k", [(128, True, True), (80, False, False),
                                                    (64, True, False)])
@pytest.mark.parametrize("step", list(ALL_STEPS))
def test_launch_and_aot_pass_the_same_constants(captured, step, head_dim, causal, even_k):
    import torch

    from flashattn.aot import compile_step
    from flashattn.launch import launch
    s = ALL_STEPS[step]
    config = s.configs("sm_90")[0]
    n = 2 * config.TILE_N + (0 if even_k else 3)
    q = torch.zeros(1, 2, n, head_dim, dtype=torch.float16)
    launch(q, q, q, torch.empty_like(q), s, config, causal=causal, scale=0.1)
    reports = compile_step(step, "sm_90", config=config, head_dim=head_dim, causal=causal,
                           even_k=even_k, dtype="float16", use_cache=False)
    specs = kernels_of(s)
    assert [r.kernel for r in reports] == [sp.name for sp in specs]
    assert all(r.error.startswith("_ExportCalled") for r in reports), [r.error for r in reports]
    launched = [args for _, args in captured.launched]
    assert len(launched) == len(captured.exported) == len(specs)
    for spec, args, sig in zip(specs, launched, captured.exported):
        assert len(args) == len(sig.parameters) == len(spec.params), spec.name
        k = len(spec.constants)
        at_launch = dict(zip(spec.constants, args[-k:]))
        compiled = dict(zip(spec.constants, (p.value for p in sig.parameters[-k:])))
        assert at_launch == compiled, f"{spec.name}: launch {at_launch} != aot {compiled}"
        for name, v in at_launch.items():
            assert type(v) is type(compiled[name]), (spec.name, name)


def test_the_contract_module_is_what_kernels_use():
    # tile_d_for has one definition: contract's (kernels re-uses it, aot goes through kernels).
    assert kernels.tile_d_for is tile_d_for


# --- the LSE output (issue 11) ------------------------------------------------------------------
def test_launch_passes_the_lse_and_its_flag(captured):
    import torch

    from flashattn.launch import launch
    s = STEPS["warp_groups"]
    config = s.configs("sm_90")[0]
    q = torch.zeros(1, 2, 2 * config.TILE_M + 5, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, q.shape[2], dtype=torch.float32)
    launch(q, q, q, torch.empty_like(q), s, config, causal=True, scale=0.1)
    launch(q, q, q, torch.empty_like(q), s, config, causal=True, scale=0.1, lse=lse)
    launch(q, q, q, torch.empty_like(q), s, config, causal=True, scale=0.1)
    (_, off), (_, on), (_, off2) = captured.launched
    by_name = [dict(zip(fmha_spec(s).params, a)) for a in (off, on, off2)]
    assert by_name[0]["WRITE_LSE"] is False and by_name[1]["WRITE_LSE"] is True
    assert by_name[1]["Lse"] is lse
    stand_in = by_name[0]["Lse"]
    assert tuple(stand_in.shape) == (1, 1, 1) and stand_in.dtype == torch.float32
    assert by_name[2]["Lse"] is stand_in          # one stand-in per device, made once
    assert {n: v for n, v in by_name[0].items() if n not in ("Lse", "WRITE_LSE", "Out")} == \
        {n: v for n, v in by_name[1].items() if n not in ("Lse", "WRITE_LSE", "Out")}


@pytest.mark.parametrize("bad,err,match", [
    (lambda q: torch_empty(1, 2, 7), ValueError, "shape"),
    (lambda q: torch_empty(1, 2, q.shape[2], dtype="float16"), TypeError, "float32"),
    (lambda q: torch_empty(1, q.shape[2], 2).transpose(1, 2), ValueError, "contiguous"),
    (lambda q: "lse", TypeError, "torch.Tensor"),
])
def test_launch_refuses_a_bad_lse(captured, bad, err, match):
    import torch

    from flashattn.launch import launch
    q = torch.zeros(1, 2, 33, 64, dtype=torch.float16)
    with pytest.raises(err, match=match):
        launch(q, q, q, torch.empty_like(q), STEPS["baseline"], Config(64, 64), causal=True,
               scale=0.1, lse=bad(q))
    with pytest.raises(ValueError, match="naive"):
        launch(q, q, q, torch.empty_like(q), STEPS["naive"], Config(64, 64), causal=True,
               scale=0.1, lse=torch.empty(1, 2, 33))
    assert captured.launched == []


def torch_empty(*shape, dtype="float32"):
    import torch
    return torch.empty(*shape, dtype=getattr(torch, dtype))
