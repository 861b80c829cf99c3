"""The public operators on CPU tensors, by opt-in (issue 20, item 2): with FLASHATTN_INTERPRET=1
or inside ``flashattn.interpret.enabled()``, ``attention``, ``sdpa``, ``decode``,
``attention_varlen`` and their backward run the real kernels in the CPU interpreter
(``flashattn.dispatch.launch_kernel``), with the configurations an H200 gets; without it, a CPU
tensor is refused and the message names the opt-in. Small shapes: the criterion of the GPU tests
(tests/criteria.py: at most 2x PyTorch's own same-precision error plus a floor) against the
fp64 references, on the CPU.
"""
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
import flashbook  # noqa: E402
from criteria import assert_flash_criterion  # noqa: E402
from flashattn import dispatch, interpret  # noqa: E402
from flashattn import reference as R  # noqa: E402
from flashbook.steps import SEARCH_SPACE, WARP_GROUP_SPACE  # noqa: E402


@pytest.fixture
def interp(monkeypatch):
    """The opt-in through the environment, for the H200 (sm_90) the interpreter stands in for."""
    monkeypatch.setenv("FLASHATTN_INTERPRET", "1")
    monkeypatch.delenv("FLASHATTN_INTERPRET_ARCH", raising=False)


@pytest.fixture
def launches(monkeypatch):
    """Every interpreted launch's grid, in order (the launches still run)."""
    grids = []
    real = interpret.launch

    def spy(grid, kernel, args, **kw):
        grids.append(tuple(grid))
        return real(grid, kernel, args, **kw)
    monkeypatch.setattr(interpret, "launch", spy)
    return grids


def inputs(b, hq, hkv, nq, nk, d, dtype=torch.float16, *, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g).to(dtype)
               for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))
    return tuple(t.requires_grad_(grad) for t in (q, k, v))


def check_forward(out, q, k, v, causal, input_pos=0, *, seed):
    from test_kernels_gpu import torch_same_precision
    scale = q.shape[-1] ** -0.5
    ref = R.attention(q.double(), k.double(), v.double(), causal=causal, input_pos=input_pos)
    pt = torch_same_precision(q, k, v, causal, scale, input_pos)
    assert out.shape == q.shape and out.dtype == q.dtype and out.device.type == "cpu"
    assert_flash_criterion(out, ref, pt, 1e-3 if q.dtype == torch.float16 else 8e-3, seed=seed)


# --- the forward -------------------------------------------------------------------------------
@pytest.mark.parametrize("step,hq,hkv,nq,nk,causal,pos", [
    ("best", 4, 2, 100, 130, True, 30),       # GQA 2:1, a prefill after a cache of 30
    ("best", 2, 2, 77, 77, False, 0),
    ("best", 4, 1, 65, 65, True, 0),          # MQA
    ("baseline", 2, 1, 70, 90, True, 20),
    ("naive", 2, 2, 40, 50, False, 0),
    ("remap", 2, 2, 300, 300, True, 0),       # 256x128 tiles, the query tiles reversed
    ("persistent", 2, 2, 130, 130, True, 0),  # the grid from the interpreter's SM count
])
def test_attention_runs_the_kernels_on_cpu(interp, step, hq, hkv, nq, nk, causal, pos):
    seed = nq + nk + hq
    q, k, v = inputs(1, hq, hkv, nq, nk, 64, seed=seed)
    out = flashbook.attention(q, k, v, causal=causal, input_pos=pos, step=step)
    check_forward(out, q, k, v, causal, pos, seed=seed)


def test_the_context_manager_and_bfloat16():
    q, k, v = inputs(2, 2, 2, 33, 33, 32, torch.bfloat16, seed=3)
    with interpret.enabled():
        out = flashattn.attention(q, k, v, causal=True)
    check_forward(out, q, k, v, True, seed=3)


def test_sdpa_with_gqa(interp):
    q, k, v = inputs(1, 4, 2, 50, 50, 64, seed=5)
    out = flashattn.sdpa(q, k, v, is_causal=True, enable_gqa=True)
    check_forward(out, q, k, v, True, seed=5)


