"""Packed variable-length prefill on the CPU: its input rules (contract.check_varlen*), the
reference against exact attention one sequence at a time, the NumPy emulation of the kernel
against the reference (ragged, empty and causal-shifted sequences, bad offsets), the kernel's
spec, configuration and grid, and the host module's launch with the kernel emulated.
"""
import math
from types import SimpleNamespace

import numpy as np
import pytest

from flashattn.contract import VarlenDims, check_varlen, check_varlen_shapes
from flashattn.kernels import (SPECS, VARLEN_CONFIGS, VARLEN_FWD, varlen_config, varlen_q_tiles,
                               varlen_constants, varlen_grid)
from flashattn.reference import (attention, emulate_varlen, pack, unpack, varlen_attention,
                                 varlen_visible)
from flashattn.config import Config

torch = pytest.importorskip("torch")


def packed(lens_q, lens_k=None, Hq=4, Hkv=2, D=16, dtype=torch.float32, seed=0):
    lens_k = lens_q if lens_k is None else lens_k
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), Hq, D, generator=g).to(dtype)
    k = torch.randn(sum(lens_k), Hkv, D, generator=g).to(dtype)
    v = torch.randn(sum(lens_k), Hkv, D, generator=g).to(dtype)
    cu_q = torch.tensor(np.concatenate([[0], np.cumsum(lens_q)]), dtype=torch.int32)
    cu_k = torch.tensor(np.concatenate([[0], np.cumsum(lens_k)]), dtype=torch.int32)
    return q, k, v, cu_q, cu_k, max(lens_q), max(lens_k)


# --- shapes and values ---------------------------------------------------------------------------
GOOD = dict(q_shape=(10, 4, 16), k_shape=(12, 2, 16), v_shape=(12, 2, 16), cu_q_shape=(3,),
            cu_k_shape=(3,), max_seqlen_q=6, max_seqlen_k=7)


def shapes(**changes):
    kw = dict(GOOD, **changes)
    return check_varlen_shapes(kw.pop("q_shape"), kw.pop("k_shape"), kw.pop("v_shape"),
                               kw.pop("cu_q_shape"), kw.pop("cu_k_shape"), **kw)


def test_good_shapes_give_the_dims():
    assert shapes() == VarlenDims(2, 4, 2, 16, 10, 12)


@pytest.mark.parametrize("changes,match", [
    (dict(q_shape=(1, 10, 4, 16)), "q must have 3 dimensions"),
    (dict(k_shape=(12, 16)), "k must have 3 dimensions"),
    (dict(v_shape=(11, 2, 16)), "same shape"),
    (dict(q_shape=(10, 4, 32)), "head dim differs"),
    (dict(q_shape=(10, 4, 300), k_shape=(12, 2, 300), v_shape=(12, 2, 300)), "between 1 and 256"),
    (dict(q_shape=(10, 3, 16)), "multiple of key/value heads"),
    (dict(cu_q_shape=(1,), cu_k_shape=(1,)), r"shape \(B \+ 1,\) with B >= 1"),
    (dict(cu_q_shape=(3, 1)), r"cu_seqlens_q must have shape \(B \+ 1,\)"),
    (dict(cu_k_shape=(4,)), "same number of sequences"),
    (dict(max_seqlen_q=-1), "max_seqlen_q must be >= 0"),
    (dict(scale=0.0), "finite positive"),
    (dict(scale=float("inf")), "finite positive"),
])
def test_bad_shapes_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        shapes(**changes)


@pytest.mark.parametrize("changes,match", [
    (dict(max_seqlen_q=6.0), "max_seqlen_q must be an int"),
    (dict(max_seqlen_k=True), "max_seqlen_k must be an int"),
    (dict(scale="0.1"), "scale must be a float"),
])
def test_bad_scalar_types_are_named(changes, match):
    with pytest.raises(TypeError, match=match):
        shapes(**changes)


def _cu(*xs):
    return torch.tensor(xs, dtype=torch.int32)


