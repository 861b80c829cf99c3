"""The interpreter tests itself: cuda.tile's own documented examples, its promotion and mma
tables, one planted bug per strictness rule, the real forward kernel mutated eight ways, and a
machine without cuda-tile."""
import contextlib
import importlib.util
import io
import math
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import flashattn
from flashattn import interpret, launch, reference
from flashattn.interpret import InterpreterError
from flashattn.interpret import tile as T
from flashbook.steps import get_step

from criteria import assert_close_to_reference
from scripts import load

HAVE_CT = importlib.util.find_spec("cuda.tile") is not None
ROOT = Path(__file__).resolve().parents[1]


def _kernels():
    import interpret_kernels
    return interpret_kernels


# --- cuda.tile's documented examples --------------------------------------------------------

def _doc_blocks(src: str):
    """(options, code, expected output) of each ``testcode``/``testoutput`` pair."""
    lines = src.split("\n")

    def grab(i):
        opts, i = [], i + 1
        while i < len(lines) and lines[i].strip().startswith(":"):
            opts.append(lines[i].strip())
            i += 1
        while i < len(lines) and not lines[i].strip():
            i += 1
        ind, body = len(lines[i]) - len(lines[i].lstrip()), []
        while i < len(lines) and (not lines[i].strip()
                                  or len(lines[i]) - len(lines[i].lstrip()) >= ind):
            body.append(lines[i][ind:])
            i += 1
        return opts, "\n".join(body).rstrip(), i

    i, out = 0, []
    while i < len(lines):
        if lines[i].strip() == ".. testcode::":
            opts, code, i = grab(i)
            while i < len(lines) and not lines[i].strip():
                i += 1
            if i < len(lines) and lines[i].strip() == ".. testoutput::":
                _, want, i = grab(i)
                out.append((opts, code, want))
        else:
            i += 1
    return out


# Features of cuda.tile the package's kernels do not use, and the interpreter does not have;
# and examples whose documented output is a compile error.
UNSUPPORTED = ("foreign_pointer", "get_raw_memory", "astile", "float8_e8m0fnu", "float4",
               "advanced_indexing", "pack_to_bytes", "unpack_from_bytes", "tiled_view",
               "static_exception", "mma_scaled")


@pytest.mark.skipif(not HAVE_CT, reason="needs cuda.tile's docstrings")
def test_cuda_tiles_documented_examples():
    import cuda.tile as ct
    src = (Path(ct.__file__).parent / "_stub.py").read_text()
    blocks = _doc_blocks(src)
    assert len(blocks) > 100
    passed, failed, skipped = 0, [], 0
    for opts, code, want in blocks:
        if any("kernel_wrapper" in o for o in opts):
            code = ("@ct.kernel\ndef kernel():\n" + textwrap.indent(code, "    ")
                    + "\nct.launch(stream, (1,), kernel, ())\n")
        code = re.sub(r"device=['\"]cuda(:0)?['\"]", "device='cpu'", code)
        if any(u in code for u in UNSUPPORTED):
            skipped += 1
            continue
        g = {"ct": interpret.shim.module() if hasattr(interpret, "shim") else None,
             "torch": torch, "stream": None}
        from flashattn.interpret import shim
        g["ct"] = shim.module()
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(code, "<cuda.tile example>", "exec"), g)
            got = buf.getvalue()
        except SyntaxError:                   # an elided example ("...")
            skipped += 1
            continue
        except InterpreterError as e:         # examples whose documented output is an error
            got = str(e)
        if " ".join(got.split()) == " ".join(want.split()):
            passed += 1
        else:
            failed.append((code, got, want))
    bad = [f for f in failed if "static_assert" not in f[0] and "ensure_constant" not in f[0]]
    assert not bad, "\n\n".join(f"{c}\n-- got --\n{g}\n-- documented --\n{w}" for c, g, w in bad)
    assert passed >= 99, (passed, len(failed), skipped)


# --- cuTile's type tables -----------------------------------------------------------------

