"""The FP8 forward and the FP8-cache decode (issue 24), run by the CPU interpreter.

Tolerances, derived from the formats (``u`` is the unit roundoff, half an ulp at 1):

* FP8 forward, against fp32 attention of the *dequantised* inputs (the kernel's own error).
  S = Q K^T: products of two fp8 numbers are exact in fp32 and D <= 256 of them sum with a
  relative error below D * 2^-24: negligible, as is the fp32 softmax. What remains is P's cast:
  the kernel computes ``p = 2^(s - m + 8)`` in [0, 256] and rounds it to the operands' fp8
  type. In the normal range (p >= 2^-6 for e4m3) the relative error is at most u = 2^-4 (e4m3:
  3 mantissa bits) or 2^-3 (e5m2: 2 bits); below it the absolute error is at most half the
  subnormal spacing, 2^-10 (e4m3; e5m2's 2^-17), against a row sum l >= 256 (the row max
  contributes 2^8). The output divides by the fp32 sum of the unrounded p, so

      |O - O_ref| <= sum_j |P^_j - p_j| |v_j| / l <= (u + Nk 2^-18) max|v|,

  and the bf16 store adds 2^-8 |O| <= 2^-8 max|v| (fp16: 2^-11). Hence
  ``tol = (u + Nk * 2^-18 + u_out) * max|v_dequantised|``: the worst case, every rounding
  in one direction. A kernel that lost a key tile or a descale misses it by orders of magnitude
  at these shapes; a tile-by-tile emulation of the kernel's arithmetic (``_emulate``) checks
  the fine structure to 2^-7 max|v| (P's roundings agree except where a last-bit difference of
  exp2 flips one, and bf16's store).

* FP8-cache decode, against fp32 decode of the dequantised caches: e4m3 (and e5m2) values are
  exact in fp16 and bf16, so the widened tiles carry no error; the descales multiply in fp32.
  What remains is the fp16/bf16 kernel's own: P cast to q's dtype (u_q = 2^-11 fp16, 2^-8 bf16)
  and the store (u_q): ``tol = 2 u_q max|v_dequantised|``.
"""
import math

import pytest
import torch

import flashattn
from flashattn import interpret
from flashattn.reference.decode import decode_reference_fp8
from flashattn.fp8 import (dequantize_fp8, hadamard_rotation, incoherent,
                           quantize_fp8, reference_fp8)
from flashattn.kernels.fp8_fwd_spec import FP8_P_SHIFT, fp8_config

U = {torch.float8_e4m3fn: 2.0 ** -4, torch.float8_e5m2: 2.0 ** -3}
U_OUT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def _inputs(B, Hq, Hkv, Nq, Nk, D, *, seed, dtype=torch.float8_e4m3fn, outliers=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g)
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    if outliers:
        k[..., 3] *= 20.0
    q8, qd = quantize_fp8(q, num_kv_heads=Hkv, dtype=dtype)
    k8, kd = quantize_fp8(k, dtype=dtype)
    v8, vd = quantize_fp8(v, dtype=dtype)
    return (q8, k8, v8), (qd, kd, vd)


def _tol(v8, vd, Nk, dtype, out_dtype=torch.bfloat16):
    vmax = dequantize_fp8(v8, vd).abs().max().item()
    sub = Nk * 2.0 ** -18 if dtype == torch.float8_e4m3fn else 0.0
    return (U[dtype] + sub + U_OUT[out_dtype]) * vmax + 1e-6


FWD_CASES = [
    # B, Hq, Hkv, Nq, Nk, D, causal, input_pos
    (1, 2, 1, 100, 100, 64, True, 0),        # GQA 2:1, one ragged tile
    (2, 4, 1, 37, 300, 64, False, 0),        # GQA 4:1, three key tiles, ragged
    (1, 3, 3, 130, 130, 128, True, 0),       # two query tiles, the diagonal
    (1, 2, 2, 20, 150, 64, True, 130),       # a prefill appended to a cache
    (1, 2, 1, 17, 65, 256, True, 48),        # D=256 (128x128 tiles, split)
    (1, 1, 1, 33, 47, 48, False, 0),         # D=48 padded to 64
]