@pytest.mark.parametrize("cu_q,cu_k,mq,match", [
    (_cu(1, 5, 10), _cu(0, 6, 12), 6, r"cu_seqlens_q\[0\] must be 0"),
    (_cu(0, 6, 4, 10), _cu(0, 6, 6, 12), 6, r"non-decreasing.*cu_seqlens_q\[2\] = 4"),
    (_cu(0, 5, 9), _cu(0, 6, 12), 6, r"cu_seqlens_q\[-1\] = 9 must equal the packed total.*10"),
    (_cu(0, 6, 12), _cu(0, 6, 12), 6, r"cu_seqlens_q\[-1\] = 12"),
    (_cu(0, 5, 10), _cu(0, 6, 11), 6, r"cu_seqlens_k\[-1\] = 11"),
    (_cu(0, 5, 10), _cu(0, 8, 6), 6, "cu_seqlens_k must be non-decreasing"),
    (_cu(0, 2, 10), _cu(0, 6, 12), 6, "sequence 1 has 8 tokens in q, more than max_seqlen_q = 6"),
    (_cu(0, 5, 10), _cu(0, 1, 12), 6, "sequence 1 has 11 tokens in k, more than max_seqlen_k"),
])
def test_bad_offsets_are_named(cu_q, cu_k, mq, match):
    q, k, v = torch.zeros(10, 4, 16), torch.zeros(12, 2, 16), torch.zeros(12, 2, 16)
    with pytest.raises(ValueError, match=match):
        check_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=mq, max_seqlen_k=7)
    # Not read when told not to (the kernel's guards take over).
    check_varlen(q, k, v, cu_q, cu_k, max_seqlen_q=mq, max_seqlen_k=7, check_values=False)


@pytest.mark.parametrize("what,match,exc", [
    ("cu_int64", "cu_seqlens_q must be int32", TypeError),
    ("cu_float", "cu_seqlens_k must be int32", TypeError),
    ("q_int", "q must hold floating-point", TypeError),
    ("mixed", "share one dtype", TypeError),
    ("list", "q must be a torch.Tensor or numpy.ndarray", TypeError),
    ("causal", "causal must be a bool", TypeError),
])
def test_bad_types_are_named(what, match, exc):
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 4])
    kw = dict(max_seqlen_q=mq, max_seqlen_k=mk)
    if what == "cu_int64":
        cu_q = cu_q.long()
    elif what == "cu_float":
        cu_k = cu_k.float()
    elif what == "q_int":
        q = q.int()
    elif what == "mixed":
        k = k.double()
    elif what == "list":
        q = q.tolist()
    elif what == "causal":
        kw["causal"] = torch.tensor(True)
    with pytest.raises(exc, match=match):
        check_varlen(q, k, v, cu_q, cu_k, **kw)