@pytest.mark.skipif(not HAVE_CT, reason="compares with cuda.tile's own tables")
def test_promotion_table_is_cuda_tiles():
    from cuda.tile import _datatype as D
    from cuda.tile._exception import TileTypeError
    names = [d.name for d in T.DTYPES]
    for a in names:
        for b in names:
            try:
                want = D.promote_dtypes(getattr(D, a), getattr(D, b)).name
            except TileTypeError:
                want = None
            try:
                got = T.promote(T.as_dtype(a), T.as_dtype(b)).name
            except InterpreterError:
                got = None
            assert got == want, (a, b, got, want)


@pytest.mark.skipif(not HAVE_CT, reason="compares with cuda.tile's own rule")
def test_loosely_typed_scalars_follow_cuda_tile():
    from cuda.tile import _datatype as D
    from cuda.tile._ir.ops_utils import _promote_dtype_and_loosely_typed_constant as loose
    for name in ("bool_", "int8", "int32", "int64", "uint8", "float16", "bfloat16", "float32",
                 "float64"):
        for v in (True, 3, 2.5, 300):
            for ff in (False, True):
                try:
                    want = loose(getattr(D, name), v, ff).name
                except Exception:
                    want = None
                try:
                    got = T.promote_loose(T.as_dtype(name), v, ff).name
                except InterpreterError:
                    got = None
                assert got == want, (name, v, ff, got, want)


@pytest.mark.skipif(not HAVE_CT, reason="compares with cuda.tile's own table")
def test_mma_table_is_cuda_tiles():
    from cuda.tile import _datatype as D
    want = {k.name: tuple(v.name for v in vs) for k, vs in D._mma_supported_dtypes.items()}
    assert T.MMA_DTYPES == want


def test_weak_scalars_keep_the_tiles_dtype():
    k = _kernels()
    x = torch.tensor([1.25], dtype=torch.float16)
    oi = torch.zeros(1, dtype=torch.int32)
    of = torch.zeros(1, dtype=torch.float32)
    interpret.launch((1,), k.promote_kernel, (x, oi, of))
    assert oi.item() == 8 and of.item() == 1.75


def test_fp16_plus_half_stays_fp16():
    a = T.Tile(np.array([1.0], np.float16), T.float16)
    assert (a + 0.5).dtype is T.float16
    assert (T.Tile(np.int32(2), T.int32) + 0.5).dtype is T.float32
    assert (T.Tile(np.int32(2), T.int32) * 3).dtype is T.int32
    with pytest.raises(InterpreterError, match="Implicit promotion"):
        a + T.Tile(np.array([1.0], np.float32), T.bfloat16)
    # bf16 is rounded to nearest-even after every operation
    b = T.Tile(np.array([1.0], np.float32), T.bfloat16) + T.Tile(np.array([2.0 ** -9], np.float32),
                                                                T.bfloat16)
    assert b.a[0] == 1.0


# --- one planted bug per strictness rule -----------------------------------------------------

def _xy(n=100, dtype=torch.float16):
    return torch.randn(n, dtype=dtype), torch.full((n,), 7.0, dtype=dtype)


def test_a_correct_kernel_runs_in_any_order():
    k = _kernels()
    x, y = _xy()
    interpret.launch((2,), k.copy_kernel, (x, y, 64), shuffle=True, seed=3)
    assert torch.equal(x, y)


def test_undetermined_padding_reads_nan():
    k = _kernels()
    x, y = torch.randn(100).half(), torch.zeros(128).half()
    interpret.launch((2,), k.load_no_padding, (x, y, 64))
    assert torch.equal(y[:100], x) and torch.isnan(y[100:]).all()


