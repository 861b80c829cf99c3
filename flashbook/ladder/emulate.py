"""A CPU emulation of the ladder kernel (``fmha.py`` beside this file): every step's launch
schedule and its arithmetic, tile by tile, in NumPy float32.

    schedule, work_per_program, tile_counts  which key tiles each program of a step visits
    emulate(step, q, k, v, ...)              the fused kernel of one step, in NumPy float32
    default_config(step)                     the tiles a step runs with on Hopper

The shipped kernel's schedule is the library's (``flashattn.reference.tiles``); the steps off
its flags change the order (REMAP off, PAIR), the mask rule (SPLIT_LOOP off) and the softmax
(FAST_MATH off, LAZY_RESCALE).
"""
from __future__ import annotations

import math

import numpy as np

from flashattn.config import Config
from flashattn.contract import check_shapes, tile_d_for
from flashattn.reference import causal_mask, softmax
from flashattn.reference.tiles import INV_LOG_2, Program, as_f32, exp2, key_tiles

from ..steps import Step, get_step
from . import SHIPPED_FLAGS

LAZY_THRESHOLD = 8.0           # LAZY_RESCALE: rescale only when a row max grows by more than 2^8


def _step(step) -> Step:
    return get_step(step) if isinstance(step, str) else step


def _flags(step) -> dict:
    """The step's flags, the shipped ones where it names none."""
    return {**SHIPPED_FLAGS, **step.flag_values()}


def default_config(step) -> Config:
    """The Config a step runs with on Hopper (sm_90); a tuned step's first search candidate."""
    return _step(step).configs("sm_90")[0]


