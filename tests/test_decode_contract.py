"""The decode path on the CPU: its input rules (contract.check_decode*), the kernels' specs and
tile, grid and split-count rules (kernels/__init__.py), and the host module's launches
(flashattn.decode), run through the NumPy emulation of the two kernels instead of a GPU.
"""
import importlib
import math
from types import SimpleNamespace

import numpy as np
import pytest

from flashattn import contract
from flashattn.contract import (DecodeDims, check_decode, check_decode_shapes,
                                check_decode_tensors, check_decode_values)
from flashattn.kernels import (DECODE, DECODE_COMBINE, DECODE_COMBINE_ROW, DECODE_SPLIT, SPECS,
                               decode_combine_constants, decode_num_splits,
                               decode_partial_shapes, decode_split_constants, decode_tiles)
from flashattn.reference import decode_attention, split_bounds

torch = pytest.importorskip("torch")


def tensors(B=2, Hq=8, Hkv=2, Nq=1, D=64, S=128, *, paged=False, page=32, pages=9,
            max_pages=4, dtype=torch.float16, lens=None):
    q = torch.randn(B, Hq, Nq, D).to(dtype)
    shape = (pages, Hkv, page, D) if paged else (B, Hkv, S, D)
    k, v = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    cap = max_pages * page if paged else S
    seqlens = torch.tensor([cap] * B if lens is None else lens, dtype=torch.int32)
    table = (torch.arange(B * max_pages, dtype=torch.int32).reshape(B, max_pages) % pages
             if paged else None)
    return q, k, v, seqlens, table


# --- shapes ------------------------------------------------------------------------------------
GOOD = dict(q_shape=(2, 8, 1, 64), k_shape=(2, 2, 128, 64), v_shape=(2, 2, 128, 64),
            seqlens_shape=(2,))


def shapes(**changes):
    kw = dict(GOOD, **changes)
    return check_decode_shapes(kw.pop("q_shape"), kw.pop("k_shape"), kw.pop("v_shape"),
                               kw.pop("seqlens_shape"), kw.pop("table_shape", None), **kw)


def test_good_shapes_give_the_dims():
    assert shapes() == DecodeDims(2, 8, 2, 1, 64, False, None, 128)
    d = shapes(k_shape=(7, 2, 32, 64), v_shape=(7, 2, 32, 64), table_shape=(2, 5))
    assert d.paged and d.page_size == 32 and d.capacity == 160 and d.Hkv == 2


@pytest.mark.parametrize("changes,match", [
    (dict(q_shape=(2, 8, 64)), "q must have 4 dimensions"),
    (dict(k_shape=(2, 2, 128)), "k_cache must have 4 dimensions"),
    (dict(v_shape=(2, 2, 64, 64)), "same shape"),
    (dict(q_shape=(0, 8, 1, 64), seqlens_shape=(0,)), "at least one sequence"),
    (dict(q_shape=(2, 8, 0, 64)), "1 to 16 new tokens"),
    (dict(q_shape=(2, 8, 17, 64)), r"1 to 16 new tokens.*flashattn.attention"),
    (dict(q_shape=(2, 8, 1, 32)), "head dim differs"),
    (dict(q_shape=(2, 8, 1, 320), k_shape=(2, 2, 128, 320), v_shape=(2, 2, 128, 320)),
     "between 1 and 256"),
    (dict(q_shape=(2, 6, 1, 64), k_shape=(2, 4, 128, 64), v_shape=(2, 4, 128, 64)),
     "multiple of the cache's key/value heads"),
    (dict(seqlens_shape=(2, 1)), r"cache_seqlens must have shape \(B,\)"),
    (dict(seqlens_shape=(3,)), r"cache_seqlens must have shape \(B,\)"),
    (dict(k_shape=(2, 2, 0, 64), v_shape=(2, 2, 0, 64)), "holds no token"),
    (dict(k_shape=(3, 2, 128, 64), v_shape=(3, 2, 128, 64)), "one row per sequence"),
    (dict(table_shape=(2,)), r"block_table must have shape \(B, max_pages\)"),
    (dict(table_shape=(3, 4)), r"block_table must have shape \(B, max_pages\)"),
    (dict(table_shape=(2, 0)), "no column"),
    (dict(k_shape=(9, 2, 24, 64), v_shape=(9, 2, 24, 64), table_shape=(2, 4)),
     "multiple of 16"),
    (dict(k_shape=(0, 2, 32, 64), v_shape=(0, 2, 32, 64), table_shape=(2, 4)), "no page"),
    (dict(scale=float("nan")), "finite positive"),
    (dict(scale=-0.1), "finite positive"),
    (dict(scale=0.0), "finite positive"),
])
def test_bad_shapes_are_named(changes, match):
    with pytest.raises(ValueError, match=match):
        shapes(**changes)


