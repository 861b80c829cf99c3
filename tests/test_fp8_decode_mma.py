"""The FP8-MMA decode (kernels/decode.py with V_TRANSPOSED: ``flashattn.decode(...,
v_transposed=True)`` over an
fp8 cache with V stored (D, S)), run by the CPU interpreter.

Two references:

* ``emulate`` (``flashattn.reference.decode.emulate_decode_fp8mma``): the kernel's arithmetic replayed in torch (q rounded to e4m3 per row, scores in
  fp32, P = 2^(s - m + 8) rounded to e4m3 tile by tile with the running max of the split, the
  splits merged by their LSE). The interpreter agrees with it to the output's rounding: a key
  off by one, a wrong descale or a wrong split bound is far outside that.
* ``decode_reference_fp8`` (fp32 attention of the dequantised caches): the error of rounding q
  and P to fp8 on top of it is bounded by 2^-4 max|v| (P's e4m3 rounding, relative 2^-4 of each
  weight, with l summed unrounded) plus the score error of q's rounding; checked loosely.
"""
import math

import pytest
import torch

import flashattn
from flashattn import interpret
from flashattn.decoding import append_kv_fp8, fp8_kv_cache
from flashattn.fp8 import quantize_fp8
from flashattn.kernels.decode_spec import (DECODE_FP8_MMA_HINTS, DECODE_FP8_MMA_MAX_TILE_N,
                                           DECODE_FP8_TILE_M, decode_kernel_constants,
                                           decode_plan)
from flashattn.reference.decode import decode_reference_fp8
from flashattn.reference.decode import emulate_decode_fp8mma as emulate

E4M3 = torch.float8_e4m3fn