@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D,causal,input_pos", FWD_CASES)
def test_fp8_forward_matches_dequantised_reference(B, Hq, Hkv, Nq, Nk, D, causal, input_pos):
    (q8, k8, v8), (qd, kd, vd) = _inputs(B, Hq, Hkv, Nq, Nk, D, seed=Nq * 7 + Nk)
    with interpret.enabled():
        out = flashattn.attention(q8, k8, v8, causal=causal, input_pos=input_pos,
                                  q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == (B, Hq, Nq, D)
    ref = reference_fp8(q8, k8, v8, qd, kd, vd, causal=causal, input_pos=input_pos)
    err = (out.float() - ref).abs().max().item()
    tol = _tol(v8, vd, Nk, torch.float8_e4m3fn)
    assert torch.isfinite(out.float()).all()
    assert err <= tol, f"max error {err:.4g} > derived bound {tol:.4g}"


def _key_spans(q0, q1, Nk, tile_n, *, causal, split):
    """The key spans [start, end) the kernel visits, in order, for the query tile of absolute
    positions [q0, q1): every key tile (causal: up to the tile's last row); with ``split`` the
    unmasked ones at ``tile_n`` keys, then the masked ones (causal diagonal, ragged end) at
    ``tile_n // 2``."""
    cdiv = lambda a, b: -(-a // b)                                   # noqa: E731
    if causal:
        tc, mask_start = cdiv(min(q1, Nk), tile_n), min(q0 // tile_n, Nk // tile_n)
    else:
        tc, mask_start = cdiv(Nk, tile_n), Nk // tile_n
    if not split:
        return [(j * tile_n, min((j + 1) * tile_n, Nk)) for j in range(tc)]
    h = tile_n // 2
    tc2 = cdiv(min(q1, Nk), h) if causal else cdiv(Nk, h)
    return ([(j * tile_n, (j + 1) * tile_n) for j in range(mask_start)]
            + [(j * h, min((j + 1) * h, Nk)) for j in range(2 * mask_start, tc2)])


def _emulate(q8, k8, v8, qd, kd, vd, *, causal, input_pos, tile_n, out_dtype, fp8,
             p_shift=FP8_P_SHIFT, tile_m=None, split=False):
    """The kernel's arithmetic tile by tile in torch (fp32), P rounded to ``fp8``: query tiles
    of ``tile_m`` rows (None: all rows at once, the same values without ``split``), the key
    spans of ``_key_spans``."""
    B, Hq, Nq, D = q8.shape
    Hkv, Nk = k8.shape[1], k8.shape[2]
    G = Hq // Hkv
    tm = tile_m or Nq
    out = torch.empty(B, Hq, Nq, D)
    for b in range(B):
        for h in range(Hq):
            kh = h // G
            scale = (1 / math.sqrt(D)) / math.log(2) * qd[b, kh].item() * kd[b, kh].item()
            for r0 in range(0, Nq, tm):
                r1 = min(r0 + tm, Nq)
                q = q8[b, h, r0:r1].float()
                m = torch.full((r1 - r0, 1), -math.inf)
                l = torch.zeros(r1 - r0, 1)
                acc = torch.zeros(r1 - r0, D)
                rows = input_pos + torch.arange(r0, r1)[:, None]
                spans = _key_spans(input_pos + r0, input_pos + r0 + tm, Nk, tile_n,
                                   causal=causal, split=split)
                for j0, j1 in spans:
                    cols = torch.arange(j0, j1)[None, :]
                    s = q @ k8[b, kh, j0:j1].float().T
                    if causal:
                        s = s.masked_fill(cols > rows, -math.inf)
                    m_new = torch.maximum(m, s.amax(-1, keepdim=True) * scale)
                    p = torch.exp2(s * scale - (m_new - p_shift))
                    alpha = torch.exp2(m - m_new)
                    l = l * alpha + p.sum(-1, keepdim=True)
                    acc = acc * alpha + p.to(fp8).float() @ v8[b, kh, j0:j1].float()
                    m = m_new
                out[b, h, r0:r1] = acc / l * vd[b, kh].item()
    return out.to(out_dtype)


def _emulate_config(config, D):
    """_emulate's tile arguments for the kernel's constants at ``config``."""
    from flashattn.kernels.fp8_fwd_spec import fp8_constants
    c = fp8_constants(config, head_dim=D, causal=False, even_k=True, v_transposed=True)
    return dict(tile_m=c["TILE_M"], tile_n=c["TILE_N"], split=c["SPLIT"])


def _forward(v_mode):
    """The library's FP8 forward; "kernel": the book's variant reading V as (N, D)."""
    if v_mode == "kernel":
        from flashbook.measure.bench_fp8 import attention_fp8_vk
        return attention_fp8_vk
    return flashattn.fp8.attention_fp8


def _v_kw(v_mode):
    return {} if v_mode == "kernel" else dict(v_transposed=v_mode == "transposed")


@pytest.mark.parametrize("fp8,out_dtype,v_mode", [
    (torch.float8_e4m3fn, torch.bfloat16, "host"),
    (torch.float8_e4m3fn, torch.float16, "kernel"),
    (torch.float8_e5m2, torch.bfloat16, "transposed"),
])
def test_fp8_forward_follows_its_arithmetic(fp8, out_dtype, v_mode):
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 40, 200, 64
    (q8, k8, v8), (qd, kd, vd) = _inputs(B, Hq, Hkv, Nq, Nk, D, seed=5, dtype=fp8)
    v_arg = v8.transpose(-1, -2).contiguous() if v_mode == "transposed" else v8
    with interpret.enabled():
        out = _forward(v_mode)(
            q8, k8, v_arg, q_descale=qd, k_descale=kd, v_descale=vd, causal=True,
            input_pos=Nk - Nq, out_dtype=out_dtype, **_v_kw(v_mode))
    assert out.dtype == out_dtype
    emu = _emulate(q8, k8, v8, qd, kd, vd, causal=True, input_pos=Nk - Nq,
                   out_dtype=out_dtype, fp8=fp8, **_emulate_config(fp8_config("sm_90", D), D))
    vmax = dequantize_fp8(v8, vd).abs().max().item()
    err_emu = (out.float() - emu.float()).abs().max().item()
    assert err_emu <= 2.0 ** -7 * vmax, f"{err_emu:.3g} from the emulation"
    ref = reference_fp8(q8, k8, v8, qd, kd, vd, causal=True, input_pos=Nk - Nq)
    err = (out.float() - ref).abs().max().item()
    assert err <= _tol(v8, vd, Nk, fp8, out_dtype)


def test_p_shift_matters():
    """Without the 2^8 shift, P's small entries fall into e4m3's subnormals (below 2^-6) or to
    zero (below 2^-10): the kernel's arithmetic with P_SHIFT = 0 is measurably worse than with
    the kernel's 8 on a peaked softmax (both emulated, fp32 out; the kernel itself matches the
    shifted emulation)."""
    B, Hq, Hkv, Nq, Nk, D = 1, 1, 1, 16, 128, 64
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, Hq, Nq, D, generator=g) * 2
    k = torch.randn(B, Hkv, Nk, D, generator=g) * 2
    v = torch.randn(B, Hkv, Nk, D, generator=g)
    (q8, qd), (k8, kd), (v8, vd) = quantize_fp8(q), quantize_fp8(k), quantize_fp8(v)
    ref = reference_fp8(q8, k8, v8, qd, kd, vd)
    kw = dict(causal=False, input_pos=0, tile_n=128, out_dtype=torch.float32,
              fp8=torch.float8_e4m3fn)
    e8 = (_emulate(q8, k8, v8, qd, kd, vd, p_shift=8, **kw) - ref).abs().max().item()
    e0 = (_emulate(q8, k8, v8, qd, kd, vd, p_shift=0, **kw) - ref).abs().max().item()
    assert FP8_P_SHIFT == 8 and e8 < e0, (e8, e0)
    with interpret.enabled():
        out = flashattn.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                  out_dtype=torch.float16)
    emu = _emulate(q8, k8, v8, qd, kd, vd, p_shift=8, **dict(kw, out_dtype=torch.float16))
    assert (out.float() - emu.float()).abs().max().item() <= 2.0 ** -7


def test_quantize_fp8_v_transposed_fused():
    """quantize_fp8(v, v_transposed=True): the same fp8 values and descales as quantising and
    then transposing, in rows padded to 16 bytes, and the forward reads it as v_transposed
    with the emulation's answer (N = 200: a row pitch of 208)."""
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 1, 24, 200, 64
    g = torch.Generator().manual_seed(11)
    v = torch.randn(B, Hkv, Nk, D, generator=g).half()
    v8, vd = quantize_fp8(v)
    v8t, vdt = quantize_fp8(v, v_transposed=True)
    assert v8t.shape == (B, Hkv, D, Nk) and v8t.stride(-1) == 1 and v8t.stride(-2) == 208
    assert torch.equal(vdt, vd)
    assert torch.equal(v8t.float(), v8.transpose(-1, -2).float())
    (q8, k8, _), (qd, kd, _) = _inputs(B, Hq, Hkv, Nq, Nk, D, seed=12)
    with interpret.enabled():
        out = flashattn.fp8.attention_fp8(q8, k8, v8t, q_descale=qd, k_descale=kd,
                                          v_descale=vdt, causal=True, input_pos=Nk - Nq,
                                          v_transposed=True)
    emu = _emulate(q8, k8, v8, qd, kd, vd, causal=True, input_pos=Nk - Nq,
                   out_dtype=torch.bfloat16, fp8=torch.float8_e4m3fn,
                   **_emulate_config(fp8_config("sm_90", D), D))
    assert (out.float() - emu.float()).abs().max().item() <= 2.0 ** -7 * v.abs().max().item()
    with pytest.raises(TypeError, match="v_transposed"):
        quantize_fp8(v, v_transposed=1)


@pytest.mark.parametrize("config", ["64x64", "128x64 occ=1 nww=8", "64x128 occ=2",
                                    "128x128 occ=1 nww=8", "64x256"])
def test_fp8_forward_config_override(config):
    """attention_fp8(config=...) runs the given tiles (the benchmark's --configs) with the
    same arithmetic: the emulation at that TILE_N."""
    from flashattn.config import Config
    B, Hq, Hkv, Nq, Nk, D = 1, 2, 2, 70, 150, 64
    (q8, k8, v8), (qd, kd, vd) = _inputs(B, Hq, Hkv, Nq, Nk, D, seed=13,
                                         dtype=torch.float8_e4m3fn)
    with interpret.enabled():
        out = flashattn.fp8.attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd,
                                          v_descale=vd, causal=False, config=config)
    emu = _emulate(q8, k8, v8, qd, kd, vd, causal=False, input_pos=0,
                   out_dtype=torch.bfloat16, fp8=torch.float8_e4m3fn,
                   **_emulate_config(Config.parse(config), D))
    vmax = dequantize_fp8(v8, vd).abs().max().item()
    assert (out.float() - emu.float()).abs().max().item() <= 2.0 ** -7 * vmax