def test_strict_padding_raises_at_the_load(monkeypatch):
    """FLASHATTN_INTERPRET_STRICT_PADDING=1: the load itself raises, naming the kernel, the
    program, the source line, the tile and the elements past the array."""
    k = _kernels()
    x, y = torch.randn(100).half(), torch.zeros(128).half()
    monkeypatch.setenv(interpret.ENV_STRICT_PADDING, "1")
    with pytest.raises(InterpreterError) as e:
        interpret.launch((2,), k.load_no_padding, (x, y, 64))
    msg = str(e.value)
    for part in ("kernel load_no_padding", "program (1, 0, 0)", "load X at interpret_kernels.py:",
                 "tile (1,) of shape (64,)", "elements 100..127 past the extent 100"):
        assert part in msg, (part, msg)
    interpret.launch((1,), k.load_no_padding, (x, y, 64))          # tile 0 is inside: fine
    monkeypatch.setenv(interpret.ENV_STRICT_PADDING, "0")
    interpret.launch((2,), k.load_no_padding, (x, y, 64))          # off: NaN, as before
    assert torch.isnan(y[100:]).all()


def test_integer_loads_past_the_end_without_padding_raise():
    k = _kernels()
    x, y = torch.arange(100, dtype=torch.int32), torch.zeros(100, dtype=torch.int32)
    with pytest.raises(InterpreterError, match="load_no_padding.*program \\(1, 0, 0\\).*X"):
        interpret.launch((2,), k.load_no_padding, (x, y, 64))


def test_a_tile_wholly_outside_raises():
    k = _kernels()
    x, y = _xy()
    with pytest.raises(InterpreterError, match="wholly outside"):
        interpret.launch((1,), k.load_past_the_end, (x, y, 64))


def test_check_bounds_false_on_a_ragged_tile_raises():
    k = _kernels()
    x, y = _xy()
    interpret.launch((1,), k.load_unchecked, (x, y, 64))                 # tile 0: inside
    with pytest.raises(InterpreterError, match="check_bounds=False"):
        interpret.launch((2,), k.load_unchecked, (x, y, 64))


def test_a_store_of_another_dtype_raises():
    k = _kernels()
    x, y = _xy()
    with pytest.raises(InterpreterError, match="float32 tile into a float16 array"):
        interpret.launch((1,), k.store_wrong_dtype, (x, y, 64))


def test_two_programs_writing_one_element_raise():
    k = _kernels()
    x, y = _xy()
    with pytest.raises(InterpreterError, match="another program"):
        interpret.launch((2,), k.store_same_tile, (x, y, 64))


@pytest.mark.parametrize("dtype,acc_f16,b_f32,ok", [
    (torch.float16, False, False, True), (torch.float16, True, False, True),
    (torch.bfloat16, False, False, True), (torch.bfloat16, True, False, False),
    (torch.float16, False, True, False), (torch.float32, False, False, True)])
def test_mma_dtype_pairs(dtype, acc_f16, b_f32, ok):
    k = _kernels()
    a, b = torch.randn(16, 16, dtype=dtype), torch.randn(16, 16, dtype=dtype)
    c = torch.zeros(16, 16, dtype=torch.float32)
    if not ok:
        with pytest.raises(InterpreterError, match="mma"):
            interpret.launch((1,), k.mma_kernel, (a, b, c, 16, acc_f16, b_f32))
        return
    interpret.launch((1,), k.mma_kernel, (a, b, c, 16, acc_f16, b_f32))
    ref = a.double() @ b.double()
    tol = 2e-2 if acc_f16 or dtype == torch.float32 else 1e-4
    assert (c.double() - ref).abs().max() <= tol * ref.abs().max()


def test_tile_shapes_must_be_powers_of_two():
    k = _kernels()
    x, y = _xy()
    with pytest.raises(InterpreterError, match="power of two"):
        interpret.launch((1,), k.odd_tile, (x, y))


def test_atomics_apply_in_program_order():
    k = _kernels()
    for shuffle in (False, True):
        counter, order = torch.zeros(1, dtype=torch.int32), torch.full((8,), -1, dtype=torch.int32)
        interpret.launch((8,), k.ticket, (counter, order), shuffle=shuffle, seed=5)
        assert counter.item() == 8 and sorted(order.tolist()) == list(range(8))
        assert (order.tolist() == list(range(8))) != shuffle


