"""Compile once: a sequence of calls over many lengths, batch sizes and window sizes launches a
fixed set of kernel specialisations.

``flashattn.dispatch.record_launches`` records each launch's key (kernel function, launch hints,
``ct.Constant`` values, and cuTile's array classes); the calls run in the interpreter with
``run=False`` (recorded, not executed: shapes are what matter). A kernel may specialise on
architecture, dtype, head dim, mask/mod and tile configuration; of the shape, only on a
length-class flag (``LENGTH_CLASS_FLAGS``: whether the keys fill whole tiles), never on a
length, batch or window size. cuTile's JIT also keys every array dimension on "is 1" and "is a
multiple of 16" (``launch_key``'s array classes): bounded, reported, not a constant of ours.
"""
import collections

import pytest
import torch

import flashattn
from flashattn import flash_attn_interface as fai
from flashattn.dispatch import record_launches

pytestmark = pytest.mark.usefixtures("one_thread")

# Two values at most whatever the lengths: whether the keys fill the last tile (EVEN_K), a
# block's tail (TAIL), one split writes the output (FINAL), and the varlen forward's query tiles
# per program (Q_TILES: 1 for long sequences on average, the table's value for short ones).
LENGTH_CLASS_FLAGS = {"EVEN_K", "TAIL", "FINAL", "Q_TILES"}


def specialisations(records):
    """{kernel name: set of (function identity, hints, constants)} of the recorded launches."""
    by = collections.defaultdict(set)
    for r in records:
        by[r["kernel"].rsplit(".", 1)[-1]].add((id(r["fn"]), r["hints"], r["constants"]))
    return by


def assert_compile_once(records, what):
    """No kernel's function or constant varies across the sweep except a length-class flag."""
    by = specialisations(records)
    assert by, f"{what}: nothing launched"
    counts = {}
    for name, keys in by.items():
        fns = {k[0] for k in keys}
        assert len(fns) == 1, (f"{what}: {name} was built {len(fns)} times (a kernel per "
                               "closure value: per-length or per-window compilation)")
        hints = {k[1] for k in keys}
        assert len(hints) == 1, f"{what}: {name} launched with {len(hints)} hint sets"
        values = collections.defaultdict(set)
        for k in keys:
            for n, v in k[2]:
                values[n].add(v)
        varying = {n: sorted(map(str, v)) for n, v in values.items() if len(v) > 1}
        bad = {n: v for n, v in varying.items() if n not in LENGTH_CLASS_FLAGS}
        assert not bad, f"{what}: {name} specialises on the shape through {bad}"
        assert len(keys) <= 2 ** len(varying)
        counts[name] = len(keys)
    print(f"{what}: {counts}")
    return counts


def _q(*shape):
    return torch.randn(*shape, dtype=torch.float16)


def sweep(kinds, cases, what):
    """Each kind (a call) over every case, recorded per kind; each kind must compile once."""
    counts = {}
    for name, call in kinds.items():
        with flashattn.interpret.enabled(), record_launches(run=False) as rec:
            for case in cases:
                call(*case)
        counts[name] = assert_compile_once(rec, f"{what}: {name}")
    return counts


LENGTHS = (17, 40, 64, 100, 129, 257)


CASES = list(zip(LENGTHS, (1, 2, 3, 1, 2, 3), ((8, 0), (32, 4), (100, 7), (5, 5), (64, 0),
                                                  (1, 3)), (0, 3, 9, 1, 30, 2)))


def _dense(n, b, pos, **kw):
    k = _q(b, 2, n + pos, 32)
    return flashattn.attention(_q(b, 4, n, 32), k, k, **kw)


def test_attention_forward_and_backward():
    def backward(n, b, w, pos):
        q = _q(b, 2, n, 32).requires_grad_()
        flashattn.attention(q, q, q, causal=True).sum().backward()
    sweep({"full": lambda n, b, w, pos: _dense(n, b, 0),
           "causal at input_pos": lambda n, b, w, pos: _dense(n, b, pos, causal=True,
                                                              input_pos=pos),
           "causal forward+backward": backward}, CASES, "attention")