@pytest.mark.parametrize("scale", [True, "0.1", torch.tensor(0.1)])
def test_scale_must_be_a_number(scale):
    with pytest.raises(TypeError, match="scale must be a float"):
        shapes(scale=scale)


# --- types, dtypes, devices ---------------------------------------------------------------------
def test_good_tensors_and_arrays_pass():
    q, k, v, lens, table = tensors(paged=True)
    assert check_decode(q, k, v, lens, table).paged
    assert not check_decode(*(t.float().numpy() for t in (q, *tensors()[1:3])),
                            lens.numpy()).paged


@pytest.mark.parametrize("which,bad,exc,match", [
    ("q", [[1.0]], TypeError, "q must be a torch.Tensor or numpy.ndarray, got list"),
    ("q", "int", TypeError, "q must hold floating-point numbers"),
    ("k", "float32", TypeError, "share one dtype"),
    ("lens", "int64", TypeError, "cache_seqlens must be int32"),
    ("lens", "float", TypeError, "cache_seqlens must be int32"),
    ("table", "int64", TypeError, "block_table must be int32"),
    ("lens", "meta", ValueError, "must be on one device"),
    ("table", "meta", ValueError, "must be on one device"),
])
def test_bad_types_are_named(which, bad, exc, match):
    q, k, v, lens, table = tensors(paged=True)
    args = dict(q=q, k=k, v=v, lens=lens, table=table)
    t = args[which]
    args[which] = (bad if not isinstance(bad, str) else
                   t.int() if bad == "int" else t.float() if bad in ("float32", "float") else
                   t.long() if bad == "int64" else t.to("meta"))
    with pytest.raises(exc, match=match):
        check_decode(args["q"], args["k"], args["v"], args["lens"], args["table"])


# --- values -------------------------------------------------------------------------------------
@pytest.mark.parametrize("lens,match", [
    ([129, 0], r"cache_seqlens\[0\] = 129 is outside \[0, 128\]"),
    ([5, -1], r"cache_seqlens\[1\] = -1 is outside"),
])
def test_lengths_past_the_cache_are_refused(lens, match):
    q, k, v, _, _ = tensors()
    with pytest.raises(ValueError, match=match):
        check_decode(q, k, v, torch.tensor(lens, dtype=torch.int32))


def test_lengths_past_the_pages_are_refused():
    q, k, v, lens, table = tensors(paged=True, lens=[128, 129])
    with pytest.raises(ValueError, match=r"outside \[0, 128\].*4 pages of 32"):
        check_decode(q, k, v, lens, table)


@pytest.mark.parametrize("page_id,match", [(9, r"block_table\[1, 2\] = 9 is not a page"),
                                           (-1, r"block_table\[1, 2\] = -1 is not a page")])
def test_page_ids_out_of_range_are_refused(page_id, match):
    q, k, v, lens, table = tensors(paged=True, lens=[128, 70])
    table[1, 2] = page_id                                    # slot 2 of 70 tokens: in use
    with pytest.raises(ValueError, match=match):
        check_decode(q, k, v, lens, table)


def test_slots_a_sequence_does_not_use_are_not_checked():
    q, k, v, lens, table = tensors(paged=True, lens=[128, 64])
    table[1, 2:] = -1                                        # vLLM leaves them as it likes
    table[0, :] = torch.tensor([8, 0, 3, 5], dtype=torch.int32)
    assert check_decode(q, k, v, lens, table).capacity == 128


