"""References: exact attention, the online softmax of chapter 2, and a CPU emulation of the kernel.

Everything here runs on a CPU with NumPy and PyTorch only, so the book can show each idea, and
the tests can check each step's tiling rules, without a GPU.

    attention(q, k, v, causal=...)           fp32/fp64 reference with flashattn.attention's contract
    softmax, online_softmax_streaming, online_softmax_blockwise, online_softmax_attention
                                             chapter 2, in base e, one element / one block at a time
    schedule, work_per_program, tile_counts  which key tiles each program visits (chapters 7, 8, 10)
    emulate(step, q, k, v, ...)              the fused kernel of one step, tile by tile, in NumPy
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .api import MAX_HEAD_DIM, tile_d_for
from .steps import Config, Step, get_step

INV_LOG_2 = 1.0 / math.log(2)  # as flashattn.kernels.fmha (not imported: it needs cuda.tile)
LAZY_THRESHOLD = 8.0           # LAZY_RESCALE: rescale only when a row max grows by more than 2^8


# ---------------------------------------------------------------------------------------------
# Exact attention
# ---------------------------------------------------------------------------------------------
def check_shapes(q_shape, k_shape, v_shape, *, causal: bool, scale, input_pos) -> None:
    """Raise ValueError (TypeError for a bad argument type) as ``flashattn.api.validate`` does,
    minus its dtype and device rules: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D), Hq % Hkv == 0."""
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 4:
            raise ValueError(f"{name} must have 4 dimensions (B, H, N, D), got shape {tuple(s)}")
    B, Hq, Nq, D = q_shape
    if tuple(k_shape) != tuple(v_shape):
        raise ValueError(f"k and v must have the same shape, got {tuple(k_shape)} and "
                         f"{tuple(v_shape)}")
    Bk, Hkv, Nk, Dk = k_shape
    if Bk != B:
        raise ValueError(f"batch size differs: q has {B}, k and v have {Bk}")
    if Dk != D:
        raise ValueError(f"head dim differs: q has {D}, k and v have {Dk}")
    if D < 1 or D > MAX_HEAD_DIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEAD_DIM}, got {D}")
    if Hkv == 0 and Hq != 0:
        raise ValueError(f"k and v have 0 heads but q has {Hq}")
    if Hkv and Hq % Hkv != 0:
        raise ValueError(f"query heads ({Hq}) must be a multiple of key/value heads ({Hkv}) "
                         "for grouped-query attention")
    if Nk == 0 and B * Hq * Nq > 0:
        raise ValueError("k and v have sequence length 0: softmax over no keys is undefined")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"scale must be a float, got {type(scale).__name__}")
        if not math.isfinite(scale):
            raise ValueError(f"scale must be finite, got {scale}")
    if isinstance(input_pos, bool) or not isinstance(input_pos, (int, np.integer)):
        raise TypeError(f"input_pos must be an int, got {type(input_pos).__name__}")
    if input_pos < 0 or input_pos > max(0, Nk - Nq):
        raise ValueError(f"input_pos must be in [0, max(0, Nk - Nq)] = [0, {max(0, Nk - Nq)}] "
                         f"(query row i sits at position input_pos + i), got {input_pos}")
    if input_pos and not causal:
        raise ValueError("input_pos only has a meaning with causal=True")


def causal_mask(Nq: int, Nk: int, input_pos: int = 0) -> np.ndarray:
    """(Nq, Nk) bool: True where query row i, at position input_pos + i, sees key j."""
    return np.arange(Nk)[None, :] <= input_pos + np.arange(Nq)[:, None]  # (Nq, Nk)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None, input_pos: int = 0):
    """Exact attention with the contract of ``flashattn.attention``, on any device.

    Args:
        q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 (query head h reads
            key/value head h // (Hq // Hkv)). torch tensors (any device, any float dtype) or
            NumPy arrays.
        causal: query row i sits at position input_pos + i and sees keys 0 .. input_pos + i.
        scale: default 1/sqrt(D).
        input_pos: 0 .. max(0, Nk - Nq), causal only (a prefill appended to a KV cache).

    Returns:
        (B, Hq, Nq, D) in float64 if the inputs are float64, else float32 (fp16/bf16 upcast);
        a torch tensor on the input device for torch inputs, a NumPy array for NumPy inputs.

    Raises:
        ValueError, TypeError: bad shapes or arguments, as ``flashattn.attention``.
    """
    is_numpy = isinstance(q, np.ndarray)
    if is_numpy:
        q, k, v = (torch.from_numpy(np.asarray(t)) for t in (q, k, v))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got "
                            f"{type(t).__name__}")
        if not (t.is_floating_point()):
            raise TypeError(f"{name} must hold floating-point numbers, got {t.dtype}")
    check_shapes(q.shape, k.shape, v.shape, causal=bool(causal), scale=scale,
                 input_pos=input_pos)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    dtype = torch.float64 if torch.float64 in (q.dtype, k.dtype, v.dtype) else torch.float32
    q, k, v = (t.to(device=q.device, dtype=dtype) for t in (q, k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if Hkv and Hq != Hkv:
        # GQA: repeat each key/value head for its Hq // Hkv query heads.
        k = k.repeat_interleave(Hq // Hkv, dim=1)                     # (B, Hq, Nk, D)
        v = v.repeat_interleave(Hq // Hkv, dim=1)                     # (B, Hq, Nk, D)
    s = (q @ k.transpose(-1, -2)) * scale                             # (B, Hq, Nq, Nk)
    if causal:
        mask = torch.from_numpy(causal_mask(Nq, Nk, input_pos)).to(q.device)  # (Nq, Nk)
        s = s.masked_fill(~mask, -math.inf)
    o = torch.softmax(s, dim=-1) @ v                                  # (B, Hq, Nq, D)
    return o.numpy() if is_numpy else o


# ---------------------------------------------------------------------------------------------
# Chapter 2: the online softmax, in base e
# ---------------------------------------------------------------------------------------------
def softmax(x, axis: int = -1) -> np.ndarray:
    """Safe softmax: subtracting the max keeps every exponent <= 0, so nothing overflows."""
    x = np.asarray(x)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def online_softmax_trace(x) -> list[tuple[float, float]]:
    """(m, d) after each element of a 1-D x: running max and running sum of exp(x - m).

    d_{j+1} = d_j * exp(m_j - m_{j+1}) + exp(x_{j+1} - m_{j+1}): when the max grows, the old
    sum is rescaled to the new max, so one pass suffices (Milakov & Gimelshein, 2018).
    """
    m, d, trace = -math.inf, 0.0, []
    for xj in np.asarray(x, dtype=np.float64).ravel():
        m_new = max(m, float(xj))
        if m_new == -math.inf:
            trace.append((m, d))        # only -inf so far: nothing to add, and -inf - -inf is NaN
            continue
        d = d * math.exp(m - m_new) + math.exp(xj - m_new)
        m = m_new
        trace.append((m, d))
    return trace


def online_softmax_streaming(x) -> np.ndarray:
    """Softmax of a 1-D x, (N,) -> (N,): one pass for (m, d), one for the probabilities."""
    x = np.asarray(x)
    m, d = online_softmax_trace(x)[-1]
    return (np.exp(x.astype(np.float64) - m) / d).astype(np.result_type(x.dtype, np.float32))


def blockwise_trace(x, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Running (m, l) after each block of ``block`` elements of the last axis.

    x: (..., N). Returns m, l of shape (..., cdiv(N, block)); the last block may be shorter.
    """
    x = np.asarray(x, dtype=np.float64)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    m = np.full(x.shape[:-1] + (1,), -np.inf)                         # (..., 1)
    l = np.zeros(x.shape[:-1] + (1,))                                 # (..., 1)
    ms, ls = [], []
    for start in range(0, x.shape[-1], block):
        xb = x[..., start:start + block]                              # (..., block)
        m_new = np.maximum(m, xb.max(axis=-1, keepdims=True))         # (..., 1)
        l = l * np.exp(m - m_new) + np.exp(xb - m_new).sum(axis=-1, keepdims=True)
        m = m_new
        ms.append(m[..., 0])
        ls.append(l[..., 0])
    return np.stack(ms, axis=-1), np.stack(ls, axis=-1)


def online_softmax_blockwise(x, block: int) -> np.ndarray:
    """Softmax over the last axis of x (..., N), reading ``block`` elements at a time."""
    x = np.asarray(x)
    m, l = blockwise_trace(x, block)
    p = np.exp(x.astype(np.float64) - m[..., -1:]) / l[..., -1:]      # (..., N)
    return p.astype(np.result_type(x.dtype, np.float32))


def online_softmax_attention(q, k, v, block: int, *, scale: float | None = None) -> np.ndarray:
    """FlashAttention's loop for one head, in base e (chapter 2), without masking.

    q: (Nq, D); k, v: (Nk, D). Keys are read ``block`` at a time; the running max m, sum l and
    unnormalised output acc are rescaled by alpha = exp(m_old - m_new) when m grows.
    Returns (Nq, D).
    """
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    m = np.full((q.shape[0], 1), -np.inf)                             # (Nq, 1)
    l = np.zeros((q.shape[0], 1))                                     # (Nq, 1)
    acc = np.zeros((q.shape[0], v.shape[1]))                          # (Nq, D)
    for start in range(0, k.shape[0], block):
        s = q @ k[start:start + block].T * scale                      # (Nq, block)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))          # (Nq, 1)
        p = np.exp(s - m_new)                                         # (Nq, block)
        alpha = np.exp(m - m_new)                                     # (Nq, 1)
        l = l * alpha + p.sum(axis=-1, keepdims=True)
        acc = acc * alpha + p @ v[start:start + block]                # (Nq, D)
        m = m_new
    return acc / l


# ---------------------------------------------------------------------------------------------
# The launch schedule of the fused kernel (chapters 7, 8, 10)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """One program of the grid's first axis (the same for every batch and head).

    bid: ct.bid(0); query_tiles: the query tiles (bid_x) it computes, in order;
    key_tiles[t]: ((j, kind), ...) the key tiles visited for query_tiles[t], kind "masked"
    (mask_scores applied) or "full".
    """
    bid: int
    query_tiles: tuple[int, ...]
    key_tiles: tuple[tuple[tuple[int, str], ...], ...]

    @property
    def work(self) -> int:
        """Key tiles visited, the unit of a program's run time."""
        return sum(len(t) for t in self.key_tiles)


def _step(step) -> Step:
    return get_step(step) if isinstance(step, str) else step


def default_config(step) -> Config:
    """The Config a step runs with on Hopper (sm_90); a tuned step's first search candidate."""
    step = _step(step)
    if step.tuned:
        from .autotune import search_space
        return search_space("sm_90", step)[0]
    return step.config_for("sm_90")


def _key_tiles(bid_x, Nk, TILE_M, TILE_N, causal, input_pos, flags):
    """The key tiles attend_query_tile visits for query tile bid_x, as (j, kind) pairs."""
    even_k = Nk % TILE_N == 0
    if causal:
        m_end = input_pos + (bid_x + 1) * TILE_M
        Tc = -(-min(m_end, Nk) // TILE_N)
        mask_start = min((input_pos + bid_x * TILE_M) // TILE_N, Nk // TILE_N)
    else:
        Tc = -(-Nk // TILE_N)
        mask_start = Nk // TILE_N
    needs_mask = causal or not even_k
    tiles = []
    for j in range(Tc):
        masked = needs_mask and (j >= mask_start if flags["SPLIT_LOOP"] else True)
        tiles.append((j, "masked" if masked else "full"))
    return tuple(tiles)


def schedule(step, Nq: int, Nk: int, *, causal: bool, input_pos: int = 0,
             config: Config | None = None) -> list[Program]:
    """The programs of the launch grid's first axis, in launch order (bid 0, 1, ...).

    Mirrors fmha_kernel: REMAP reverses the order when causal (chapter 8); PAIR halves the grid
    and program i does query tiles i and n-1-i (chapter 10); see ``Program``.
    """
    step = _step(step)
    if step.kernel != "fmha":
        raise ValueError(f"step {step.name!r} is not the fused kernel: it has no tile schedule")
    config = config or default_config(step)
    flags = step.flag_values()
    TM, TN = config.TILE_M, config.TILE_N
    n = -(-Nq // TM)                                                  # num_m_blocks
    programs = []
    for bid in range(-(-n // 2) if flags["PAIR"] else n):
        if flags["PAIR"]:
            tiles = [bid] if n - 1 - bid == bid else [bid, n - 1 - bid]
        elif flags["REMAP"] and causal:
            tiles = [n - 1 - bid]
        else:
            tiles = [bid]
        keys = tuple(_key_tiles(t, Nk, TM, TN, causal, input_pos, flags) for t in tiles)
        programs.append(Program(bid, tuple(tiles), keys))
    return programs


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


# ---------------------------------------------------------------------------------------------
# CPU emulation of the fused kernel
# ---------------------------------------------------------------------------------------------
def _exp2(x, ftz: bool):
    p = np.exp2(x)
    if ftz:
        # FAST_MATH: exp2(..., flush_to_zero=True) returns 0 instead of a denormal.
        p = np.where(p < np.finfo(np.float32).tiny, np.float32(0), p)
    return p


def _update(qk, m_i, l_i, acc, qk_scale, ftz):
    """online_softmax_update of fmha.py, batched over (batch, head) in the first axis."""
    m_ij = np.maximum(m_i, qk.max(axis=-1, keepdims=True) * qk_scale)    # (BH, TILE_M, 1)
    p = _exp2(qk * qk_scale - m_ij, ftz)                                # (BH, TILE_M, TILE_N)
    alpha = _exp2(m_i - m_ij, ftz)                                      # (BH, TILE_M, 1)
    l_i = l_i * alpha + p.sum(axis=-1, keepdims=True)
    return p, m_ij, l_i, acc * alpha


def _as_f32(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        t = t.detach().to("cpu", torch.float32).numpy()
    return np.asarray(t, dtype=np.float32)


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
    q, k, v = _as_f32(q), _as_f32(k), _as_f32(v)
    check_shapes(q.shape, k.shape, v.shape, causal=causal, scale=scale, input_pos=input_pos)
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kv_head = np.arange(Hq) // max(1, Hq // max(Hkv, 1))             # GQA, chapter 4
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
    flags = step.flag_values()
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
                        p_s = _exp2(qk * qk_scale - m_i, ftz)         # stale max, no rescale
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