def test_attention_window_sizes_and_positions():
    sweep({"window_size": lambda n, b, w, pos: _dense(n, b, pos, causal=True, input_pos=pos,
                                                      window_size=w),
           "softcap": lambda n, b, w, pos: _dense(n, b, pos, causal=True, input_pos=pos,
                                                  softcap=30.0)}, CASES, "attention")


def test_attention_varlen_forward_and_backward():
    def varlen(lens):
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
        q = _q(sum(lens), 4, 32).requires_grad_()
        out = flashattn.attention_varlen(q, q, q, cu, cu, max(lens), max(lens), causal=True)
        out.sum().backward()
    sweep({"causal forward+backward": varlen},
          [((5, 17, 64),), ((100, 1, 33),), ((129, 257),), ((16, 48, 80, 3),), ((7000, 9),)],
          "attention_varlen")


def test_flash_attn_windows_alibi_softcap():
    def fa(n, b, **kw):
        k = _q(b, n + 11, 2, 32)
        return fai.flash_attn_func(_q(b, n, 4, 32), k, k, **kw)
    slopes = torch.rand(4)
    sweep({"window": lambda n, b, w, pos: fa(n, b, window_size=w),
           "causal ALiBi": lambda n, b, w, pos: fa(n, b, causal=True, alibi_slopes=slopes),
           "window ALiBi softcap": lambda n, b, w, pos: fa(n, b, causal=True, window_size=w,
                                                           alibi_slopes=slopes, softcap=30.0),
           "causal, more queries than keys": lambda n, b, w, pos: fai.flash_attn_func(
               _q(b, n + 5, 4, 32), _q(b, n, 2, 32), _q(b, n, 2, 32), causal=True)},
          CASES, "flash_attn_func")


def test_flash_attn_with_kvcache_lengths():
    with flashattn.interpret.enabled(), record_launches(run=False) as rec:
        for cap, b in ((128, 2), (512, 3), (2048, 1), (8192, 2)):
            kc = _q(b, cap, 2, 64)
            lens = torch.full((b,), cap // 2, dtype=torch.int32)
            fai.flash_attn_with_kvcache(_q(b, 1, 4, 64), kc, kc, _q(b, 1, 2, 64),
                                        _q(b, 1, 2, 64), cache_seqlens=lens, causal=True,
                                        num_splits=4)
    assert_compile_once(rec, "flash_attn_with_kvcache (fixed num_splits)")


def test_decode_default_splits_are_reported():
    """The decode kernels with the default split count: the combine kernel's TILE_S follows
    the split count, which follows the cache length (a power of two, bounded by
    DECODE_MAX_SPLITS): reported here, not a failure (the decode kernels are consolidated
    elsewhere)."""
    with flashattn.interpret.enabled(), record_launches(run=False) as rec:
        for cap in (128, 1024, 8192, 65536):
            kc = _q(1, 2, cap, 64)
            flashattn.decode(_q(1, 4, 1, 64), kc, kc, torch.full((1,), cap, dtype=torch.int32))
    by = specialisations(rec)
    varying = collections.defaultdict(set)
    for name, keys in by.items():
        for k in keys:
            for n, v in k[2]:
                varying[(name, n)].add(v)
    per_length = {k: sorted(v) for k, v in varying.items()
                  if len(v) > 1 and k[1] not in LENGTH_CLASS_FLAGS}
    print("decode default splits: specialisations", {n: len(k) for n, k in by.items()},
          "varying with the cache length:", per_length)
    assert all(len(v) <= 8 for v in per_length.values())     # bounded (powers of two)


def test_record_launches_key():
    from flashattn.dispatch import launch_key
    from flashattn.kernels import fmha
    q = _q(1, 1, 17, 32)
    with flashattn.interpret.enabled(), record_launches(run=False) as rec:
        flashattn.attention(q, q, q)
    assert len(rec) == 1 and rec[0]["kernel"].endswith("fmha_kernel")
    c = dict(rec[0]["constants"])
    assert c["EVEN_K"] is False and c["CAUSAL"] is False and c["TILE_D"] == 32
    assert ("Q", "float16", ("1", "1", "*", "16")) in rec[0]["arrays"]
    key = launch_key(fmha.fmha_kernel, ())
    assert key["constants"] == () and key["arrays"] == ()
