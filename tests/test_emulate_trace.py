"""The hand-written mirror of the forward kernel's schedule (``flashbook.ladder.emulate``:
``schedule``, ``work_per_program``, ``tile_counts``, read by chapters 7, 8 and 10; the shipped
kernel's is ``flashattn.reference.schedule``) against what the real ``fmha_kernel`` does,
recorded by the interpreter's trace (``flashattn.interpret``).

For each step whose schedule the mirror states (the plain grid, REMAP, PAIR; the persistent
grid's work items, dealt round-robin as the kernel deals them), causal and not, at a few
lengths and an ``input_pos``: the K and V tiles each program loads are the mirror's work for it,
in the mirror's order, query tile by query tile; and the tiles the kernel masks
(``mask_scores``, observed through a copy of the ladder kernel, flashbook/ladder/fmha.py, that records its calls) are the
mirror's "masked" ones, so ``tile_counts`` counts what the kernel does.
"""
import collections
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from flashattn import interpret, kernels
from flashattn import reference as R
from flashbook.ladder import emulate as E
from flashattn.kernels import fmha_constants, fmha_grid, fmha_spec
from flashbook.steps import Config, get_step
from flashbook.ladder import LADDER
from scripts import load

pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py

B, HQ, HKV, D = 1, 2, 1, 64                           # GQA 2:1: the kv head of each load too
# (step, SM count of the persistent grid): 132 gives one work item per program at these
# lengths; 3 makes each program loop over several.
VARIANTS = [("baseline", None), ("loop_split", None), ("remap", None), ("arch_tuned", None),
            ("warp_groups", None), ("pair", None), ("persistent", 132), ("persistent", 3)]
# (Nq, Nk, input_pos): whole tiles, ragged tiles, several query tiles, a prefill after a cache.
SHAPES = [(128, 128, 0), (200, 200, 0), (512, 512, 0), (100, 300, 0), (100, 300, 200)]
CASES = [(c, s) for c in (False, True) for s in SHAPES if c or not s[2]]
CONFIGS = {"own": None, "32x64": Config(32, 64)}      # the step's sm_90 tiles; many small ones


def _id(x):
    if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str):
        return x[0] if x[1] is None else f"{x[0]}@{x[1]}sm"
    if isinstance(x, tuple):
        return "x".join(map(str, x))
    return "causal" if x is True else "full" if x is False else str(x)


