"""The CPU emulation of the ladder kernel (flashbook/ladder/emulate.py): every step's tiling rules
give exact attention; the shipped kernel's schedule is the library's (CPU)."""
import zlib

import numpy as np
import pytest
import torch

from flashattn import reference as R
from flashbook.ladder import SHIPPED_FLAGS, emulate as E
from flashbook.steps import EXPERIMENTS, STEPS, Config


pytestmark = pytest.mark.usefixtures("one_thread")   # tests/conftest.py


FUSED = [name for name, s in {**STEPS, **EXPERIMENTS}.items() if s.kernel == "fmha"]
# (Nq, Nk, input_pos): odd lengths, a ragged last tile, a prefill after a cache of 130 tokens.
SHAPES = [(1, 1, 0), (17, 17, 0), (113, 113, 0), (70, 200, 0), (70, 200, 130), (300, 300, 0)]
HEADS = {"mha": (2, 2, 2), "gqa4": (1, 4, 1)}                       # (B, Hq, Hkv)
CASES = [(c, s) for c in (False, True) for s in SHAPES if c or not s[2]]  # (causal, shape)
SMALL = Config(32, 16)   # many tiles even on short sequences, and TILE_M != TILE_N
CONFIGS = {"own": None, "32x16": SMALL}


def case_id(x):
    return "x".join(map(str, x)) if isinstance(x, tuple) else ("causal" if x else "full")


def make_qkv(seed, B, Hq, Hkv, Nq, Nk, D):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, Hq, Nq, D)).astype(np.float32)      # (B, Hq, Nq, D)
    k = rng.standard_normal((B, Hkv, Nk, D)).astype(np.float32)     # (B, Hkv, Nk, D)
    v = rng.standard_normal((B, Hkv, Nk, D)).astype(np.float32)     # (B, Hkv, Nk, D)
    return q, k, v


def assert_matches_reference(out, q, k, v, rtol=1e-5, **kw):
    ref = R.attention(*(t.astype(np.float64) for t in (q, k, v)), **kw)
    assert out.shape == ref.shape and out.dtype == np.float32
    err = np.abs(out - ref).max()
    assert err <= rtol * np.abs(ref).max(), f"max error {err:.3g}"


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("D", [16, 80, 64])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("causal,shape", CASES, ids=case_id)
@pytest.mark.parametrize("step", FUSED)
def test_emulation_matches_reference(step, causal, shape, heads, D, config):
    Nq, Nk, input_pos = shape
    B, Hq, Hkv = HEADS[heads]
    seed = zlib.crc32(repr((step, causal, heads, shape, D, config)).encode())  # fixed per case
    q, k, v = make_qkv(seed, B, Hq, Hkv, Nq, Nk, D)
    out = E.emulate(step, q, k, v, causal=causal, input_pos=input_pos, config=CONFIGS[config])
    assert_matches_reference(out, q, k, v, causal=causal, input_pos=input_pos)


@pytest.mark.parametrize("causal", [False, True])
def test_naive_and_torch_inputs(causal):
    q, k, v = make_qkv(0, 1, 4, 2, 50, 50, 24)
    out = E.emulate("naive", torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                    causal=causal, scale=0.2)
    assert_matches_reference(out, q, k, v, causal=causal, scale=0.2)


@pytest.mark.parametrize("step", ["baseline", "lazy_rescale", "pair"])
def test_round_p_is_fp16_close(step):
    q, k, v = make_qkv(1, 1, 2, 2, 100, 100, 64)
    out = E.emulate(step, q, k, v, causal=True, round_p=True)
    assert_matches_reference(out, q, k, v, rtol=5e-3, causal=True)


