"""MLA decoding (flashattn.flash_mla_with_kvcache) in the interpreter against float64 references
written from the definition: the absorbed form over the latent cache, and the unabsorbed form
over per-head keys and values expanded from it; odd lengths, empty sequences, pages out of
order, several splits, causal speculative tokens, FP8 caches, and bad input."""
import math

import pytest
import torch

import flashattn
from flashattn.kernels.mla_decode_spec import MlaDims, mla_num_splits, mla_plan, mla_tiles
from flashattn.mla import flash_mla_with_kvcache, get_mla_metadata
from flashattn.reference.mla import (absorb, mla_decode_reference, mla_unabsorbed_reference)
from criteria import seed_of

D_LAT, D_ROPE = 512, 64
D = D_LAT + D_ROPE


def _paged(lens, page, Hkv, dtype, gen, spare=1):
    """A latent cache with each sequence's pages in shuffled order, and its block table."""
    n_pages = [max(1, -(-int(n) // page)) for n in lens]
    total = sum(n_pages) + spare
    perm = torch.randperm(total, generator=gen)
    table = torch.full((len(lens), max(n_pages)), -1, dtype=torch.int32)
    i = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = perm[i:i + n].to(torch.int32)
        i += n
    table[table < 0] = int(perm[-1])                    # unused slots point at a real page
    kv = torch.randn(total, page, Hkv, D, generator=gen).to(dtype)
    return kv, table


def _run(q, kv, table, lens, *, causal, splits=None, descale=None, scale=None):
    with flashattn.interpret.enabled():
        meta, ns = get_mla_metadata(lens, q.shape[1] * q.shape[2] // kv.shape[2], kv.shape[2])
        if splits is not None:
            meta = meta.clone()
            meta[0, 0] = splits
        return flash_mla_with_kvcache(q, kv, table, lens, D_LAT, meta, ns, softmax_scale=scale,
                                      causal=causal, descale=descale)


def _check(o, lse, ro, rlse, dtype, case):
    tol = 8e-3 if dtype == torch.bfloat16 else 1.5e-3
    err = (o.double() - ro).abs().max().item()
    assert err <= tol * max(1.0, ro.abs().max().item()), f"{case}: out error {err:.3g}"
    fin = torch.isfinite(rlse)
    assert torch.equal(torch.isinf(lse), ~fin), f"{case}: +inf LSE rows differ"
    assert bool((lse[~fin] == math.inf).all()) and not bool(torch.isnan(lse).any())
    lerr = (lse.double() - rlse)[fin].abs().max().item() if fin.any() else 0.0
    assert lerr <= 2e-3, f"{case}: lse error {lerr:.3g}"
    return err, lerr


CASES = [  # (B, Sq, Hq, Hkv, lens, page, causal, dtype, splits)
    (2, 1, 16, 1, (70, 129), 64, False, torch.bfloat16, None),
    (3, 2, 16, 1, (1, 0, 200), 64, True, torch.bfloat16, 3),
    (2, 4, 16, 1, (3, 190), 64, True, torch.float16, 2),
    (2, 1, 32, 2, (65, 64), 32, False, torch.float16, 1),
    (1, 3, 8, 1, (2,), 16, True, torch.bfloat16, None),     # fewer keys than new tokens
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-Sq{c[1]}-H{c[2]}:{c[3]}-"
                         f"len{'_'.join(map(str, c[4]))}-p{c[5]}-{'causal' if c[6] else 'full'}-"
                         f"{str(c[7])[6:]}-s{c[8]}")
def test_mla_decode_matches_fp64(case):
    B, Sq, Hq, Hkv, lens, page, causal, dtype, splits = case
    gen = torch.Generator().manual_seed(seed_of(str(case)))
    lens = torch.tensor(lens, dtype=torch.int32)
    kv, table = _paged(lens, page, Hkv, dtype, gen)
    q = torch.randn(B, Sq, Hq, D, generator=gen).to(dtype)
    o, lse = _run(q, kv, table, lens, causal=causal, splits=splits)
    assert o.shape == (B, Sq, Hq, D_LAT) and o.dtype == dtype
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    ro, rlse = mla_decode_reference(q, kv, table, lens, D_LAT, causal=causal)
    _check(o, lse, ro, rlse, dtype, case)
    assert bool((o[lens == 0] == 0).all())                 # an empty sequence: output 0


@pytest.mark.parametrize("per_batch", [False, True])
def test_mla_decode_fp8_cache(per_batch):
    gen = torch.Generator().manual_seed(seed_of(f"fp8{per_batch}"))
    lens = torch.tensor([97, 40], dtype=torch.int32)
    kv, table = _paged(lens, 64, 1, torch.float32, gen)
    descale = torch.tensor([0.02, 0.05]) if per_batch else torch.tensor([0.03])
    kv8 = (kv * 4).to(torch.float8_e4m3fn)                 # stored values; real = stored x descale
    q = (torch.randn(2, 2, 16, D, generator=gen) * 3).to(torch.bfloat16)
    o, lse = _run(q, kv8, table, lens, causal=True, splits=2, descale=descale)
    ro, rlse = mla_decode_reference(q, kv8, table, lens, D_LAT, causal=True,
                                    descale=descale if per_batch else float(descale))
    _check(o, lse, ro, rlse, torch.bfloat16, f"fp8 per_batch={per_batch}")


def test_absorbed_and_unabsorbed_forms_agree_with_the_kernel():
    """DeepSeek's two forms of one layer: expanded K/V per head (128 nope + 64 rope dims, V of
    128) against the absorbed query over the latent cache, through the kernel and W_UV."""
    gen = torch.Generator().manual_seed(7)
    B, Sq, H, d_nope, d_v, page = 2, 2, 16, 128, 128, 64
    lens = torch.tensor([77, 130], dtype=torch.int32)
    n_max = int(lens.max())
    latent = torch.randn(B, n_max, D_LAT, generator=gen) * 0.5
    k_rope = torch.randn(B, n_max, D_ROPE, generator=gen)
    w_uk = torch.randn(H, d_nope, D_LAT, generator=gen) / math.sqrt(D_LAT)
    w_uv = torch.randn(H, d_v, D_LAT, generator=gen) / math.sqrt(D_LAT)
    q_nope = torch.randn(B, Sq, H, d_nope, generator=gen)
    q_rope = torch.randn(B, Sq, H, D_ROPE, generator=gen)
    scale = (d_nope + D_ROPE) ** -0.5                       # the model's scale, not 576's
    ref, ref_lse = mla_unabsorbed_reference(q_nope, q_rope, latent, k_rope, w_uk, w_uv, lens,
                                            scale, causal=True)
    # The latent cache, paged: token n of sequence b in slot n of its pages.
    kv, table = _paged(lens, page, 1, torch.float32, gen)
    for b in range(B):
        for n in range(int(lens[b])):
            kv[table[b, n // page], n % page, 0] = torch.cat([latent[b, n], k_rope[b, n]])
    q_abs, up = absorb(q_nope, q_rope, w_uk, w_uv)
    o_lat, lse_abs = mla_decode_reference(q_abs, kv, table, lens, D_LAT, softmax_scale=scale,
                                          causal=True)
    assert (up(o_lat) - ref).abs().max().item() < 1e-10     # the two forms, in fp64
    assert (lse_abs - ref_lse).abs().max().item() < 1e-10
    o, lse = _run(q_abs.to(torch.bfloat16), kv.to(torch.bfloat16), table, lens, causal=True,
                  scale=scale)
    err = (up(o.double()) - ref).abs().max().item()
    assert err < 2e-2 * ref.abs().max().item(), err
    assert (lse.double() - ref_lse).abs().max().item() < 2e-2


def test_plan_and_metadata():
    assert mla_tiles(rows=128, page_size=64, arch="sm_90") == (64, 32)
    assert mla_tiles(rows=8, page_size=16, arch="sm_90") == (16, 16)
    assert mla_tiles(rows=128, page_size=64, arch="sm_90", fp8=True) == (64, 16)
    # DeepSeek-V3 decode: 128 heads, B=64 on 132 SMs: 128 programs, one split.
    assert mla_num_splits(B=64, Hkv=1, rows=128, max_seqlen=32768, page_size=64,
                          sm_count=132, arch="sm_90") == 1
    # B=1: the cache is split to fill the GPU: 66 wanted for 2 row blocks, dealt as runs of
    # cdiv(1024 tiles, 66) = 16 tiles: 64 splits, none empty.
    assert mla_num_splits(B=1, Hkv=1, rows=128, max_seqlen=32768, page_size=64,
                          sm_count=132, arch="sm_90") == 64
    assert mla_num_splits(B=1, Hkv=1, rows=128, max_seqlen=0, page_size=64,
                          sm_count=132, arch="sm_90") == 1
    dims = MlaDims(B=2, Sq=1, Hq=128, Hkv=1, D=576, Dv=512, page_size=64, max_pages=8,
                   num_pages=16)
    p = mla_plan(dims, num_splits=4, causal=False, fp8=False, arch="sm_90")
    assert p["split_grid"] == (2, 4, 2) and p["opart_shape"] == (4, 2, 128, 512)
    assert mla_plan(dims, num_splits=1, causal=False, fp8=False)["combine_grid"] is None
    with flashattn.interpret.enabled():
        meta, ns = get_mla_metadata(torch.tensor([5, 300], dtype=torch.int32), 32, 1)
    assert ns.shape == (3,) and ns.dtype == torch.int32 and int(ns[0]) == 0


@pytest.mark.parametrize("mutate, exc, words", [
    (dict(q=lambda q: q.float()), TypeError, "q must be"),
    (dict(kv=lambda kv: kv[..., :512].contiguous()), ValueError, "head dim"),
    (dict(table=lambda t: t.long()), TypeError, "block_table"),
    (dict(lens=lambda n: n + 1000), ValueError, "cache_seqlens must be in"),
    (dict(table=lambda t: t + 100), ValueError, "page ids outside"),
    (dict(head_dim_v=500), ValueError, "head_dim_v"),
    (dict(kv=lambda kv: torch.cat([kv] * 3, dim=2)), ValueError, "multiple"),
    (dict(descale=0.5), ValueError, "FP8 k_cache only"),
    (dict(meta_rows=64), ValueError, "metadata was made for"),
])
def test_bad_input_is_named(mutate, exc, words):
    gen = torch.Generator().manual_seed(1)
    lens = torch.tensor([40, 64], dtype=torch.int32)
    kv, table = _paged(lens, 64, 1, torch.bfloat16, gen)
    q = torch.randn(2, 1, 16, D, generator=gen).to(torch.bfloat16)
    q = mutate.get("q", lambda x: x)(q)
    kv = mutate.get("kv", lambda x: x)(kv)
    table = mutate.get("table", lambda x: x)(table)
    lens2 = mutate.get("lens", lambda x: x)(lens)
    with flashattn.interpret.enabled():
        meta, ns = get_mla_metadata(lens, mutate.get("meta_rows", 16), 1)
    with flashattn.interpret.enabled(), pytest.raises(exc, match=words):
        flash_mla_with_kvcache(q, kv, table, lens2, mutate.get("head_dim_v", D_LAT), meta, ns,
                               descale=mutate.get("descale"))


def test_fp8_cache_needs_descale():
    gen = torch.Generator().manual_seed(2)
    lens = torch.tensor([10], dtype=torch.int32)
    kv, table = _paged(lens, 64, 1, torch.float32, gen)
    q = torch.randn(1, 1, 16, D, generator=gen).to(torch.bfloat16)
    with flashattn.interpret.enabled():
        meta, ns = get_mla_metadata(lens, 16, 1)
    with flashattn.interpret.enabled(), pytest.raises(ValueError, match="descale"):
        flash_mla_with_kvcache(q, kv.to(torch.float8_e4m3fn), table, lens, D_LAT, meta, ns)


def test_cpu_tensors_without_the_interpreter_are_refused():
    lens = torch.tensor([10], dtype=torch.int32)
    with pytest.raises(ValueError, match="interpreter"):
        get_mla_metadata(lens, 16, 1)