SPLIT_CASES = [
    # B, Hq, Hkv, Nq, Nk, D, causal, input_pos, v_mode: both loops, every kind of end
    (1, 2, 1, 40, 700, 64, False, 0, "host"),        # 700 = 2 x 256 + 188: two masked 128s
    (1, 2, 2, 33, 600, 128, False, 0, "transposed"),  # 600 = 2 x 256 + 88: one masked 128
    (1, 2, 1, 40, 512, 64, False, 0, "host"),        # even: no masked loop
    (1, 2, 1, 600, 600, 64, True, 0, "host"),        # causal, 5 query tiles, ragged
    (1, 2, 1, 200, 520, 64, True, 320, "kernel"),    # causal Nq != Nk, a prefill on a cache
    (1, 1, 1, 130, 384, 128, True, 0, "transposed"),  # causal, Nk a multiple of 128 only
    (1, 2, 1, 150, 300, 256, True, 0, "host"),       # D=256: 128x128, masked tiles of 64
    (1, 1, 1, 40, 200, 256, False, 0, "transposed"),  # 200 = 128 + 72: two masked 64s
]


@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D,causal,input_pos,v_mode", SPLIT_CASES)
def test_fp8_forward_split_follows_its_arithmetic(B, Hq, Hkv, Nq, Nk, D, causal, input_pos,
                                                  v_mode):
    """sm_90's split tiles (128x256, at D=256 128x128; SPLIT: the masked tiles at half the keys
    in a loop of their own, and causal the longest query tiles first): the emulation of exactly
    those key spans per query tile, and the derived bound against the dequantised reference;
    GQA, ragged ends of Q and K, causal with Nq != Nk, each V layout."""
    from flashattn.kernels.fp8_fwd_spec import fp8_constants
    cfg = fp8_config("sm_90", D)
    assert fp8_constants(cfg, head_dim=D, causal=causal, even_k=False,
                         v_transposed=True)["SPLIT"]
    (q8, k8, v8), (qd, kd, vd) = _inputs(B, Hq, Hkv, Nq, Nk, D, seed=Nq + 3 * Nk)
    v_arg = v8.transpose(-1, -2).contiguous() if v_mode == "transposed" else v8
    with interpret.enabled(arch="sm_90"):
        out = _forward(v_mode)(
            q8, k8, v_arg, q_descale=qd, k_descale=kd, v_descale=vd, causal=causal,
            input_pos=input_pos, config=cfg, **_v_kw(v_mode))
    assert torch.isfinite(out.float()).all()
    emu = _emulate(q8, k8, v8, qd, kd, vd, causal=causal, input_pos=input_pos,
                   out_dtype=torch.bfloat16, fp8=torch.float8_e4m3fn,
                   **_emulate_config(cfg, D))
    vmax = dequantize_fp8(v8, vd).abs().max().item()
    err_emu = (out.float() - emu.float()).abs().max().item()
    assert err_emu <= 2.0 ** -7 * vmax, f"{err_emu:.3g} from the emulation"
    ref = reference_fp8(q8, k8, v8, qd, kd, vd, causal=causal, input_pos=input_pos)
    err = (out.float() - ref).abs().max().item()
    assert err <= _tol(v8, vd, Nk, torch.float8_e4m3fn)


