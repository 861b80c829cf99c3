"""Someone else's cuTile kernels in the interpreter: NVIDIA TileGym's attention (forward
``tile_fmha``, backward ``tile_fmha_with_backward``, flash decode ``fmha_decode``), unmodified,
on CPU tensors.

How: inside ``flashattn.interpret.intercept()`` TileGym's own host code runs as shipped; its
``ct.launch(stream, grid, kernel, args)`` goes to ``flashattn.interpret.launch(grid, kernel,
args)`` with the grid and arguments it computed, and its device queries
(``torch.cuda.get_device_capability`` picks its tiles) answer as the interpreted GPU. Its
autotuner times on a GPU, so it is off here (``TILEGYM_DISABLE_AUTOTUNE=1``: its first
configuration, as TileGym's CI runs).

TileGym comes from the package index, installed by this module's set-up when missing
(``pip install --no-deps tilegym==1.5.1``: its metadata pins another transformers; the kernels
need only torch and cuda-tile); without network it skips, saying so.
"""
import importlib.util

import pytest
import torch

from flashattn import interpret, reference
from flashattn.interpret import InterpreterError

from criteria import assert_close_to_reference, assert_flash_criterion
from tilegym_setup import no_autotune, tilegym_or_skip

HAVE_CT = importlib.util.find_spec("cuda.tile") is not None
pytestmark = pytest.mark.skipif(not HAVE_CT, reason="TileGym imports cuda.tile itself")


@pytest.fixture(scope="module")
def tg():
    """TileGym's (forward, backward, decode), autotuning off for the module."""
    tilegym = tilegym_or_skip()
    for _ in no_autotune():
        yield tilegym.kernels()


def _qkv(B, Hq, Hkv, Nq, Nk, D, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g).half()
    k = torch.randn(B, Hkv, Nk, D, generator=g).half()
    v = torch.randn(B, Hkv, Nk, D, generator=g).half()
    return q, k, v


# sm_90 gives TileGym's 256x128 forward tiles, sm_80 its 64x64 ones (its own table).
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("causal", [False, True])
def test_tilegym_forward(tg, arch, causal):
    fwd, _, _ = tg
    q, k, v = _qkv(1, 4, 2, 256, 256, 64, seed=1)              # GQA 4:2, tile-aligned
    with interpret.intercept(arch), interpret.trace() as tr:
        o = fwd(q, k, v, is_causal=causal)
    launches = {e[0] for e in tr.events}
    assert launches == {"_fmha_kernel"}
    err, _ = assert_close_to_reference(o, q, k, v, causal=causal, seed=1)
    print(f"tile_fmha {arch} causal={causal}: max error {err:.2e} against fp64")


def test_tilegym_backward(tg):
    _, fwd_bwd, _ = tg
    q, k, v = _qkv(1, 4, 2, 128, 128, 64, seed=2)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).half()
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    with interpret.intercept(), interpret.trace() as tr:
        o = fwd_bwd(qq, kk, vv, is_causal=True)
        o.backward(dout)
    assert {e[0] for e in tr.events} == {"_fmha_fwd_kernel_with_lse",
                                         "_fmha_bwd_preprocess_kernel",
                                         "_fmha_bwd_dkdv_kernel", "_fmha_bwd_dq_kernel"}
    assert_close_to_reference(o.detach(), q, k, v, causal=True, seed=2)
    want = reference.attention_backward(q.double(), k.double(), v.double(), dout.double(),
                                        causal=True)
    same_prec = reference.attention_backward(q.float(), k.float(), v.float(), dout.float(),
                                             causal=True)
    for name, got, ref, pt in zip("qkv", (qq.grad, kk.grad, vv.grad), want, same_prec):
        err, _ = assert_flash_criterion(got, ref.float(), pt.half(), 2e-3, seed=2)
        print(f"tile_fmha_with_backward d{name}: max error {err:.2e} against fp64")


@pytest.mark.parametrize("Nk", [256, 300])                   # 300: the last K/V tile ragged
def test_tilegym_flash_decode(tg, Nk):
    _, _, decode = tg
    q, k, v = _qkv(2, 16, 2, 1, Nk, 64, seed=4)                # 8 query heads per KV head
    with interpret.intercept(), interpret.trace() as tr:
        o = decode(q, k, v, None)
    assert {e[0] for e in tr.events} == {"_attention_decode_kernel_grouped",
                                         "_splitk_reduce_kernel"}
    err, _ = assert_close_to_reference(o, q, k, v, causal=False, seed=4)
    print(f"fmha_decode Nk={Nk}: max error {err:.2e} against fp64")


def test_a_ragged_tilegym_load_raises_where_it_reads_undetermined_padding(tg, monkeypatch):
    """TileGym's forward loads K with the default PaddingMode.UNDETERMINED and masks the
    scores afterwards. On a ragged length the interpreter reads that padding as NaN (it does
    not guess what a GPU would read) and the output is NaN; the switch makes the load itself
    raise, naming the kernel, the program, the source line and the tile."""
    fwd, _, _ = tg
    q, k, v = _qkv(1, 2, 2, 100, 100, 64, seed=5)
    monkeypatch.delenv(interpret.ENV_STRICT_PADDING, raising=False)
    with interpret.intercept():
        o = fwd(q, k, v, is_causal=False)
    assert torch.isnan(o).all(), "without the switch the undetermined padding reads NaN"
    monkeypatch.setenv(interpret.ENV_STRICT_PADDING, "1")
    with interpret.intercept(), pytest.raises(InterpreterError) as e:
        fwd(q, k, v, is_causal=False)
    msg = str(e.value)
    for part in ("kernel _fmha_kernel", "program (0, 0, 0)", "load K", "attention.py:",
                 "tile (0, 0, 0, 0)", "UNDETERMINED", "elements 100..127 past the extent 100"):
        assert part in msg, (part, msg)


def test_intercept_puts_everything_back(tg):
    import cuda.tile as ct
    before = (ct.launch, torch.cuda.current_stream, torch.cuda.get_device_capability,
              torch.cuda.get_device_properties)
    with interpret.intercept("sm_100") as props:
        assert torch.cuda.get_device_capability() == (10, 0)
        assert torch.cuda.get_device_properties("cuda").multi_processor_count == \
            interpret.ARCH_SMS["sm_100"] == props.multi_processor_count
        assert ct.launch is not before[0]
    assert (ct.launch, torch.cuda.current_stream, torch.cuda.get_device_capability,
            torch.cuda.get_device_properties) == before
