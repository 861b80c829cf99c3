"""MLA decoding on the GPU (``flashattn.flash_mla_with_kvcache``) at DeepSeek-V3's shape against
the float64 reference written from the definition (``flashattn.reference.mla``).

Pass criterion, as tests/test_decode_gpu.py: every output written and finite, and the max error
against the fp64 reference at most twice PyTorch's error computing the same attention in the
inputs' precision (SDPA over the gathered latent, a boolean mask) plus a small floor; the LSE
within 2e-3 where finite and +inf exactly where no key is visible. Every cache slot past a
sequence's length and every page no sequence uses holds NaN: a read past a length fails.

Shapes: Hq 128 (and 16) query heads over one latent head of 512 + 64, B 4, caches of 1K-4K
tokens (ragged, 0 and 1 included), pages of 64 in shuffled order, Sq 1, 2, 4 (causal among the
new tokens), bf16 and fp16, the split count chosen by get_mla_metadata or forced, the FP8 cache
with a per-sequence and a per-tensor descale, and one call captured in a CUDA graph.

    python -m pytest -o addopts="" -m gpu tests/test_mla_gpu.py
"""
import math

import pytest
from criteria import assert_flash_criterion, seed_of

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

D_LAT, D_ROPE, PAGE = 512, 64, 64
D = D_LAT + D_ROPE

CASES = [  # (Hq, Sq, lens, causal, dtype, splits, fp8) fp8: None, "batch" or "tensor"
    (128, 1, (1024, 4096, 1, 2049), False, "bfloat16", None, None),
    (128, 1, (4096, 4096, 4096, 4096), True, "bfloat16", None, None),
    (128, 2, (4096, 0, 1500, 3000), True, "bfloat16", 8, None),
    (128, 4, (1024, 2048, 4096, 7), True, "float16", None, None),
    (128, 1, (1000, 3000, 2, 4096), False, "float16", 1, None),
    (16, 3, (2, 4096, 1023, 65), True, "bfloat16", None, None),
    (128, 1, (4096, 1024, 3071, 0), True, "bfloat16", None, "batch"),
    (128, 2, (2048, 4096, 5, 1024), True, "float16", 4, "tensor"),
]