def test_best_chooses_as_on_the_gpu(interp, launches):
    # sm_90: "best" is warp_groups, whose first configuration has 128x128 tiles.
    q, k, v = inputs(1, 2, 2, 300, 300, 64, seed=7)
    assert WARP_GROUP_SPACE["sm_90"][0].TILE_M == 128
    flashattn.attention(q, k, v, causal=True)
    assert launches == [(3, 2, 1)]
    # sm_100 (148 SMs): arch_tuned, whose first configuration has 256-row tiles.
    launches.clear()
    with interpret.enabled(arch="sm_100"):
        assert dispatch.device_arch(q.device) == "sm_100"
        assert dispatch.device_sm_count(q.device) == 148
        flashattn.attention(q, k, v, causal=True)
    assert SEARCH_SPACE["sm_100"][0].TILE_M == 256 and launches == [(2, 2, 1)]


def test_autotune_never_times_on_cpu(interp, launches, monkeypatch, tmp_path):
    """A tuned step with the search on: no search (there is no GPU to time); the first
    configuration of the space, or the winner cached for the stood-in GPU."""
    import json

    from flashattn import autotune
    monkeypatch.setenv("FLASHATTN_AUTOTUNE", "1")
    monkeypatch.setenv("FLASHATTN_CACHE", str(tmp_path))
    monkeypatch.setattr(autotune, "_memory", {})
    monkeypatch.setattr(autotune, "search", lambda *a, **kw: pytest.fail("searched on a CPU"))
    q, k, v = inputs(1, 2, 2, 200, 200, 64, seed=9)
    out = flashbook.attention(q, k, v, step="autotune")      # seed space: 64x64 first
    assert launches == [(4, 2, 1)]
    check_forward(out, q, k, v, False, seed=9)
    assert not list(tmp_path.iterdir()), "the interpreter wrote an autotune cache"
    # A winner cached for the H200 (e.g. copied from the GPU host) is what the H200 runs.
    key = f"autotune:{autotune.shape_key(q, k, False)}"
    (tmp_path / "autotune-NVIDIA_H200.json").write_text(json.dumps(
        {key: dict(TILE_M=128, TILE_N=128, occupancy=2, ms=1.0)}))
    monkeypatch.setattr(autotune, "_memory", {})
    launches.clear()
    flashbook.attention(q, k, v, step="autotune")
    assert launches == [(2, 2, 1)]


# --- decoding ------------------------------------------------------------------------------------
@pytest.mark.parametrize("paged", [False, True])
def test_decode_contiguous_and_paged(interp, paged):
    from test_decode_gpu import torch_same_precision
    g = torch.Generator().manual_seed(11)
    B, Hq, Hkv, Nq, D, S = 3, 8, 2, 2, 64, 320
    q = torch.randn(B, Hq, Nq, D, generator=g).half()
    lens = torch.tensor([300, 1, 0], dtype=torch.int32)
    table = None
    if paged:
        page, pages = 32, S // 32
        k = torch.randn(B * pages + 1, Hkv, page, D, generator=g).half()
        table = torch.randperm(B * pages + 1, generator=g)[:B * pages].view(B, pages)
        table = table.to(torch.int32)
    else:
        k = torch.randn(B, Hkv, S, D, generator=g).half()
    v = torch.randn(k.shape, generator=g).half()
    out = flashattn.decode(q, k, v, lens, block_table=table)
    ref = R.decode_attention(q.double(), k.double(), v.double(), lens, block_table=table)
    pt = torch_same_precision(q, k, v, lens, table, D ** -0.5)
    assert_flash_criterion(out, ref, pt, 1e-3, seed=11)
    assert (out[2] == 0).all() and (out[1, :, 0] == 0).all()     # rows that see no key