def test_flush_to_zero_and_approximate_division():
    k = _kernels()
    x = torch.tensor([-130.0, -10.0, 0.0, 3.0], dtype=torch.float32)
    e, ef, d, da = (torch.zeros(4) for _ in range(4))
    interpret.launch((1,), k.math_kernel, (x, e, ef, d, da, 4))
    assert e[0] > 0 and ef[0] == 0                      # 2^-130 is denormal: flushed
    assert torch.equal(e[1:], torch.exp2(x[1:]))
    assert torch.equal(d, x / 3.0)
    assert ((da - d).abs() <= 2 * torch.finfo(torch.float32).eps * d.abs()).all()


def test_errors_name_the_kernel_program_and_tile():
    k = _kernels()
    x, y = _xy()
    with pytest.raises(InterpreterError) as e:
        interpret.launch((2,), k.store_same_tile, (x, y, 64))
    msg = str(e.value)
    assert "store_same_tile" in msg and "program (1, 0, 0)" in msg and "tile (0,)" in msg


def test_bad_launches_get_clear_errors():
    k = _kernels()
    x, y = _xy()
    with pytest.raises(InterpreterError, match="grid"):
        interpret.launch((0,), k.copy_kernel, (x, y, 64))
    with pytest.raises(InterpreterError, match="takes 3 arguments"):
        interpret.launch((1,), k.copy_kernel, (x, y))
    with pytest.raises(InterpreterError, match="constant TILE"):
        interpret.launch((1,), k.copy_kernel, (x, y, torch.tensor(64)))


# --- the real forward kernel, mutated: every planted bug is caught ---------------------------

# (name, original text, mutation, step, case): each mutation is one bug a kernel author makes.
MUTATIONS = [
    ("load without padding",
     "latency=V_LAT, padding_mode=ct.PaddingMode.ZERO)", "latency=V_LAT)",
     "arch_tuned", dict(N=200, causal=False)),
    # (the key range is common.key_tile_range's: its Nk clamp is skipped by passing no Nk)
    ("causal loop not clamped to Nk",
     "k_seqlen, TILE_N, CAUSAL)", "2 ** 30, TILE_N, CAUSAL)",
     "large_tiles", dict(N=100, causal=True)),
    ("K read without its transpose",
     "order=(0, 1, 3, 2), latency=K_LAT, padding_mode", "latency=K_LAT, padding_mode",
     "baseline", dict(N=128, causal=False)),
    ("ragged tile not masked",
     "and j >= mask_start:", "and j >= Tc:",
     "arch_tuned", dict(N=200, causal=False)),
    ("fp32 tile stored into fp16",
     "acc = acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)",
     "acc = acc.reshape((1, 1, TILE_M, TILE_D))", "baseline", dict(N=64, causal=True)),
    ("check_bounds=False on a ragged tile",
     "        if UNCHECKED_KV:\n            v = ", "        if True:\n            v = ",
     "baseline", dict(N=200, causal=False)),
    ("two programs store one tile",
     "                bid_x = ct.bid(0)\n", "                bid_x = ct.bid(0) // 2\n",
     "baseline", dict(N=200, causal=False)),
    ("fp32 operand to mma",
     "acc = ct.mma(p.astype(Q.dtype), v, acc)", "acc = ct.mma(p, v, acc)",
     "baseline", dict(N=64, causal=False)),
]


def _source_of(step):
    """The file of the fused kernel ``step`` runs: the shipped kernel, or the book's ladder."""
    import flashbook  # noqa: F401  (registers the ladder kernel with the library)
    from flashattn.kernels import fmha_spec
    return Path(importlib.util.find_spec(fmha_spec(get_step(step)).module).origin)


def _mutant(tmp_path, name, old, new, step):
    src = _source_of(step).read_text()
    assert src.count(old) >= 1, f"the kernel no longer holds the text to mutate for {name!r}"
    path = tmp_path / f"fmha_mutant_{abs(hash(name))}.py"
    path.write_text(src.replace(old, new))                             # every occurrence
    mod = load(path, path.stem)
    return mod.fmha_kernel