def test_fp8_split_plan():
    """SPLIT comes with the tile (256 keys, or 128 keys at D=256), not the arch: on sm_90 every
    head dim, elsewhere none; the key spans of a causal query tile cover its keys once, the
    256-key tiles first."""
    from flashattn.kernels.fp8_fwd_spec import FP8_CONFIGS, fp8_constants
    from flashattn.config import Config

    def split(cfg, d=128):
        cfg = Config.parse(cfg) if isinstance(cfg, str) else cfg
        return fp8_constants(cfg, head_dim=d, causal=True, even_k=True,
                             v_transposed=True)["SPLIT"]
    assert split("128x256 occ=1 nww=8") and split("64x256", 64) and not split("128x128")
    assert split("128x128", 256) and not split("128x64", 256) and not split("128x32", 256)
    assert fp8_config("sm_90", 128).TILE_N == 256 and fp8_config("sm_90", 64).TILE_N == 256
    for arch, table in FP8_CONFIGS.items():
        for d, cfg in table.items():
            assert split(cfg, d) == (arch == "sm_90"), (arch, d, cfg)
    for q0 in range(0, 1024, 128):
        spans = _key_spans(q0, q0 + 128, 1000, 256, causal=True, split=True)
        assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        assert spans[-1][1] == min(q0 + 128, 1000)
        assert [e - s for s, e in spans if e - s == 256] == [256] * (min(q0, 1000) // 256)


def test_fp8_forward_bad_config():
    (q8, k8, v8), (qd, kd, vd) = _inputs(1, 1, 1, 16, 16, 64, seed=1)
    with pytest.raises(TypeError, match="config"):
        flashattn.fp8.attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                    config=(64, 64))
    with pytest.raises(ValueError, match="configuration"):
        flashattn.fp8.attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                    config="64by64")


