"""E32: the FP8-cache decode redesigned around FP8 tensor-core products (issue 26).

    python experiments/fp8_decode_v2.py check                     # CPU: interpreter vs reference
    python experiments/fp8_decode_v2.py compile --out experiments/data/46-fp8-decode-v2/
    python experiments/fp8_decode_v2.py time --out $OUT/fp8dec2.json --budget-s 200   # H200
    python experiments/fp8_decode_v2.py time --dry-run --out /tmp/fp8dec2.json        # CPU

The library's fp8-cache decode (``flashattn/kernels/fp8.py`` ``decode_split_fp8_kernel``) widens
each fp8 K and V tile to fp16 on chip and multiplies in fp16; on the H200 it ran at 0.45-0.77x
the fp16-cache decode (E31): the widening (a converter warp group, through shared memory) costs
more than the halved bytes save. The kernels here never widen the cache:

* ``QK8`` (idea a): the query rows are quantised to e4m3 in the kernel, once per program, with a
  per-row scale ``amax / 448`` folded into the softmax scale; S = Q8 K8^T is an FP8 MMA on the
  cache's bytes as they arrive (K's natural (S, D) layout is already K-major for it).
* ``PV8`` (idea b): P is scaled into e4m3's range as in the FP8 forward (``2^(s - m + 8)``) and
  O += P8 V is an FP8 MMA, with V kept transposed in the cache, ``(B, Hkv, D, S)``: the key axis
  (this product's reduction) contiguous, K-major, as Hopper's FP8 MMA reads both operands (the
  FP8 forward's ``V_T``). The 2^8 cancels in the normalisation and is taken out of the LSE.
  Without PV8, V stays (B, Hkv, S, D) and is widened as in the library kernel.
* ``TILE_M`` (idea d): 64 rows (warpgroup MMA: QGMMA on sm_90, UTCQMMA on sm_100) or the fp16
  plan's 16 (warp MMA; with both operands K-major an fp8 fragment is four consecutive bytes, so
  the compiler may reach it with ldmatrix instead of the byte loads of the library's 16-row
  kernel: the compile report says which).

Everything else (split plan, TILE_N, fused / row / block merge, PDL, NaN poisoning of invalid
lengths) is the library's fp16 plan (``decode.decode_plan``), so only the tile work differs.
Contiguous caches only (a paged V^T cache would transpose within each page; not written).
``v2-qk8-pv8`` is now the library's ``flashattn/kernels/fp8_decode.py`` (contiguous and paged,
``flashattn.decode(..., v_transposed=True)``); this file keeps the variants as timed in E33.

Variants (``VARIANTS``): ``v2-qk8`` (QK8, V widened, 64 rows), ``v2-qk8-pv8`` (QK8 + PV8, 64
rows), ``v2-qk8-pv8-m16`` (QK8 + PV8, 16 rows), ``v2-qk8-pv8-n64`` / ``-n256`` (key tiles of
64 / 256 keys instead of the plan's 128). Rows of ``time``: ``decode-fp16`` (the base),
``decode-fp16#2``, ``decode-fp8`` and ``decode-fp8#2`` (the library's fp8 cache, twice: the
control) and each variant; B = 1, 8, 64, caches 4K-128K, Hq=32, Hkv=8, Nq=1, D=128 (the shapes of
``flashbook/measure/bench_fp8.py``). Every row is checked against its reference before timing.

Accuracy: QK8 adds e4m3 rounding of q (unit roundoff 2^-4) to the scores, the FP8 forward's
error class; the reference is ``flashattn.reference.decode.decode_reference_fp8`` (fp32 attention of fp16 q
and the dequantised caches), so the variants' error against it is larger than the library
kernel's (which keeps q in fp16): ``check`` prints both.

The forward part (``--part forward``; ``both`` by default): ``fmha_fp8_emu_kernel``, the
library's FP8 forward with each key tile in two halves (``fwd-split``) and the second half's
exponentials computed on the FMA pipe (``fwd-emu``, ``exp2_fma``), against the library's FP8
forward (twice: the control) and the fp16 forward (the base), B=1 H=16 N=16K D=128.

Prediction and SASS: experiments/LOG.md E32, experiments/data/46-fp8-decode-v2/.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cuda.tile as ct  # noqa: E402

from flashattn.kernels.decode import merge_splits  # noqa: E402
from flashattn.kernels.spec import Array, KernelSpec  # noqa: E402

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
INV_LOG_2 = 1.0 / math.log(2)
FP8_MAX = 448          # e4m3's largest finite value: q rows are scaled so their amax lands here
P_SHIFT = 8            # P = 2^(s - m + 8) in [0, 256], as the FP8 forward


def _tile(Q, K, V, q, q8, row_scale, scale, m_i, l_i, acc, batch_idx, kv_head, t, seqlen,
          q_pos, offs_n_tile, TILE_M, TILE_N, TILE_D, QK8, PV8, MASKED):
    """One key tile of the online softmax (inlined by cuTile); MASKED: the tile holds keys at
    or past a query's position or past seqlen (those slots may hold anything, NaN included)."""
    n0 = t * TILE_N
    # --- S = Q K^T: K read (D, TILE_N) from its (S, D) memory, K-major ---
    k = ct.load(K, index=(batch_idx, kv_head, 0, t), shape=(1, 1, TILE_D, TILE_N),
                order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    k = k.reshape((TILE_D, TILE_N))                                  # [TILE_D, TILE_N] fp8
    qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    if QK8:
        qk = ct.mma(q8, k, qk, use_fast_acc=True)                    # FP8 MMA, no widening
        s = qk * row_scale                                           # [TILE_M, TILE_N] log2
    else:
        qk = ct.mma(q, k.astype(Q.dtype), qk)
        s = qk * scale
    if MASKED:
        s = ct.where((n0 + offs_n_tile)[None, :] <= q_pos, s, -math.inf)  # select, never add

    # --- online softmax in fp32 ---
    m_ij = max(m_i, ct.max(s, axis=-1, keepdims=True))               # [TILE_M, 1]
    m_use = ct.where(m_ij == -math.inf, 0.0, m_ij)
    alpha = ct.exp2(m_i - m_use)                                     # [TILE_M, 1]
    if PV8:
        p = ct.exp2(s - (m_use - P_SHIFT), flush_to_zero=True)       # in [0, 2^P_SHIFT]
    else:
        p = ct.exp2(s - m_use)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)

    # --- O += P V ---
    if PV8:
        # V stored (D, S): the key axis, this MMA's reduction, contiguous (K-major).
        v = ct.load(V, index=(batch_idx, kv_head, t, 0), shape=(1, 1, TILE_N, TILE_D),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((TILE_N, TILE_D))                              # [TILE_N, TILE_D] fp8
        if MASKED:
            # Garbage (NaN) past seqlen times P = 0 is NaN: zero those keys' values.
            v = ct.where((n0 + offs_n_tile)[:, None] < seqlen, v, 0.0).astype(V.dtype)
        acc = ct.mma(p.astype(V.dtype), v, acc * alpha, use_fast_acc=True)
    else:
        v = ct.load(V, index=(batch_idx, kv_head, t, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((TILE_N, TILE_D)).astype(Q.dtype)              # [TILE_N, TILE_D]
        if MASKED:
            v = ct.where((n0 + offs_n_tile)[:, None] < seqlen, v, 0.0)
        acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
    return m_ij, l_i, acc


@ct.kernel
def decode_fp8mma_kernel(Q, K, V, SeqLens, KDescale, VDescale, Opart, Lse, Out, Counter,
                         qk_scale: float, num_q: int,
                         TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                         FINAL: ConstBool, FUSED: ConstBool, PDL: ConstBool,
                         QK8: ConstBool, PV8: ConstBool):
    """Partial attention of one GQA group over one run of an fp8 cache, FP8 MMAs.

    Q, Out: (B, Hkv, G * Nq, D) fp16/bf16; K: fp8 (B, Hkv, S, D); V: fp8 (B, Hkv, D, S) when PV8
    (transposed), else (B, Hkv, S, D); KDescale, VDescale (B, Hkv) fp32. Grid, split rule,
    FINAL, FUSED and PDL as ``decode_split_kernel``.
    """
    bid_m = ct.bid(0)
    split = ct.bid(1)
    bh = ct.bid(2)
    num_splits = ct.num_blocks(1)
    num_kv_heads = K.shape[1]
    batch_idx = bh // num_kv_heads
    kv_head = bh % num_kv_heads
    k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
    v_ds = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
    scale = qk_scale * INV_LOG_2 * k_ds                              # base 2, K dequantised

    capacity = K.shape[2]
    seqlen_raw = ct.gather(SeqLens, (batch_idx,), padding_value=0).item()
    seqlen = min(max(seqlen_raw, 0), capacity)
    bad = ct.where(seqlen == seqlen_raw, 0, 1)                       # 1: poison the output
    n_tiles = ct.cdiv(seqlen, TILE_N)
    per_split = ct.cdiv(n_tiles, num_splits)
    t_start = min(split * per_split, n_tiles)
    t_end = min(t_start + per_split, n_tiles)
    mask_from = seqlen - num_q + 1

    rows = bid_m * TILE_M + ct.arange(TILE_M, dtype=ct.int32)       # [TILE_M]
    q_pos = (seqlen - num_q + rows % num_q)[:, None]                 # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)                  # [TILE_N]
    q = ct.load(Q, index=(batch_idx, kv_head, bid_m, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))  # [TILE_M, TILE_D]
    if QK8:
        # --- q to e4m3, one scale per row (its amax at 448), folded into the softmax scale ---
        qf = q.astype(ct.float32)
        amax = ct.max(ct.abs(qf), axis=-1, keepdims=True)           # [TILE_M, 1]
        amax = ct.where(amax > 0.0, amax, 1.0)                       # padding rows: zeros
        q8 = (qf * (FP8_MAX / amax)).astype(K.dtype)                 # [TILE_M, TILE_D] fp8
        row_scale = (amax * (1.0 / FP8_MAX)) * scale                 # [TILE_M, 1]
    else:
        q8 = q
        row_scale = ct.full((TILE_M, 1), scale, dtype=ct.float32)
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)

    # Full tiles first, with no mask at all, then the tile(s) the mask touches (the last one
    # for Nq=1). One loop with ``if masked`` inside made the compiler copy every V tile through
    # a worker warp group's registers (LDS.128 -> SEL/PRMT -> STS.128, sm_90 SASS) to apply a
    # select that only the last tile needs.
    t_mid = min(max(t_start, max(mask_from, 0) // TILE_N), t_end)
    for t in range(t_start, t_mid):
        m_i, l_i, acc = _tile(Q, K, V, q, q8, row_scale, scale, m_i, l_i, acc, batch_idx,
                              kv_head, t, seqlen, q_pos, offs_n_tile,
                              TILE_M, TILE_N, TILE_D, QK8, PV8, False)
    for t in range(t_mid, t_end):
        m_i, l_i, acc = _tile(Q, K, V, q, q8, row_scale, scale, m_i, l_i, acc, batch_idx,
                              kv_head, t, seqlen, q_pos, offs_n_tile,
                              TILE_M, TILE_N, TILE_D, QK8, PV8, True)

    has_keys = l_i > 0.0
    o = ct.truediv(acc, ct.where(has_keys, l_i, 1.0)) * v_ds         # 2^P_SHIFT cancels here
    if PV8:
        l_true = ct.where(has_keys, l_i, 1.0) * (1.0 / (1 << P_SHIFT))  # the sum without 2^8
    else:
        l_true = ct.where(has_keys, l_i, 1.0)
    lse = ct.where(has_keys, m_i + ct.log2(l_true), -math.inf)
    if bad > 0:
        o = ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32)
        lse = ct.full((TILE_M, 1), math.nan, dtype=ct.float32)
    if FINAL:
        ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                 tile=o.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
    else:
        ct.store(Opart, index=(split, bh, bid_m, 0), tile=o.reshape((1, 1, TILE_M, TILE_D)))
        ct.store(Lse, index=(split, bh, bid_m), tile=lse.reshape((1, 1, TILE_M)))
        if PDL:
            ct.grid_dependency_control_launch_dependents()
        if FUSED:
            arrived = ct.atomic_add(Counter, (bh, bid_m), 1,
                                    memory_order=ct.MemoryOrder.ACQ_REL,
                                    memory_scope=ct.MemoryScope.DEVICE)
            if arrived == num_splits - 1:
                ct.atomic_xchg(Counter, (bh, bid_m), 0)
                out = merge_splits(Opart, Lse, bh, bid_m, TILE_M, TILE_D)
                ct.store(Out, index=(batch_idx, kv_head, bid_m, 0),
                         tile=out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))


SPEC = KernelSpec(
    "decode_fp8mma", "experiments.fp8_decode_v2", "decode_fp8mma_kernel",
    arrays=(Array("Q", 4), Array("K", 4, "float8_e4m3fn"), Array("V", 4, "float8_e4m3fn"),
            Array("SeqLens", 1, "int32"), Array("KDescale", 2, "float32"),
            Array("VDescale", 2, "float32"), Array("Opart", 4, "float32"),
            Array("Lse", 3, "float32"), Array("Out", 4), Array("Counter", 2, "int32")),
    scalars=(("qk_scale", float), ("num_q", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "FINAL", "FUSED", "PDL", "QK8", "PV8"))

# name -> (QK8, PV8, TILE_M on sm_90/sm_100: None = the library fp8 kernel's 64-row tile)
VARIANTS = {
    "v2-qk8": dict(QK8=True, PV8=False, tile_m=None),
    "v2-qk8-pv8": dict(QK8=True, PV8=True, tile_m=None),
    "v2-qk8-pv8-m16": dict(QK8=True, PV8=True, tile_m=16),
    # idea (d): the key tile sized for fp8 bytes (the plan's 128 keys are 32 KB of fp8 K+V
    # against 64 KB of fp16): 64 keys (more pipeline stages or CTAs) and 256 keys (the fp16
    # tile's bytes, half the per-tile overhead).
    "v2-qk8-pv8-n64": dict(QK8=True, PV8=True, tile_m=None, tile_n=64),
    "v2-qk8-pv8-n256": dict(QK8=True, PV8=True, tile_m=None, tile_n=256),
}


def variant_constants(split_constants: dict, arch: str | None, variant: str) -> dict:
    """The kernel's constants from the fp16 plan's split constants (no paging here)."""
    from flashattn.kernels.decode_spec import DECODE_FP8_TILE_M
    v = VARIANTS[variant]
    c = dict(split_constants, TILE_M=max(int(split_constants["TILE_M"]),
                                         DECODE_FP8_TILE_M.get(arch or "", 0)))
    if v["tile_m"] is not None:
        c["TILE_M"] = max(int(split_constants["TILE_M"]), v["tile_m"])
    if v.get("tile_n"):
        c["TILE_N"] = v["tile_n"]          # the split count (grid) stays the plan's
    return dict(TILE_M=c["TILE_M"], TILE_N=c["TILE_N"], TILE_D=c["TILE_D"],
                FINAL=bool(c.get("FINAL", False)), FUSED=bool(c.get("FUSED", False)),
                PDL=bool(c.get("PDL", False)), QK8=v["QK8"], PV8=v["PV8"])


def transpose_v_cache(v8):
    """(B, Hkv, S, D) fp8 -> (B, Hkv, D, S) fp8: the cache layout PV8 reads (a serving engine
    would append each new token's V as a column; here the whole cache is converted once)."""
    import torch
    vt = torch.empty(v8.shape[:2] + (v8.shape[3], v8.shape[2]), dtype=v8.dtype, device=v8.device)
    vt.view(torch.uint8).copy_(v8.view(torch.uint8).transpose(-1, -2))
    return vt


def decode_v2(q, k8, v8, lens, *, k_descale, v_descale, variant: str, out=None,
              num_splits=None):
    """Decode over a contiguous fp8 cache with ``variant``'s kernel (CPU tensors: the
    interpreter). v8 is (B, Hkv, D, S) for the PV8 variants (``transpose_v_cache``), else
    (B, Hkv, S, D), as k8."""
    import importlib
    import torch
    from flashattn.contract import check_decode
    from flashattn.dispatch import device_arch, device_sm_count, launch_kernel, on_device
    from flashattn.kernels import (DECODE_COMBINE, DECODE_COMBINE_ROW, decode_partial_shapes,
                                   decode_split_grid, hinted)
    _dec = importlib.import_module("flashattn.decoding")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    pv8 = VARIANTS[variant]["PV8"]
    want = (k8.shape[:2] + (k8.shape[3], k8.shape[2])) if pv8 else tuple(k8.shape)
    if tuple(v8.shape) != tuple(want):
        raise ValueError(f"{variant} reads V as {'(B, Hkv, D, S)' if pv8 else '(B, Hkv, S, D)'}"
                         f" = {tuple(want)}, got {tuple(v8.shape)}")
    v_sd = v8
    B, Hq, Nq, D = q.shape
    q_like = torch.empty(q.shape, dtype=k8.dtype, device=q.device)
    v_std = v_sd.transpose(-1, -2) if pv8 else v_sd            # shape check only (a view)
    dims = check_decode(q_like, k8, v_std, lens, None, scale=None, check_values=None)
    Hkv = dims.Hkv
    arch = device_arch(q.device)
    plan = _dec.decode_plan(dims, num_splits=num_splits, sm_count=device_sm_count(q.device),
                            arch=arch)
    c = variant_constants(plan["split_constants"], arch, variant)
    rows = plan["rows"]
    grid = decode_split_grid(B=B, Hkv=Hkv, rows=rows, tile_m=c["TILE_M"],
                             num_splits=plan["num_splits"])
    opart_shape, lse_shape = decode_partial_shapes(num_splits=plan["num_splits"], B=B,
                                                   Hkv=Hkv, rows=rows, tile_m=c["TILE_M"],
                                                   head_dim=D)
    out = torch.empty_like(q) if out is None else out
    final = plan["combine"] is None
    f32 = dict(dtype=torch.float32, device=q.device)
    opart = torch.empty((1, 1, 1, 1) if final else opart_shape, **f32)
    lse = torch.empty((1, 1, 1) if final else lse_shape, **f32)
    counter = (_dec._counters(q.device, plan["counter_shape"]) if plan["combine"] == "fused"
               else torch.empty((1, 1), dtype=torch.int32, device=q.device))
    out_rows = out.view(B, Hkv, rows, D)
    args = SPEC.args(dict(Q=q.contiguous().view(B, Hkv, rows, D), K=k8, V=v_sd, SeqLens=lens,
                          KDescale=k_descale, VDescale=v_descale, Opart=opart, Lse=lse,
                          Out=out_rows, Counter=counter),
                     dict(qk_scale=1.0 / math.sqrt(D), num_q=Nq), c)
    with on_device(q.device):
        launch_kernel(q.device, grid, hinted(SPEC.kernel(), {}), args)
        if plan["combine"] in ("row", "block"):
            spec = DECODE_COMBINE_ROW if plan["combine"] == "row" else DECODE_COMBINE
            launch_kernel(q.device, plan["combine_grid"], spec.kernel(),
                          spec.args(dict(Opart=opart, Lse=lse, Out=out_rows), {},
                                    plan["combine_constants"]), pdl=plan.get("pdl", False))
    return out



# --- the FP8 forward: half of the exponentials on the FMA pipe (item 3 of the brief) ---------
# In the FP8 forward an exponential costs as much as the products: per 128x128 tile the MUFU unit
# (16 exp2 per clock per SM) needs 16,384 / 16 = 1,024 clocks, the FP8 tensor cores (~4,096 MAC
# per clock per SM) 2 x 128^3 / 4,096 = 1,024. FlashAttention-4's lever: compute some
# exponentials with a polynomial on the FMA pipe (128 lanes per clock per SM) instead. P is
# rounded to e4m3 (3 mantissa bits) anyway, so a cubic is far more accurate than needed.
EXP2_MAGIC = 12582912.0   # 1.5 * 2^23: x + MAGIC rounds x to an integer held in the low bits


def exp2_fma(x):
    """2^x for x <= 8 with FADD/FFMA/shift/add only (no MUFU, no F2I: those share the quarter-
    rate pipe): x = j + f, j = round(x), f in [-0.5, 0.5]; 2^f by its cubic Taylor polynomial
    (relative error <= 8.5e-4, at f = -0.5, against e4m3's 2^-4 rounding of P); 2^j added to the
    exponent field. x is clamped at -125 (2^-125: zero once P is cast to e4m3)."""
    x = ct.maximum(x, -125.0)
    t = x + EXP2_MAGIC                                           # j in the low mantissa bits
    j = t - EXP2_MAGIC
    f = x - j                                                    # [-0.5, 0.5]
    poly = ((0.05550411 * f + 0.2402265) * f + 0.6931472) * f + 1.0
    bits = ct.bitcast(poly, ct.int32) + ct.bitwise_lshift(ct.bitcast(t, ct.int32), 23)
    return ct.bitcast(bits, ct.float32)


@ct.kernel
def exp2_fma_kernel(X, Y, TILE: ConstInt):
    """Y = exp2_fma(X) over one tile (the test's probe of the polynomial)."""
    x = ct.load(X, index=(0,), shape=(TILE,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, index=(0,), tile=exp2_fma(x))


@ct.kernel
def fmha_fp8_emu_kernel(Q, K, V, Out, QDescale, KDescale, VDescale,
                        qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                        TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                        CAUSAL: ConstBool, EVEN_K: ConstBool, EMU: ConstBool):
    """The library's FP8 forward (V given transposed, (B, Hkv, D, Nk); fast accumulation; P
    shifted by 2^8) with each key tile taken as two halves of TILE_N // 2 keys: S in two
    products, one row max, P of the first half by MUFU.EX2 and of the second by ``exp2_fma``
    when EMU (else MUFU too: the split alone), O += P_0 V_0 + P_1 V_1."""
    bid_x = ct.bid(0)
    bid_y = ct.bid(1)
    batch_idx = bid_y // num_heads
    head_idx = bid_y % num_heads
    kv_head = head_idx // group_size
    q_ds = ct.gather(QDescale, (batch_idx, kv_head), padding_value=1.0).item()
    k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
    v_ds = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
    scale = qk_scale * INV_LOG_2 * q_ds * k_ds

    offs_m = (input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    offs_h = ct.arange(TILE_N // 2, dtype=ct.int32)[None, :]         # [1, HALF]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    k_seqlen = K.shape[2]
    if CAUSAL:
        m_end = input_pos + (bid_x + 1) * TILE_M
        Tc = ct.cdiv(min(m_end, k_seqlen), TILE_N)
        mask_start = min((input_pos + bid_x * TILE_M) // TILE_N, k_seqlen // TILE_N)
    else:
        Tc = ct.cdiv(k_seqlen, TILE_N)
        mask_start = k_seqlen // TILE_N

    for j in range(0, Tc):
        k0 = ct.load(K, index=(batch_idx, kv_head, 0, 2 * j), shape=(1, 1, TILE_D, TILE_N // 2),
                     order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        k1 = ct.load(K, index=(batch_idx, kv_head, 0, 2 * j + 1),
                     shape=(1, 1, TILE_D, TILE_N // 2), order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO)
        s0 = ct.mma(q, k0.reshape((TILE_D, TILE_N // 2)),
                    ct.full((TILE_M, TILE_N // 2), 0.0, dtype=ct.float32), use_fast_acc=True)
        s1 = ct.mma(q, k1.reshape((TILE_D, TILE_N // 2)),
                    ct.full((TILE_M, TILE_N // 2), 0.0, dtype=ct.float32), use_fast_acc=True)
        if (CAUSAL or not EVEN_K) and j >= mask_start:
            n0 = j * TILE_N + offs_h                                 # [1, HALF]
            n1 = n0 + TILE_N // 2
            ok0 = ct.full((TILE_M, TILE_N // 2), True, dtype=ct.bool_)
            ok1 = ct.full((TILE_M, TILE_N // 2), True, dtype=ct.bool_)
            if not EVEN_K:
                ok0 = ok0 & (n0 < k_seqlen)
                ok1 = ok1 & (n1 < k_seqlen)
            if CAUSAL:
                ok0 = ok0 & (offs_m >= n0)
                ok1 = ok1 & (offs_m >= n1)
            s0 = ct.where(ok0, s0, -math.inf)
            s1 = ct.where(ok1, s1, -math.inf)
        m_ij = max(m_i, max(ct.max(s0, axis=-1, keepdims=True),
                            ct.max(s1, axis=-1, keepdims=True)) * scale)
        shift = m_ij - P_SHIFT
        p0 = ct.exp2(s0 * scale - shift, flush_to_zero=True)         # MUFU.EX2
        if EMU:
            p1 = exp2_fma(s1 * scale - shift)                        # FMA pipe
        else:
            p1 = ct.exp2(s1 * scale - shift, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p0, axis=-1, keepdims=True) + ct.sum(p1, axis=-1,
                                                                         keepdims=True)
        m_i = m_ij
        v0 = ct.load(V, index=(batch_idx, kv_head, 2 * j, 0), shape=(1, 1, TILE_N // 2, TILE_D),
                     order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
        v1 = ct.load(V, index=(batch_idx, kv_head, 2 * j + 1, 0),
                     shape=(1, 1, TILE_N // 2, TILE_D), order=(0, 1, 3, 2),
                     padding_mode=ct.PaddingMode.ZERO)
        acc = ct.mma(p0.astype(Q.dtype), v0.reshape((TILE_N // 2, TILE_D)), acc * alpha,
                     use_fast_acc=True)
        acc = ct.mma(p1.astype(Q.dtype), v1.reshape((TILE_N // 2, TILE_D)), acc,
                     use_fast_acc=True)

    acc = ct.truediv(acc, l_i) * v_ds
    ct.store(Out, index=(batch_idx, head_idx, bid_x, 0),
             tile=acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))


FWD_SPEC = KernelSpec(
    "fmha_fp8_emu", "experiments.fp8_decode_v2", "fmha_fp8_emu_kernel",
    arrays=(Array("Q", 4, "float8_e4m3fn"), Array("K", 4, "float8_e4m3fn"),
            Array("V", 4, "float8_e4m3fn"), Array("Out", 4), Array("QDescale", 2, "float32"),
            Array("KDescale", 2, "float32"), Array("VDescale", 2, "float32")),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "EMU"))
FWD_VARIANTS = {"fwd-split": False, "fwd-emu": True}


def attention_fp8_v2(q8, k8, v8t, *, q_descale, k_descale, v_descale, causal: bool,
                     variant: str = "fwd-emu", config=None, out_dtype=None):
    """The FP8 forward through ``fmha_fp8_emu_kernel``: q8, k8 (B, H, N, D) e4m3, v8t
    (B, Hkv, D, Nk) e4m3 (``quantize_fp8(v, v_transposed=True)``), descales (B, Hkv)."""
    import torch
    from flashattn.dispatch import device_arch, launch_kernel, on_device
    from flashattn.kernels import hinted
    from flashattn.kernels.fp8_fwd_spec import fp8_config
    if variant not in FWD_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(FWD_VARIANTS)}")
    B, Hq, Nq, D = q8.shape
    Hkv, Nk = k8.shape[1], k8.shape[2]
    if tuple(v8t.shape) != (B, Hkv, D, Nk):
        raise ValueError(f"v8t must be (B, Hkv, D, Nk) = {(B, Hkv, D, Nk)}, got "
                         f"{tuple(v8t.shape)}")
    config = fp8_config(device_arch(q8.device), D) if config is None else config
    if Nk % config.TILE_N:
        # A half tile wholly past Nk would be a load outside the array (undefined on a GPU).
        raise ValueError(f"this experiment needs Nk a multiple of TILE_N = {config.TILE_N}, "
                         f"got {Nk}")
    out = torch.empty((B, Hq, Nq, D), dtype=out_dtype or torch.bfloat16, device=q8.device)
    consts = dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=D, CAUSAL=bool(causal),
                  EVEN_K=Nk % config.TILE_N == 0, EMU=FWD_VARIANTS[variant])
    args = FWD_SPEC.args(dict(Q=q8, K=k8, V=v8t, Out=out, QDescale=q_descale,
                              KDescale=k_descale, VDescale=v_descale),
                         dict(qk_scale=1.0 / math.sqrt(D), input_pos=0, num_heads=Hq,
                              group_size=Hq // Hkv), consts)
    with on_device(q8.device):
        launch_kernel(q8.device, (-(-Nq // config.TILE_M), B * Hq, 1),
                      hinted(FWD_SPEC.kernel(), config.hints()), args)
    return out

# --- check: the interpreter against the references (CPU) ---------------------------------------
def check_rows(*, B=2, Hq=8, Hkv=2, D=64, L=300, seed=0) -> list[dict]:
    """Every kernel on one small case (GQA 4:1, two sequences, the second shorter with NaN in
    the slots past its length), one split and three: max |error| against the FP8-cache
    reference (fp16 q, dequantised caches) and against fp32 attention of the unquantised
    caches (what a user loses), and the output's scale. CPU tensors run in the interpreter."""
    import torch
    import flashattn
    from flashattn import interpret
    from flashattn.fp8 import quantize_fp8
    from flashattn.reference.decode import decode_reference_fp8
    from flashattn.reference.decode import decode_attention
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, 1, D, generator=g).to(torch.float16)
    k = torch.randn(B, Hkv, L, D, generator=g)
    v = torch.randn(B, Hkv, L, D, generator=g)
    k8, kd = quantize_fp8(k, num_kv_heads=Hkv)
    v8, vd = quantize_fp8(v, num_kv_heads=Hkv)
    lens = torch.tensor([L] + [max(1, L // 2 - 19 * i) for i in range(1, B)], dtype=torch.int32)
    nan8 = torch.tensor(float("nan")).to(k8.dtype)
    for b in range(1, B):
        k8[b, :, int(lens[b]):] = nan8
        v8[b, :, int(lens[b]):] = nan8
    ref8 = decode_reference_fp8(q, k8, v8, lens, kd, vd)
    ref32 = torch.cat([decode_attention(q[b:b + 1].float(), k[b:b + 1], v[b:b + 1],
                                        lens[b:b + 1]) for b in range(B)])
    scale = ref32.abs().max().item()
    out = []
    with interpret.enabled():
        for ns in (1, 3):
            runs = {"decode-fp8": lambda: flashattn.decode(q, k8, v8, lens, k_descale=kd,
                                                           v_descale=vd, num_splits=ns)}
            for name, var in VARIANTS.items():
                vv = transpose_v_cache(v8) if var["PV8"] else v8
                runs[name] = (lambda n=name, vv=vv: decode_v2(
                    q, k8, vv, lens, k_descale=kd, v_descale=vd, variant=n, num_splits=ns))
            for name, fn in runs.items():
                o = fn().float()
                out.append(dict(impl=name, splits=ns, B=B, Hq=Hq, Hkv=Hkv, D=D, L=L,
                                err_ref8=(o - ref8).abs().max().item(),
                                err_fp32=(o - ref32).abs().max().item(),
                                rmse_fp32=((o - ref32) ** 2).mean().sqrt().item(),
                                out_absmax=scale))
    return out


# --- compile: SASS of every kernel (tileiras, no GPU) ------------------------------------------
SASS_PATTERNS = {
    "QGMMA": r"\bQGMMA\b", "HGMMA": r"\bHGMMA\b", "UTCQMMA": r"\bUTC\w*QMMA\b",
    "UTCHMMA": r"\bUTC\w*HMMA\b", "QMMA": r"\bQMMA\b", "HMMA": r"\bHMMA\b",
    "LDSM": r"\bLDSM\b", "LDS.U8": r"\bLDS\.U8\b", "LDS.U16": r"\bLDS\.U16\b",
    "LDS.128": r"\bLDS\.128\b", "LDS": r"\bLDS\b", "STS": r"\bSTS\b", "STS.U16": r"\bSTS\.U16\b",
    "STS.128": r"\bSTS\.128\b", "F2FP.unpack": r"\bF2FP\.\S*UNPACK", "F2FP": r"\bF2FP\b",
    "I2F": r"\bI2F\b", "PRMT": r"\bPRMT\b", "MUFU.EX2": r"\bMUFU\.EX2\b", "BAR": r"\bBAR\b",
    "UTMALDG": r"\bUTMALDG\b", "LDG": r"\bLDG\b", "LDL": r"\bLDL\b", "STL": r"\bSTL\b"}


def sass_counts(text: str) -> dict:
    """Opcode counts of a SASS listing, and the longest backward branch's span (the main
    loop's instruction count, per warp; in a warp-specialised kernel, the longest loop)."""
    instr = []
    for ln in text.splitlines():
        mm = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*)", ln)
        if mm:
            instr.append((int(mm.group(1), 16), mm.group(2)))
    counts = {k: sum(1 for _, s in instr if re.search(p, s)) for k, p in SASS_PATTERNS.items()}
    loops = []                                   # (span, the loop's own opcode counts)
    for addr, s in instr:
        b = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", s)
        if b and int(b.group(1), 16) < addr:
            body = [x for a, x in instr if int(b.group(1), 16) <= a <= addr]
            loops.append((len(body), body))
    counts["lines"] = len(instr)
    # The main loop: the shortest backward-branch span holding an MMA (per warp; in a
    # warp-specialised kernel the MMA/softmax warps' loop). Its opcode mix is what a tile costs.
    mma = re.compile(r"\b(?:QGMMA|HGMMA|UTC\w*MMA|QMMA|HMMA)\b")
    main = min((lp for lp in loops if any(mma.search(x) for x in lp[1])), default=(0, []),
               key=lambda lp: lp[0])
    counts["loop"] = main[0]
    counts["loop_counts"] = {k: sum(1 for x in main[1] if re.search(p, x))
                             for k, p in SASS_PATTERNS.items()}
    counts["loops"] = sorted((n for n, _ in loops), reverse=True)[:6]
    forms = sorted({m for _, s in instr for m in re.findall(
        r"\b(?:QGMMA|HGMMA|UTC\w*MMA|QMMA|HMMA)[\w.]*", s)})
    counts["mma_forms"] = forms
    return counts


LOOP_OPS = {"MMA": r"\b(?:QGMMA|HGMMA|UTC\w*MMA|QMMA|HMMA)\b", "MUFU.EX2": r"\bMUFU\.EX2\b",
            "F2FP": r"\bF2FP\b", "PRMT": r"\bPRMT\b", "LDS": r"\bLDS", "STS": r"\bSTS",
            "LDSM": r"\bLDSM\b", "SEL": r"\bSEL\b", "LDL/STL": r"\b(?:LDL|STL)\b",
            "TMA": r"\bUTMALDG\b", "SYNCS": r"\bSYNCS\b"}


def loop_table(text: str, max_span: int = 2000) -> list[dict]:
    """The per-tile loops of a listing: every backward branch spanning at most ``max_span``
    instructions (longer spans are the outer structure of a warp-specialised kernel) and at
    least 40, with its opcode mix: which warps do MMA/softmax work and which copy or convert."""
    instr = []
    for ln in text.splitlines():
        mm = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*)", ln)
        if mm:
            instr.append((int(mm.group(1), 16), mm.group(2)))
    out = []
    for addr, s in instr:
        b = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", s)
        if b and int(b.group(1), 16) < addr:
            body = [x for a, x in instr if int(b.group(1), 16) <= a <= addr]
            if 40 <= len(body) <= max_span:
                out.append(dict(start=hex(int(b.group(1), 16)), end=hex(addr), instr=len(body),
                                **{k: sum(1 for x in body if re.search(p, x))
                                   for k, p in LOOP_OPS.items()}))
    return out


def compile_cases(archs=("sm_90", "sm_100"), D=128, rows=4):
    """(label, spec, constants, hints) for the fp16 split kernel, the library's fp8 kernel and
    each variant, at the benchmark's decode shape (GQA 32:8, Nq=1: 4 packed rows; contiguous,
    several splits)."""
    from flashattn.kernels import (DECODE_SPLIT, DECODE_SPLIT_FP8, DECODE_SPLIT_HINTS,
                                   decode_hints, decode_kernel_constants,
                                   decode_split_constants)
    cases = []
    for arch in archs:
        base = decode_split_constants(rows=rows, head_dim=D, page_size=None, arch=arch)
        hints = DECODE_SPLIT_HINTS.get(arch, {})
        cases.append((arch, "fp16 cache (library)", DECODE_SPLIT, base, dict(hints)))
        c8 = decode_kernel_constants(rows=rows, head_dim=D, page_size=None, arch=arch,
                                     cache="float8_e4m3fn")
        cases.append((arch, "fp8 cache (library)", DECODE_SPLIT_FP8, c8, decode_hints(c8, arch)))
        for name in VARIANTS:
            cases.append((arch, name, SPEC, variant_constants(base, arch, name), {}))
    return cases


def forward_compile_cases(archs=("sm_90", "sm_100"), D=128):
    """The library's FP8 forward (V^T, its default tile) beside fwd-split and fwd-emu, causal
    and not, at the arch's FP8 configuration."""
    from flashattn.kernels.fp8_fwd_spec import FMHA_FP8, fp8_config, fp8_constants
    cases = []
    for arch in archs:
        cfg = fp8_config(arch, D)
        for causal in (False, True):
            tag = f"{'causal' if causal else 'full'} {cfg.label()}"
            cases.append((arch, f"fwd fp8 (library) {tag}", FMHA_FP8, fp8_constants(
                cfg, head_dim=D, causal=causal, even_k=True, v_transposed=True), cfg.hints()))
            for name, emu in FWD_VARIANTS.items():
                cases.append((arch, f"{name} {tag}", FWD_SPEC, dict(
                    TILE_M=cfg.TILE_M, TILE_N=cfg.TILE_N, TILE_D=D, CAUSAL=causal, EVEN_K=True,
                    EMU=emu), cfg.hints()))
    return cases


def compile_report(archs=("sm_90", "sm_100"), keep_dir: Path | None = None,
                   forward: bool = True) -> list[dict]:
    from flashattn.aot import compile_spec
    rows = []
    cases = compile_cases(archs) + (forward_compile_cases(archs) if forward else [])
    for arch, label, spec, consts, hints in cases:
        r = compile_spec(spec, arch, consts, hints=hints, dtype="float16", align=16,
                         label=label, step=spec.name, keep_sass=True)
        text = getattr(r, "sass_text", "")
        if keep_dir is not None and text:
            fn = re.sub(r"[^A-Za-z0-9]+", "-", f"{arch}-{label}").strip("-") + ".sass"
            (keep_dir / fn).write_text(text)
        rows.append(dict(arch=arch, kernel=label, tile=f"{consts['TILE_M']}x{consts['TILE_N']}",
                         ffma=sum(1 for ln in text.splitlines() if re.search(r"\bFFMA\b", ln)),
                         registers=r.registers, stack=r.stack_bytes, shared=r.shared_bytes,
                         error=r.error, hints=hints, loop_table=loop_table(text),
                         **sass_counts(text)))
    return rows


def format_report(rows) -> str:
    cols = ["QGMMA", "HGMMA", "UTCQMMA", "UTCHMMA", "QMMA", "HMMA", "LDSM", "LDS.U8", "LDS.U16",
            "LDS.128", "STS", "F2FP", "PRMT", "MUFU.EX2", "BAR", "lines", "loop"]
    head = ["arch", "kernel", "tile", "regs", "stack", "smem"] + cols + ["loops", "MMA forms"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["error"]:
            out.append(f"| {r['arch']} | {r['kernel']} | {r['tile']} | ERROR {r['error'][:120]} |")
            continue
        out.append("| " + " | ".join(
            [r["arch"], r["kernel"], r["tile"], str(r["registers"]), str(r["stack"]),
             str(r["shared"])] + [str(r[c]) for c in cols]
            + [",".join(map(str, r["loops"])), " ".join(r["mma_forms"])]) + " |")
    return "\n".join(out)


# --- time: the H200 run ------------------------------------------------------------------------
def kv_bytes(B, L, Hkv=8, D=128, elem=2):
    """Bytes of K and V one decode step reads (every sequence full)."""
    return 2 * B * Hkv * L * D * elem


def decode_calls(B, L, device, *, Hq=32, Hkv=8, D=128, variants=tuple(VARIANTS)):
    """{row: fn} for one shape and each row's max |error| against its reference (batch 0):
    fp16 rows against fp32 attention of the fp16 cache, fp8 rows against
    ``decode_reference_fp8``. Caches: N(0, 1), which e4m3 holds with descale 1."""
    import torch
    import flashattn
    from flashattn.reference.decode import decode_reference_fp8
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, Hq, 1, D, generator=g, device=device, dtype=torch.float16)
    kc = torch.randn(B, Hkv, L, D, generator=g, device=device, dtype=torch.float16)
    vc = torch.randn(B, Hkv, L, D, generator=g, device=device, dtype=torch.float16)
    k8, v8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
    v8t = transpose_v_cache(v8) if any(VARIANTS[v]["PV8"] for v in variants) else None
    kd = torch.ones(B, Hkv, dtype=torch.float32, device=device)
    vd = torch.ones(B, Hkv, dtype=torch.float32, device=device)
    lens = torch.full((B,), L, dtype=torch.int32, device=device)
    outs = {n: torch.empty_like(q) for n in ("fp16", "fp8") + tuple(variants)}
    fns = {
        "decode-fp16": lambda: flashattn.decode(q, kc, vc, lens, out=outs["fp16"]),
        "decode-fp16#2": lambda: flashattn.decode(q, kc, vc, lens, out=outs["fp16"]),
        "decode-fp8": lambda: flashattn.decode(q, k8, v8, lens, k_descale=kd, v_descale=vd,
                                               out=outs["fp8"]),
        "decode-fp8#2": lambda: flashattn.decode(q, k8, v8, lens, k_descale=kd, v_descale=vd,
                                                 out=outs["fp8"]),
    }
    for name in variants:
        vv = v8t if VARIANTS[name]["PV8"] else v8
        fns[name] = (lambda n=name, vv=vv: decode_v2(q, k8, vv, lens, k_descale=kd,
                                                      v_descale=vd, variant=n, out=outs[n]))
    b1 = slice(0, 1)
    ref8 = decode_reference_fp8(q[b1], k8[b1], v8[b1], lens[b1], kd[b1], vd[b1]).float().cpu()
    ref16 = flashattn.reference.decode_attention(q[b1].float(), kc[b1].float(), vc[b1].float(),
                                                 lens[b1]).float().cpu()
    errs = {}
    for name, fn in fns.items():
        o = fn()
        ref = ref16 if "fp16" in name else ref8
        errs[name] = (o[b1].float().cpu() - ref).abs().max().item()
    return fns, errs


def forward_calls(B, H, N, D, causal, device, *, Hkv=None):
    """{row: fn} for the FP8 forward at one shape, and each row's max |error| (one head):
    fwd-fp16 (flashattn.attention on fp16, the base) against fp32 attention of the fp16 inputs;
    the FP8 rows against ``reference_fp8`` (fp32 attention of the dequantised inputs)."""
    import torch
    import flashattn
    from flashattn.fp8 import attention_fp8, quantize_fp8, reference_fp8
    Hkv = Hkv or H
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(B, H, N, D, generator=g, device=device, dtype=torch.float16)
    k = torch.randn(B, Hkv, N, D, generator=g, device=device, dtype=torch.float16)
    v = torch.randn(B, Hkv, N, D, generator=g, device=device, dtype=torch.float16)
    q8, qd = quantize_fp8(q, num_kv_heads=Hkv)
    k8, kd = quantize_fp8(k, num_kv_heads=Hkv)
    v8t, vd = quantize_fp8(v, num_kv_heads=Hkv, v_transposed=True)
    kw = dict(q_descale=qd, k_descale=kd, v_descale=vd, causal=causal)
    cfg = None
    if device.type == "cpu":
        from flashattn.config import Config
        cfg = Config.parse("64x64")
    fns = {
        "fwd-fp16": lambda: flashattn.attention(q, k, v, causal=causal),
        "fwd-fp8": lambda: attention_fp8(q8, k8, v8t, v_transposed=True, config=cfg, **kw),
        "fwd-fp8#2": lambda: attention_fp8(q8, k8, v8t, v_transposed=True, config=cfg, **kw),
    }
    for name in FWD_VARIANTS:
        fns[name] = (lambda n=name: attention_fp8_v2(q8, k8, v8t, variant=n, config=cfg, **kw))
    hs = slice(0, 1)
    ref8 = reference_fp8(q8[:1, hs], k8[:1, hs], v8t[:1, hs].transpose(-1, -2), qd[:1, hs],
                         kd[:1, hs], vd[:1, hs], causal=causal).float().cpu()
    ref16 = flashattn.reference.attention(q[:1, hs].float(), k[:1, hs].float(),
                                          v[:1, hs].float(), causal=causal).float().cpu()
    errs = {}
    for name, fn in fns.items():
        o = fn()
        errs[name] = (o[:1, hs].float().cpu() - (ref16 if "fp16" in name else ref8)).abs().max().item()
    return fns, errs


def _timer(dry: bool):
    """{name: fn} -> {name: {median_ms, ...}}: flashattn.timing.time_rounds on the GPU (CUDA
    graphs, L2 flush and idle before each sample, random order per round); in the dry run the
    host time of one call (fake timing)."""
    if dry:
        def fake(fns, rounds):
            res = {}
            for n, f in fns.items():
                t0 = time.perf_counter()
                f()
                res[n] = dict(median_ms=(time.perf_counter() - t0) * 1e3,
                              method="fake (CPU host time)")
            return res
        return fake
    from flashattn.timing import time_rounds
    from flashbook.measure.harness import estimate_ms

    def project(fns, rounds):
        est = estimate_ms(fns)
        inner = {n: max(1, min(20, int(3.0 / max(ms, 1e-3)))) for n, ms in est.items()}
        return {n: dict(median_ms=t.median_ms, ci_lo_ms=t.ci_lo_ms, ci_hi_ms=t.ci_hi_ms,
                        method=t.method, samples=t.samples, inner=inner[n])
                for n, t in time_rounds(fns, rounds=rounds, inner=inner).items()}
    return project


# A row whose output is further than this from its reference is not timed (a wrong kernel).
# fp16 / library fp8 rows: fp32-accumulated, ~1e-4 at these shapes (E31: <= 7e-5). Variants:
# q rounded to e4m3 (unit roundoff 2^-4) changes scores of size ~1 by up to ~0.1, and P in e4m3;
# the CPU check measured ~3e-2 at 300 keys, less at long caches (outputs average more keys).
TOL = {"fp16": 2e-3, "fp8": 2e-3, "v2": 0.1}
FWD_RESERVE_S = 60.0   # the forward part's share of --budget-s when both parts run


TOL["fwd"] = 0.1      # P in e4m3: the library FP8 forward's own error class (E31: <= ~4e-2)


def _tol(name):
    if name.startswith("fwd"):
        return TOL["fwd"] if ("fp8" in name or name in FWD_VARIANTS) else TOL["fp16"]
    return TOL["v2"] if name.startswith("v2") else TOL["fp8" if "fp8" in name else "fp16"]


def time_main(a) -> int:
    import torch
    t_start = time.time()
    if a.dry_run:
        import contextlib
        from flashattn import interpret
        ctx, device = interpret.enabled(), torch.device("cpu")
        shapes = [(1, 256), (2, 384)]
        hq, hkv, d = 8, 2, 64
    else:
        import contextlib
        import os
        os.environ.setdefault("FLASHATTN_AUTOTUNE", "0")
        ctx, device = contextlib.nullcontext(), torch.device("cuda")
        shapes = [(b, L) for b in a.batch for L in a.cache]
        hq, hkv, d = 32, 8, 128
    timer = _timer(a.dry_run)
    rows, skipped, failed = [], [], []
    if a.part == "forward":
        shapes = []
    # With both parts the decode shapes leave FWD_RESERVE_S of the budget to the forward.
    dec_budget = a.budget_s - (FWD_RESERVE_S if a.part == "both" else 0)
    with ctx, torch.no_grad():
        for B, L in shapes:
            shape = dict(part="decode", B=B, L=L, Hq=hq, Hkv=hkv, D=d)
            if time.time() - t_start > dec_budget:
                skipped.append(shape)
                continue
            fns, errs = decode_calls(B, L, device, Hq=hq, Hkv=hkv, D=d, variants=a.variants)
            bad = [n for n, e in errs.items() if not e <= _tol(n)]
            for n in bad:
                failed.append(dict(shape, impl=n, max_err=errs[n]))
                del fns[n]
            res = timer(fns, a.rounds)
            base = res.get("decode-fp16", {}).get("median_ms", math.nan)
            fp8 = res.get("decode-fp8", {}).get("median_ms")
            for name, r in res.items():
                nbytes = kv_bytes(B, L, Hkv=hkv, D=d, elem=2 if "fp16" in name else 1)
                rows.append(dict(shape, impl=name, max_err=errs[name], kv_bytes=nbytes,
                                 gbps=nbytes / r["median_ms"] / 1e6,
                                 vs_fp16=base / r["median_ms"],
                                 vs_fp8=(fp8 / r["median_ms"]) if fp8 else None, **r))
            del fns
            if device.type == "cuda":
                torch.cuda.empty_cache()
        fwd_shapes = [] if a.part == "decode" else (
            [(1, 2, 128, 64, c) for c in (False, True)] if a.dry_run else
            [(1, 16, N, 128, c) for N in a.fwd_n for c in (False, True)])
        for B, H, N, D, causal in fwd_shapes:
            shape = dict(part="forward", B=B, H=H, N=N, D=D, causal=causal)
            if time.time() - t_start > a.budget_s:
                skipped.append(shape)
                continue
            fns, errs = forward_calls(B, H, N, D, causal, device)
            for n in [n for n, e in errs.items() if not e <= _tol(n)]:
                failed.append(dict(shape, impl=n, max_err=errs[n]))
                del fns[n]
            res = timer(fns, a.rounds)
            flops = 4.0 * B * H * N * N * D / (2 if causal else 1)
            b16 = res.get("fwd-fp16", {}).get("median_ms", math.nan)
            b8 = res.get("fwd-fp8", {}).get("median_ms", math.nan)
            for name, r in res.items():
                rows.append(dict(shape, impl=name, max_err=errs[name],
                                 tflops=flops / r["median_ms"] / 1e9,
                                 vs_fp16=b16 / r["median_ms"], vs_fp8=b8 / r["median_ms"], **r))
            del fns
            if device.type == "cuda":
                torch.cuda.empty_cache()
    lines = []
    for r in rows:
        if r["part"] == "forward":
            lines.append(f"fwd N={r['N']:<6} {'causal' if r['causal'] else 'full  '} "
                         f"{r['impl']:12} {r['median_ms']:9.4f} ms {r['tflops']:7.1f} TFLOPS "
                         f"x{r['vs_fp16']:.3f} fp16 x{r['vs_fp8']:.3f} fp8 err {r['max_err']:.2e}")
            continue
        lines.append(f"B={r['B']:<3} L={r['L']:<7} {r['impl']:16} {r['median_ms']:9.4f} ms "
                     f"{r['gbps']:8.1f} GB/s x{r['vs_fp16']:.3f} fp16 "
                     + (f"x{r['vs_fp8']:.3f} fp8 " if r["vs_fp8"] else "")
                     + f"err {r['max_err']:.2e}")
    print("\n".join(lines))
    if failed:
        print(f"NOT TIMED (error above tolerance): {failed}")
    if skipped:
        print(f"skipped (budget {a.budget_s} s spent): {skipped}")
    from flashattn.env import metadata
    meta = dict(metadata("python experiments/fp8_decode_v2.py " + " ".join(a.argv),
                         device=device if device.type == "cuda" else None),
                device=(torch.cuda.get_device_name(device) if device.type == "cuda"
                        else "cpu (interpreter dry run, fake timing)"),
                rounds=a.rounds, dry_run=a.dry_run, budget_s=a.budget_s,
                variants=list(a.variants), tolerance=TOL, part=a.part, seconds=round(time.time() - t_start, 1),
                method=("fake: CPU host time of one call" if a.dry_run else
                        "flashattn.timing.time_rounds: CUDA graphs, L2 flush + idle per sample, "
                        "random order per round"))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, rows=rows, skipped=skipped, failed=failed),
                              indent=1) + "\n")
    print(f"wrote {out} ({meta['seconds']} s)")
    return 1 if failed and not a.dry_run else 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("time", help="time every row (GPU; --dry-run: CPU interpreter)")
    t.add_argument("--out", default="fp8dec2.json")
    t.add_argument("--budget-s", type=float, default=200.0,
                   help="stop adding shapes after this many seconds")
    t.add_argument("--rounds", type=int, default=10)
    # B=8 first: the target's shapes (B=8 from 32K) are timed before the budget can run out.
    t.add_argument("--batch", type=int, nargs="+", default=[8, 64, 1])
    t.add_argument("--cache", type=int, nargs="+",
                   default=[4096, 16384, 32768, 65536, 131072])
    t.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    t.add_argument("--part", choices=("decode", "forward", "both"), default="both")
    t.add_argument("--fwd-n", type=int, nargs="+", default=[16384],
                   help="forward lengths (B=1, H=16, D=128, causal and not)")
    t.add_argument("--dry-run", action="store_true",
                   help="CPU: tiny shapes through the interpreter, fake timing")
    c = sub.add_parser("compile", help="SASS report (tileiras + cuobjdump, no GPU)")
    c.add_argument("--out", default="experiments/data/46-fp8-decode-v2")
    c.add_argument("--arch", nargs="+", default=["sm_90", "sm_100"])
    k = sub.add_parser("check", help="interpreter against the references (CPU)")
    k.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    a.argv = argv
    if a.mode == "time":
        return time_main(a)
    if a.mode == "compile":
        d = Path(a.out)
        (d / "sass").mkdir(parents=True, exist_ok=True)
        rows = compile_report(tuple(a.arch), keep_dir=d / "sass")
        (d / "sass.json").write_text(json.dumps(rows, indent=1) + "\n")
        table = format_report(rows)
        loops = ["", "Per-tile loops (backward branches of 40-2000 instructions; per warp):", ""]
        for r in rows:
            for lp in r["loop_table"]:
                loops.append(f"- {r['arch']} {r['kernel']}: " + ", ".join(
                    f"{k} {v}" for k, v in lp.items() if v))
        table = table + "\n" + "\n".join(loops)
        (d / "sass.md").write_text(table + "\n")
        for f in (d / "sass").glob("*.sass"):          # listings compressed: ~1.7 MB each
            import lzma
            (d / "sass" / (f.name + ".xz")).write_bytes(lzma.compress(f.read_bytes()))
            f.unlink()
        print(table)
        return 0
    rows = check_rows()
    for r in rows:
        print(f"{r['impl']:16} splits={r['splits']} max|err| vs fp8 ref {r['err_ref8']:.2e}  "
              f"vs fp32 of unquantised caches {r['err_fp32']:.2e} (rmse {r['rmse_fp32']:.2e}; "
              f"|out| max {r['out_absmax']:.2f})")
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