def launch_traced(step, Nq, Nk, *, causal, input_pos, config, sm_count, kernel=None):
    """Run fmha_kernel (or ``kernel``, a copy of it) over its grid in launch order, traced.
    Returns (grid, trace)."""
    g = torch.Generator().manual_seed(Nq * 1000 + Nk)
    q = torch.randn(B, HQ, Nq, D, generator=g).half()
    k, v = (torch.randn(B, HKV, Nk, D, generator=g).half() for _ in range(2))
    out = torch.full(q.shape, math.nan, dtype=q.dtype)
    lse = torch.full((1, 1, 1), math.nan)                 # WRITE_LSE off: never touched
    grid = fmha_grid(step, config, B=B, Hq=HQ, Nq=Nq, sm_count=sm_count)
    spec = LADDER if kernel is not None else fmha_spec(step)   # a probe is a ladder copy
    args = spec.args(dict(Q=q, K=k, V=v, Out=out, Lse=lse),
                     dict(qk_scale=D ** -0.5, input_pos=input_pos, num_heads=HQ,
                          group_size=HQ // HKV, num_m_blocks=-(-Nq // config.TILE_M)),
                     fmha_constants(step, config, head_dim=D, causal=causal,
                                    even_k=Nk % config.TILE_N == 0, spec=spec))
    with interpret.trace() as tr:
        interpret.launch(grid, kernel or spec.kernel(), args)
    assert not torch.isnan(out).any()
    return grid, tr


def expected_items(step, grid, progs):
    """{program: [(batch, head, Program of the mirror, its query tile), ...]} in the order the
    kernel runs them: program (x, y) runs the mirror's program x for (batch, head) y; a
    persistent program p runs work items p, p + grid, ... of the (batch, head)-major list,
    item t being the mirror's program t % n (its REMAP order) of (batch, head) t // n."""
    out = {}
    if step.flag_values()["PERSISTENT"]:
        n = len(progs)
        for p in range(grid[0]):
            out[(p, 0, 0)] = [(*divmod(t // n, HQ), progs[t % n], 0)
                              for t in range(p, n * B * HQ, grid[0])]
        return out
    assert grid == (len(progs), B * HQ, 1)
    for prog in progs:
        for y in range(B * HQ):
            out[(prog.bid, y, 0)] = [(*divmod(y, HQ), prog, i)
                                     for i in range(len(prog.query_tiles))]
    return out


def traced_visits(tr):
    """{program: [(batch, head, query tile, [K tiles], [V tiles]), ...]} from the trace: a Q
    load opens a query tile, the K and V loads after it are its key tiles, the Out store (of
    the same tile) closes it. Each load's (batch, kv head) is checked on the way."""
    per = collections.defaultdict(list)
    for kernel, prog, op, arr, idx, _ in tr.events:
        assert kernel == "fmha_kernel"
        if op == "load" and arr == "Q":
            b, h, t, d0 = idx
            assert d0 == 0
            per[prog].append((b, h, t, [], []))
            continue
        b, h, t, ks, vs = per[prog][-1]
        if op == "load" and arr == "K":                  # K^T: (batch, kv head, 0, j)
            assert idx[:3] == (b, h // (HQ // HKV), 0), idx
            ks.append(idx[3])
        elif op == "load" and arr == "V":                # (batch, kv head, j, 0)
            assert idx[:2] == (b, h // (HQ // HKV)) and idx[3] == 0, idx
            vs.append(idx[2])
        elif op == "store" and arr == "Out":
            assert idx == (b, h, t, 0), (idx, (b, h, t))
        else:
            raise AssertionError(f"unexpected {op} of {arr} at {idx}")
    return per


def _setup(variant, causal, shape, config):
    name, sms = variant
    step = get_step(name)
    Nq, Nk, pos = shape
    config = CONFIGS[config] or E.default_config(step)
    progs = E.schedule(step, Nq, Nk, causal=causal, input_pos=pos, config=config)
    return step, Nq, Nk, pos, config, sms, progs


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("causal,shape", CASES, ids=_id)
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_the_trace_is_the_mirrors_schedule(variant, causal, shape, config):
    step, Nq, Nk, pos, config, sms, progs = _setup(variant, causal, shape, config)
    if fmha_spec(step) is kernels.FMHA:           # the shipped kernel: the library's schedule
        assert progs == R.schedule(Nq, Nk, causal=causal, input_pos=pos, config=config)
    grid, tr = launch_traced(step, Nq, Nk, causal=causal, input_pos=pos, config=config,
                             sm_count=sms)
    items = expected_items(step, grid, progs)
    # Work: K tiles and V tiles loaded by each program = work_per_program's (summed over a
    # persistent program's items).
    work = E.work_per_program(step, Nq, Nk, causal=causal, input_pos=pos, config=config)
    assert work == [p.work for p in progs]
    want = collections.Counter({prog: sum(len(p.key_tiles[i]) for _, _, p, i in its)
                                for prog, its in items.items()})
    assert set(items) == {(x, y, z) for x in range(grid[0]) for y in range(grid[1])
                          for z in range(grid[2])}
    assert tr.loads("K") == +want
    assert tr.loads("V") == +want
    if not step.flag_values()["PERSISTENT"]:
        assert [tr.loads("K")[(p.bid, y, 0)] for p in progs for y in range(B * HQ)] == \
            [w for w in work for _ in range(B * HQ)]
    # The tiles: each program's query tiles in the mirror's order, each with the mirror's key
    # tiles in order, K and V alike.
    got = traced_visits(tr)
    for prog, its in items.items():
        exp = [(b, h, p.query_tiles[i], [j for j, _ in p.key_tiles[i]],
                [j for j, _ in p.key_tiles[i]]) for b, h, p, i in its]
        assert got[prog] == exp, f"program {prog}"


# --- the masked tiles: a copy of the ladder kernel whose mask_scores records each call ---------
PROBE = '''

MASKED = []                    # (bid 0, bid 1, first query position, first key) per call
_mask_scores_of_the_kernel = mask_scores


def mask_scores(qk, offs_m, offs_n, k_seqlen, CAUSAL, EVEN_K):
    MASKED.append((int(ct.bid(0)), int(ct.bid(1)), int(ct.min(offs_m)), int(ct.min(offs_n))))
    return _mask_scores_of_the_kernel(qk, offs_m, offs_n, k_seqlen, CAUSAL, EVEN_K)
'''


@pytest.fixture
def probe(tmp_path):
    """A fresh copy of flashbook/ladder/fmha.py (its text unchanged) with the recording mask_scores
    appended; the interpreter runs it like the original."""
    src = Path(importlib.util.find_spec(LADDER.module).origin).read_text()   # the ladder
    assert "mask_scores" in src and "\ndef mask_scores(" not in src    # the shared helper
    path = tmp_path / "fmha_probe.py"
    path.write_text(src + PROBE)
    interpret.install_shim()
    mod = load(path, "fmha_probe")
    return mod


@pytest.mark.parametrize("causal,shape", CASES, ids=_id)
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_the_masked_tiles_are_the_mirrors(variant, causal, shape, probe):
    config = "32x64"
    step, Nq, Nk, pos, config, sms, progs = _setup(variant, causal, shape, config)
    grid, tr = launch_traced(step, Nq, Nk, causal=causal, input_pos=pos, config=config,
                             sm_count=sms, kernel=probe.fmha_kernel)
    items = expected_items(step, grid, progs)
    TM = config.TILE_M
    got = collections.defaultdict(list)
    for x, y, first, first_key in probe.MASKED:
        assert (first - pos) % TM == 0 and first_key % config.TILE_N == 0
        got[(x, y, 0)].append(((first - pos) // TM, first_key // config.TILE_N))
    for prog, its in items.items():
        exp = [(p.query_tiles[i], j) for _, _, p, i in its for j, kind in p.key_tiles[i]
               if kind == "masked"]
        assert got.get(prog, []) == exp, f"program {prog}"
    # tile_counts: what the kernel visited and masked, per (batch, head).
    c = E.tile_counts(step, Nq, Nk, causal=causal, input_pos=pos, config=config)
    assert len(probe.MASKED) == c["masked"] * B * HQ
    assert sum(tr.loads("K").values()) == (c["full"] + c["masked"]) * B * HQ