def test_quantize_fp8_round_trip_and_groups():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 33, 64, generator=g).half()
    x[1, 2] = 0
    x8, d = quantize_fp8(x, num_kv_heads=2)
    assert x8.dtype == torch.float8_e4m3fn and d.shape == (2, 2) and d.dtype == torch.float32
    back = dequantize_fp8(x8, d)
    # Normal range: relative error <= 2^-4; subnormals: absolute <= 2^-10 * descale.
    bound = 2.0 ** -4 * x.float().abs() + 2.0 ** -10 * d.repeat_interleave(2, 1)[..., None, None]
    assert ((back - x.float()).abs() <= bound + 1e-7).all()
    # The largest |x| of each group maps to 448.
    assert x8.float().abs().reshape(2, 2, -1).amax(-1).eq(448).all()
    z8, dz = quantize_fp8(torch.zeros(1, 1, 4, 16))
    assert dz.item() == 1.0 and (z8.float() == 0).all()
    y8, dy = quantize_fp8(x, dtype=torch.float8_e5m2)
    assert y8.dtype == torch.float8_e5m2 and dy.shape == (2, 4)


@pytest.mark.parametrize("bad,exc,match", [
    (lambda: quantize_fp8(torch.randn(2, 3, 4)), ValueError, "4 dimensions"),
    (lambda: quantize_fp8(torch.randn(1, 3, 4, 16), num_kv_heads=2), ValueError, "divide"),
    (lambda: quantize_fp8(torch.randn(1, 1, 4, 16), dtype=torch.float16), ValueError,
     "float8"),
    (lambda: quantize_fp8(torch.full((1, 1, 2, 16), math.inf)), ValueError, "NaN or inf"),
])
def test_quantize_fp8_bad_inputs(bad, exc, match):
    with pytest.raises(exc, match=match):
        bad()


