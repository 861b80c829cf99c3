"""flashattn.attention(..., window_size=, softcap=): flash-attn's keywords, routed to the flex
kernels, checked in the interpreter against an independent fp64 reference; step="best" never
sends them to a path that ignores them (decode), a named step refuses them. No GPU."""
import math

import pytest
import torch

import flashattn
from flashattn import interpret

from criteria import assert_flash_criterion, seed_of


def _qkv(case, Hq, Hkv, Nq, Nk, D, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed_of(case))
    return (torch.randn(1, Hq, Nq, D, generator=g).to(dtype),
            torch.randn(1, Hkv, Nk, D, generator=g).to(dtype),
            torch.randn(1, Hkv, Nk, D, generator=g).to(dtype))


def reference(q, k, v, *, causal, window, softcap, input_pos=0, dtype=torch.float64):
    """Attention with flash-attn's window and softcap, written out (masked rows: 0)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    pos = input_pos + torch.arange(q.shape[2])[:, None]
    j = torch.arange(k.shape[2])[None, :]
    left, right = window
    ok = torch.ones_like(s[0, 0], dtype=torch.bool)
    if left >= 0:
        ok &= j >= pos - left
    if right >= 0:
        ok &= j <= pos + right
    if causal:
        ok &= j <= pos
    s = s.masked_fill(~ok, -math.inf)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return p @ v


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal,window,softcap,input_pos,Nq,Nk", [
    (True, (16, -1), None, 0, 100, 100),
    (True, (16, 0), 5.0, 40, 37, 77),
    (False, (8, 20), None, 0, 70, 50),
    (False, (-1, 10), 3.0, 0, 45, 45),
    (False, (-1, -1), 2.5, 0, 33, 65),
    (True, (-1, -1), 4.0, 0, 50, 50),
])
def test_window_and_softcap(causal, window, softcap, input_pos, Nq, Nk, dtype):
    case = f"{causal}{window}{softcap}{Nq}{dtype}"
    q, k, v = _qkv(case, 4, 2, Nq, Nk, 64, dtype)
    with interpret.enabled():
        out = flashattn.attention(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                  input_pos=input_pos)
    kw = dict(causal=causal, window=window, softcap=softcap, input_pos=input_pos)
    ref = reference(q, k, v, **kw)
    pt = reference(q, k, v, dtype=torch.float32, **kw).to(dtype)
    assert_flash_criterion(out, ref.float(), pt, 1e-3 if dtype == torch.float16 else 8e-3,
                           seed=case)


def test_best_never_sends_a_window_to_decode(monkeypatch):
    """A decode-shaped call (one query row, a long cache) with a window: the decode path would
    ignore it; step='best' must take the flex kernel. The window keeps it cheap here."""
    from flashattn import api
    def no_decode(*a, **k):
        raise AssertionError("decode path chosen for a windowed call")
    monkeypatch.setattr(api, "launch_via_decode", no_decode)
    Nk = 4096
    q, k, v = _qkv("decode", 8, 2, 1, Nk, 64)
    with interpret.enabled():
        assert api.prefer_decode(q, k, True, Nk - 1)      # without the window: decode
        out = flashattn.attention(q, k, v, causal=True, input_pos=Nk - 1, window_size=(100, 0),
                                  softcap=20.0)
    kw = dict(causal=True, window=(100, 0), softcap=20.0, input_pos=Nk - 1)
    ref = reference(q, k, v, **kw)
    pt = reference(q, k, v, dtype=torch.float32, **kw).half()
    assert_flash_criterion(out, ref.float(), pt, 1e-3, seed=0)


def test_off_values_take_the_dense_path():
    q, k, v = _qkv("off", 2, 2, 40, 40, 32)
    with interpret.enabled():
        a = flashattn.attention(q, k, v, causal=True)
        b = flashattn.attention(q, k, v, causal=True, window_size=(-1, -1), softcap=0.0)
    assert torch.equal(a, b)


def test_nothing_silently_dropped():
    q, k, v = _qkv("named", 2, 2, 40, 40, 32)
    with interpret.enabled():
        with pytest.raises(TypeError, match="step"):          # the library runs no named step
            flashattn.attention(q, k, v, window_size=(8, 0), step="baseline")
        with pytest.raises(TypeError, match="window_size"):
            flashattn.attention(q.detach(), k, v, window_size=8)
        with pytest.raises(ValueError, match="softcap"):
            flashattn.attention(q.detach(), k, v, softcap=-1.0)
