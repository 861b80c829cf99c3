"""Decode attention over a KV cache on the CPU (flashattn.reference.decode, issue 12).

The exact reference against ``reference.attention`` (chapter 2's), the LSE merge on adversarial
splits, the paged cache against the contiguous one, GQA from 1:1 to 32:1, and the NumPy
emulation of the two kernels (the closest a CPU gets to running them) against the reference,
including the device-side guards.
"""
import math

import numpy as np
import pytest

from flashattn.reference import (attention, decode_attention, emulate_decode, gather_cache,
                                 merge_partials, split_bounds, split_kv_attention,
                                 split_partials)

torch = pytest.importorskip("torch")

HEADS = ((1, 1), (4, 4), (8, 2), (8, 1), (32, 8), (32, 1))      # (Hq, Hkv): 1:1 .. 32:1


def make(B, Hq, Hkv, Nq, D, S, *, seed=0, magnitude=1.0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = (rng.standard_normal((B, Hq, Nq, D)) * magnitude).astype(dtype)
    k = (rng.standard_normal((B, Hkv, S, D)) * magnitude).astype(dtype)
    v = rng.standard_normal((B, Hkv, S, D)).astype(dtype)
    return q, k, v


def to_paged(k, v, lens, page_size, *, seed=0, spare_pages=3, garbage=np.nan):
    """The same cache as pages in a shuffled pool, garbage in every unused slot and page."""
    rng = np.random.default_rng(seed)
    B, Hkv, S, D = k.shape
    max_pages = -(-S // page_size)
    num_pages = B * max_pages + spare_pages
    order = rng.permutation(num_pages)
    kp = np.full((num_pages, Hkv, page_size, D), garbage, k.dtype)
    vp = np.full((num_pages, Hkv, page_size, D), garbage, v.dtype)
    table = np.full((B, max_pages), -1, np.int32)    # slots past a sequence: never read
    for b in range(B):
        for p in range(-(-int(lens[b]) // page_size)):
            page = order[b * max_pages + p]
            table[b, p] = page
            n = min(page_size, int(lens[b]) - p * page_size)
            kp[page, :, :n] = k[b, :, p * page_size:p * page_size + n]
            vp[page, :, :n] = v[b, :, p * page_size:p * page_size + n]
    return kp, vp, table


def poison_tail(k, v, lens):
    """NaN in every cache slot past each sequence's length: those must never be read."""
    k, v = k.copy(), v.copy()
    for b, n in enumerate(lens):
        k[b, :, n:] = np.nan
        v[b, :, n:] = np.nan
    return k, v


# --- the exact reference ----------------------------------------------------------------------
@pytest.mark.parametrize("hq,hkv", HEADS)
@pytest.mark.parametrize("nq", [1, 2, 4, 16])
def test_full_cache_is_causal_attention_at_the_end(hq, hkv, nq):
    # Every sequence full: decode is attention(causal=True) with the queries at the end.
    q, k, v = make(2, hq, hkv, nq, 32, 70, seed=hq * 100 + nq)
    lens = np.array([70, 70], np.int32)
    out = decode_attention(q, k, v, lens)
    ref = attention(q, k, v, causal=True, input_pos=70 - nq)
    np.testing.assert_allclose(out, ref, atol=1e-12)


@pytest.mark.parametrize("nq", [1, 3, 16])
def test_ragged_lengths_are_each_sequence_alone(nq):
    lens = np.array([1, 17, 64, 3, nq], np.int32)
    q, k, v = make(len(lens), 8, 2, nq, 16, 64, seed=nq)
    k, v = poison_tail(k, v, lens)
    out = decode_attention(q, k, v, lens)
    assert np.isfinite(out).all()
    for b, n in enumerate(lens):
        if n >= nq:
            ref = attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=True,
                            input_pos=int(n) - nq)
            np.testing.assert_allclose(out[b:b + 1], ref, atol=1e-12)


def test_rows_that_see_no_key_are_zero():
    # Length 0: every row is empty. Length 2 with Nq = 4: rows 0 and 1 sit at positions -2, -1.
    q, k, v = make(2, 4, 2, 4, 8, 16, seed=1)
    lens = np.array([0, 2], np.int32)
    out, lse = decode_attention(q, k, v, lens, return_lse=True)
    assert (out[0] == 0).all() and np.isneginf(lse[0]).all()
    assert (out[1, :, :2] == 0).all() and np.isneginf(lse[1, :, :2]).all()
    # Row 2 sees key 0 only, row 3 keys 0 and 1.
    np.testing.assert_allclose(out[1, :, 2], v[1, np.arange(4) // 2, 0], atol=1e-12)
    assert np.isfinite(lse[1, :, 2:]).all()


def test_lse_is_the_log_of_the_softmax_denominator():
    q, k, v = make(1, 2, 1, 3, 8, 10, seed=2)
    lens = np.array([9], np.int32)
    _, lse = decode_attention(q, k, v, lens, return_lse=True)
    s = np.einsum("hqd,kd->hqk", q[0], k[0, 0, :9]) / math.sqrt(8)
    vis = np.arange(9)[None, :] <= (9 - 3 + np.arange(3))[:, None]
    expect = np.log(np.where(vis, np.exp(s), 0).sum(-1))
    np.testing.assert_allclose(lse[0], expect, rtol=1e-12)


def test_torch_inputs_give_torch_outputs_in_fp32():
    q, k, v = (torch.from_numpy(t).half() for t in make(2, 4, 2, 1, 16, 32, seed=3))
    lens = torch.tensor([32, 5], dtype=torch.int32)
    out = decode_attention(q, k, v, lens)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32
    assert out.shape == (2, 4, 1, 16)


# --- the paged cache ---------------------------------------------------------------------------
@pytest.mark.parametrize("page_size", [16, 32, 64])
@pytest.mark.parametrize("seed", range(4))
def test_paged_equals_contiguous_for_random_block_tables(page_size, seed):
    rng = np.random.default_rng(seed)
    B, S = 4, 150
    lens = rng.integers(0, S + 1, B).astype(np.int32)
    lens[seed % B] = S                                   # one full sequence, one random
    hq, hkv = HEADS[seed % len(HEADS)]
    nq = (1, 2, 4, 16)[seed]
    q, k, v = make(B, hq, hkv, nq, 24, S, seed=seed)
    kp, vp, table = to_paged(k, v, lens, page_size, seed=seed)
    contiguous = decode_attention(q, *poison_tail(k, v, lens), lens)
    paged = decode_attention(q, kp, vp, lens, block_table=table)
    np.testing.assert_allclose(paged, contiguous, atol=1e-12)
    assert np.isfinite(paged).all()


def test_gather_cache_reads_pages_in_table_order():
    k = np.arange(2 * 1 * 16 * 1, dtype=np.float64).reshape(2, 1, 16, 1)   # pages 0, 1
    table = np.array([[1, 0]], np.int32)
    got = gather_cache(k, table, 20, 0)[0, :, 0]
    np.testing.assert_array_equal(got, np.r_[np.arange(16, 32), np.arange(0, 4)])


# --- the split-KV merge ----------------------------------------------------------------------------
def _exact_and_lse(q, k, v, lens, **kw):
    return decode_attention(q, k, v, lens, return_lse=True, **kw)


@pytest.mark.parametrize("name,splits", [
    ("one split", lambda n: [(0, n)]),
    ("empty splits everywhere", lambda n: [(0, 0), (0, 0), (0, n // 2), (n // 2, n // 2),
                                           (n // 2, n), (n, n)]),
    ("single keys", lambda n: [(0, n - 3), (n - 3, n - 2), (n - 2, n - 1), (n - 1, n)]),
    ("uneven", lambda n: [(0, 1), (1, 2), (2, n - 1), (n - 1, n)]),
])
def test_merge_of_partials_is_exact(name, splits):
    n, nq = 40, 4
    q, k, v = make(1, 8, 2, nq, 16, n, seed=5)
    lens = np.array([n], np.int32)
    out, lse = _exact_and_lse(q, k, v, lens)
    o_parts, lse_parts = split_partials(q, k, v, lens, splits=[splits(n)])
    merged, merged_lse = merge_partials(o_parts, lse_parts)
    np.testing.assert_allclose(merged, out, atol=1e-12)
    np.testing.assert_allclose(merged_lse, lse, atol=1e-12)


def test_a_split_whose_rows_are_all_masked_has_zero_weight():
    # Nq = 4: the last key is seen by row 3 only; rows 0..2 of that split see nothing.
    n, nq = 33, 4
    q, k, v = make(1, 2, 1, nq, 8, n, seed=6)
    lens = np.array([n], np.int32)
    o_parts, lse_parts = split_partials(q, k, v, lens, splits=[[(0, n - 1), (n - 1, n)]])
    assert np.isneginf(lse_parts[1, 0, :, :3]).all() and (o_parts[1, 0, :, :3] == 0).all()
    assert np.isfinite(lse_parts[1, 0, :, 3]).all()
    merged, _ = merge_partials(o_parts, lse_parts)
    np.testing.assert_allclose(merged, decode_attention(q, k, v, lens), atol=1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_extreme_logits_merge_without_overflow(sign):
    # Logits of about +-1e4: exp overflows (or underflows to 0 everywhere) without the maxima.
    n = 48
    rng = np.random.default_rng(7)
    q = np.zeros((1, 2, 2, 4))
    q[..., 0] = 1.0
    k = np.zeros((1, 1, n, 4))
    k[0, 0, :, 0] = sign * 2e4 + rng.standard_normal(n)    # scale 0.5: logits ~ +-1e4
    v = rng.standard_normal((1, 1, n, 4))
    lens = np.array([n], np.int32)
    out, lse = decode_attention(q, k, v, lens, scale=0.5, return_lse=True)
    assert np.isfinite(out).all() and np.isfinite(lse).all() and abs(lse).max() > 9e3
    for splits in ([(0, 5), (5, 5), (5, n)], [(0, n - 1), (n - 1, n)]):
        merged, merged_lse = merge_partials(*split_partials(q, k, v, lens, scale=0.5,
                                                            splits=[splits]))
        np.testing.assert_allclose(merged, out, atol=1e-10)
        np.testing.assert_allclose(merged_lse, lse, rtol=1e-12)


def test_merge_of_nothing_is_zero_and_minus_infinity():
    o = np.zeros((3, 2, 5))
    lse = np.full((3, 2), -np.inf)
    out, out_lse = merge_partials(o, lse)
    assert (out == 0).all() and np.isneginf(out_lse).all()


def test_merge_propagates_nan():
    o = np.zeros((2, 1, 3))
    lse = np.array([[0.0], [np.nan]])
    assert np.isnan(merge_partials(o, lse)[0]).all()


def test_merge_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="disagree"):
        merge_partials(np.zeros((2, 3, 4)), np.zeros((2, 4)))


@pytest.mark.parametrize("num_splits", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("tile_n", [16, 64])
def test_split_kv_attention_equals_exact(num_splits, tile_n):
    lens = np.array([0, 1, 16, 17, 200], np.int32)
    q, k, v = make(len(lens), 8, 1, 2, 16, 200, seed=num_splits)
    k, v = poison_tail(k, v, lens)
    np.testing.assert_allclose(
        split_kv_attention(q, k, v, lens, num_splits=num_splits, tile_n=tile_n),
        decode_attention(q, k, v, lens), atol=1e-12)


@pytest.mark.parametrize("seqlen", [0, 1, 63, 64, 65, 1000])
@pytest.mark.parametrize("num_splits", [1, 2, 5, 16, 40])
def test_split_bounds_partition_the_keys_in_tile_runs(seqlen, num_splits):
    tile_n = 64
    b = split_bounds(seqlen, num_splits, tile_n)
    assert len(b) == num_splits
    assert b[0][0] == 0 and b[-1][1] == seqlen
    for (a0, e0), (a1, e1) in zip(b, b[1:]):
        assert a0 <= e0 == a1 <= e1                      # contiguous, in order
    n_tiles = -(-seqlen // tile_n)
    per = -(-n_tiles // num_splits) if n_tiles else 0
    for a, e in b:
        assert e == a or (a % tile_n == 0 and e - a <= per * tile_n)
    assert sum(e > a for a, e in b) == (-(-n_tiles // per) if per else 0)


def test_split_partials_refuse_bad_splits():
    q, k, v = make(1, 2, 1, 1, 8, 10)
    lens = np.array([10], np.int32)
    with pytest.raises(ValueError, match="cover each key once"):
        split_partials(q, k, v, lens, splits=[[(0, 5), (6, 10)]])
    with pytest.raises(ValueError, match="outside"):
        split_partials(q, k, v, lens, splits=[[(0, 11)]])
    with pytest.raises(ValueError, match="one list of ranges per sequence"):
        split_partials(q, k, v, lens, splits=[[(0, 10)], [(0, 10)]])


# --- the two kernels, emulated -------------------------------------------------------------------
EMULATED = [  # (Hq, Hkv, Nq, D, page_size or None, tile_m, tile_n, num_splits)
    (1, 1, 1, 64, None, 16, 64, 1),
    (8, 2, 1, 64, 64, 16, 64, 3),
    (32, 1, 1, 80, 32, 32, 32, 4),        # MQA, head dim 80 padded to 128
    (32, 8, 4, 32, None, 16, 32, 5),
    (8, 1, 16, 16, 16, 64, 16, 2),        # 128 rows: two row blocks
    (4, 4, 2, 16, 48, 16, 16, 8),         # page size 48: tiles of 16
]


@pytest.mark.parametrize("hq,hkv,nq,d,page,tm,tn,splits", EMULATED)
def test_emulated_kernels_match_the_reference(hq, hkv, nq, d, page, tm, tn, splits):
    lens = np.array([0, 1, nq, 97, 130], np.int32)
    q, k, v = make(len(lens), hq, hkv, nq, d, 130, seed=hq + nq + d, dtype=np.float32)
    ref = decode_attention(q, *poison_tail(k, v, lens), lens)
    if page is None:
        out = emulate_decode(q, *poison_tail(k, v, lens), lens, num_splits=splits, tile_m=tm,
                             tile_n=tn)
    else:
        kp, vp, table = to_paged(k, v, lens, page, seed=d)
        out = emulate_decode(q, kp, vp, lens, table, num_splits=splits, tile_m=tm, tile_n=tn,
                             combine_tile_m=max(1, tm // 2))
    assert np.isfinite(out).all(), "garbage past a sequence reached the output"
    np.testing.assert_allclose(out, ref, atol=2e-6)


@pytest.mark.parametrize("hq,hkv,nq,d,page,tm,tn,splits", EMULATED)
@pytest.mark.parametrize("tile_s", [1, 2, 8])
def test_emulated_row_combine_matches_the_reference(hq, hkv, nq, d, page, tm, tn, splits, tile_s):
    # The one-row combine, tile_s splits a step (a last step past the splits included).
    lens = np.array([0, 1, nq, 97, 130], np.int32)
    q, k, v = make(len(lens), hq, hkv, nq, d, 130, seed=hq + nq + d, dtype=np.float32)
    ref = decode_attention(q, *poison_tail(k, v, lens), lens)
    if page is None:
        out = emulate_decode(q, *poison_tail(k, v, lens), lens, num_splits=splits, tile_m=tm,
                             tile_n=tn, combine_tile_s=tile_s)
    else:
        kp, vp, table = to_paged(k, v, lens, page, seed=d)
        out = emulate_decode(q, kp, vp, lens, table, num_splits=splits, tile_m=tm, tile_n=tn,
                             combine_tile_s=tile_s)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=2e-6)


def test_emulated_partials_use_base_two_lse():
    lens = np.array([50], np.int32)
    q, k, v = make(1, 2, 1, 1, 16, 50, seed=9)
    _, lse_nat = decode_attention(q, k, v, lens, return_lse=True)
    _, _, Lse = emulate_decode(q, k, v, lens, num_splits=1, tile_n=16, return_partials=True)
    np.testing.assert_allclose(Lse[0, 0, :2], lse_nat[0, :, 0] / math.log(2), rtol=1e-12)


def test_emulated_guards_write_nan_for_bad_lengths_and_pages():
    # No host check here: what the GPU does with bad device tables, sequence by sequence.
    lens = np.array([40, 40, 40, 40], np.int32)
    q, k, v = make(4, 4, 2, 2, 16, 64, seed=10, dtype=np.float32)
    kp, vp, table = to_paged(k, v, lens, 16, seed=10)
    ref = decode_attention(q, kp, vp, lens, block_table=table)
    bad_lens = lens.copy()
    bad_lens[1] = 65                   # past the capacity (4 pages of 16)
    bad_lens[2] = -1
    bad_table = table.copy()
    bad_table[3, 1] = kp.shape[0]      # page id out of range
    out = emulate_decode(q, kp, vp, bad_lens, bad_table, num_splits=3, tile_n=16)
    assert np.isnan(out[1]).all() and np.isnan(out[2]).all() and np.isnan(out[3]).all()
    np.testing.assert_allclose(out[0], ref[0], atol=2e-6)
    # A bad entry in a slot the sequence does not use is never read.
    unused = table.copy()
    unused[0, 3] = 10 ** 6
    out = emulate_decode(q, kp, vp, lens, unused, num_splits=2, tile_n=16)
    np.testing.assert_allclose(out, ref, atol=2e-6)


def test_emulated_kernels_with_extreme_logits():
    # In float64: at |logit| ~ 1e4 fp32 itself rounds the logits by ~1e-3.
    n = 96
    rng = np.random.default_rng(11)
    q = np.zeros((1, 4, 2, 16))
    q[..., 0] = 1.0
    k = np.zeros((1, 2, n, 16))
    k[0, :, :, 0] = 1e4 * rng.choice([-1.0, 1.0], (2, n)) + rng.standard_normal((2, n))
    v = rng.standard_normal((1, 2, n, 16))
    lens = np.array([n], np.int32)
    ref = decode_attention(q, k, v, lens, scale=1.0)
    out = emulate_decode(q, k, v, lens, scale=1.0, num_splits=5, tile_n=16)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, atol=1e-10)
