"""Programmatic dependent launch (E27) on the GPU: the decode's combine and the backward's
dK/dV and dQ passes launched as dependents give the same bits as plain launches, eagerly and
replayed from a CUDA graph (where the dependency becomes a programmatic edge).

    python -m pytest -o addopts="" -m gpu tests/test_pdl_gpu.py
"""
from unittest import mock

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

NAN = float("nan")


def _flags(**flags):
    from contextlib import ExitStack

    from flashbook.ladder import variants as kernels   # the book's switches
    stack = ExitStack()
    for k, v in flags.items():
        stack.enter_context(mock.patch.object(kernels, k, v))
    return stack


@pytest.mark.parametrize("trigger", (False, True))
@pytest.mark.parametrize("B,N,page", ((1, 4096, None), (8, 1000, None), (2, 33000, None),
                                      (3, 2048, 64)))
def test_decode_pdl_equal(B, N, page, trigger):
    from flashattn.decoding import decode as library_decode
    from flashbook.ladder.variants import decode
    g = torch.Generator(device="cuda").manual_seed(B * 100 + N)
    q = torch.randn(B, 32, 1, 128, generator=g, device="cuda", dtype=torch.float16)
    lens = torch.randint(1, N + 1, (B,), generator=g, device="cuda", dtype=torch.int32)
    lens[0] = N
    if page is None:
        k, v = (torch.randn(B, 8, N, 128, generator=g, device="cuda", dtype=torch.float16)
                for _ in range(2))
        table = None
    else:
        pages = B * (-(-N // page))
        k, v = (torch.randn(pages, 8, page, 128, generator=g, device="cuda",
                            dtype=torch.float16) for _ in range(2))
        table = torch.randperm(pages, generator=g, device="cuda").to(torch.int32).view(B, -1)
    want = library_decode(q, k, v, lens, block_table=table)
    with _flags(DECODE_PDL=True, DECODE_PDL_TRIGGER=trigger):
        out = torch.full_like(want, NAN)
        decode(q, k, v, lens, block_table=table, out=out)
        torch.cuda.synchronize()
        assert torch.equal(out, want)
        # A CUDA graph of three steps, replayed after the lengths change.
        outs = [torch.full_like(want, NAN) for _ in range(3)]
        gr = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            decode(q, k, v, lens, block_table=table, out=outs[0], num_splits=8)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(gr):
            for o in outs:
                decode(q, k, v, lens, block_table=table, out=o, num_splits=8)
        lens.sub_(1).clamp_(min=0)
        gr.replay()
        torch.cuda.synchronize()
    want2 = library_decode(q, k, v, lens, block_table=table, num_splits=8)
    for o in outs:
        assert torch.equal(o, want2)


@pytest.mark.parametrize("mode", (1, 2))
@pytest.mark.parametrize("causal", (True, False))
@pytest.mark.parametrize("N", (1000, 4096))
def test_backward_pdl_equal(N, causal, mode):
    from flashattn.autograd import attention_forward
    from flashattn.launch_bwd import attention_backward as library_backward
    from flashbook.ladder.variants import attention_backward
    g = torch.Generator(device="cuda").manual_seed(N + causal)
    q = torch.randn(2, 16, N, 128, generator=g, device="cuda", dtype=torch.float16)
    k, v, do = (torch.randn(2, 4 if t < 2 else 16, N, 128, generator=g, device="cuda",
                            dtype=torch.float16) for t in range(3))
    with torch.no_grad():
        out, lse = attention_forward(q, k, v, causal=causal)
    want = library_backward(q, k, v, out, do, lse, causal=causal)
    with _flags(BWD_PDL=mode):
        for _ in range(2):
            grads = tuple(torch.full_like(t, NAN) for t in (q, k, v))
            got = attention_backward(q, k, v, out, do, lse, causal=causal, grads=grads)
            torch.cuda.synchronize()
            for a, b in zip(got, want):
                assert torch.equal(a, b)