def test_attention_takes_the_decode_path_as_on_the_gpu(interp, monkeypatch):
    host = sys.modules["flashattn.decoding"]
    calls = []
    real = host.launch_decode
    monkeypatch.setattr(host, "launch_decode", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    q, k, v = inputs(2, 4, 2, 1, 1100, 64, seed=13)
    out = flashattn.attention(q, k, v, causal=True, input_pos=1099)
    assert calls == [1], "step='best' did not take the split-KV decode path"
    check_forward(out, q, k, v, True, 1099, seed=13)


# --- packed variable-length sequences ------------------------------------------------------------
def packed(lens_q, lens_k, hq, hkv, d, *, seed, grad=False):
    g = torch.Generator().manual_seed(seed)
    cu = [torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
          for lens in (lens_q, lens_k)]
    q = torch.randn(sum(lens_q), hq, d, generator=g).half().requires_grad_(grad)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).half().requires_grad_(grad)
            for _ in range(2))
    return q, k, v, cu[0], cu[1], max(lens_q), max(lens_k)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward(interp, causal):
    from test_varlen_gpu import per_sequence
    q, k, v, cu_q, cu_k, mq, mk = packed([5, 0, 70, 33], [9, 3, 70, 20], 4, 2, 32, seed=15)
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    ref = R.varlen_attention(q.double(), k.double(), v.double(), cu_q, cu_k, causal=causal)
    pt = per_sequence(q, k, v, cu_q, cu_k, causal, 32 ** -0.5, q.dtype)
    assert_flash_criterion(out, ref, pt, 1e-3, seed=15)


# --- the backward through autograd ---------------------------------------------------------------
def check_grads(grads, ref, pt, *, seed):
    from test_backward_gpu import check
    check(grads, ref, pt, "float16", seed=seed)


@pytest.mark.parametrize("causal,pos", [(False, 0), (True, 30)])
def test_attention_backward(interp, causal, pos):
    from test_backward_gpu import reference, torch_same_precision
    q, k, v = inputs(1, 4, 2, 100, 130, 64, seed=17, grad=True)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(18)).half()
    out = flashattn.attention(q, k, v, causal=causal, input_pos=pos)
    out.backward(dout)
    _, _, ref = reference(q.detach(), k.detach(), v.detach(), dout, causal, 64 ** -0.5, pos)
    pt = torch_same_precision(q.detach(), k.detach(), v.detach(), dout, causal, 64 ** -0.5,
                              pos)
    check_grads((q.grad, k.grad, v.grad), ref, pt, seed=17)


def test_varlen_backward(interp):
    from test_varlen_gpu import ref_grads_fp64, torch_grads_same_precision
    q, k, v, cu_q, cu_k, mq, mk = packed([5, 0, 40, 33], [9, 3, 20, 40], 4, 2, 32, seed=19,
                                         grad=True)
    out = flashattn.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(20)).half()
    out.backward(dout)
    args = (q.detach(), k.detach(), v.detach(), dout, cu_q, cu_k, True, 32 ** -0.5)
    check_grads((q.grad, k.grad, v.grad), ref_grads_fp64(*args),
                torch_grads_same_precision(*args), seed=19)


# --- without the opt-in --------------------------------------------------------------------------
OPT_IN = r"FLASHATTN_INTERPRET=1 or call inside `with flashattn\.interpret\.enabled\(\):`"


@pytest.mark.parametrize("op", ["attention", "sdpa", "backward", "decode", "varlen"])
def test_without_the_opt_in_cpu_is_refused_naming_it(monkeypatch, op):
    monkeypatch.delenv("FLASHATTN_INTERPRET", raising=False)
    q, k, v = inputs(1, 2, 2, 8, 8, 16, seed=1)
    from flashattn.launch_bwd import attention_backward
    run = {
        "attention": lambda: flashattn.attention(q, k, v),
        "sdpa": lambda: flashattn.sdpa(q, k, v),
        "backward": lambda: attention_backward(q, k, v, q, q, torch.zeros(1, 2, 8), causal=True),
        "decode": lambda: flashattn.decode(q[:, :, :1], k, v, torch.tensor([8], dtype=torch.int32)),
        "varlen": lambda: flashattn.attention_varlen(
            q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
            torch.tensor([0, 8], dtype=torch.int32), torch.tensor([0, 8], dtype=torch.int32),
            8, 8),
    }[op]
    with pytest.raises(ValueError, match=r"CUDA GPU(.|\n)*flashattn\.reference(.|\n)*" + OPT_IN):
        run()
    # enabled(on=False) switches it off whatever the environment says.
    monkeypatch.setenv("FLASHATTN_INTERPRET", "1")
    with interpret.enabled(on=False), pytest.raises(ValueError, match=OPT_IN):
        run()