def test_incoherent_processing_keeps_attention_and_spreads_outliers():
    r = hadamard_rotation(64, seed=1)
    assert torch.allclose(r @ r.T, torch.eye(64), atol=1e-6)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 10, 64, generator=g)
    k = torch.randn(1, 2, 30, 64, generator=g)
    k[..., 5] *= 50                              # one outlier feature
    v = torch.randn(1, 2, 30, 64, generator=g)
    qr, kr = incoherent(q, k, seed=1)
    a = flashattn.reference.attention(q.double(), k.double(), v.double())
    b = flashattn.reference.attention(qr.double(), kr.double(), v.double())
    assert (a - b).abs().max().item() < 1e-5
    # The rotated K's largest coordinate is far below the outlier's.
    assert kr.abs().max() < 0.5 * k.abs().max()
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard_rotation(48)


def _fp8_args(**over):
    (q8, k8, v8), (qd, kd, vd) = _inputs(1, 2, 1, 8, 16, 32, seed=1)
    d = dict(q=q8, k=k8, v=v8, q_descale=qd, k_descale=kd, v_descale=vd)
    d.update(over)
    return d


@pytest.mark.parametrize("over,exc,match", [
    (dict(k="half"), TypeError, "one fp8 dtype"),
    (dict(v="e5m2"), TypeError, "one fp8 dtype"),
    (dict(q_descale=None), ValueError, "q_descale is missing"),
    (dict(v_descale=None), ValueError, "v_descale is missing"),
    (dict(k_descale=torch.ones(1, 2)), ValueError, r"k_descale must have shape \(B, Hkv\)"),
    (dict(k_descale=torch.ones(1, 1, dtype=torch.float16)), TypeError, "float32"),
    (dict(q_descale="1"), TypeError, "q_descale must be"),
    (dict(v_descale=-1.0), ValueError, "positive"),
    (dict(out_dtype=torch.float32), TypeError, "out_dtype"),
    (dict(step="baseline"), TypeError, "step"),          # the library runs no named step
    (dict(q="grad"), ValueError, "no backward"),
])
def test_fp8_forward_bad_inputs(over, exc, match):
    args = _fp8_args()
    for name, val in list(over.items()):
        if val == "half":
            over[name] = args[name].float().half()
        elif val == "e5m2":
            over[name] = args[name].float().to(torch.float8_e5m2)
        elif val == "grad":
            over[name] = args[name].float().to(torch.float8_e4m3fn).requires_grad_()
    args.update(over)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with interpret.enabled(), pytest.raises(exc, match=match):
        flashattn.attention(q, k, v, **args)


def test_fp8_forward_more_bad_inputs():
    args = _fp8_args()
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match="interpreter|CUDA GPU"):
        flashattn.attention(q, k, v, **args)                 # CPU without the interpreter
    with interpret.enabled():
        with pytest.raises(ValueError, match="fp8 inputs only"):
            flashattn.attention(q.float().half(), k.float().half(), v.float().half(),
                                q_descale=args["q_descale"])
        with pytest.raises(ValueError, match="multiple of 16"):
            (q8, k8, v8), (qd, kd, vd) = _inputs(1, 1, 1, 4, 4, 40, seed=0)
            flashattn.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
        with pytest.raises(TypeError, match="v_transpose"):  # one name: v_transposed
            flashattn.fp8.attention_fp8(q, k, v, v_transpose="host", **args)
        with pytest.raises(ValueError):                      # transposed V of the wrong shape
            flashattn.fp8.attention_fp8(q, k, v, v_transposed=True, **args)