def _paged(lens, Hkv, dtype, gen, device):
    """A paged latent cache (pages shuffled, NaN everywhere no sequence has a token) and its
    block table; the values are drawn in float32 and rounded to ``dtype``."""
    n_pages = [max(1, -(-int(n) // PAGE)) for n in lens]
    total = sum(n_pages) + 2
    perm = torch.randperm(total, generator=gen)
    table = torch.full((len(lens), max(n_pages)), int(perm[-1]), dtype=torch.int32)
    kv = torch.full((total, PAGE, Hkv, D), math.nan)
    i = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = perm[i:i + n].to(torch.int32)
        vals = torch.randn(int(lens[b]), Hkv, D, generator=gen)
        for p in range(n):
            chunk = vals[p * PAGE:(p + 1) * PAGE]
            kv[table[b, p], :len(chunk)] = chunk
        i += n
    return kv.to(dtype).to(device), table.to(device)


def _torch_same_precision(q, kv, table, lens, causal, descale):
    """PyTorch's own error: SDPA in q's dtype over each sequence's gathered latent."""
    from flashattn.reference.mla import gather_pages
    B, Sq, Hq, _ = q.shape
    out = torch.zeros(B, Sq, Hq, D_LAT, dtype=q.dtype, device=q.device)
    kv_cpu, table_cpu = kv.cpu(), table.cpu()
    for b in range(B):
        n = int(lens[b])
        if n == 0:
            continue
        k = gather_pages(kv_cpu, table_cpu, b, n)[:, 0].to(q.device).to(q.dtype)   # (n, D)
        if descale is not None:
            k = (k.float() * float(descale[b])).to(q.dtype)
        pos = n - Sq + torch.arange(Sq, device=q.device)
        vis = (torch.arange(n, device=q.device)[None] <= pos[:, None]) if causal else \
            torch.ones(Sq, n, dtype=torch.bool, device=q.device)
        qq = q[b].transpose(0, 1)                                     # (Hq, Sq, D)
        o = torch.nn.functional.scaled_dot_product_attention(
            qq[None], k[None, None], k[None, None, :, :D_LAT], attn_mask=vis, scale=D ** -0.5)
        out[b] = torch.nan_to_num(o[0].transpose(0, 1), nan=0.0)
    return out


def _meta(lens, Sq, Hq, splits):
    import flashattn
    meta, ns = flashattn.get_mla_metadata(lens, Sq * Hq, 1)
    if splits is not None:
        meta = meta.clone()
        meta[0, 0] = splits
    return meta, ns


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"H{c[0]}-Sq{c[1]}-"
                         f"{'_'.join(map(str, c[2]))}-{'causal' if c[3] else 'full'}-{c[4]}-"
                         f"s{c[5]}-{c[6] or 'nofp8'}")
def test_mla_decode_gpu_matches_fp64(case):
    check_case(case, torch.device("cuda"))


def check_case(case, dev):
    import flashattn
    from flashattn.reference.mla import mla_decode_reference
    Hq, Sq, lens, causal, dtype, splits, fp8 = case
    seed = seed_of(str(case))
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    B = len(lens)
    if fp8:
        kv, table = _paged(lens, 1, torch.float32, gen, dev)
        kv8 = (kv * 8).to(torch.float8_e4m3fn)
        if fp8 == "batch":
            descale = torch.tensor([0.1, 0.15, 0.2, 0.125], device=dev)[:B]
            kw = dict(descale=descale)
        else:
            descale = torch.full((B,), 0.125, device=dev)
            kw = dict(descale=0.125)
        kv_used = kv8
    else:
        kv_used, table = _paged(lens, 1, dt, gen, dev)
        descale, kw = None, {}
    q = torch.randn(B, Sq, Hq, D, generator=gen).to(dt).to(dev)
    meta, ns = _meta(lens_t, Sq, Hq, splits)
    out, lse = flashattn.flash_mla_with_kvcache(q, kv_used, table, lens_t, D_LAT, meta, ns,
                                                causal=causal, **kw)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    assert out.shape == (B, Sq, Hq, D_LAT) and out.dtype == dt
    assert lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    ref, rlse = mla_decode_reference(q.cpu(), kv_used.cpu(), table.cpu(), lens_t.cpu(), D_LAT,
                                     causal=causal,
                                     descale=None if descale is None else descale.cpu())
    pt = _torch_same_precision(q, kv_used, table, lens_t, causal, descale)
    floor = 1e-3 if dt == torch.float16 else 8e-3
    assert_flash_criterion(out.cpu(), ref.float(), pt.cpu(), floor, seed=seed)
    lse = lse.cpu().double()
    fin = torch.isfinite(rlse)
    assert torch.equal(torch.isinf(lse) & (lse > 0), ~fin), f"seed {seed}: +inf LSE rows differ"
    if fin.any():
        err = (lse - rlse)[fin].abs().max().item()
        assert err <= 2e-3, f"seed {seed}: lse error {err:.3g}"


def test_mla_decode_captures_in_a_cuda_graph():
    """A decode step replayed from a CUDA graph (as serving engines run it) gives the eager
    call's output: the call makes no host synchronisation on the GPU path."""
    import flashattn
    gen = torch.Generator().manual_seed(11)
    dev = torch.device("cuda")
    lens = torch.tensor([4096, 1000, 2047, 64], dtype=torch.int32, device=dev)
    kv, table = _paged(lens.tolist(), 1, torch.bfloat16, gen, dev)
    q = torch.randn(4, 1, 128, D, generator=gen).to(torch.bfloat16).to(dev)
    meta, ns = flashattn.get_mla_metadata(lens, 128, 1)
    eager, _ = flashattn.flash_mla_with_kvcache(q, kv, table, lens, D_LAT, meta, ns, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):                          # warm-up outside the capture
        flashattn.flash_mla_with_kvcache(q, kv, table, lens, D_LAT, meta, ns, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = flashattn.flash_mla_with_kvcache(q, kv, table, lens, D_LAT, meta, ns,
                                                  causal=True)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