def test_tensor_contract_refuses_cpu_and_float32():
    from flashattn.contract import check_varlen_tensors
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 4])
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        check_varlen_tensors(q, k, v, cu_q, cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
    q, k, v = q.half(), k.half(), v.half()
    with pytest.raises(ValueError, match="runs on a CUDA GPU"):
        check_varlen_tensors(q, k, v, cu_q, cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
    with pytest.raises(TypeError, match="cu_seqlens_q must be a torch.Tensor"):
        check_varlen_tensors(q, k, v, cu_q.numpy(), cu_k, max_seqlen_q=mq, max_seqlen_k=mk)


# --- the reference -------------------------------------------------------------------------------
def test_visibility_is_bottom_right():
    assert varlen_visible(2, 4, True).tolist() == [[True, True, True, False], [True] * 4]
    assert varlen_visible(3, 3, True).tolist() == np.tril(np.ones((3, 3), bool)).tolist()
    assert not varlen_visible(4, 2, True)[:2].any()                   # rows that see no key
    assert varlen_visible(2, 3, False).all()


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_exact_attention_per_sequence(causal):
    lens = [5, 1, 17, 0, 9]
    q, k, v, cu_q, cu_k, mq, mk = packed(lens, Hq=6, Hkv=2, D=8, dtype=torch.float64, seed=3)
    out = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    assert out.dtype == torch.float64 and out.shape == q.shape
    c = cu_q.tolist()
    for b, n in enumerate(lens):
        if n == 0:
            continue
        sl = slice(c[b], c[b + 1])
        ref = attention(q[sl].transpose(0, 1)[None], k[sl].transpose(0, 1)[None],
                        v[sl].transpose(0, 1)[None], causal=causal)[0].transpose(0, 1)
        torch.testing.assert_close(out[sl], ref, atol=1e-12, rtol=1e-12)


def test_reference_causal_with_more_queries_than_keys():
    # 4 queries, 2 keys: rows 0 and 1 see nothing (0, lse -inf); rows 2, 3 see k0 and k0..k1.
    q, k, v, cu_q, cu_k, mq, mk = packed([4], [2], Hq=2, Hkv=1, D=4, dtype=torch.float64)
    out, lse = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=True, return_lse=True)
    assert (out[:2] == 0).all() and torch.isneginf(lse[:2]).all()
    torch.testing.assert_close(out[2], v[0].expand(2, 4))
    full = attention(q[3:].transpose(0, 1)[None], k.transpose(0, 1)[None],
                     v.transpose(0, 1)[None])[0].transpose(0, 1)
    torch.testing.assert_close(out[3:], full)


def test_reference_prefill_onto_a_cache_matches_input_pos():
    # len_q < len_k, causal bottom-right == attention(..., input_pos=len_k - len_q).
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 5], [10, 5], dtype=torch.float64, seed=5)
    out = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=True)
    ref = attention(q[:3].transpose(0, 1)[None], k[:10].transpose(0, 1)[None],
                    v[:10].transpose(0, 1)[None], causal=True, input_pos=7)[0].transpose(0, 1)
    torch.testing.assert_close(out[:3], ref)


def test_pack_unpack_round_trip():
    x = torch.randn(3, 2, 7, 4)
    p, cu = pack(x, [7, 0, 3])
    assert p.shape == (10, 2, 4) and cu.tolist() == [0, 7, 7, 10] and cu.dtype == torch.int32
    u = unpack(p, cu, 7, fill=float("nan"))
    torch.testing.assert_close(u[0], x[0])
    torch.testing.assert_close(u[2, :, :3], x[2, :, :3])
    assert torch.isnan(u[1]).all() and torch.isnan(u[2, :, 3:]).all()
    pn, cun = pack(x.numpy(), [7, 0, 3])
    np.testing.assert_array_equal(pn, p.numpy())
    np.testing.assert_array_equal(unpack(pn, cun, 7), unpack(p, cu, 7).numpy())


# --- the kernel, emulated ------------------------------------------------------------------------
EMU_CASES = [  # lens_q, lens_k, Hq, Hkv, D, causal, tile_m, tile_n
    ([1, 37, 64, 65, 0, 3], None, 4, 2, 16, True, 16, 16),
    ([1, 37, 64, 65, 0, 3], None, 4, 2, 16, False, 16, 32),
    ([5, 20], [50, 3], 2, 1, 24, True, 16, 16),         # prefill onto a cache; more q than k
    ([5, 20], [50, 3], 2, 1, 24, False, 16, 16),
    ([7, 0, 9], [0, 4, 9], 3, 3, 8, True, 16, 16),      # an empty key sequence: zeros
    ([100], [100], 2, 2, 32, True, 32, 16),             # many tiles, the mask from mask_start
]


@pytest.mark.parametrize("lens_q,lens_k,Hq,Hkv,D,causal,tm,tn", EMU_CASES)
def test_emulated_kernel_matches_reference(lens_q, lens_k, Hq, Hkv, D, causal, tm, tn):
    q, k, v, cu_q, cu_k, mq, mk = packed(lens_q, lens_k, Hq=Hq, Hkv=Hkv, D=D, seed=len(lens_q))
    ref = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal).numpy()
    out = emulate_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=causal, tile_m=tm, tile_n=tn)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=1e-4)


