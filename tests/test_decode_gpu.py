"""Split-KV decoding on the GPU (``flashattn.decode``, issue 12) against the fp32 reference.

Pass criterion, as tests/test_kernels_gpu.py: the max error against the fp32 reference
(``flashattn.reference.decode_attention``) is at most twice PyTorch's error computing the same
attention in the inputs' precision, plus a small floor. Outputs are poisoned with NaN before
each launch (``out=``), and every cache slot past a sequence's length, and every page no
sequence uses, holds NaN: an unwritten output or a read past a length fails.

The matrix is sampled (every value of every axis, not every product): Nq 1, 2, 4, 16; GQA 1:1
to 32:1; fp16 and bf16; head dims 64, 128, 256 (and 80, padded); contiguous caches and pages
of 16, 64, 128, 256 tokens; ragged lengths in one batch, 0 and 1 included. Seeds come from the
test id (``zlib.crc32``), and every failure message names its seed.

    python -m pytest -o addopts="" -m gpu tests/test_decode_gpu.py -n 8
"""
import math

import pytest
from criteria import assert_flash_criterion, seed_of

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

NQ = (1, 2, 4, 16)
HEADS = ((8, 8), (8, 2), (32, 8), (8, 1), (32, 1), (4, 4))      # 1:1, 4:1, 4:1, 8:1, 32:1
DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 256, 80)
PAGES = (None, 16, 64, 128, 256)                                  # None: contiguous cache
LENGTHS = (                                                       # (capacity, lengths)
    (256, (0, 1, 17, 256)),
    (1000, (1000, 999, 1, 513)),
    (4096, (4096, 0, 2049, 3)),
    (300, (16, 300, 2, 100)),
    (33000, (33000, 1)),                                          # many splits
)
CASES_N = 24