def test_values_are_checked_by_default_only_on_the_cpu(monkeypatch):
    q, k, v, lens, table = tensors(paged=True, lens=[128, 1000])
    with pytest.raises(ValueError, match="outside"):
        check_decode(q, k, v, lens, table)
    check_decode(q, k, v, lens, table, check_values=False)          # the kernel's guards
    seen = []
    monkeypatch.setattr(contract, "check_decode_values", lambda *a, **kw: seen.append(1))
    q, k, v, lens, table = (t.to("meta") for t in (q, k, v, lens, table))
    check_decode(q, k, v, lens, table)                      # a device: not read by default
    assert seen == []
    check_decode(q, k, v, lens, table, check_values=True)   # asked: read
    assert seen == [1]


def test_reading_values_under_graph_capture_is_refused(monkeypatch):
    monkeypatch.setattr(contract, "_capturing", lambda: True)
    q, k, v, lens, table = (t.to("meta") for t in tensors(paged=True))
    with pytest.raises(ValueError, match="CUDA-graph capture"):
        check_decode(q, k, v, lens, table, check_values=True)
    check_decode(q, k, v, lens, table)                      # default: not read, no error


def test_check_decode_values_takes_numpy_and_torch():
    dims = DecodeDims(2, 2, 1, 1, 8, True, 16, 64)
    check_decode_values(np.array([64, 0], np.int32), np.array([[0, 1, 2, 3], [-1, -1, -1, -1]]),
                        dims, num_pages=4)
    with pytest.raises(ValueError, match=r"block_table\[0, 3\] = 4"):
        check_decode_values(torch.tensor([64, 0]), torch.tensor([[0, 1, 2, 4], [0, 0, 0, 0]]),
                            dims, num_pages=4)


# --- the kernels' extra rules ---------------------------------------------------------------------
def test_kernel_contract_refuses_what_the_kernels_cannot_take():
    q, k, v, lens, table = tensors(paged=True)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        check_decode_tensors(q.numpy(), k, v, lens, table)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        check_decode_tensors(q.float(), k.float(), v.float(), lens, table)
    strided = torch.randn(9, 2, 64, 32).half().transpose(-1, -2)     # (9, 2, 32, 64), D strided
    with pytest.raises(ValueError, match="contiguous in its last dimension"):
        check_decode_tensors(q, strided, strided, lens, table)
    with pytest.raises(ValueError, match="run on a CUDA GPU"):
        check_decode_tensors(q, k, v, lens, table)
    # A cache kept (pages, page_size, Hkv, D) is accepted as a view: D stays contiguous.
    vllm = torch.randn(9, 32, 2, 64).half().transpose(1, 2)
    with pytest.raises(ValueError, match="run on a CUDA GPU"):   # i.e. every other rule passed
        check_decode_tensors(q, vllm, vllm, lens, table)


# --- specs, tiles, grids and the split rule ---------------------------------------------------------
def test_decode_specs_are_registered_and_match_their_kernels():
    assert SPECS["decode_split"] is DECODE_SPLIT and SPECS["decode_combine"] is DECODE_COMBINE
    assert SPECS["decode_combine_row"] is DECODE_COMBINE_ROW
    for spec in DECODE.values():
        spec.check_signature()
        assert spec.module == "flashattn.kernels.decode"


def test_decode_signature_declares_int32_tables():
    ct = pytest.importorskip("cuda.tile")
    c = decode_split_constants(rows=4, head_dim=128, page_size=64, arch="sm_90")
    sig = DECODE_SPLIT.signature(dtype="bfloat16", constants=c)
    params = sig.parameters
    assert len(params) == len(DECODE_SPLIT.params)
    by_name = dict(zip(DECODE_SPLIT.params, params))
    assert by_name["BlockTable"].dtype == ct.int32 and by_name["SeqLens"].dtype == ct.int32
    assert by_name["Opart"].dtype == ct.float32 and by_name["Q"].dtype == ct.bfloat16
    assert [p.value for p in params[-len(DECODE_SPLIT.constants):]] == [
        c[n] for n in DECODE_SPLIT.constants]