# --- decoding over an FP8 cache ----------------------------------------------------------------
def _cache(B, Hq, Hkv, Nq, S, D, *, seed, qdtype=torch.float16, paged=None,
           fp8=torch.float8_e4m3fn):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g).to(qdtype)
    if paged is None:
        kc = torch.randn(B, Hkv, S, D, generator=g)
        vc = torch.randn(B, Hkv, S, D, generator=g)
        k8, kd = quantize_fp8(kc, dtype=fp8)
        v8, vd = quantize_fp8(vc, dtype=fp8)
        return q, k8, v8, kd, vd, None
    page, num_pages, max_pages = paged
    kp = torch.randn(num_pages, Hkv, page, D, generator=g)
    vp = torch.randn(num_pages, Hkv, page, D, generator=g)
    # One scale per kv head over the page pool, shared by every sequence (a row per batch).
    k8, kd = quantize_fp8(kp.transpose(0, 1).reshape(1, Hkv, -1, D))
    v8, vd = quantize_fp8(vp.transpose(0, 1).reshape(1, Hkv, -1, D))
    k8 = k8.reshape(Hkv, num_pages, page, D).transpose(0, 1).contiguous()
    v8 = v8.reshape(Hkv, num_pages, page, D).transpose(0, 1).contiguous()
    perm = torch.randperm(num_pages, generator=g)[:B * max_pages].reshape(B, max_pages)
    return (q, k8, v8, kd.expand(B, Hkv).contiguous(), vd.expand(B, Hkv).contiguous(),
            perm.to(torch.int32))


DECODE_CASES = [
    # B, Hq, Hkv, Nq, S, D, lens, paged (page, pages, max_pages), num_splits, q dtype
    (3, 4, 1, 1, 200, 64, (200, 0, 1), None, None, torch.float16),      # GQA 4:1, ragged
    (2, 2, 2, 3, 160, 64, (160, 45, None), None, 3, torch.bfloat16),   # Nq=3, three splits
    (2, 8, 2, 2, None, 64, (130, 64, None), (64, 9, 4), 2, torch.float16),  # paged
    (1, 2, 1, 1, 96, 128, (96, None, None), None, 1, torch.float16),   # one split: FINAL
    (2, 2, 1, 2, 80, 256, (80, 33, None), None, 2, torch.bfloat16),    # D=256: S in 2 slices
]


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])   # 64-row tile / the fp16 plan's 16 rows
@pytest.mark.parametrize("B,Hq,Hkv,Nq,S,D,lens,paged,splits,qdtype", DECODE_CASES)
def test_fp8_cache_decode_matches_reference(B, Hq, Hkv, Nq, S, D, lens, paged, splits, qdtype,
                                            arch):
    q, k8, v8, kd, vd, bt = _cache(B, Hq, Hkv, Nq, S, D, seed=B * 31 + D, qdtype=qdtype,
                                   paged=paged)
    seqlens = torch.tensor([n for n in lens[:B]], dtype=torch.int32)
    if bt is None:
        # Slots past a length hold an fp8 NaN: the kernel must select, never multiply by 0.
        nan8 = torch.full((), math.nan).to(k8.dtype)
        for b, n in enumerate(seqlens.tolist()):
            k8[b, :, n:] = nan8
            v8[b, :, n:] = nan8
    with interpret.enabled(arch):
        out = flashattn.decode(q, k8, v8, seqlens, block_table=bt, k_descale=kd, v_descale=vd,
                               num_splits=splits)
    assert out.dtype == qdtype
    ref = decode_reference_fp8(q, k8, v8, seqlens, kd, vd, block_table=bt)
    u = 2.0 ** -11 if qdtype == torch.float16 else 2.0 ** -8
    vmax = (torch.nan_to_num(v8.float()).abs().amax() * vd.max()).item()
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * u * vmax + 1e-6, f"{err:.3g}"