def _caches(B, Hq, Hkv, Nq, S, D, *, seed, qdtype=torch.float16, paged=None, fp8=E4M3):
    """q and an fp8 cache with V transposed (contiguous, or paged as (page, pages, max_pages)),
    slots past each length left for the test to poison."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g).to(qdtype)
    if paged is None:
        k = torch.randn(B, Hkv, S, D, generator=g)
        v = torch.randn(B, Hkv, S, D, generator=g)
        k8, v8t, kd, vd = fp8_kv_cache(k, v, capacity=S, dtype=fp8)
        return q, k8, v8t, kd, vd, None
    page, num_pages, max_pages = paged
    kp = torch.randn(num_pages, Hkv, page, D, generator=g)
    vp = torch.randn(num_pages, Hkv, page, D, generator=g)
    k8, kd = quantize_fp8(kp.transpose(0, 1).reshape(1, Hkv, -1, D), dtype=fp8)
    v8, vd = quantize_fp8(vp.transpose(0, 1).reshape(1, Hkv, -1, D), dtype=fp8)
    k8 = k8.reshape(Hkv, num_pages, page, D).transpose(0, 1).contiguous()
    v8t = v8.reshape(Hkv, num_pages, page, D).permute(1, 0, 3, 2).contiguous()  # (P, Hkv, D, ps)
    perm = torch.randperm(num_pages, generator=g)[:B * max_pages].reshape(B, max_pages)
    return (q, k8, v8t, kd.expand(B, Hkv).contiguous(), vd.expand(B, Hkv).contiguous(),
            perm.to(torch.int32))


CASES = [
    # B, Hq, Hkv, Nq, S, D, lens, paged (page, pages, max_pages), num_splits, q dtype
    (3, 4, 1, 1, 200, 64, (200, 0, 1), None, None, torch.float16),     # GQA 4:1, lengths 0/1
    (2, 2, 2, 3, 160, 64, (160, 45, None), None, 3, torch.bfloat16),  # Nq=3, three splits
    (2, 8, 2, 2, None, 64, (130, 64, None), (64, 9, 4), 2, torch.float16),  # paged
    (1, 2, 1, 1, 96, 128, (96, None, None), None, 1, torch.float16),  # one split: FINAL
    (2, 16, 2, 1, 272, 128, (272, 129, None), None, 2, torch.float16),  # GQA 8:1, ragged tail
    (2, 2, 1, 2, 80, 256, (80, 33, None), None, 2, torch.bfloat16),   # D=256
    (1, 4, 2, 1, None, 128, (100, None, None), (32, 6, 4), 1, torch.bfloat16),  # paged FINAL
]


def _run(case, arch, *, poison=True):
    B, Hq, Hkv, Nq, S, D, lens, paged, splits, qdtype = case
    q, k8, v8t, kd, vd, bt = _caches(B, Hq, Hkv, Nq, S, D, seed=B * 31 + D + Hq,
                                     qdtype=qdtype, paged=paged)
    seqlens = torch.tensor(list(lens[:B]), dtype=torch.int32)
    if bt is None and poison:
        # Slots past a length hold an fp8 NaN: the kernel must select, never multiply by 0.
        nan8 = torch.full((), math.nan).to(k8.dtype)
        for b, n in enumerate(seqlens.tolist()):
            k8[b, :, n:] = nan8
            v8t[b, :, :, n:] = nan8
    with interpret.enabled(arch):
        out = flashattn.decode(q, k8, v8t, seqlens, block_table=bt, k_descale=kd,
                               v_descale=vd, num_splits=splits, v_transposed=True)
    return out, (q, k8, v8t, seqlens, kd, vd, bt, splits)


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])    # 64-row tile / the fp16 plan's rows
@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_fp8mma_decode_matches_emulation(case, arch):
    out, (q, k8, v8t, seqlens, kd, vd, bt, splits) = _run(case, arch)
    B, Hq, Hkv, Nq, S, D = case[:6]
    assert out.dtype == q.dtype and out.shape == q.shape
    page = None if bt is None else k8.shape[2]
    fp8 = str(k8.dtype).replace("torch.", "")
    c = decode_kernel_constants(rows=(Hq // Hkv) * Nq, head_dim=D, page_size=page, arch=arch,
                                cache=fp8, v_transposed=True)
    if splits is None:
        from flashattn.contract import check_decode
        dims = check_decode(torch.empty(q.shape, dtype=k8.dtype), k8, v8t.transpose(-1, -2),
                            seqlens, bt)
        from flashattn.dispatch import device_sm_count
        with interpret.enabled(arch):
            splits = decode_plan(dims, cache=fp8, v_transposed=True,
                                 sm_count=device_sm_count(q.device), arch=arch)["num_splits"]
    em = emulate(q, k8, torch.nan_to_num(v8t.float()).to(k8.dtype), seqlens, kd, vd,
                 tile_n=c["TILE_N"], num_splits=splits, block_table=bt)
    u = 2.0 ** -11 if q.dtype == torch.float16 else 2.0 ** -8
    err = (out.float() - em).abs()
    assert torch.isfinite(out).all()
    assert (err <= 2 * u * em.abs() + 2e-4).all(), f"max {err.max():.3g}"
    # Lengths 0: zeros, as FlashAttention (and the fp16 decode).
    for b, n in enumerate(seqlens.tolist()):
        if n == 0:
            assert out[b].abs().max() == 0


@pytest.mark.parametrize("case", CASES[:3] + CASES[5:6], ids=["c0", "c1", "c2", "c5"])
def test_fp8mma_decode_near_dequantised_reference(case):
    out, (q, k8, v8t, seqlens, kd, vd, bt, splits) = _run(case, "sm_90", poison=False)
    ref = decode_reference_fp8(q, k8, v8t, seqlens, kd, vd, block_table=bt, v_transposed=True)
    vmax = (v8t.float().abs().amax() * vd.max()).item()
    err = (out.float() - ref).abs()
    # P's e4m3 rounding bounds the weights' error by 2^-4 (relative); q's rounding moves the
    # scores by ~2^-4 of |q||k| scale: a loose bound, and a typical error far inside it.
    assert err.max() <= 2.0 ** -3 * vmax, f"{err.max():.3g}"
    assert err.pow(2).mean().sqrt() <= 2.0 ** -6 * vmax


def test_fp8mma_decode_e5m2_and_scale():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 1, 64, generator=g).half()
    k = torch.randn(2, 2, 96, 64, generator=g)
    v = torch.randn(2, 2, 96, 64, generator=g)
    k8, v8t, kd, vd = fp8_kv_cache(k, v, dtype=torch.float8_e5m2)
    lens = torch.tensor([96, 50], dtype=torch.int32)
    with interpret.enabled("sm_90"):
        out = flashattn.decode(q, k8, v8t, lens, k_descale=kd, v_descale=vd, num_splits=2,
                               scale=0.3, v_transposed=True)
    em = emulate(q, k8, v8t, lens, kd, vd, tile_n=128, num_splits=2, scale=0.3)
    assert (out.float() - em).abs().max() <= 2e-3


def test_fp8_kv_cache_and_append_round_trip():
    """fp8_kv_cache then append_kv_fp8 (contiguous and paged, V transposed or not) store what
    quantize_fp8 would with the same descales; decode over the appended cache matches the
    emulation."""
    g = torch.Generator().manual_seed(5)
    B, Hkv, S, D = 2, 2, 40, 32
    k = torch.randn(B, Hkv, S, D, generator=g)
    v = torch.randn(B, Hkv, S, D, generator=g)
    k8, v8t, kd, vd = fp8_kv_cache(k[:, :, :30], v[:, :, :30], capacity=48, margin=2.0)
    assert k8.shape == (B, Hkv, 48, D) and v8t.shape == (B, Hkv, D, 48)
    assert v8t.stride(-1) == 1
    lens = torch.tensor([30, 30], dtype=torch.int32)
    append_kv_fp8(k8, v8t, k[:, :, 30:33], v[:, :, 30:33], lens, kd, vd, v_transposed=True)
    want_k = (k / kd[:, :, None, None]).clamp(-448, 448).to(E4M3)
    want_v = (v / vd[:, :, None, None]).clamp(-448, 448).to(E4M3)
    assert torch.equal(k8[:, :, :33].view(torch.uint8), want_k[:, :, :33].view(torch.uint8))
    assert torch.equal(v8t[..., :33].transpose(-1, -2).view(torch.uint8),
                       want_v[:, :, :33].view(torch.uint8))
    assert (k8[:, :, 33:].float() == 0).all()
    # V not transposed, and paged (pages of 16, V^T per page).
    k8b, v8b, kdb, vdb = fp8_kv_cache(k[:, :, :30], v[:, :, :30], capacity=48,
                                      v_transposed=False)
    append_kv_fp8(k8b, v8b, k[:, :, 30:31], v[:, :, 30:31], lens, kdb, vdb)
    assert torch.equal(v8b[:, :, 30].view(torch.uint8),
                       (v[:, :, 30] / vdb[:, :, None]).to(E4M3).view(torch.uint8))
    pool_k = torch.zeros(6, Hkv, 16, D, dtype=E4M3)
    pool_vt = torch.zeros(6, Hkv, D, 16, dtype=E4M3)
    bt = torch.tensor([[4, 0, 2], [1, 5, 3]], dtype=torch.int32)
    append_kv_fp8(pool_k, pool_vt, k[:, :, :20], v[:, :, :20], torch.zeros(2, dtype=torch.int32),
                  kd, vd, block_table=bt, v_transposed=True)
    assert torch.equal(pool_k[5, :, 3].view(torch.uint8), want_k[1, :, 19].view(torch.uint8))
    assert torch.equal(pool_vt[0, :, :, 2].view(torch.uint8), want_v[0, :, 18].view(torch.uint8))
    q = torch.randn(B, 4, 1, D, generator=g).half()
    lens20 = torch.tensor([20, 17], dtype=torch.int32)
    with interpret.enabled("sm_90"):
        out = flashattn.decode(q, pool_k, pool_vt, lens20, block_table=bt, k_descale=kd,
                               v_descale=vd, num_splits=2, v_transposed=True)
    em = emulate(q, pool_k, pool_vt, lens20, kd, vd, tile_n=16, num_splits=2, block_table=bt)
    assert (out.float() - em).abs().max() <= 2e-3


def test_fp8_decode_plan_per_arch():
    """The plan keeps the fp16 plan's splits and key tile (capped where the table says); the
    fp8 row tile is 64 on sm_90/sm_100 (warpgroup MMAs), the fp16 plan's elsewhere; V in K's
    layout plans the widening path (head-dim slices), V transposed the FP8-MMA path."""
    from flashattn.contract import DecodeDims
    for arch in ("sm_90", "sm_100", "sm_120", None):
        for D in (64, 128, 256):
            for page in (None, 64):
                dims = DecodeDims(B=8, Hq=32, Hkv=8, Nq=1, D=D, paged=page is not None,
                                  page_size=page, capacity=32768)
                base = decode_plan(dims, sm_count=132, arch=arch)
                b = base["split_constants"]
                p = decode_plan(dims, cache="float8_e4m3fn", v_transposed=True, sm_count=132,
                                arch=arch)
                assert p["kernel"] == "decode_split_fp8"
                assert p["num_splits"] == base["num_splits"]
                c = p["split_constants"]
                cap = DECODE_FP8_MMA_MAX_TILE_N.get(arch or "", {}).get(c["TILE_D"], 1 << 30)
                assert c["TILE_N"] == min(b["TILE_N"], cap)
                assert p["hints"] == DECODE_FP8_MMA_HINTS.get(arch or "", {}).get(c["TILE_D"], {})
                assert c["TILE_M"] == DECODE_FP8_TILE_M.get(arch or "", b["TILE_M"])
                assert c["KV_FP8"] and c["V_TRANSPOSED"] and c["P_SHIFT"] == 8
                assert c["SLICE_D"] == c["TILE_D"]
                assert p["split_grid"] == (1, p["num_splits"], 64)
                assert p["opart_shape"][2] == c["TILE_M"]
                w = decode_plan(dims, cache="float8_e4m3fn", sm_count=132, arch=arch)
                cw = w["split_constants"]
                assert w["kernel"] == "decode_split_fp8" and not cw["V_TRANSPOSED"]
                assert cw["TILE_N"] == b["TILE_N"] and cw["TILE_M"] == c["TILE_M"]
                assert cw["SLICE_D"] == min(cw["TILE_D"], 128) and cw["P_SHIFT"] == 0
                assert decode_plan(dims, cache="float8_e5m2", sm_count=132,
                                   arch=arch)["kernel"] == "decode_split_fp8_e5m2"
    with pytest.raises(TypeError, match="v_transposed"):
        decode_plan(dims, cache="float8_e4m3fn", v_transposed=1, sm_count=132)
    with pytest.raises(ValueError, match="fp8 caches only"):
        decode_plan(dims, v_transposed=True, sm_count=132)
    assert decode_kernel_constants(rows=4, head_dim=128, page_size=64, arch="sm_90",
                                   cache="float8_e4m3fn", v_transposed=True) == dict(
        TILE_M=64, TILE_N=64, TILE_D=128, PAGED=True, FINAL=False, KV_FP8=True,
        V_TRANSPOSED=True, SLICE_D=128, P_SHIFT=8)
    assert decode_kernel_constants(rows=4, head_dim=128, page_size=None, arch="sm_120",
                                   cache="float8_e4m3fn", v_transposed=True)["TILE_N"] == 64


def test_fp8mma_decode_bad_inputs():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 64, generator=g).half()
    k = torch.randn(2, 2, 64, 64, generator=g)
    k8, v8t, kd, vd = fp8_kv_cache(k, k, capacity=80)
    lens = torch.tensor([64, 10], dtype=torch.int32)
    kw = dict(k_descale=kd, v_descale=vd)
    with interpret.enabled("sm_90"):
        with pytest.raises(ValueError, match=r"\(B, Hkv, D, S\).*K's layout"):
            flashattn.decode(q, k8, v8t.transpose(-1, -2).contiguous(), lens, v_transposed=True,
                             **kw)
        with pytest.raises(ValueError, match="v_transposed"):
            flashattn.decode(q, k8, v8t[..., :64], lens, v_transposed=True, **kw)
        with pytest.raises(ValueError, match="contiguous in its last dimension.*key axis"):
            flashattn.decode(q, k8, v8t.transpose(-1, -2).contiguous().transpose(-1, -2),
                             lens, v_transposed=True, **kw)
        with pytest.raises(TypeError, match="v_transposed must be a bool"):
            flashattn.decode(q, k8, v8t, lens, v_transposed="yes", **kw)
        with pytest.raises(ValueError, match="fp8 caches only"):
            flashattn.decode(q, k.half(), k.half(), lens, v_transposed=True)
        with pytest.raises(TypeError, match="one fp8 dtype"):
            flashattn.decode(q, k8, v8t.float().half(), lens, v_transposed=True, **kw)
        with pytest.raises(ValueError, match="k_descale"):
            flashattn.decode(q, k8, v8t, lens, v_transposed=True, v_descale=vd)
        with pytest.raises(ValueError, match="outside"):
            flashattn.decode(q, k8, v8t, torch.tensor([81, 1], dtype=torch.int32),
                             v_transposed=True, **kw)
    with pytest.raises(ValueError, match="capacity"):
        fp8_kv_cache(k, k, capacity=10)
    with pytest.raises(TypeError, match="v_transposed"):
        fp8_kv_cache(k, k, v_transposed=None)
    with pytest.raises(ValueError, match="past the cache"):
        append_kv_fp8(k8, v8t, k[:, :, :20], k[:, :, :20], lens, kd, vd, v_transposed=True)
    with pytest.raises(ValueError, match="v_cache8 must be"):
        append_kv_fp8(k8, v8t, k[:, :, :1], k[:, :, :1], lens, kd, vd)
    with pytest.raises(TypeError, match="int32"):
        append_kv_fp8(k8, v8t, k[:, :, :1], k[:, :, :1], lens.long(), kd, vd, v_transposed=True)


def test_fp8mma_decode_reads_quantize_fp8_v_transposed():
    """``quantize_fp8(v, v_transposed=True)`` (a view of 16-byte padded rows) is a V cache the
    MMA decode reads as it is."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 4, 1, 64, generator=g).half()
    k8, kd = quantize_fp8(torch.randn(2, 2, 100, 64, generator=g))
    v8t, vd = quantize_fp8(torch.randn(2, 2, 100, 64, generator=g), v_transposed=True)
    assert v8t.shape == (2, 2, 64, 100) and v8t.stride(-2) == 112
    lens = torch.tensor([100, 61], dtype=torch.int32)
    with interpret.enabled("sm_90"):
        out = flashattn.decode(q, k8, v8t, lens, k_descale=kd, v_descale=vd, num_splits=2,
                               v_transposed=True)
    em = emulate(q, k8, v8t, lens, kd, vd, tile_n=128, num_splits=2)
    assert (out.float() - em).abs().max() <= 2e-3