@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 256])
@pytest.mark.parametrize("rows", [1, 2, 4, 8, 16, 32, 64, 128, 512])
def test_decode_tiles(head_dim, rows):
    td = contract.tile_d_for(head_dim)
    for arch in (None, "sm_90", "sm_100", "sm_120"):
        for page in (None, 16, 48, 64, 128, 256):
            tm, tn = decode_tiles(rows=rows, head_dim=head_dim, page_size=page, arch=arch)
            assert tm & (tm - 1) == 0 and tn & (tn - 1) == 0
            assert 16 <= tm <= 64 and 16 <= tn <= 128
            assert tm >= min(rows, 16) and (tm >= rows or tm >= 32)
            wide = arch in ("sm_90", "sm_100") and tm == 64
            assert tm * tn * td <= (1 << 20 if wide else 1 << 18)       # the register budget
            assert page is not None or tn >= 32                         # not starved of keys
            if page is not None:
                assert page % tn == 0                    # a tile never straddles two pages
            c = decode_split_constants(rows=rows, head_dim=head_dim, page_size=page, arch=arch)
            assert set(c) == set(DECODE_SPLIT.constants) and c["PAGED"] is (page is not None)
            assert c["FINAL"] is False
            assert (c["TILE_M"], c["TILE_N"], c["TILE_D"]) == (tm, tn, td)
            cc = decode_combine_constants(split_tile_m=tm, head_dim=head_dim)
            assert set(cc) == set(DECODE_COMBINE.constants)
            assert tm % cc["TILE_M"] == 0 and cc["TILE_M"] * cc["TILE_D"] <= 2048


def test_decode_tiles_refuse_bad_arguments():
    with pytest.raises(ValueError, match="rows"):
        decode_tiles(rows=0, head_dim=64)
    with pytest.raises(ValueError, match="multiple of 16"):
        decode_tiles(rows=1, head_dim=64, page_size=24)


