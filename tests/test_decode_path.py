"""attention()'s decode path on the CPU: ``prefer_decode`` (when a call of flashattn.attention
is a decode step) and ``attention_via_decode`` (attention's arguments through the split-KV
kernels, emulated in NumPy) against exact attention, every input_pos included; and the public
export ``flashattn.decode``.
"""
import contextlib
import importlib
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

host = importlib.import_module("flashattn.decoding")
from flashattn import api  # noqa: E402  (the routing of step="best")


class FakeCuda:
    """A tensor stand-in for prefer_decode, which reads shapes, dtypes and devices only."""

    def __init__(self, *shape, dtype=torch.float16, device="cuda"):
        self.shape, self.dtype, self.device = shape, dtype, SimpleNamespace(type=device)


def q_k(B=1, Hq=32, Hkv=8, Nq=1, Nk=32768, D=128, **kw):
    return FakeCuda(B, Hq, Nq, D, **kw), FakeCuda(B, Hkv, Nk, D, **kw)


def test_flashattn_decode_is_the_public_function():
    import flashattn
    assert flashattn.decode is host.decode and "decode" in flashattn.__all__
    assert callable(flashattn.decode) and host.__name__ == "flashattn.decoding"


@pytest.mark.parametrize("kw,causal,input_pos,expect", [
    (dict(), True, 32767, True),                       # one new token at the end of the cache
    (dict(), False, 0, True),                          # one row, non-causal: sees every key
    (dict(Nq=4), True, 32764, True),                   # speculative decoding
    (dict(Nq=4), True, 100, True),                     # causal rows anywhere in the cache
    (dict(Nq=5), True, 100, False),                    # past the measured crossover (Nq <= 4)
    (dict(Nq=4), False, 0, False),                     # non-causal rows > 1: not decode's mask
    (dict(Nq=16, B=8), True, 0, False),                # the square kernel is faster there
    (dict(Nq=17), True, 0, False),                     # past the decode kernels' Nq
    (dict(Nk=512), True, 511, False),                  # a short cache: the square kernel
    (dict(Nk=api.DECODE_PATH_MIN_NK, Nq=1), True, api.DECODE_PATH_MIN_NK - 1, True),
    (dict(dtype=torch.float32), True, 32767, False),   # attention refuses it anyway
    (dict(device="cpu"), True, 32767, False),
    (dict(Hq=6, Hkv=4), True, 32767, False),           # not GQA
    (dict(B=8193, Hkv=8), True, 32767, False),         # B x Hkv past a grid axis
    (dict(Nq=4), True, 32765, False),                  # input_pos past Nk - Nq
])
def test_prefer_decode(kw, causal, input_pos, expect):
    q, k = q_k(**kw)
    assert api.prefer_decode(q, k, causal, input_pos) is expect


def test_prefer_decode_never_raises_on_odd_inputs():
    assert api.prefer_decode(None, None, True, 0) is False
    assert api.prefer_decode(FakeCuda(1, 2, 3), FakeCuda(1, 2, 3, 4), True, 0) is False