@pytest.mark.parametrize("slope", [0.02, 0.1])
def test_lazy_rescale_takes_both_branches(slope, monkeypatch):
    """Scores that grow along the keys make the row max jump by more than 2^8 in some tiles
    and less in others, so both branches of LAZY_RESCALE run."""
    q, k, v = make_qkv(2, 1, 2, 1, 120, 300, 16)
    k[..., 0] += slope * np.arange(300)                               # score grows with j
    q[..., 0] = np.abs(q[..., 0]) + 1
    config = E.default_config("lazy_rescale")
    lazy = E.emulate("lazy_rescale", q, k, v, config=config)
    assert_matches_reference(lazy, q, k, v)
    # The stale-max branch ran: the result is not bit-identical to the eager update ...
    assert not np.array_equal(lazy, E.emulate("remap", q, k, v, config=config))
    # ... and the rescaling branch ran after the first tile: without it exp2 overflows.
    monkeypatch.setattr(E, "LAZY_THRESHOLD", np.inf)
    assert np.isnan(E.emulate("lazy_rescale", q, k, v, config=config)).any()


@pytest.mark.parametrize("scale", [0.0, -0.5])
def test_nonpositive_scale_is_refused(scale):
    # The kernels scale the row max after taking it, which is only right for scale > 0
    # (with scale <= 0 the emulation, like the kernel, gives NaN): the API refuses it.
    import torch

    from flashattn.contract import check_tensors
    q = torch.zeros(1, 1, 4, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="finite positive"):
        check_tensors(q, q, q, causal=True, scale=scale, input_pos=0)


# --- Schedules (chapters 7, 8, 10) ---
@pytest.mark.parametrize("config", [Config(64, 64), Config(256, 128), Config(64, 128),
                                    Config(32, 16)], ids=lambda c: c.label())
@pytest.mark.parametrize("causal,shape", CASES + [(c, (1000, 1000, 0)) for c in (False, True)]
                         + [(True, (100, 1000, 900))], ids=case_id)