def _programs(B, Hkv, rows, splits, head_dim=128, arch="sm_90"):
    tm, _ = decode_tiles(rows=rows, head_dim=head_dim, arch=arch)
    return B * Hkv * -(-rows // tm) * splits


@pytest.mark.parametrize("B", [1, 2, 8, 64, 256])
@pytest.mark.parametrize("Hkv,rows", [(8, 4), (1, 32), (32, 1), (8, 64), (2, 128)])
@pytest.mark.parametrize("max_seqlen", [0, 1, 128, 1000, 32 * 1024, 128 * 1024])
def test_split_rule_fills_the_gpu_without_empty_splits(B, Hkv, rows, max_seqlen):
    for sm_count in (80, 132, 148):
        _check_split_rule(B, Hkv, rows, max_seqlen, sm_count)


def _check_split_rule(B, Hkv, rows, max_seqlen, sm_count):
    s = decode_num_splits(B=B, Hkv=Hkv, rows=rows, max_seqlen=max_seqlen, head_dim=128,
                          sm_count=sm_count, arch="sm_90")
    _, tn = decode_tiles(rows=rows, head_dim=128, arch="sm_90")
    n_tiles = -(-max_seqlen // tn)
    assert 1 <= s <= max(1, min(256, n_tiles))
    # Every split of the longest sequence gets at least one K/V tile (the kernel's dealing).
    if n_tiles:
        assert all(e > a for a, e in split_bounds(max_seqlen, s, tn))
    # One wave of programs (at most one per SM), unless the tiles or the cap run out first:
    # the longest split is as short as with floor(SMs / base) splits (or the cap, or one
    # tile each) ...
    base = _programs(B, Hkv, rows, 1)
    want = max(1, sm_count // base)
    if n_tiles:
        assert -(-n_tiles // s) == -(-n_tiles // min(want, n_tiles, 256))
    # ... and no more splits than that asks for: never a partial second wave.
    assert s <= want
    assert s == 1 or _programs(B, Hkv, rows, s) <= sm_count


def test_split_rule_examples_from_its_docstring():
    f = decode_num_splits
    kw = dict(Hkv=8, rows=4, head_dim=128, sm_count=132, arch="sm_90")
    assert f(B=1, max_seqlen=128 * 1024, **kw) == 16
    assert f(B=8, max_seqlen=32 * 1024, **kw) == 2
    assert f(B=64, max_seqlen=32 * 1024, **kw) == 1
    assert f(B=1, max_seqlen=100, **kw) == 1                 # one tile: one split
    assert f(B=1, max_seqlen=10 ** 7, Hkv=1, rows=1, head_dim=128, sm_count=132,
             arch="sm_90") == 132                              # one program per SM
    assert f(B=1, max_seqlen=10 ** 7, Hkv=1, rows=1, head_dim=128, sm_count=132,
             arch="sm_90", waves=4) == 256                     # the cap
    assert f(B=1, max_seqlen=128 * 1024, waves=2, **kw) == 32  # floor(264/8)=33: runs of 32
    assert f(B=16, max_seqlen=128 * 1024, **kw) == 1            # 128 programs: one wave
    assert f(B=1, max_seqlen=8 * 128, min_tiles_per_split=4, **kw) == 2


@pytest.mark.parametrize("bad", [dict(B=0), dict(Hkv=0), dict(rows=0), dict(sm_count=0),
                                 dict(waves=0), dict(max_splits=0), dict(max_seqlen=-1)])
def test_split_rule_refuses_bad_arguments(bad):
    kw = dict(B=1, Hkv=8, rows=4, max_seqlen=1024, head_dim=128, sm_count=132)
    with pytest.raises(ValueError):
        decode_num_splits(**{**kw, **bad})


def test_partial_shapes_are_whole_tiles():
    o, l = decode_partial_shapes(num_splits=3, B=2, Hkv=4, rows=100, tile_m=64, head_dim=80)
    assert o == (3, 8, 128, 128) and l == (3, 8, 128)


# --- the host module, its kernels emulated ---------------------------------------------------------
@pytest.fixture
def emulated_gpu(monkeypatch):
    """Run ``flashattn.decoding.decode`` on CPU tensors: its checks as on a GPU (minus the device),
    an H100's SM count, and ``ct.launch`` replaced by the NumPy emulation of each kernel,
    writing the tensors' memory through NumPy views."""
    ct = pytest.importorskip("cuda.tile")
    host = importlib.import_module("flashattn.decoding")
    from flashattn.reference import (emulate_combine_kernel, emulate_combine_row_kernel,
                                     emulate_split_kernel)
    launched = []

    from flashbook.ladder import variants

    def fake_launch(stream, grid, kernel, args, **launch_options):
        args = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        if kernel is DECODE_SPLIT.kernel():
            emulate_split_kernel(grid, *args)
        elif kernel is variants.DECODE_SPLIT.kernel():     # the ladder's: Counter after Out
            variants.emulate_split_kernel(grid, *args)
        elif kernel is DECODE_COMBINE.kernel():
            emulate_combine_kernel(grid, *args)
        elif kernel is variants.DECODE_COMBINE.kernel():   # the ladder's: PDL last
            emulate_combine_kernel(grid, *args[:-1])
        elif kernel is DECODE_COMBINE_ROW.kernel():
            emulate_combine_row_kernel(grid, *args)
        elif kernel is variants.DECODE_COMBINE_ROW.kernel():
            emulate_combine_row_kernel(grid, *args[:-1])
        else:
            raise AssertionError(f"unexpected kernel {kernel}")
        launched.append(SimpleNamespace(grid=grid, kernel=kernel, args=args))

    monkeypatch.setattr(ct, "launch", fake_launch)
    for mod in (host, importlib.import_module("flashattn.contract")):  # CUDA-only rules off
        monkeypatch.setattr(mod, "check_decode_tensors",
                            lambda *a, interpret=False, **kw: check_decode(*a, **kw))
    from flashattn import dispatch
    monkeypatch.setattr(dispatch, "cuda_properties", lambda index: ("sm_90", 132))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **kw: None)
    return SimpleNamespace(decode=host.decode, ladder_decode=variants.decode, launched=launched)


CASES = [  # B, Hq, Hkv, Nq, D, paged, lens, num_splits
    (3, 8, 2, 1, 64, False, [128, 1, 0], None),
    (2, 32, 1, 4, 80, True, [100, 5], 3),
    (2, 16, 1, 16, 32, True, [128, 16], 2),        # 256 rows: 4 row blocks
    (1, 4, 4, 2, 128, False, [77], 7),
    (2, 32, 8, 4, 64, True, [128, 3], 1),           # one split: one launch (FINAL)
    (2, 8, 8, 1, 128, False, [0, 128], 1),
]


def case_tensors(seed, B, Hq, Hkv, Nq, D, paged, lens):
    """The tensors of one row of CASES (a paged case with its 11 pages in shuffled order):
    (q, k, v, seqlens, table)."""
    torch.manual_seed(seed)
    q, k, v, seqlens, table = tensors(B, Hq, Hkv, Nq, D, 128, paged=paged, page=32, pages=11,
                                      max_pages=4, lens=lens)
    if paged:
        table = torch.randperm(11, dtype=torch.int32)[:B * 4].reshape(B, 4).contiguous()
    return q, k, v, seqlens, table


def host_case(emulated_gpu, seed, B, Hq, Hkv, Nq, D, paged, lens, splits):
    """One row of CASES through ``flashattn.decode`` with its kernels emulated:
    (q, k, v, seqlens, table, out)."""
    q, k, v, seqlens, table = case_tensors(seed, B, Hq, Hkv, Nq, D, paged, lens)
    out = emulated_gpu.decode(q, k, v, seqlens, block_table=table, num_splits=splits)
    return q, k, v, seqlens, table, out


@pytest.mark.parametrize("B,Hq,Hkv,Nq,D,paged,lens,splits", CASES)
def test_host_launches_compute_decode_attention(emulated_gpu, B, Hq, Hkv, Nq, D, paged, lens,
                                                splits):
    q, k, v, seqlens, table, out = host_case(emulated_gpu, B * 100 + Hq + Nq, B, Hq, Hkv, Nq, D,
                                             paged, lens, splits)
    assert out.dtype == q.dtype and out.shape == q.shape
    ref = decode_attention(q, k, v, seqlens, block_table=table)
    err = (out.float() - ref).abs().max().item()
    assert err < 2e-3, err
    split, *rest = emulated_gpu.launched
    final = split.grid[1] == 1
    assert split.kernel is DECODE_SPLIT.kernel()
    # One split: the split kernel writes the output (FINAL), no combine; otherwise a combine.
    assert [r.kernel for r in rest] == ([] if final else [DECODE_COMBINE.kernel()])
    rows = Hq // Hkv * Nq
    c = decode_split_constants(rows=rows, head_dim=D, page_size=32 if paged else None,
                               arch="sm_90", final=final)
    assert split.args[-len(DECODE_SPLIT.constants):] == [c[n] for n in DECODE_SPLIT.constants]
    assert split.args[10] == pytest.approx(1 / math.sqrt(D)) and split.args[11] == Nq
    if splits is not None:
        assert split.grid[1] == splits
    assert split.grid == (-(-rows // c["TILE_M"]), split.grid[1], B * Hkv)


def test_host_default_split_count_comes_from_the_capacity(emulated_gpu):
    q, k, v, seqlens, _ = tensors(1, 8, 8, 1, 64, 4096, lens=[10])
    emulated_gpu.decode(q, k, v, seqlens)
    # rows 1, 8 groups: floor(132 / 8) = 16 splits wanted (one wave), 32 tiles of 128 in the
    # capacity: 16 runs of 2.
    assert emulated_gpu.launched[0].grid == (1, 16, 8)
    emulated_gpu.launched.clear()
    emulated_gpu.decode(q, k, v, seqlens, max_seqlen=300)
    assert emulated_gpu.launched[0].grid == (1, 3, 8)


def test_host_writes_nan_for_bad_device_values(emulated_gpu):
    q, k, v, seqlens, table = tensors(2, 4, 2, 1, 32, paged=True, lens=[128, 60])
    seqlens[0] = 129
    out = emulated_gpu.decode(q, k, v, seqlens, block_table=table, check_values=False)
    assert torch.isnan(out[0]).all() and not torch.isnan(out[1]).any()
    with pytest.raises(ValueError, match="outside"):
        emulated_gpu.decode(q, k, v, seqlens, block_table=table)   # CPU tables: checked


@pytest.mark.parametrize("bad,match", [(0, "positive integer"), (1.5, "positive integer"),
                                       (True, "positive integer"), (70000, "at most 65535")])
def test_host_refuses_bad_split_counts(emulated_gpu, bad, match):
    q, k, v, seqlens, _ = tensors()
    with pytest.raises(ValueError, match=match):
        emulated_gpu.decode(q, k, v, seqlens, num_splits=bad)


def test_host_refuses_a_batch_past_the_grid(emulated_gpu):
    q, k, v, seqlens, _ = tensors(B=8193, Hq=8, Hkv=8, D=16, S=16)
    with pytest.raises(ValueError, match="exceeds 65535"):
        emulated_gpu.decode(q, k, v, seqlens)


def test_host_refuses_a_bad_out(emulated_gpu):
    q, k, v, seqlens, _ = tensors()
    with pytest.raises(ValueError, match="out must be"):
        emulated_gpu.decode(q, k, v, seqlens, out=torch.empty(2, 8, 1, 64))


# --- the one-row combine (decode_combine_row_kernel): chosen by shape (E21) -------------
@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 256])
def test_row_combine_constants(head_dim):
    from flashattn.kernels import decode_combine_row_constants
    td = contract.tile_d_for(head_dim)
    for splits in (1, 2, 3, 16, 17, 256):
        c = decode_combine_row_constants(head_dim=head_dim, num_splits=splits)
        assert set(c) == set(DECODE_COMBINE_ROW.constants) and c["TILE_D"] == td
        ts = c["TILE_S"]
        assert ts & (ts - 1) == 0 and ts * td <= max(4096, td)
        assert ts >= min(splits, 4096 // td)                   # as many as fit
    with pytest.raises(ValueError, match="num_splits"):
        decode_combine_row_constants(head_dim=head_dim, num_splits=0)


def test_combine_kind():
    from flashattn import kernels
    from flashattn.kernels import decode_combine_kind
    # E21's switch: few rows (one wave) and many splits -> one program per row.
    assert (kernels.DECODE_ROW_COMBINE_MAX, kernels.DECODE_ROW_COMBINE_MIN_SPLITS) == (128, 8)
    assert decode_combine_kind(B=1, Hkv=8, rows=4, num_splits=16) == "row"     # B=1 Nq=1
    assert decode_combine_kind(B=1, Hkv=8, rows=16, num_splits=16) == "row"    # B=1 Nq=4
    assert decode_combine_kind(B=2, Hkv=8, rows=4, num_splits=8) == "row"      # B=2 Nq=1
    assert decode_combine_kind(B=2, Hkv=8, rows=16, num_splits=8) == "block"   # 256 rows
    assert decode_combine_kind(B=4, Hkv=8, rows=4, num_splits=4) == "block"    # 4 splits
    assert decode_combine_kind(B=1, Hkv=8, rows=4, num_splits=1) is None
    assert decode_combine_kind(B=1, Hkv=8, rows=4, num_splits=16, row_max=0) == "block"
    assert decode_combine_kind(B=2, Hkv=8, rows=4, num_splits=2, min_splits=2) == "row"


@pytest.mark.parametrize("B,Hq,Hkv,Nq,D,paged,lens,splits", CASES)
def test_host_row_combine_computes_decode_attention(emulated_gpu, monkeypatch, B, Hq, Hkv, Nq,
                                                    D, paged, lens, splits):
    from flashattn.kernels import decode_spec as kernels   # the rule's module
    monkeypatch.setattr(kernels, "DECODE_ROW_COMBINE_MAX", 10 ** 6)
    monkeypatch.setattr(kernels, "DECODE_ROW_COMBINE_MIN_SPLITS", 2)
    q, k, v, seqlens, table, out = host_case(emulated_gpu, B * 100 + Hq + Nq + 1, B, Hq, Hkv, Nq, D,
                                             paged, lens, splits)
    ref = decode_attention(q, k, v, seqlens, block_table=table)
    assert (out.float() - ref).abs().max().item() < 2e-3
    split, *rest = emulated_gpu.launched
    if split.grid[1] == 1:
        assert rest == []                                      # FINAL: no combine at all
    else:
        (comb,) = rest
        rows = Hq // Hkv * Nq
        assert comb.kernel is DECODE_COMBINE_ROW.kernel() and comb.grid == (rows, B * Hkv, 1)


# --- the merge fused into the split kernel (E23) -----------------------------------------------
@pytest.mark.parametrize("order_seed", [0, 1, 2, 3])
@pytest.mark.parametrize("B,Hq,Hkv,Nq,D,paged,lens,splits", [c for c in CASES if c[-1] != 1])
def test_emulated_fused_merge_in_any_order(order_seed, B, Hq, Hkv, Nq, D, paged, lens, splits):
    # The programs of the split kernel run in a shuffled order: whichever split of a row block
    # counts last merges it; the answer is the two-kernel one and every counter ends at 0
    # (emulate_decode raises otherwise).
    from flashattn.reference import emulate_decode
    from flashbook.ladder.variants import emulate_decode_fused
    q, k, v, seqlens, table = case_tensors(B * 100 + Hq + Nq + 7, B, Hq, Hkv, Nq, D, paged,
                                           lens)
    kw = dict(block_table=table, num_splits=splits or 5, tile_n=32)
    two = emulate_decode(q.double(), k.double(), v.double(), seqlens, **kw)
    fused = emulate_decode_fused(q.double(), k.double(), v.double(), seqlens,
                                 order_seed=order_seed, **kw)
    np.testing.assert_allclose(fused, two, rtol=1e-12, atol=1e-13)
    ref = decode_attention(q.double(), k.double(), v.double(), seqlens, block_table=table)
    np.testing.assert_allclose(fused, ref.numpy(), rtol=1e-9, atol=1e-10)


def test_emulated_fused_merge_keeps_nan_for_bad_lengths():
    from flashbook.ladder.variants import emulate_decode_fused
    q, k, v, seqlens, table = tensors(2, 4, 2, 1, 32, paged=True, lens=[128, 60])
    seqlens[0] = 129
    out = emulate_decode_fused(q, k, v, seqlens, block_table=table, num_splits=3, tile_n=32,
                               order_seed=5)
    assert np.isnan(out[0]).all() and not np.isnan(out[1]).any()


def test_combine_kind_fused():
    # The fused merge is the book's (flashbook/ladder/variants.py), off by default.
    from flashattn.contract import DecodeDims
    from flashbook.ladder import variants
    assert variants.DECODE_FUSED_COMBINE is False

    def kind(splits, fused, paged=False):
        dims = DecodeDims(B=8, Hq=32, Hkv=8, Nq=1, D=128, paged=paged,
                          page_size=64 if paged else None, capacity=4096)
        return variants.decode_plan(dims, num_splits=splits, sm_count=132, arch="sm_90",
                                    fused=fused)["combine"]
    assert kind(2, True) == "fused"
    assert kind(1, True) is None
    assert kind(2, False) == "block"
    # Paged caches keep a two-kernel merge (tileiras 13.4.92 crashes on the paged atomic).
    assert kind(2, True, paged=True) == "block"


@pytest.mark.parametrize("B,Hq,Hkv,Nq,D,paged,lens,splits", CASES)
def test_host_fused_merge_is_one_launch(emulated_gpu, monkeypatch, B, Hq, Hkv, Nq, D, paged,
                                        lens, splits):
    from flashbook.ladder import variants
    monkeypatch.setattr(variants, "DECODE_FUSED_COMBINE", True)
    counters = []

    def zeros(device, shape):
        counters.append(torch.zeros(tuple(shape), dtype=torch.int32))
        return counters[-1]
    monkeypatch.setattr(variants, "_counters", zeros)
    q, k, v, seqlens, table = case_tensors(B * 100 + Hq + Nq + 3, B, Hq, Hkv, Nq, D, paged, lens)
    out = emulated_gpu.ladder_decode(q, k, v, seqlens, block_table=table, num_splits=splits)
    ref = decode_attention(q, k, v, seqlens, block_table=table)
    assert (out.float() - ref).abs().max().item() < 2e-3
    split, *rest = emulated_gpu.launched
    rows = Hq // Hkv * Nq
    final = split.grid[1] == 1
    if paged:                                             # paged: the two-kernel merge
        assert counters == [] and len(rest) == (0 if final else 1)
        return
    assert rest == []                                     # no combine launch
    c = dict(decode_split_constants(rows=rows, head_dim=D, page_size=None, arch="sm_90",
                                    final=final), FUSED=not final, PDL=False)
    names = variants.DECODE_SPLIT.constants
    assert split.args[-len(names):] == [c[n] for n in names]
    if final:
        assert counters == []                             # one split: nothing to count
    else:
        (counter,) = counters
        assert counter.shape == (B * Hkv, -(-rows // c["TILE_M"]))
        assert (counter == 0).all()                       # every row block set back to 0
