"""The forward kernel's own source, LSE output included, run on a CPU by a NumPy stand-in for
cuda.tile (issue 11): every fused step writes the same output as the reference and, with
WRITE_LSE, the natural-log LSE of each row that the backward takes. Without WRITE_LSE the
stand-in Lse is never touched.

The stand-in is tests/test_backward_kernels.py's ``NumpyTile`` (loads with ``order`` and padding,
stores that drop what lies past the array, fp16 MMAs into fp32), plus what the forward uses
besides: row max and sum, division, log2, bit casts and the tile slicing of ``exp_poly``.
Every function of kernels/fmha.py is rebuilt with ``ct`` (and the ``max``/``min`` builtins,
which cuTile overloads for tiles) bound to the stand-in.
"""
import math
import types

import numpy as np
import pytest

from flashattn import reference as R
from flashattn.kernels import FMHA, fmha_constants, fmha_grid
from flashattn.steps import EXPERIMENTS, STEPS, Config, with_config

from test_backward_kernels import NumpyTile

pytest.importorskip("cuda.tile")

FUSED = [n for n, s in {**STEPS, **EXPERIMENTS}.items() if s.kernel == "fmha"]


class ForwardTile(NumpyTile):
    """NumpyTile plus the operations of the forward kernel."""

    def __init__(self, num_blocks=(1, 1, 1)):
        super().__init__()
        self.grid = num_blocks

    def num_blocks(self, axis):
        return self.grid[axis]

    @staticmethod
    def max(x, axis=None, keepdims=False):
        return np.max(x, axis=axis, keepdims=keepdims)

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return x.sum(axis=axis, keepdims=keepdims, dtype=np.float32)

    @staticmethod
    def maximum(a, b):
        return np.maximum(a, b).astype(np.float32)

    @staticmethod
    def truediv(a, b, flush_to_zero=False, rounding_mode=None):
        return (a / b).astype(np.float32)

    @staticmethod
    def log2(x):
        with np.errstate(divide="ignore"):
            return np.log2(x).astype(np.float32)

    @staticmethod
    def bitcast(x, dtype):
        return np.ascontiguousarray(x).view(dtype)

    @staticmethod
    def extract(x, index, shape):
        sl = tuple(slice(i * n, (i + 1) * n) for i, n in zip(index, shape))
        return x[sl]

    @staticmethod
    def cat(tiles, axis):
        return np.concatenate(tiles, axis=axis)


def _np_max(a, b):
    return np.maximum(a, b)


def _np_min(a, b):
    return np.minimum(a, b)


def forward_source(tile):
    """fmha_kernel's Python source with ``ct`` -> ``tile`` in it and every helper."""
    import flashattn.kernels.fmha as mod
    g = dict(vars(mod), ct=tile, max=_np_max, min=_np_min)
    for name, obj in vars(mod).items():
        f = getattr(obj, "_pyfunc", obj)
        if isinstance(f, types.FunctionType) and f.__module__ == mod.__name__:
            g[name] = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__,
                                         f.__closure__)
    return g["fmha_kernel"]


def run_forward(step_name, q, k, v, *, causal, scale, input_pos, config, write_lse):
    step = with_config({**STEPS, **EXPERIMENTS}[step_name], config)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    out = np.full(q.shape, np.nan, np.float16)
    lse = np.full((B, Hq, Nq) if write_lse else (1, 1, 1), np.nan, np.float32)
    grid = fmha_grid(step, config, B=B, Hq=Hq, Nq=Nq, sm_count=3)
    args = FMHA.args(dict(Q=q, K=k, V=v, Out=out, Lse=lse),
                     dict(qk_scale=scale, input_pos=input_pos, num_heads=Hq,
                          group_size=Hq // Hkv, num_m_blocks=-(-Nq // config.TILE_M)),
                     fmha_constants(step, config, head_dim=D, causal=causal,
                                    even_k=Nk % config.TILE_N == 0, write_lse=write_lse))
    tile = ForwardTile(grid)
    fn = forward_source(tile)
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                tile.bids = (x, y, z)
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    fn(*args)
    return out, lse


CASES = [  # (B, Hq, Hkv, Nq, Nk, D, causal, input_pos)
    (1, 2, 1, 70, 100, 32, True, 30),       # GQA, a prefill after a cache, ragged tiles
    (2, 2, 2, 45, 45, 16, True, 0),         # ragged square
    (1, 2, 1, 50, 33, 32, False, 0),        # Nq > Nk, non-causal
    (1, 2, 2, 64, 64, 32, False, 0),        # whole tiles (UNCHECKED_KV's case)
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("step", FUSED)
def test_forward_source_writes_the_lse(step, case):
    B, Hq, Hkv, Nq, Nk, D, causal, pos = case
    rng = np.random.default_rng(Nq * 100 + Nk)
    q, k, v = (rng.standard_normal(s).astype(np.float16) for s in
               ((B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D)))
    scale = 0.9 / math.sqrt(D)
    kw = dict(causal=causal, scale=scale, input_pos=pos)
    f64 = [t.astype(np.float64) for t in (q, k, v)]
    ref_out = R.attention(*f64, **kw)
    ref_lse = R.attention_lse(f64[0], f64[1], **kw)
    config = Config(16, 32)
    out, lse = run_forward(step, q, k, v, config=config, write_lse=True, **kw)
    assert not np.isnan(out).any() and np.isfinite(lse).all()
    assert np.abs(out.astype(np.float64) - ref_out).max() < 1e-2
    # exp2 approximations (exp_poly) and the lazy max (lazy_rescale) leave the LSE exact to
    # fp32 rounding of the row sums: well under the backward's needs.
    assert np.abs(lse - ref_lse).max() < 2e-3 * max(1.0, np.abs(ref_lse).max())
    # Off: the same output, bit for bit, and the one-element stand-in untouched.
    out_off, stand_in = run_forward(step, q, k, v, config=config, write_lse=False, **kw)
    assert np.array_equal(out_off, out) and np.isnan(stand_in).all()


def test_the_lse_feeds_the_backward_emulation():
    # The chain on a CPU: the forward source's out and LSE, the backward emulation, against
    # the exact gradients.
    B, Hq, Hkv, Nq, Nk, D = 1, 4, 2, 40, 56, 32
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal(s).astype(np.float16) for s in
                     ((B, Hq, Nq, D), (B, Hkv, Nk, D), (B, Hkv, Nk, D), (B, Hq, Nq, D)))
    kw = dict(causal=True, scale=0.2, input_pos=16)
    out, lse = run_forward("warp_groups", q, k, v, config=Config(16, 16), write_lse=True, **kw)
    got = R.emulate_backward(q, k, v, out, dout, lse, config=Config(16, 32), **kw)
    want = R.attention_backward(*(t.astype(np.float64) for t in (q, k, v, dout)), **kw)
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 2e-2 * max(np.abs(w).max(), 1.0)