def test_emulated_kernel_with_extreme_logits_stays_finite():
    q, k, v, cu_q, cu_k, mq, mk = packed([40, 33], Hq=2, Hkv=1, D=16, seed=9)
    q, k = q * 30, k * 30
    ref = varlen_attention(q.double(), k.double(), v.double(), cu_q, cu_k, mq, mk,
                           causal=True).numpy()
    out = emulate_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, tile_m=16, tile_n=16)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=1e-4)


@pytest.mark.parametrize("bad", ["decreasing", "past_total", "past_max", "negative"])
def test_emulated_kernel_gives_nan_for_bad_offsets_only(bad):
    q, k, v, cu_q, cu_k, mq, mk = packed([8, 8, 8], Hq=2, Hkv=1, D=8, seed=2)
    good = emulate_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, tile_m=16, tile_n=16)
    cu_q, cu_k = cu_q.clone(), cu_k.clone()
    if bad == "decreasing":
        cu_k[2] = 4                                    # sequence 1: k end < start; 2: k start
        hit = [1, 2]
    elif bad == "past_total":
        cu_k[3] = 30                                   # the last sequence runs past total_k
        hit = [2]
    elif bad == "past_max":
        mq = 6                                         # every sequence is longer: all NaN
        hit = [0, 1, 2]
    else:
        cu_q[0] = -3
        hit = [0]
    out = emulate_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=True, tile_m=16, tile_n=16)
    for b in range(3):
        rows = out[8 * b:8 * b + 8] if bad != "past_max" else out[8 * b:8 * b + 6]
        if b in hit:
            assert np.isnan(rows).all(), (bad, b)
        else:
            np.testing.assert_array_equal(rows, good[8 * b:8 * b + 8])


# --- spec, configuration, grid -------------------------------------------------------------------
def test_spec_is_registered_and_matches_the_kernel():
    assert SPECS["varlen_fwd"] is VARLEN_FWD
    VARLEN_FWD.check_signature()
    assert VARLEN_FWD.params[:6] == ("Q", "K", "V", "Out", "CuSeqlensQ", "CuSeqlensK")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_100", "sm_120", None, "sm_75"])
@pytest.mark.parametrize("d", [16, 59, 64, 80, 128, 200, 256])
def test_every_arch_and_head_dim_has_a_config(arch, d):
    c = varlen_config(arch, d)
    assert c.TILE_M >= 16 and c.TILE_N >= 16
    k = varlen_constants(c, head_dim=d, causal=True)
    assert k == dict(TILE_M=c.TILE_M, TILE_N=c.TILE_N, TILE_D=max(16, 1 << (d - 1).bit_length()),
                     CAUSAL=True, Q_TILES=1, K_LAT=2, V_LAT=4)   # the forward's latencies
    assert set(VARLEN_CONFIGS) >= {"sm_80", "sm_90", "sm_100", "sm_120"}


