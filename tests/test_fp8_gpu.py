"""The FP8 forward and the FP8-cache decode on the GPU (issue 24), against the references of the
dequantised inputs, with the tolerances derived in tests/test_fp8.py (e4m3: P's rounding
2^-4 max|v| + Nk 2^-18 max|v| + the output's rounding; the decode: 2 u_q max|v|). The GPU's
FP8 MMA accumulates with fast accumulation (use_fast_acc), not modelled there: S's error stays
far below P's rounding at D <= 256. Decode outputs are NaN-poisoned (``out=``) and every cache
slot past a length holds an fp8 NaN. The FP8-MMA decode (V cache transposed) is checked against
the replay of its arithmetic (``reference.decode.emulate_decode_fp8mma``) and the dequantised
reference.

    python -m pytest -o addopts="" -m gpu tests/test_fp8_gpu.py
"""
import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

FWD = [  # B, Hq, Hkv, Nq, Nk, D, causal, input_pos, fp8, v_mode
    (2, 8, 2, 1000, 1000, 128, True, 0, "float8_e4m3fn", "host"),
    (1, 4, 4, 777, 2049, 128, False, 0, "float8_e4m3fn", "kernel"),
    (1, 8, 1, 300, 1300, 64, True, 1000, "float8_e4m3fn", "transposed"),
    (2, 4, 2, 513, 513, 256, True, 0, "float8_e4m3fn", "host"),
    (1, 4, 4, 256, 4096, 128, False, 0, "float8_e5m2", "host"),
    (1, 2, 2, 17, 100, 64, False, 0, "float8_e4m3fn", "kernel"),
]


@pytest.mark.parametrize("B,Hq,Hkv,Nq,Nk,D,causal,input_pos,fp8,v_mode", FWD)
def test_fp8_forward_gpu(B, Hq, Hkv, Nq, Nk, D, causal, input_pos, fp8, v_mode):
    import flashattn
    from flashattn.fp8 import attention_fp8, dequantize_fp8, quantize_fp8, reference_fp8
    dt = getattr(torch, fp8)
    g = torch.Generator(device="cuda").manual_seed(Nq + Nk)
    q = torch.randn(B, Hq, Nq, D, generator=g, device="cuda")
    k = torch.randn(B, Hkv, Nk, D, generator=g, device="cuda")
    v = torch.randn(B, Hkv, Nk, D, generator=g, device="cuda")
    q8, qd = quantize_fp8(q, num_kv_heads=Hkv, dtype=dt)
    k8, kd = quantize_fp8(k, dtype=dt)
    v8, vd = quantize_fp8(v, dtype=dt)
    v_arg = v8.transpose(-1, -2).contiguous() if v_mode == "transposed" else v8
    if v_mode == "kernel":                  # the book's variant: V read as (N, D)
        from flashbook.measure.bench_fp8 import attention_fp8_vk as attention_fp8
        kw = {}
    else:
        kw = dict(v_transposed=v_mode == "transposed")
    out = attention_fp8(q8, k8, v_arg, q_descale=qd, k_descale=kd, v_descale=vd,
                        causal=causal, input_pos=input_pos, **kw)
    torch.cuda.synchronize()
    ref = reference_fp8(q8, k8, v8, qd, kd, vd, causal=causal, input_pos=input_pos)
    u = 2.0 ** -4 if fp8 == "float8_e4m3fn" else 2.0 ** -3
    sub = Nk * 2.0 ** -18 if fp8 == "float8_e4m3fn" else 0.0
    vmax = dequantize_fp8(v8, vd).abs().max().item()
    assert torch.isfinite(out.float()).all()
    err = (out.float() - ref).abs().max().item()
    assert err <= (u + sub + 2.0 ** -8) * vmax + 1e-5, err
    # Through the public entry point too.
    o2 = flashattn.attention(q8, k8, v8, causal=causal, input_pos=input_pos, q_descale=qd,
                             k_descale=kd, v_descale=vd)
    assert (o2.float() - ref).abs().max().item() <= (u + sub + 2.0 ** -8) * vmax + 1e-5