@pytest.mark.parametrize("step", FUSED)
def test_schedule_rules(step, causal, shape, config):
    Nq, Nk, input_pos = shape
    TM, TN = config.TILE_M, config.TILE_N
    n_m, n_n = -(-Nq // TM), -(-Nk // TN)
    progs = E.schedule(step, Nq, Nk, causal=causal, input_pos=input_pos, config=config)
    assert [p.bid for p in progs] == list(range(len(progs)))
    # Every query tile is computed exactly once.
    assert sorted(t for p in progs for t in p.query_tiles) == list(range(n_m))
    split = {**STEPS, **EXPERIMENTS}[step].flag_values()["SPLIT_LOOP"]
    for p in progs:
        for bid_x, visits in zip(p.query_tiles, p.key_tiles):
            first, last = input_pos + bid_x * TM, input_pos + (bid_x + 1) * TM - 1  # positions
            js = [j for j, _ in visits]
            assert js == list(range(len(js)))                         # tiles 0, 1, ... in order
            # Visited: every tile holding a key a valid row sees; none past the causal bound.
            last_valid = min(last, input_pos + Nq - 1)
            need = -(-min(last_valid + 1, Nk) // TN) if causal else n_n
            assert need <= len(js) <= n_n
            if causal:
                assert all(j * TN <= last for j in js)
            for j, kind in visits:
                keys = j * TN + np.arange(TN)
                needs_mask = (keys >= Nk).any() or (causal and (keys > first).any())
                if kind == "full":
                    assert not needs_mask, f"tile ({bid_x}, {j}) needs the mask"
                elif split:
                    # SPLIT_LOOP masks only from mask_start, which may be one tile early.
                    assert needs_mask or (causal and j == first // TN)
    c = E.tile_counts(step, Nq, Nk, causal=causal, input_pos=input_pos, config=config)
    assert c["full"] + c["masked"] + c["skipped"] == n_m * n_n
    assert c["full"] + c["masked"] == sum(E.work_per_program(
        step, Nq, Nk, causal=causal, input_pos=input_pos, config=config))
    if not causal:
        assert c["skipped"] == 0
    if not split and (causal or Nk % TN):
        assert c["full"] == 0                                        # every visited tile masked


SHIPPED_ORDER = [name for name in FUSED if all(
    {**SHIPPED_FLAGS, **{**STEPS, **EXPERIMENTS}[name].flag_values()}[f] == SHIPPED_FLAGS[f]
    for f in ("SPLIT_LOOP", "REMAP", "PAIR", "PERSISTENT"))]


@pytest.mark.parametrize("causal,shape", CASES + [(True, (100, 1000, 900))], ids=case_id)
@pytest.mark.parametrize("step", SHIPPED_ORDER)
def test_the_shipped_schedule_is_the_librarys(step, causal, shape):
    """A step launched as the shipped kernel is (order, mask rule, grid) has the library's
    schedule, ``flashattn.reference.schedule``; a step off those flags has another."""
    Nq, Nk, input_pos = shape
    config = E.default_config(step)
    assert E.schedule(step, Nq, Nk, causal=causal, input_pos=input_pos, config=config) == \
        R.schedule(Nq, Nk, causal=causal, input_pos=input_pos, config=config)
    if causal and Nq > config.TILE_M:
        for other in ("baseline", "loop_split", "pair"):
            assert E.schedule(other, Nq, Nk, causal=True, input_pos=input_pos,
                              config=config) != \
                R.schedule(Nq, Nk, causal=True, input_pos=input_pos, config=config)


def test_remap_reverses_causal_order():
    n = 4096 // 256
    progs = E.schedule("remap", 4096, 4096, causal=True)
    assert [p.query_tiles for p in progs] == [(n - 1 - i,) for i in range(n)]
    work = E.work_per_program("remap", 4096, 4096, causal=True)
    assert work == sorted(work, reverse=True)                          # longest first
    assert [p.query_tiles for p in E.schedule("remap", 4096, 4096, causal=False)] == \
        [(i,) for i in range(n)]
    assert [p.query_tiles for p in E.schedule("loop_split", 4096, 4096, causal=True)] == \
        [(i,) for i in range(n)]


@pytest.mark.parametrize("config", [None, Config(256, 128), Config(64, 64), Config(128, 64)])
def test_pair_balances_causal_work(config):
    N = 8192
    config = config or E.default_config("pair")
    work = E.work_per_program("pair", N, N, causal=True, config=config)
    assert max(work) / min(work) <= 1.05
    plain = E.work_per_program("loop_split", N, N, causal=True, config=config)
    assert max(plain) / min(plain) > 10
    assert sum(work) == sum(plain)                                     # same tiles, regrouped
    progs = E.schedule("pair", N, N, causal=True, config=config)
    n = len(plain)
    assert len(progs) == n // 2
    assert all(p.query_tiles == (p.bid, n - 1 - p.bid) for p in progs)


def test_pair_odd_tile_count_middle_program():
    """With an odd number of query tiles the middle program does one tile only."""
    progs = E.schedule("pair", 5 * 64, 5 * 64, causal=True, config=Config(64, 64))
    assert [p.query_tiles for p in progs] == [(0, 4), (1, 3), (2,)]


def test_tile_counts_loop_split_causal():
    # 1024 x 1024 causal, 256 x 128 tiles: 4 x 8 tiles; each query tile has 2 diagonal tiles.
    c = E.tile_counts("loop_split", 1024, 1024, causal=True)
    assert c == dict(full=2 * (0 + 1 + 2 + 3), masked=4 * 2, skipped=4 * 8 - 20)
    assert E.tile_counts("baseline", 1024, 1024, causal=True, config=Config(256, 128)) == \
        dict(full=0, masked=20, skipped=12)


def test_default_configs():
    assert E.default_config("large_tiles") == Config(256, 128)
    assert E.default_config("pair") == EXPERIMENTS["pair"].config_for("sm_90")
    from flashbook.steps import seed_space
    assert E.default_config("autotune") == seed_space("sm_90")[0]
    assert E.default_config("arch_tuned") == STEPS["arch_tuned"].configs("sm_90")[0]
    with pytest.raises(ValueError, match="naive"):
        E.schedule("naive", 10, 10, causal=False)