def test_grid_covers_the_longest_sequence():
    c = varlen_config("sm_90", 128)
    assert varlen_grid(c, B=3, Hq=32, max_seqlen_q=4097) == (-(-4097 // c.TILE_M), 32, 3)
    assert varlen_grid(c, B=1, Hq=1, max_seqlen_q=0) == (1, 1, 1)
    # Q_TILES query tiles per program: the first axis shrinks, rounded up.
    c = Config(64, 64)
    tiles = -(-4097 // 64)                                                 # 65
    for qt in (1, 2, 4, 7, 65, 100):
        assert varlen_grid(c, B=3, Hq=8, max_seqlen_q=4097, q_tiles=qt) == (-(-tiles // qt), 8, 3)
    for bad in (0, -1):
        with pytest.raises(ValueError, match="q_tiles"):
            varlen_grid(c, B=1, Hq=1, max_seqlen_q=64, q_tiles=bad)
        with pytest.raises(ValueError, match="q_tiles"):
            varlen_constants(c, head_dim=64, causal=False, q_tiles=bad)


def test_q_tiles_rule_has_two_values_whatever_the_lengths(monkeypatch):
    from flashattn.kernels import varlen_spec   # the table the plan reads
    c = Config(64, 64)
    # E22's rule on the H200: 4 tiles a program below 64 query tiles a sequence on average.
    assert varlen_spec.VARLEN_Q_TILES == {"sm_90": 4} and varlen_spec.VARLEN_Q_TILES_BELOW == 64
    assert varlen_q_tiles(c, max_seqlen_q=1024, arch="sm_90", total_q=32768, B=32) == 4
    assert varlen_q_tiles(c, max_seqlen_q=256, arch="sm_90", total_q=32768, B=128) == 4
    assert varlen_q_tiles(c, max_seqlen_q=4096, arch="sm_90", total_q=32768, B=8) == 1
    assert varlen_q_tiles(c, max_seqlen_q=8192, arch="sm_90", total_q=32768, B=25) == 4  # mean
    assert varlen_q_tiles(c, max_seqlen_q=4096, arch="sm_90") == 1         # no mean: longest
    # Not capped at the longest sequence's tiles (a kernel per short length): compile once.
    assert varlen_q_tiles(c, max_seqlen_q=100, arch="sm_90", total_q=190, B=2) == 4
    assert varlen_q_tiles(c, max_seqlen_q=1024, arch="sm_100", total_q=4096, B=4) == 1
    assert varlen_q_tiles(c, max_seqlen_q=1024, total_q=4096, B=4) == 1
    monkeypatch.setattr(varlen_spec, "VARLEN_Q_TILES", {"sm_90": 8})
    assert varlen_q_tiles(c, max_seqlen_q=4096, arch="sm_90", total_q=4096, B=4) == 8
    assert varlen_q_tiles(c, max_seqlen_q=130, arch="sm_90", total_q=130, B=1) == 8
    assert varlen_q_tiles(c, max_seqlen_q=0, arch="sm_90", total_q=0, B=1) == 8


@pytest.mark.parametrize("q_tiles", [1, 2, 3, 5, 40])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_kernel_with_several_tiles_per_program(q_tiles, causal):
    # Mixed lengths (0, 1, a tile and one, several tiles, q shorter than k): each program runs
    # up to q_tiles tiles, in reverse for causal; the answer must not depend on q_tiles.
    q, k, v, cu_q, cu_k, mq, mk = packed([1, 0, 17, 70, 33], [5, 3, 17, 70, 50], Hq=4, Hkv=2,
                                         D=24, dtype=torch.float64, seed=11)
    ref = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    out = emulate_varlen(q, k, v, cu_q, cu_k, mq, mk, causal=causal, tile_m=16, tile_n=16,
                         q_tiles=q_tiles)
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-12, rtol=1e-10)


# --- the host module, its kernel emulated --------------------------------------------------------
@pytest.fixture
def emulated_gpu(monkeypatch):
    """``flashattn.varlen.attention_varlen`` on CPU tensors: the checks as on a GPU (minus the
    device), and ``ct.launch`` replaced by the NumPy emulation writing through NumPy views."""
    ct = pytest.importorskip("cuda.tile")
    from flashattn import varlen as host
    from flashattn.reference import emulate_varlen_kernel
    launched = []

    def fake_launch(stream, grid, kernel, args, **launch_options):
        assert kernel is VARLEN_FWD.kernel()
        arrays = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        emulate_varlen_kernel(grid, *arrays)
        launched.append(SimpleNamespace(grid=grid, kernel=kernel, args=args))

    from flashattn import contract
    monkeypatch.setattr(ct, "launch", fake_launch)
    monkeypatch.setattr(host, "check_varlen_tensors",   # the CUDA-only rules off
                        lambda *a, interpret=False, **kw: contract.check_varlen(*a, **kw))
    from flashattn import dispatch
    monkeypatch.setattr(dispatch, "cuda_properties", lambda index: ("sm_120", 84))
    monkeypatch.setattr(host, "hinted", lambda kernel, hints: kernel)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **kw: None)
    monkeypatch.setattr(torch.cuda, "device", lambda d: __import__("contextlib").nullcontext())
    return SimpleNamespace(run=host.attention_varlen, launched=launched)


@pytest.mark.parametrize("causal", [False, True])
def test_host_launch_computes_varlen_attention(emulated_gpu, causal):
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 70, 0, 33], [3, 70, 5, 40], Hq=4, Hkv=2, D=24,
                                         dtype=torch.float32, seed=4)
    out = emulated_gpu.run(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    ref = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    (launch,) = emulated_gpu.launched
    c = varlen_config("sm_120", 24)
    assert launch.grid == (-(-70 // c.TILE_M), 4, 4)
    assert launch.args[-7:] == (c.TILE_M, c.TILE_N, 32, causal, 1, 2, 4)   # ..., K_LAT, V_LAT
    assert launch.args[6] == pytest.approx(1 / math.sqrt(24))
    assert launch.args[7:10] == (2, 70, 70)


@pytest.mark.parametrize("causal", [False, True])
def test_host_launch_with_several_tiles_per_program(emulated_gpu, monkeypatch, causal):
    from flashattn.kernels import varlen_spec   # the table the plan reads
    monkeypatch.setattr(varlen_spec, "VARLEN_Q_TILES", {"sm_120": 3})     # the fixture's arch
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 70, 0, 33], [3, 70, 5, 40], Hq=4, Hkv=2, D=24,
                                         dtype=torch.float32, seed=5)
    out = emulated_gpu.run(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    ref = varlen_attention(q, k, v, cu_q, cu_k, mq, mk, causal=causal)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    (launch,) = emulated_gpu.launched
    c = varlen_config("sm_120", 24)
    tiles = -(-70 // c.TILE_M)
    assert launch.grid == (-(-tiles // 3), 4, 4)
    assert launch.args[-3] == 3                                        # Q_TILES


def test_host_writes_nan_for_bad_device_offsets(emulated_gpu):
    q, k, v, cu_q, cu_k, mq, mk = packed([8, 8], Hq=2, Hkv=1, D=8)
    cu_k = cu_k.clone()
    cu_k[2] = 40
    out = emulated_gpu.run(q, k, v, cu_q, cu_k, mq, mk, check_values=False)
    assert torch.isnan(out[8:]).all() and not torch.isnan(out[:8]).any()
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] = 40"):
        emulated_gpu.run(q, k, v, cu_q, cu_k, mq, mk)


def test_host_empty_totals_launch_nothing(emulated_gpu):
    q, k, v, cu_q, cu_k, _, _ = packed([0, 0], [3, 4], Hq=2, Hkv=1, D=8)
    assert emulated_gpu.run(q, k, v, cu_q, cu_k, 0, 4).shape == (0, 2, 8)
    q, k, v, cu_q, cu_k, _, _ = packed([3, 4], [0, 0], Hq=2, Hkv=1, D=8)
    out = emulated_gpu.run(q, k, v, cu_q, cu_k, 4, 0)
    assert (out == 0).all() and out.shape == (7, 2, 8)
    assert emulated_gpu.launched == []


def test_host_refuses_a_bad_out(emulated_gpu):
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 4])
    with pytest.raises(ValueError, match="out must be"):
        emulated_gpu.run(q, k, v, cu_q, cu_k, mq, mk, out=torch.empty(7, 4, 8))


def test_tensors_on_different_devices_are_named():
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 4])
    with pytest.raises(ValueError, match="must be on one device"):
        check_varlen(q, k.to("meta"), v, cu_q, cu_k, max_seqlen_q=mq, max_seqlen_k=mk)


def test_reference_takes_numpy():
    q, k, v, cu_q, cu_k, mq, mk = packed([3, 4], [5, 1], dtype=torch.float64)
    ref = varlen_attention(q, k, v, cu_q, cu_k, causal=True)
    out = varlen_attention(q.numpy(), k.numpy(), v.numpy(), cu_q.numpy(), cu_k.numpy(),
                           causal=True)
    assert isinstance(out, np.ndarray)
    np.testing.assert_allclose(out, ref.numpy())