@pytest.mark.parametrize("paged", [None, 64])
@pytest.mark.parametrize("qdtype", ["float16", "bfloat16"])
def test_fp8_cache_decode_gpu(paged, qdtype):
    import flashattn
    from flashattn.reference.decode import decode_reference_fp8
    B, Hq, Hkv, Nq, D = 4, 32, 8, 1, 128
    lens = torch.tensor([5000, 0, 1, 3333], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(B, Hq, Nq, D, generator=g, device="cuda").to(getattr(torch, qdtype))
    if paged is None:
        S = 5120
        kc = torch.randn(B, Hkv, S, D, generator=g, device="cuda")
        vc = torch.randn(B, Hkv, S, D, generator=g, device="cuda")
        for b, n in enumerate(lens.tolist()):
            kc[b, :, n:] = math.nan
            vc[b, :, n:] = math.nan
        bt = None
    else:
        max_pages = 5120 // paged
        num_pages = B * max_pages + 3
        kc = torch.full((num_pages, Hkv, paged, D), math.nan, device="cuda")
        vc = torch.full((num_pages, Hkv, paged, D), math.nan, device="cuda")
        bt = torch.randperm(num_pages, device="cuda")[:B * max_pages].reshape(B, max_pages)
        bt = bt.to(torch.int32)
        for b, n in enumerate(lens.tolist()):
            for p in range(-(-n // paged)):
                m = min(paged, n - p * paged)
                kc[bt[b, p], :, :m] = torch.randn(Hkv, m, D, generator=g, device="cuda")
                vc[bt[b, p], :, :m] = torch.randn(Hkv, m, D, generator=g, device="cuda")
    k8, v8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)   # N(0,1): descale 0.5
    kd = torch.full((B, Hkv), 0.5, device="cuda")
    vd = torch.full((B, Hkv), 0.25, device="cuda")
    out = torch.full_like(q, math.nan)
    flashattn.decode(q, k8, v8, lens, block_table=bt, k_descale=kd, v_descale=vd, out=out)
    torch.cuda.synchronize()
    ref = decode_reference_fp8(q, torch.nan_to_num(k8.float()).to(torch.float8_e4m3fn),
                               torch.nan_to_num(v8.float()).to(torch.float8_e4m3fn), lens,
                               kd, vd, block_table=bt)
    u = 2.0 ** -11 if qdtype == "float16" else 2.0 ** -8
    vmax = 0.25 * torch.nan_to_num(v8.float()).abs().max().item()
    assert not torch.isnan(out).any()
    assert (out.float().cpu() - ref).abs().max().item() <= 2 * u * vmax + 1e-5


def test_fp8_cache_decode_cuda_graph():
    import flashattn
    from flashattn.fp8 import quantize_fp8
    from flashattn.reference.decode import decode_reference_fp8
    B, Hq, Hkv, D, S = 2, 8, 2, 128, 4096
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(B, Hq, 1, D, generator=g, device="cuda").half()
    k8, kd = quantize_fp8(torch.randn(B, Hkv, S, D, generator=g, device="cuda"))
    v8, vd = quantize_fp8(torch.randn(B, Hkv, S, D, generator=g, device="cuda"))
    lens = torch.tensor([100, 200], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    flashattn.decode(q, k8, v8, lens, k_descale=kd, v_descale=vd, out=out, num_splits=4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashattn.decode(q, k8, v8, lens, k_descale=kd, v_descale=vd, out=out, num_splits=4)
    lens.copy_(torch.tensor([4096, 1], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_reference_fp8(q, k8, v8, lens, kd, vd)
    vmax = (v8.float().abs().max() * vd.max()).item()
    assert (out.float().cpu() - ref).abs().max().item() <= 2 * 2.0 ** -11 * vmax + 1e-5


# --- the FP8-MMA decode: V cache transposed (kernels/decode.py, V_TRANSPOSED) -------------------
def _mma_tile_n(Hq, Hkv, Nq, D, page):
    from flashattn.dispatch import device_arch
    from flashattn.kernels.decode_spec import decode_kernel_constants
    arch = device_arch(torch.device("cuda"))
    return decode_kernel_constants(rows=(Hq // Hkv) * Nq, head_dim=D, page_size=page, arch=arch,
                                   cache="float8_e4m3fn", v_transposed=True)["TILE_N"]


@pytest.mark.parametrize("D,paged,qdtype,splits", [
    (128, None, "float16", 3), (128, 64, "bfloat16", 2), (64, None, "bfloat16", 1),
    (256, None, "float16", 2), (256, 64, "float16", 1), (128, None, "float16", None)])
def test_fp8mma_decode_gpu(D, paged, qdtype, splits):
    """Against the kernel's arithmetic replayed in torch (``emulate_decode_fp8mma``; the FP8
    MMA's fast accumulation is not modelled: 2^-8 max|v| of slack) and, loosely, against the
    dequantised reference (q and P rounded to fp8: 2^-3 max|v|, rms 2^-6 max|v|)."""
    import flashattn
    from flashattn.reference.decode import decode_reference_fp8
    from flashattn.reference.decode import emulate_decode_fp8mma
    B, Hq, Hkv, Nq = 4, 32, 8, 1
    lens = torch.tensor([3000, 0, 1, 2333], dtype=torch.int32, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(B, Hq, Nq, D, generator=g, device="cuda").to(getattr(torch, qdtype))
    S = 3072
    if paged is None:
        kc = torch.randn(B, Hkv, S, D, generator=g, device="cuda")
        vt = torch.randn(B, Hkv, D, S, generator=g, device="cuda")
        for b, n in enumerate(lens.tolist()):
            kc[b, :, n:] = math.nan
            vt[b, :, :, n:] = math.nan
        bt = None
    else:
        max_pages = S // paged
        num_pages = B * max_pages + 3
        kc = torch.full((num_pages, Hkv, paged, D), math.nan, device="cuda")
        vt = torch.full((num_pages, Hkv, D, paged), math.nan, device="cuda")
        bt = torch.randperm(num_pages, device="cuda")[:B * max_pages].reshape(B, max_pages)
        bt = bt.to(torch.int32)
        for b, n in enumerate(lens.tolist()):
            for p in range(-(-n // paged)):
                m = min(paged, n - p * paged)
                kc[bt[b, p], :, :m] = torch.randn(Hkv, m, D, generator=g, device="cuda")
                vt[bt[b, p], :, :, :m] = torch.randn(Hkv, D, m, generator=g, device="cuda")
    k8, v8t = kc.to(torch.float8_e4m3fn), vt.to(torch.float8_e4m3fn)
    kd = torch.full((B, Hkv), 0.5, device="cuda")
    vd = torch.full((B, Hkv), 0.25, device="cuda")
    out = torch.full_like(q, math.nan)
    flashattn.decode(q, k8, v8t, lens, block_table=bt, k_descale=kd, v_descale=vd, out=out,
                     num_splits=splits, v_transposed=True)
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert out[1].abs().max().item() == 0                        # length 0: zeros
    k8c = torch.nan_to_num(k8.float()).to(torch.float8_e4m3fn)
    v8c = torch.nan_to_num(v8t.float()).to(torch.float8_e4m3fn)
    vmax = 0.25 * v8c.float().abs().max().item()
    if splits is not None:
        em = emulate_decode_fp8mma(q, k8c, v8c, lens, kd, vd, block_table=bt,
                                   tile_n=_mma_tile_n(Hq, Hkv, Nq, D, paged), num_splits=splits)
        u = 2.0 ** -11 if qdtype == "float16" else 2.0 ** -8
        err = (out.float().cpu() - em).abs()
        assert (err <= 2 * u * em.abs() + 2.0 ** -8 * vmax).all(), f"{err.max():.3g}"
    ref = decode_reference_fp8(q, k8c, v8c, lens, kd, vd, block_table=bt, v_transposed=True)
    err = (out.float().cpu() - ref).abs()
    assert err.max().item() <= 2.0 ** -3 * vmax
    assert err.pow(2).mean().sqrt().item() <= 2.0 ** -6 * vmax


def test_fp8mma_decode_cuda_graph_and_append():
    """fp8_kv_cache + append_kv_fp8, then the decode captured in a CUDA graph and replayed
    after the lengths change in place."""
    import flashattn
    from flashattn.decoding import append_kv_fp8, fp8_kv_cache
    from flashattn.reference.decode import decode_reference_fp8
    B, Hq, Hkv, D, S = 2, 8, 2, 128, 4096
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(B, Hq, 1, D, generator=g, device="cuda").half()
    k = torch.randn(B, Hkv, S, D, generator=g, device="cuda")
    v = torch.randn(B, Hkv, S, D, generator=g, device="cuda")
    k8, v8t, kd, vd = fp8_kv_cache(k[:, :, :4000], v[:, :, :4000], capacity=S, margin=1.5)
    append_kv_fp8(k8, v8t, k[:, :, 4000:4001], v[:, :, 4000:4001],
                  torch.full((B,), 4000, dtype=torch.int32, device="cuda"), kd, vd,
                  v_transposed=True)
    lens = torch.tensor([100, 200], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    kw = dict(k_descale=kd, v_descale=vd, out=out, num_splits=4, v_transposed=True)
    flashattn.decode(q, k8, v8t, lens, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        flashattn.decode(q, k8, v8t, lens, **kw)
    lens.copy_(torch.tensor([4001, 1], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    ref = decode_reference_fp8(q, k8, v8t, lens, kd, vd, v_transposed=True)
    vmax = (v8t.float().abs().max() * vd.max()).item()
    err = (out.float().cpu() - ref).abs()
    assert err.max().item() <= 2.0 ** -3 * vmax
    assert err.pow(2).mean().sqrt().item() <= 2.0 ** -6 * vmax