def test_dispatch_leaves_cuda_devices_alone(interp):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert dispatch.interpreting(cpu) and not dispatch.interpreting(cuda)
    assert not dispatch.interpreting(None)
    assert not dispatch.capturing(cpu)                # never asks torch.cuda for a CPU device
    with dispatch.on_device(cpu):
        pass
    with interpret.enabled(on=False):
        assert not dispatch.interpreting(cpu)


# --- a long call says so before it starts --------------------------------------------------------
@pytest.fixture
def nothing_runs(monkeypatch):
    """Interpreted launches recorded, not run."""
    grids = []
    monkeypatch.setattr(interpret, "launch", lambda grid, kernel, args, **kw: grids.append(grid))
    return grids


def test_a_long_call_warns_before_it_starts(interp, nothing_runs):
    q = torch.empty(8, 16, 8192, 64, dtype=torch.float16)        # 64 x 64 128x128 tiles x 128
    with pytest.warns(dispatch.SlowInterpreterWarning,
                      match=r"flashattn\.attention .*about 524,288 .*steps.*roughly 13 min") as w:
        flashattn.attention(q, q, q)
    assert w[0].filename == __file__                             # points at the caller's line
    assert nothing_runs == [(64, 128, 1)]
    assert dispatch.STEP_COST_S == 1.5e-3 and dispatch.LONG_CALL_S == 60.0
    # A small call stays quiet.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flashattn.attention(q[:1, :2, :256], q[:1, :2, :256], q[:1, :2, :256])


def test_decode_and_varlen_backward_warn_once(interp, nothing_runs):
    # 64 sequences of 32K keys, all on one page of 256 (little memory, many key tiles).
    k = torch.zeros(1, 8, 256, 64, dtype=torch.float16)
    table = torch.zeros(64, 128, dtype=torch.int32)
    lens = torch.full((64,), 32768, dtype=torch.int32)
    with pytest.warns(dispatch.SlowInterpreterWarning, match=r"flashattn\.decode"):
        flashattn.decode(torch.zeros(64, 32, 1, 64, dtype=torch.float16), k, k, lens,
                         block_table=table)
    # One sequence of 16K: its square forward and backward would each warn on their own.
    q, k, v, cu_q, cu_k, mq, mk = packed([16384], [16384], 8, 8, 64, seed=0)
    dims = flashattn.contract.check_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=mq,
                                           max_seqlen_k=mk)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        flashattn.attention_varlen_backward(q, k, v, q, q, cu_q, cu_k, mq, mk, causal=True)
    slow = [x for x in w if issubclass(x.category, dispatch.SlowInterpreterWarning)]
    assert len(slow) == 1 and "attention_varlen_backward" in str(slow[0].message), \
        [str(x.message) for x in slow]       # the per-sequence square kernels stay quiet
    from flashattn.config import Config
    from flashattn.varlen import varlen_steps
    assert varlen_steps(cu_q, cu_k, dims, Config(64, 64), causal=True) == 8 * 256 * 257 // 2


def test_attention_steps():
    assert dispatch.attention_steps(128, 128, 64, 64, causal=False) == 4
    assert dispatch.attention_steps(128, 128, 64, 64, causal=True) == 3
    assert dispatch.attention_steps(64, 256, 64, 64, causal=True, offset=192) == 4
    assert dispatch.attention_steps(4, 2, 64, 64, causal=True, offset=-2) == 1
    assert dispatch.attention_steps(0, 10, 64, 64, causal=False) == 0


# --- where cuda-tile is not installed -------------------------------------------------------------
def test_without_cuda_tile_installed():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'cuda' or name.startswith('cuda.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch, flashattn\n"
        "assert 'cuda.tile' not in sys.modules\n"
        "q = torch.randn(1, 2, 40, 32).half()\n"
        "with flashattn.interpret.enabled():\n"
        "    o = flashattn.attention(q, q, q, causal=True)\n"
        "r = flashattn.reference.attention(q.double(), q.double(), q.double(), causal=True)\n"
        "print((o.double() - r).abs().max().item())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=120,
                         env={**__import__("os").environ, "FLASHATTN_INTERPRET": ""})
    assert res.returncode == 0, res.stderr
    assert float(res.stdout.strip()) < 5e-3