def sampled_cases():
    cases = []
    for c in range(CASES_N):
        nq = NQ[c % len(NQ)]
        hq, hkv = HEADS[c % len(HEADS)]
        dtype = DTYPES[(c // 2) % len(DTYPES)]
        d = HEAD_DIMS[(c // 3) % len(HEAD_DIMS)]
        page = PAGES[(c + c // len(PAGES)) % len(PAGES)]
        cap, lens = LENGTHS[c % len(LENGTHS)]
        cases.append(pytest.param(nq, hq, hkv, dtype, d, page, cap, lens,
                                  id=f"nq{nq}-h{hq}:{hkv}-{dtype[:2]}-d{d}-"
                                     f"{'page' + str(page) if page else 'contig'}-cap{cap}-"
                                     f"lens{'_'.join(map(str, lens))}"))
    return cases


def make_cache(lens, hq, hkv, nq, d, dtype, cap, page, *, seed, magnitude=1.0):
    """q, k_cache, v_cache, cache_seqlens, block_table on the GPU; NaN wherever nothing may be
    read (slots past each length, pages no sequence uses); pages in shuffled order."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    B = len(lens)
    q = (torch.randn(B, hq, nq, d, generator=g, device="cuda") * magnitude).to(dt)
    k = (torch.randn(B, hkv, cap, d, generator=g, device="cuda") * magnitude).to(dt)
    v = torch.randn(B, hkv, cap, d, generator=g, device="cuda").to(dt)
    n = torch.arange(cap, device="cuda")
    lens_t = torch.tensor(lens, dtype=torch.int32, device="cuda")
    past = (n[None, :] >= lens_t[:, None].long())[:, None, :, None]       # (B, 1, cap, 1)
    k, v = k.masked_fill(past, math.nan), v.masked_fill(past, math.nan)
    if page is None:
        return q, k, v, lens_t, None
    max_pages = -(-cap // page)
    num_pages = B * max_pages + 3
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
    kp = torch.full((num_pages, hkv, page, d), math.nan, dtype=dt, device="cuda")
    vp = torch.full_like(kp, math.nan)
    table = torch.full((B, max_pages), -1, dtype=torch.int32)
    for b in range(B):
        for p in range(-(-lens[b] // page)):
            pid = int(order[b * max_pages + p])
            table[b, p] = pid
            m = min(page, cap - p * page)
            kp[pid, :, :m] = k[b, :, p * page:p * page + m]
            vp[pid, :, :m] = v[b, :, p * page:p * page + m]
    return q, kp, vp, lens_t, table.cuda()


def torch_same_precision(q, k_cache, v_cache, lens, table, scale):
    """Decode attention in PyTorch, in the inputs' precision (the error budget's yardstick)."""
    B, Hq, Nq, D = q.shape
    Hkv = k_cache.shape[1]
    L = max(int(lens.max()), 1)
    n = torch.arange(L, device=q.device)
    if table is None:
        k, v = k_cache[:, :, :L], v_cache[:, :, :L]
    else:
        page = k_cache.shape[2]
        pages = table.long().clamp(min=0)[:, n // page]                   # (B, L)
        k = k_cache[pages, :, n % page].permute(0, 2, 1, 3)               # (B, Hkv, L, D)
        v = v_cache[pages, :, n % page].permute(0, 2, 1, 3)
    valid = n[None, :] < lens[:, None].long()                             # (B, L)
    k = k.masked_fill(~valid[:, None, :, None], 0).repeat_interleave(Hq // Hkv, 1)
    v = v.masked_fill(~valid[:, None, :, None], 0).repeat_interleave(Hq // Hkv, 1)
    s = (q @ k.transpose(-1, -2)) * scale                                 # (B, Hq, Nq, L)
    pos = lens[:, None].long() - Nq + torch.arange(Nq, device=q.device)   # (B, Nq)
    see = (n[None, None, :] <= pos[:, :, None]) & valid[:, None, :]       # (B, Nq, L)
    s = s.masked_fill(~see[:, None], -math.inf)
    p = torch.softmax(s.float(), dim=-1).nan_to_num(0.0).to(q.dtype)
    return p @ v


def run(q, k, v, lens, table, **kw):
    from flashattn.decoding import decode
    out = torch.full(q.shape, math.nan, dtype=q.dtype, device=q.device)   # contiguous
    decode(q, k, v, lens, block_table=table, out=out, **kw)
    torch.cuda.synchronize()
    return out


def check(out, q, k, v, lens, table, scale, floor, *, seed):
    from flashattn.reference import decode_attention
    ref = decode_attention(q, k, v, lens, block_table=table, scale=scale)
    pt = torch_same_precision(q, k, v, lens, table, scale)
    err, err_pt = assert_flash_criterion(out, ref, pt, floor, seed=seed)
    # Rows that see no key are exactly 0, as FlashAttention's.
    Nq = q.shape[2]
    for b, n in enumerate(lens.tolist()):
        empty = max(0, min(Nq, Nq - n))
        assert (out[b, :, :empty] == 0).all(), f"seed {seed}: empty rows of sequence {b} not 0"
    return err, err_pt


def floor_of(dtype):
    return 1e-3 if dtype == "float16" else 8e-3


@pytest.mark.parametrize("nq,hq,hkv,dtype,d,page,cap,lens", sampled_cases())
def test_decode_matches_reference(nq, hq, hkv, dtype, d, page, cap, lens, request,
                                  record_property):
    seed = seed_of(request.node.callspec.id)
    q, k, v, lens_t, table = make_cache(lens, hq, hkv, nq, d, dtype, cap, page, seed=seed)
    scale = 1.0 / math.sqrt(d)
    out = run(q, k, v, lens_t, table)
    err, err_pt = check(out, q, k, v, lens_t, table, scale, floor_of(dtype), seed=seed)
    record_property("seed", seed)
    record_property("err_ratio", err / max(err_pt, 1e-12))


@pytest.mark.parametrize("num_splits", [1, 2, 7, 64, 300])
def test_any_split_count_gives_the_same_answer(num_splits, request):
    # 300 splits of 1000 keys: most are empty (their partials must weigh nothing).
    seed = seed_of(request.node.callspec.id)
    q, k, v, lens, table = make_cache((1000, 0, 1, 130), 32, 8, 2, 128, "float16", 1000, 64,
                                      seed=seed)
    out = run(q, k, v, lens, table, num_splits=num_splits)
    check(out, q, k, v, lens, table, 128 ** -0.5, 1e-3, seed=seed)


@pytest.mark.parametrize("num_splits", [2, 7, 16, 64, 300])
@pytest.mark.parametrize("nq", [1, 4, 16])
def test_row_combine_gives_the_same_answer(num_splits, nq, monkeypatch, request):
    # The one-row combine forced on (by default only for few rows and many splits, E21); 300
    # splits of 1000 keys leave most splits empty and need several TILE_S steps.
    from flashattn.kernels import decode_spec as kernels   # the rule's module
    monkeypatch.setattr(kernels, "DECODE_ROW_COMBINE_MAX", 10 ** 6)
    monkeypatch.setattr(kernels, "DECODE_ROW_COMBINE_MIN_SPLITS", 2)
    seed = seed_of(request.node.callspec.id)
    q, k, v, lens, table = make_cache((1000, 0, 1, 130), 32, 8, nq, 128, "float16", 1000, 64,
                                      seed=seed)
    out = run(q, k, v, lens, table, num_splits=num_splits)
    check(out, q, k, v, lens, table, 128 ** -0.5, 1e-3, seed=seed)


@pytest.mark.parametrize("num_splits", [2, 7, 16, 64, 300])
@pytest.mark.parametrize("nq", [1, 4, 16])
def test_fused_merge_gives_the_same_answer(num_splits, nq, monkeypatch, request):
    # E23: the last split of each row block merges (an atomic count, no second launch);
    # called three times so that a counter not set back to 0 would show; contiguous cache.
    from flashbook.ladder import variants
    monkeypatch.setattr(variants, "DECODE_FUSED_COMBINE", True)
    seed = seed_of(request.node.callspec.id)
    q, k, v, lens, table = make_cache((1000, 0, 1, 130), 32, 8, nq, 128, "float16", 1000, None,
                                      seed=seed)
    first = variants.decode(q, k, v, lens, num_splits=num_splits)
    check(first, q, k, v, lens, table, 128 ** -0.5, 1e-3, seed=seed)
    for _ in range(2):
        again = variants.decode(q, k, v, lens, num_splits=num_splits)
        assert torch.equal(again, first), f"seed {seed}: a repeated call differs"
    from flashbook.ladder.variants import _COUNTERS
    assert all((b == 0).all() for bufs in _COUNTERS.values() for b in bufs)


def test_fused_merge_in_a_cuda_graph(monkeypatch):
    # Captured (its counters zeroed inside the graph), replayed as lengths change.
    from flashattn.reference import decode_attention
    from flashbook.ladder import variants
    from flashbook.ladder.variants import decode
    monkeypatch.setattr(variants, "DECODE_FUSED_COMBINE", True)
    seed = 23
    q, k, v, lens, _ = make_cache((2048, 1024, 1, 700), 32, 8, 1, 128, "float16", 2048, None,
                                  seed=seed)
    k.nan_to_num_(0.0)
    v.nan_to_num_(0.0)
    out = torch.full_like(q, math.nan)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            decode(q, k, v, lens, num_splits=16, out=out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(q, k, v, lens, num_splits=16, out=out)
    for new in ((2048, 1024, 1, 700), (1, 2048, 0, 5), (17, 1300, 2047, 64)):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        ref = decode_attention(q, k, v, lens)
        err = (out.float() - ref).abs().max().item()
        assert err < 2e-3, f"seed {seed}: lengths {new}: error {err:.3g} after replay"


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_stay_finite(dtype):
    seed = 7
    q, k, v, lens, table = make_cache((512, 77), 8, 2, 4, 64, dtype, 512, 64, seed=seed,
                                      magnitude=6.0)
    out = run(q, k, v, lens, table, num_splits=5)
    from flashattn.reference import decode_attention
    ref = decode_attention(q, k, v, lens, block_table=table)
    assert torch.isfinite(out).all(), f"seed {seed}: infinite outputs"
    err = (out.float() - ref).abs().max().item()
    assert err < 3e-2, f"seed {seed}: max error {err:.3g}"


def test_bad_device_tables_give_nan_for_their_sequences_only():
    seed = 11
    q, k, v, lens, table = make_cache((256, 256, 256, 100), 8, 2, 1, 64, "float16", 256, 64,
                                      seed=seed)
    good = run(q, k, v, lens, table)
    bad_lens, bad_table = lens.clone(), table.clone()
    bad_lens[1] = 257                          # past the capacity (4 pages of 64)
    bad_lens[2] = -5
    bad_table[3, 1] = k.shape[0] + 10          # a page that does not exist
    out = run(q, k, v, bad_lens, bad_table, check_values=False)
    assert torch.isnan(out[1:]).all(), f"seed {seed}: a bad sequence gave numbers"
    assert torch.equal(out[0], good[0]), f"seed {seed}: a good sequence changed"
    with pytest.raises(ValueError, match="outside"):
        run(q, k, v, bad_lens, bad_table, check_values=True)


def test_vllm_cache_layout_as_a_view():
    # (num_pages, page_size, Hkv, D), as vLLM and FlashAttention keep it, passed transposed.
    seed = 12
    q, k, v, lens, table = make_cache((300, 45), 16, 4, 1, 128, "bfloat16", 320, 64, seed=seed)
    k_nhd, v_nhd = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    out = run(q, k_nhd.transpose(1, 2), v_nhd.transpose(1, 2), lens, table)
    check(out, q, k, v, lens, table, 128 ** -0.5, 8e-3, seed=seed)


def test_non_contiguous_query():
    seed = 13
    q, k, v, lens, table = make_cache((200, 31), 8, 2, 4, 64, "float16", 200, None, seed=seed)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)      # (B, Hq, Nq, D), strided
    assert not q_view.is_contiguous()
    out = run(q_view, k, v, lens, table)
    check(out, q, k, v, lens, table, 0.125, 1e-3, seed=seed)


def test_pages_past_two_to_the_31_elements():
    # A pool of 4.5 GB per cache: page ids times the page stride pass 2^31 elements (int32
    # index arithmetic would wrap). The sequences' pages are the last ones of the pool.
    seed, page, d = 31, 16, 64
    num_pages = (1 << 31) // (page * d) + 4096
    dt = torch.float16
    k = torch.empty((num_pages, 1, page, d), dtype=dt, device="cuda")
    v = torch.empty_like(k)
    g = torch.Generator(device="cuda").manual_seed(seed)
    lens = torch.tensor([1000, 37], dtype=torch.int32, device="cuda")
    table = torch.arange(num_pages - 128, num_pages, dtype=torch.int32, device="cuda")
    table = table.view(2, 64)
    k[num_pages - 128:] = torch.randn((128, 1, page, d), generator=g, device="cuda").to(dt)
    v[num_pages - 128:] = torch.randn((128, 1, page, d), generator=g, device="cuda").to(dt)
    q = torch.randn((2, 4, 1, d), generator=g, device="cuda").to(dt)
    out = run(q, k, v, lens, table)
    from flashattn.reference import decode_attention
    small_k, small_v = k[num_pages - 128:], v[num_pages - 128:]
    ref = decode_attention(q, small_k, small_v, lens, block_table=table - (num_pages - 128))
    err = (out.float() - ref).abs().max().item()
    assert err < 2e-3, f"seed {seed}: max error {err:.3g} with a pool past 2^31 elements"


@pytest.mark.parametrize("page", [None, 64])
def test_cuda_graph_replays_as_lengths_change(page, record_property):
    """Capture one decode step, then change lengths, pages and cache contents in place and
    replay: each replay must match the reference for the new values."""
    import time

    from flashattn.decoding import decode
    from flashattn.reference import decode_attention
    seed, cap = 21, 2048
    q, k, v, lens, table = make_cache((2048, 1024, 1, 700), 32, 8, 1, 128, "float16", cap,
                                      page, seed=seed)
    if table is not None:        # every slot mapped: any new length has its pages
        spare = [p for p in range(k.shape[0]) if p not in set(table.flatten().tolist())]
        flat = table.flatten()
        holes = (flat < 0).nonzero().flatten().tolist()
        for i, p in zip(holes, spare):
            flat[i] = p
        table.copy_(flat.view_as(table))
        k.nan_to_num_(0.0)
        v.nan_to_num_(0.0)
    else:
        k.nan_to_num_(0.0)
        v.nan_to_num_(0.0)
    out = torch.full_like(q, math.nan)
    kw = dict(block_table=table, num_splits=16, out=out)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                      # warm up (compiles) off the capture
        for _ in range(2):
            decode(q, k, v, lens, **kw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode(q, k, v, lens, **kw)
    g = torch.Generator(device="cuda").manual_seed(seed)
    for new in ((2048, 1024, 1, 700), (1, 2048, 0, 5), (17, 1300, 2047, 64), (0, 0, 0, 1)):
        lens.copy_(torch.tensor(new, dtype=torch.int32))
        q.copy_(torch.randn(q.shape, generator=g, device="cuda"))
        k.add_(0.1 * torch.randn(k.shape, generator=g, device="cuda").to(k.dtype))
        if table is not None:
            table.copy_(table.flip(0))                 # new page assignments too
        out.fill_(math.nan)
        graph.replay()
        torch.cuda.synchronize()
        ref = decode_attention(q, k, v, lens, block_table=table)
        assert not torch.isnan(out).any(), f"lengths {new}: unwritten outputs after replay"
        err = (out.float() - ref).abs().max().item()
        assert err < 5e-3, f"lengths {new}: max error {err:.3g} after replay"
    # Host overhead per call (recorded, not asserted: the issue asks for the numbers).
    for name, fn in (("eager", lambda: decode(q, k, v, lens, **kw)), ("graph", graph.replay)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(50):
            fn()
        host = (time.perf_counter() - t0) / 50
        torch.cuda.synchronize()
        record_property(f"host_us_{name}", round(host * 1e6, 1))