def schedule(step, Nq: int, Nk: int, *, causal: bool, input_pos: int = 0,
             config: Config | None = None) -> list[Program]:
    """The programs of the launch grid's first axis, in launch order (bid 0, 1, ...).

    Mirrors fmha_kernel: REMAP reverses the order when causal; PAIR halves the grid
    and program i does query tiles i and n-1-i; without SPLIT_LOOP every visited tile is
    masked when the mask is needed; see ``Program``.
    """
    step = _step(step)
    if step.kernel != "fmha":
        raise ValueError(f"step {step.name!r} is not the fused kernel: it has no tile schedule")
    config = config or default_config(step)
    flags = _flags(step)
    n = -(-Nq // config.TILE_M)                                       # num_m_blocks
    if flags["PAIR"]:
        groups = [(i,) if n - 1 - i == i else (i, n - 1 - i) for i in range(-(-n // 2))]
    elif flags["REMAP"] and causal:
        groups = [(n - 1 - i,) for i in range(n)]
    else:
        groups = [(i,) for i in range(n)]
    mask_all = not flags["SPLIT_LOOP"] and (causal or Nk % config.TILE_N != 0)

    def visits(bid_x):
        tiles = key_tiles(bid_x, Nk, tile_m=config.TILE_M, tile_n=config.TILE_N, causal=causal,
                          input_pos=input_pos)
        return tuple((j, "masked") for j, _ in tiles) if mask_all else tiles

    return [Program(bid, tiles, tuple(visits(t) for t in tiles))
            for bid, tiles in enumerate(groups)]


def work_per_program(step, Nq: int, Nk: int, *, causal: bool, input_pos: int = 0,
                     config: Config | None = None) -> list[int]:
    """Key tiles visited by each program, in launch order."""
    return [p.work for p in schedule(step, Nq, Nk, causal=causal, input_pos=input_pos,
                                     config=config)]


def tile_counts(step, Nq: int, Nk: int, *, causal: bool, input_pos: int = 0,
                config: Config | None = None) -> dict:
    """Count the (query tile, key tile) pairs of one (batch, head) by what the kernel does.

    Returns dict(full=, masked=, skipped=); skipped pairs are never visited, and the three sum
    to cdiv(Nq, TILE_M) * cdiv(Nk, TILE_N).
    """
    step = _step(step)
    config = config or default_config(step)
    progs = schedule(step, Nq, Nk, causal=causal, input_pos=input_pos, config=config)
    kinds = [kind for p in progs for t in p.key_tiles for _, kind in t]
    total = -(-Nq // config.TILE_M) * -(-Nk // config.TILE_N)
    return dict(full=kinds.count("full"), masked=kinds.count("masked"),
                skipped=total - len(kinds))


def _update(qk, m_i, l_i, acc, qk_scale, ftz):
    """online_softmax_update of fmha.py, batched over (batch, head) in the first axis."""
    m_ij = np.maximum(m_i, qk.max(axis=-1, keepdims=True) * qk_scale)    # (BH, TILE_M, 1)
    p = exp2(qk * qk_scale - m_ij, ftz)                                 # (BH, TILE_M, TILE_N)
    alpha = exp2(m_i - m_ij, ftz)                                       # (BH, TILE_M, 1)
    l_i = l_i * alpha + p.sum(axis=-1, keepdims=True)
    return p, m_ij, l_i, acc * alpha


def emulate(step, q, k, v, *, causal: bool = False, scale: float | None = None,
            input_pos: int = 0, config: Config | None = None, round_p: bool = False):
    """Run one step's kernel in NumPy float32, tile by tile, in the kernel's order and rules.

    Args:
        step: a name or Step; q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) (NumPy or torch).
        config: tile shape, default ``default_config(step)``.
        round_p: cast P to float16 before P V, as the kernel does for fp16 inputs.

    Returns:
        (B, Hq, Nq, D) float32 NumPy array. For "naive", the materialised softmax.

    Like the kernel, the fused steps need scale > 0: the row max is taken before scaling, so
    scale <= 0 gives NaN once a tile is masked (tests/test_emulation.py::test_nonpositive_scale).
    """
    step = _step(step)
    q, k, v = as_f32(q), as_f32(k), as_f32(v)
    check_shapes(q.shape, k.shape, v.shape, causal=causal, scale=scale, input_pos=input_pos)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kv_head = np.arange(Hq) // max(1, Hq // max(Hkv, 1))             # GQA
    k, v = k[:, kv_head], v[:, kv_head]                               # (B, Hq, Nk, D)
    if step.kernel == "naive":
        s = (q @ k.transpose(0, 1, 3, 2)) * np.float32(scale)         # (B, Hq, Nq, Nk)
        if causal:
            s = np.where(causal_mask(Nq, Nk, input_pos), s, -np.inf)
        p = softmax(s).astype(np.float32)
        if round_p:
            p = p.astype(np.float16).astype(np.float32)
        return p @ v

    config = config or default_config(step)
    flags = _flags(step)
    TM, TN, TD = config.TILE_M, config.TILE_N, tile_d_for(D)
    ftz = flags["FAST_MATH"]
    n_m, n_n = -(-Nq // TM), -(-Nk // TN)
    qk_scale = np.float32(scale * INV_LOG_2)                          # softmax in base 2
    # Zero padding as ct.load(padding_mode=ZERO): rows past N, head-dim columns past D.
    qp = np.zeros((B * Hq, n_m * TM, TD), np.float32)
    kp = np.zeros((B * Hq, n_n * TN, TD), np.float32)
    vp = np.zeros((B * Hq, n_n * TN, TD), np.float32)
    qp[:, :Nq, :D] = q.reshape(B * Hq, Nq, D)
    kp[:, :Nk, :D] = k.reshape(B * Hq, Nk, D)
    vp[:, :Nk, :D] = v.reshape(B * Hq, Nk, D)
    out = np.zeros((B * Hq, n_m * TM, TD), np.float32)

    with np.errstate(over="ignore", invalid="ignore"):  # the unchosen lazy branch may overflow
        for prog in schedule(step, Nq, Nk, causal=causal, input_pos=input_pos, config=config):
            for bid_x, visits in zip(prog.query_tiles, prog.key_tiles):
                rows = slice(bid_x * TM, (bid_x + 1) * TM)
                qt = qp[:, rows]                                      # (BH, TILE_M, TILE_D)
                offs_m = input_pos + bid_x * TM + np.arange(TM)[:, None]  # (TILE_M, 1)
                m_i = np.full((B * Hq, TM, 1), -np.inf, np.float32)
                l_i = np.zeros((B * Hq, TM, 1), np.float32)
                acc = np.zeros((B * Hq, TM, TD), np.float32)
                for j, kind in visits:
                    cols = slice(j * TN, (j + 1) * TN)
                    qk = qt @ kp[:, cols].transpose(0, 2, 1)          # (BH, TILE_M, TILE_N)
                    if kind == "masked":                              # mask_scores
                        offs_n = j * TN + np.arange(TN)[None, :]      # (1, TILE_N)
                        mask = offs_n < Nk if Nk % TN else np.ones((1, TN), bool)
                        if causal:
                            mask = mask & (offs_m >= offs_n)          # (TILE_M, TILE_N)
                        qk = qk + np.where(mask, np.float32(0), np.float32(-np.inf))
                    if flags["LAZY_RESCALE"]:
                        m_blk = qk.max(axis=-1, keepdims=True) * qk_scale  # (BH, TILE_M, 1)
                        grow = (m_blk - m_i).max(axis=(1, 2))[:, None, None]  # per program
                        p_f, m_f, l_f, acc_f = _update(qk, m_i, l_i, acc, qk_scale, ftz)
                        p_s = exp2(qk * qk_scale - m_i, ftz)          # stale max, no rescale
                        l_s = l_i + p_s.sum(axis=-1, keepdims=True)
                        full = grow > LAZY_THRESHOLD
                        p = np.where(full, p_f, p_s)
                        m_i, l_i, acc = np.where(full, m_f, m_i), np.where(full, l_f, l_s), \
                            np.where(full, acc_f, acc)
                    else:
                        p, m_i, l_i, acc = _update(qk, m_i, l_i, acc, qk_scale, ftz)
                    if round_p:
                        p = p.astype(np.float16).astype(np.float32)   # p.astype(Q.dtype)
                    acc = acc + p @ vp[:, cols]                       # (BH, TILE_M, TILE_D)
                out[:, rows] = acc / l_i
    return out[:, :Nq, :D].reshape(B, Hq, Nq, D)


__all__ = ["LAZY_THRESHOLD", "Program", "default_config", "emulate", "schedule",
           "tile_counts", "work_per_program"]