@pytest.fixture
def emulated_gpu(monkeypatch):
    """attention_via_decode on CPU tensors, the decode kernels emulated (as in
    tests/test_decode_contract.py), the CUDA-only checks replaced by the CPU ones."""
    ct = pytest.importorskip("cuda.tile")
    from flashattn import contract
    from flashattn.kernels import DECODE_COMBINE, DECODE_SPLIT
    from flashattn.reference import emulate_combine_kernel, emulate_split_kernel

    def fake_launch(stream, grid, kernel, args, **launch_options):
        args = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        (emulate_split_kernel if kernel is DECODE_SPLIT.kernel() else
         emulate_combine_kernel)(grid, *args)

    def cpu_check_tensors(q, k, v, *, causal, scale, input_pos, interpret=False):
        contract.check_shapes(tuple(q.shape), tuple(k.shape), tuple(v.shape), causal=causal,
                              scale=scale, input_pos=input_pos)
    monkeypatch.setattr(ct, "launch", fake_launch)
    monkeypatch.setattr(contract, "check_tensors", cpu_check_tensors)
    monkeypatch.setattr(api, "check_tensors", cpu_check_tensors)
    monkeypatch.setattr(host, "check_decode_tensors",
                        lambda *a, interpret=False, **kw: contract.check_decode(*a, **kw))
    from flashattn import dispatch
    monkeypatch.setattr(dispatch, "cuda_properties", lambda index: ("sm_90", 132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **kw: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    return api.attention_via_decode


@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D,causal,input_pos", [
    (2, 8, 2, 1, 300, 64, True, 299),        # decode: the last position
    (2, 8, 2, 1, 300, 64, False, 0),         # one row, every key
    (1, 4, 4, 4, 257, 32, True, 253),        # speculative: rows at the end
    (1, 4, 1, 4, 257, 32, True, 60),         # rows in the middle of the cache
    (3, 16, 2, 16, 400, 80, True, 0),        # rows at the start
])
def test_attention_via_decode_is_attention(emulated_gpu, B, Hq, Hkv, Nq, Nk, D, causal,
                                           input_pos):
    from flashattn.reference import attention
    g = torch.Generator().manual_seed(B + Nq + input_pos)
    q = torch.randn(B, Hq, Nq, D, generator=g).half()
    k = torch.randn(B, Hkv, Nk, D, generator=g).half()
    v = torch.randn(B, Hkv, Nk, D, generator=g).half()
    out = emulated_gpu(q, k, v, causal=causal, input_pos=input_pos)
    ref = attention(q, k, v, causal=causal, input_pos=input_pos)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert (out.float() - ref).abs().max().item() < 2e-3


def test_attention_via_decode_refuses_what_it_cannot_compute(emulated_gpu):
    q, k = torch.zeros(1, 2, 4, 16).half(), torch.zeros(1, 2, 300, 16).half()
    with pytest.raises(ValueError, match="non-causal attention with Nq = 4"):
        emulated_gpu(q, k, k, causal=False)
    q = torch.zeros(1, 2, 8, 16).half()
    with pytest.raises(ValueError, match="Nq = 8 > Nk = 4"):
        emulated_gpu(q, k[:, :, :4], k[:, :, :4], causal=True)
    with pytest.raises(ValueError, match="1 to 16 new tokens"):
        emulated_gpu(torch.zeros(1, 2, 17, 16).half(), k, k, causal=True)


# --- on the GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D,causal,input_pos,dtype", [
    (8, 32, 8, 1, 32768, 128, True, 32767, "float16"),
    (8, 32, 8, 1, 4096, 128, False, 0, "bfloat16"),
    (2, 16, 2, 4, 1000, 64, True, 996, "float16"),
    (2, 16, 2, 4, 1000, 64, True, 300, "float16"),
    (1, 8, 1, 16, 2048, 256, True, 0, "bfloat16"),
])
def test_attention_via_decode_on_the_gpu(B, Hq, Hkv, Nq, Nk, D, causal, input_pos, dtype):
    """The decode path computes attention()'s answer (the FlashAttention criterion against
    the fp32 reference, relative to PyTorch's own error in the inputs' precision)."""
    import math

    from criteria import assert_flash_criterion

    from flashattn.reference import attention
    seed = B * 1000 + Nq * 10 + int(causal)
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    q = torch.randn(B, Hq, Nq, D, generator=g, device="cuda").to(dt)
    k = torch.randn(B, Hkv, Nk, D, generator=g, device="cuda").to(dt)
    v = torch.randn(B, Hkv, Nk, D, generator=g, device="cuda").to(dt)
    out = api.attention_via_decode(q, k, v, causal=causal, input_pos=input_pos)
    if api.prefer_decode(q, k, causal, input_pos):
        # attention(step="best") takes this path itself: the same launches, the same bits.
        import flashattn
        assert torch.equal(flashattn.attention(q, k, v, causal=causal, input_pos=input_pos),
                           out)
    ref = attention(q, k, v, causal=causal, input_pos=input_pos)
    kk, vv = (t.repeat_interleave(Hq // Hkv, 1) for t in (k, v))
    s = (q @ kk.transpose(-1, -2)).float() / math.sqrt(D)
    if causal:
        keep = torch.arange(Nk, device="cuda")[None, :] <= \
            input_pos + torch.arange(Nq, device="cuda")[:, None]
        s = s.masked_fill(~keep, -math.inf)
    pt = torch.softmax(s, -1).to(dt) @ vv
    assert_flash_criterion(out, ref, pt, 1e-3 if dtype == "float16" else 8e-3, seed=seed)