def test_fp8_decode_constants_per_arch():
    """An fp8 cache (V in K's layout) keeps the fp16 plan's TILE_N and splits; on sm_90/sm_100
    its row tile is 64 (warpgroup MMA: the fp8 tiles widened through shared memory), elsewhere
    the fp16 plan's; S in head-dim slices (SLICE_D) of at most 128 everywhere."""
    from flashattn.kernels import decode_kernel_constants, decode_split_constants
    from flashattn.kernels.decode_spec import DECODE_FP8_TILE_M
    for arch in ("sm_90", "sm_100", "sm_120", None):
        for d in (64, 128, 256):
            for rows in (1, 4, 16, 32, 64, 128):
                c = decode_split_constants(rows=rows, head_dim=d, page_size=None, arch=arch)
                f = decode_kernel_constants(rows=rows, head_dim=d, page_size=None, arch=arch,
                                            cache="float8_e4m3fn")
                assert f["TILE_N"] == c["TILE_N"] and f["TILE_D"] == c["TILE_D"]
                assert -(-rows // f["TILE_M"]) <= -(-rows // c["TILE_M"])
                assert f["SLICE_D"] == min(c["TILE_D"], 128) and c["SLICE_D"] == c["TILE_D"]
                assert f["KV_FP8"] and not c["KV_FP8"] and not f["V_TRANSPOSED"]
                if arch in DECODE_FP8_TILE_M:
                    assert f["TILE_M"] == max(c["TILE_M"], 64)
                else:
                    assert f["TILE_M"] == c["TILE_M"]


def test_fp8_decode_hints():
    """nww=8 only where the 64-row tile spilled without it (sm_90, paged, one split); the fp16
    kernel's hints are kept."""
    from flashattn.kernels import decode_hints
    fp8 = dict(KV_FP8=True, V_TRANSPOSED=False, TILE_D=128)
    assert decode_hints(dict(fp8, PAGED=True, FINAL=True), "sm_90") == {"num_worker_warps": 8}
    assert decode_hints(dict(fp8, PAGED=True, FINAL=False), "sm_90") == {}
    assert decode_hints(dict(fp8, KV_FP8=False, PAGED=True, FINAL=True), "sm_90") == {}
    assert decode_hints(dict(fp8, PAGED=True, FINAL=True), "sm_100") == {}


def test_e5m2_cache_decode():
    q, k8, v8, kd, vd, _ = _cache(2, 4, 2, 2, 140, 64, seed=4, fp8=torch.float8_e5m2)
    seqlens = torch.tensor([140, 3], dtype=torch.int32)
    with interpret.enabled():
        out = flashattn.decode(q, k8, v8, seqlens, k_descale=kd, v_descale=vd, num_splits=2)
    ref = decode_reference_fp8(q, k8, v8, seqlens, kd, vd)
    vmax = (v8.float().abs().amax() * vd.max()).item()
    assert k8.dtype == torch.float8_e5m2
    assert (out.float() - ref).abs().max().item() <= 2 * 2.0 ** -11 * vmax + 1e-6


def test_fp8_cache_decode_bad_inputs():
    q, k8, v8, kd, vd, _ = _cache(2, 4, 2, 1, 64, 64, seed=1)
    lens = torch.tensor([64, 10], dtype=torch.int32)
    with interpret.enabled():
        with pytest.raises(ValueError, match="k_descale is missing"):
            flashattn.decode(q, k8, v8, lens, v_descale=vd)
        with pytest.raises(ValueError, match=r"v_descale must have shape \(B, Hkv\)"):
            flashattn.decode(q, k8, v8, lens, k_descale=kd, v_descale=torch.ones(2, 4))
        with pytest.raises(ValueError, match=r"k_descale must have shape"):
            flashattn.decode(q, k8, v8, lens, k_descale=kd[:1], v_descale=vd)
        with pytest.raises(TypeError, match="one fp8 dtype"):
            flashattn.decode(q, k8, v8.float().half(), lens, k_descale=kd, v_descale=vd)
        with pytest.raises(TypeError, match="one fp8 dtype"):
            flashattn.decode(q, k8, v8.float().to(torch.float8_e5m2), lens, k_descale=kd,
                             v_descale=vd)
        with pytest.raises(TypeError, match="float16 or bfloat16 queries"):
            flashattn.decode(q.float(), k8, v8, lens, k_descale=kd, v_descale=vd)
        with pytest.raises(ValueError, match="fp8 caches only"):
            flashattn.decode(q, k8.float().half(), v8.float().half(), lens, k_descale=kd)
        with pytest.raises(ValueError):          # a length past the cache, checked on the host
            flashattn.decode(q, k8, v8, torch.tensor([65, 1], dtype=torch.int32),
                             k_descale=kd, v_descale=vd)