def _run_forward(kernel, step, *, N, causal, Nk=None, input_pos=0, D=64):
    g = torch.Generator().manual_seed(7)
    Nk = Nk or N
    q = torch.randn(1, 2, N, D, generator=g).half()
    k = torch.randn(1, 2, Nk, D, generator=g).half()
    v = torch.randn(1, 2, Nk, D, generator=g).half()
    s = get_step(step)
    out = torch.full_like(q, float("nan"))
    grid, real, args = launch.fmha_args(q, k, v, out, s, s.configs("sm_90")[0], causal=causal,
                                        scale=D ** -0.5, input_pos=input_pos)
    interpret.launch(grid, kernel or real, args)
    return q, k, v, out


@pytest.mark.parametrize("name,old,new,step,case", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_planted_bug_is_caught(tmp_path, name, old, new, step, case):
    # Unmutated, the same case passes the criterion ...
    q, k, v, out = _run_forward(None, step, **case)
    ref_args = dict(causal=case["causal"], input_pos=case.get("input_pos", 0))
    assert_close_to_reference(out, q, k, v, **ref_args)
    # ... mutated, it is caught: an InterpreterError, or an answer the criterion rejects.
    kernel = _mutant(tmp_path, name, old, new, step)
    try:
        q, k, v, out = _run_forward(kernel, step, **case)
    except InterpreterError:
        return
    with pytest.raises(AssertionError):
        assert_close_to_reference(out, q, k, v, **ref_args)


def test_program_order_does_not_change_the_answer():
    s = get_step("arch_tuned")
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 200, 64, generator=g).half() for _ in range(3))
    outs = []
    for shuffle, seed in ((False, None), (True, 1), (True, 2)):
        out = torch.empty_like(q)
        grid, kern, args = launch.fmha_args(q, k, v, out, s, s.configs("sm_90")[0], causal=True,
                                            scale=0.125, input_pos=0)
        interpret.launch(grid, kern, args, shuffle=shuffle, seed=seed)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_the_trace_counts_tiles():
    s = get_step("loop_split")                               # 256x128 tiles on sm_90's table
    cfg = s.configs("sm_90")[0]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 512, 64, generator=g).half() for _ in range(3))
    out = torch.empty_like(q)
    grid, kern, args = launch.fmha_args(q, k, v, out, s, cfg, causal=True, scale=0.125,
                                        input_pos=0)
    with interpret.trace() as tr:
        interpret.launch(grid, kern, args)
    per = tr.loads("K")
    n_m = 512 // cfg.TILE_M
    assert sorted(per.values()) == sorted(
        math.ceil((i + 1) * cfg.TILE_M / cfg.TILE_N) for i in range(n_m))
    assert tr.loads("V") == per and sum(tr.loads("Q").values()) == n_m


# --- where cuda-tile is not installed -------------------------------------------------------

HIDE = """
import importlib.abc, sys
class Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "cuda.tile" or name.startswith("cuda.tile."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Hide())
"""


def test_runs_without_cuda_tile():
    code = HIDE + textwrap.dedent("""
        import torch, flashattn
        from flashattn import interpret, launch, reference
        from flashbook.steps import get_step
        assert getattr(sys.modules.get("cuda.tile"), "__interpreter_shim__", True)
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 2, 77, 64, generator=g).half() for _ in range(3))
        s = get_step("warp_groups"); out = torch.empty_like(q)
        grid, kern, args = launch.fmha_args(q, k, v, out, s, s.configs("sm_90")[0],
                                            causal=True, scale=0.125, input_pos=0)
        interpret.launch(grid, kern, args)
        import cuda.tile
        assert cuda.tile.__interpreter_shim__
        ref = reference.attention(q.double(), k.double(), v.double(), causal=True)
        print("err", (out.double() - ref).abs().max().item())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    err = float(r.stdout.split("err")[1])
    assert err < 2e-3
