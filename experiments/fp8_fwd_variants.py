"""FP8 forward speed candidates (issue 26): the library's ``fmha_fp8_kernel`` with switches.

The kernel here is ``flashattn/kernels/fp8.py``'s FP8 forward (V given transposed, (B, Hkv, D, Nk);
fast accumulation; P = 2^(s - m + 8) cast to e4m3; the add-form mask) with switches aimed at the
loop that E32's SASS read and E33's profile timed (2.84 ms at SM 45 %: MUFU, issue slots and
tensor cores each need about 1,050 clocks a 128x128 tile, the tile takes about 2,450):

* ``LSUM`` (0 off, 1 or 2: the product written before or after P V; the compiler orders both
  the same): the row sum of P on the tensor cores, ``l += P8 @ ones(TILE_N, 16)`` (an FP8 MMA of
  16 columns beside P V, 1/8 of its work) instead of 64 FADD per thread per tile; the 16 columns
  are equal, the end takes their max. The sum is then of the e4m3-rounded P that P V uses.
* ``SPLIT``: the unmasked key tiles in a loop of TILE_N keys, the masked ones (causal diagonal,
  ragged end) in a second loop of TILE_N // 2 keys: 128x256 spilled 248 bytes causal with the
  mask inside its one loop; split, the masked work is at 128 keys.
* ``PIPE``: S of the next key tile written before the softmax of this one (FlashAttention-3's
  intra-warpgroup pipelining in the source); the last iteration recomputes the last tile (index
  clamped, no load past K).
* ``EXP16``: the exponent in fp32, the exponential of its fp16 value (hoping for a packed
  MUFU.EX2 of two halves).
* ``K_LAT``, ``V_LAT``: the ``latency`` hints (1-10) of the K and V loads (0: none, the FP8
  library kernel's; the fp16 forward uses 2 and 4); they move the compiler's pipeline depth,
  i.e. shared memory and whether two programs fit an SM.
* ``REV`` (causal): the longest query tiles launched first, as the fp16 forward does (chapter 8)
  and the FP8 forward does not.

Tiles and hints come from the variant's ``Config`` (``VARIANTS``). Everything else is the
library kernel as it was before SPLIT and REV went into it: ``base`` (all off) compiles to that
kernel's SASS (sm_90: the same 2,880 lines, 527-instruction loop and 165,000 bytes of shared
memory); ``n256-split-rev`` is what the library now ships on sm_90 at D=128.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cuda.tile as ct  # noqa: E402

from flashattn.kernels.common import INV_LOG_2, key_tile_range  # noqa: E402
from flashattn.kernels.spec import Array, KernelSpec  # noqa: E402

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
P_SHIFT = 8           # P = 2^(s - m + 8) in [0, 256]: e4m3's range (448), as the library
LSUM_N = 16           # columns of the ones tile of the LSUM product (the smallest FP8 MMA N)


def _load_k(K, batch_idx, kv_head, j, TILE_N, TILE_D, LAT):
    if LAT > 0:
        k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO, latency=LAT)
    else:
        k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    return k.reshape((TILE_D, TILE_N))                                 # [TILE_D, TILE_N] fp8


def _load_v(V, batch_idx, kv_head, j, TILE_N, TILE_D, LAT):
    if LAT > 0:
        v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO, latency=LAT)
    else:
        v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO)
    return v.reshape((TILE_N, TILE_D))                                 # [TILE_N, TILE_D] fp8


def _mask(qk, j, offs_m, offs_n_tile, k_seqlen, TILE_M, TILE_N, CAUSAL, EVEN_K):
    """The library's add-form mask (the select form spilled on sm_100/sm_120)."""
    offs_n = j * TILE_N + offs_n_tile                                  # [1, TILE_N]
    mask = ct.full((TILE_M, TILE_N), True, dtype=ct.bool_)
    if not EVEN_K:
        mask = mask & (offs_n < k_seqlen)
    if CAUSAL:
        mask = mask & (offs_m >= offs_n)
    return qk + ct.where(mask, 0.0, -math.inf)


def _softmax_pv(qk, m_i, l_i, l_mm, acc, ones, V, batch_idx, kv_head, j, scale, dtype,
                TN, TILE_D, LSUM, LAT, EXP16):
    """One key tile after S: the online softmax (``common.online_softmax_update`` with FLUSH, no
    GUARD, P_SHIFT = 8), P to fp8, O += P V; the row sum by FADD or (LSUM) by an MMA."""
    m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * scale)        # [TILE_M, 1]
    if EXP16:
        # The exponent in fp32, the exponential in fp16 (two per MUFU.EX2 if packed).
        x = (qk * scale - (m_ij - P_SHIFT)).astype(ct.float16)
        p8 = ct.exp2(x).astype(dtype)
        p = p8                                                         # (LSUM sums it)
    else:
        p = ct.exp2(qk * scale - (m_ij - P_SHIFT), flush_to_zero=True)
        p8 = p.astype(dtype)
    alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)                    # [TILE_M, 1]
    if LSUM == 1:
        l_mm = ct.mma(p8, ones, l_mm * alpha, use_fast_acc=True)       # [TILE_M, LSUM_N]
    if LSUM == 0:
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    v = _load_v(V, batch_idx, kv_head, j, TN, TILE_D, LAT)
    acc = ct.mma(p8, v, acc * alpha, use_fast_acc=True)                # [TILE_M, TILE_D]
    if LSUM == 2:
        l_mm = ct.mma(p8, ones, l_mm * alpha, use_fast_acc=True)       # after P V
    return m_ij, l_i, l_mm, acc


@ct.kernel
def fmha_fp8_var_kernel(Q, K, V, Out, QDescale, KDescale, VDescale,
                        qk_scale: float, input_pos: int, num_heads: int, group_size: int,
                        TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                        CAUSAL: ConstBool, EVEN_K: ConstBool,
                        LSUM: ConstInt, PIPE: ConstBool, K_LAT: ConstInt, V_LAT: ConstInt,
                        EXP16: ConstBool, SPLIT: ConstBool, REV: ConstBool):
    """The library FP8 forward (V^T) with the LSUM / PIPE / LAT switches (module docstring)."""
    if REV and CAUSAL:
        bid_x = ct.num_blocks(0) - 1 - ct.bid(0)    # the longest query tiles first, as fmha.py
    else:
        bid_x = ct.bid(0)
    bid_y = ct.bid(1)
    batch_idx = bid_y // num_heads
    head_idx = bid_y % num_heads
    kv_head = head_idx // group_size
    q_ds = ct.gather(QDescale, (batch_idx, kv_head), padding_value=1.0).item()
    k_ds = ct.gather(KDescale, (batch_idx, kv_head), padding_value=1.0).item()
    v_ds = ct.gather(VDescale, (batch_idx, kv_head), padding_value=1.0).item()
    scale = qk_scale * INV_LOG_2 * q_ds * k_ds                         # log2 units, dequantised

    offs_m = input_pos + bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)
    offs_m = offs_m[:, None]                                           # [TILE_M, 1]
    offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]           # [1, TILE_N]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    l_mm = ct.full((TILE_M, LSUM_N), 0.0, dtype=ct.float32)           # LSUM: P8 @ ones
    ones = ct.full((TILE_N, LSUM_N), 1.0, dtype=Q.dtype)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))

    k_seqlen = K.shape[2]
    Tc, mask_start = key_tile_range(input_pos + bid_x * TILE_M, input_pos + (bid_x + 1) * TILE_M,
                                    k_seqlen, TILE_N, CAUSAL)
    s_next = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
    if PIPE:
        k0 = _load_k(K, batch_idx, kv_head, 0, TILE_N, TILE_D, K_LAT)
        s_next = ct.mma(q, k0, s_next, use_fast_acc=True)

    if SPLIT:
        Tc = mask_start                  # the unmasked tiles here, the masked ones below
    for j in range(0, Tc):
        if PIPE:
            qk = s_next
            # The next tile's S before this tile's softmax (the last iteration: the last tile
            # again, its result unused; no load past K).
            kn = _load_k(K, batch_idx, kv_head, min(j + 1, Tc - 1), TILE_N, TILE_D,
                            K_LAT)
            s_next = ct.mma(q, kn, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32),
                            use_fast_acc=True)
        else:
            k = _load_k(K, batch_idx, kv_head, j, TILE_N, TILE_D, K_LAT)
            qk = ct.mma(q, k, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32),
                        use_fast_acc=True)
        if (CAUSAL or not EVEN_K) and not SPLIT and j >= mask_start:
            qk = _mask(qk, j, offs_m, offs_n_tile, k_seqlen, TILE_M, TILE_N, CAUSAL, EVEN_K)

        m_i, l_i, l_mm, acc = _softmax_pv(qk, m_i, l_i, l_mm, acc, ones, V, batch_idx, kv_head,
                                          j, scale, Q.dtype, TILE_N, TILE_D, LSUM, V_LAT, EXP16)

    if SPLIT:
        # The masked key tiles (the causal diagonal, a ragged end) in tiles of TILE_N // 2.
        TN2 = TILE_N // 2
        offs_n2 = ct.arange(TN2, dtype=ct.int32)[None, :]
        ones2 = ct.full((TN2, LSUM_N), 1.0, dtype=Q.dtype)
        if CAUSAL:
            Tc2 = ct.cdiv(min(input_pos + (bid_x + 1) * TILE_M, k_seqlen), TN2)
        else:
            Tc2 = ct.cdiv(k_seqlen, TN2)
        for j2 in range(2 * mask_start, Tc2):
            k = _load_k(K, batch_idx, kv_head, j2, TN2, TILE_D, K_LAT)
            qk = ct.mma(q, k, ct.full((TILE_M, TN2), 0.0, dtype=ct.float32), use_fast_acc=True)
            qk = _mask(qk, j2, offs_m, offs_n2, k_seqlen, TILE_M, TN2, CAUSAL, EVEN_K)
            m_i, l_i, l_mm, acc = _softmax_pv(qk, m_i, l_i, l_mm, acc, ones2, V, batch_idx,
                                              kv_head, j2, scale, Q.dtype, TN2, TILE_D, LSUM,
                                              V_LAT, EXP16)

    if LSUM > 0:
        l_i = ct.max(l_mm, axis=-1, keepdims=True)                     # its 16 equal columns
    acc = ct.truediv(acc, l_i) * v_ds
    acc = acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)
    ct.store(Out, index=(batch_idx, head_idx, bid_x, 0), tile=acc)


SPEC = KernelSpec(
    "fmha_fp8_var", "experiments.fp8_fwd_variants", "fmha_fp8_var_kernel",
    arrays=(Array("Q", 4, "float8_e4m3fn"), Array("K", 4, "float8_e4m3fn"),
            Array("V", 4, "float8_e4m3fn"), Array("Out", 4), Array("QDescale", 2, "float32"),
            Array("KDescale", 2, "float32"), Array("VDescale", 2, "float32")),
    scalars=(("qk_scale", float), ("input_pos", int), ("num_heads", int),
             ("group_size", int)),
    constants=("TILE_M", "TILE_N", "TILE_D", "CAUSAL", "EVEN_K", "LSUM", "PIPE", "K_LAT",
               "V_LAT", "EXP16", "SPLIT", "REV"))

# name -> (config label, "" for the arch's library config; the switches that differ from
# SWITCHES). Which ones the GPU script times: CANDIDATES there, after the compile report.
VARIANTS: dict[str, tuple[str | None, dict]] = {
    "base": ("", {}),                        # the library kernel before SPLIT/REV
    "lsum": ("", dict(LSUM=1)),
    "pipe": ("", dict(PIPE=True)),
    "e16-lsum": ("", dict(LSUM=1, EXP16=True)),
    "lat24": ("", dict(K_LAT=2, V_LAT=4)),               # the fp16 forward's hints
    "lat8": ("", dict(K_LAT=8, V_LAT=8)),
    "rev": ("", dict(REV=True)),
    "m64-occ2-lat2": ("64x128 occ=2", dict(K_LAT=2, V_LAT=2)),
    "m64-occ2-lat2-lsum": ("64x128 occ=2", dict(K_LAT=2, V_LAT=2, LSUM=1)),
    "n256": ("128x256 occ=1 nww=8", {}),
    "n256-lsum": ("128x256 occ=1 nww=8", dict(LSUM=1)),
    "n256-split": ("128x256 occ=1 nww=8", dict(SPLIT=True)),
    "n256-split-lsum": ("128x256 occ=1 nww=8", dict(LSUM=1, SPLIT=True)),
    "n256-split-lsum-rev": ("128x256 occ=1 nww=8", dict(LSUM=1, SPLIT=True, REV=True)),
    # What the library ships on sm_90 at D=128 since SPLIT and REV went into fmha_fp8_kernel.
    "n256-split-rev": ("128x256 occ=1 nww=8", dict(SPLIT=True, REV=True)),
}
SWITCHES = dict(LSUM=0, PIPE=False, K_LAT=0, V_LAT=0, EXP16=False, SPLIT=False, REV=False)


# sm_90's FP8 forward configs (by padded head dim) before SPLIT went into the library.
OLD_SM90 = {64: "128x128 occ=1 nww=8", 128: "128x128 occ=1 nww=8", 256: "128x64 occ=1 nww=8"}


def old_config(arch: str | None, head_dim: int):
    """The library's FP8 forward config for ``arch`` and ``head_dim`` before SPLIT went in (only
    sm_90's changed)."""
    from flashattn.contract import tile_d_for
    from flashattn.kernels.fp8_spec import fp8_config
    from flashattn.config import Config
    if arch == "sm_90":
        return Config.parse(OLD_SM90[max(64, tile_d_for(head_dim))])
    return fp8_config(arch, head_dim)


def variant_config(name: str, arch: str | None, head_dim: int):
    from flashattn.config import Config
    label, _ = VARIANTS[name]
    # "": the library's config before SPLIT went in (sm_90 D=128: 128x128 nww=8; it now ships
    # 128x256, which without SPLIT spills causal).
    return Config.parse(label) if label else old_config(arch, head_dim)


def variant_constants(name: str, config, *, head_dim: int, causal: bool, even_k: bool) -> dict:
    from flashattn.contract import tile_d_for
    sw = dict(SWITCHES, **VARIANTS[name][1])
    return dict(TILE_M=config.TILE_M, TILE_N=config.TILE_N, TILE_D=tile_d_for(head_dim),
                CAUSAL=bool(causal), EVEN_K=bool(even_k), **sw)


def attention_fp8_var(q8, k8, v8t, *, q_descale, k_descale, v_descale, causal: bool,
                      variant: str, config=None, out_dtype=None):
    """The FP8 forward through ``fmha_fp8_var_kernel``: q8 (B, Hq, N, D), k8 (B, Hkv, Nk, D),
    v8t (B, Hkv, D, Nk) e4m3 (``quantize_fp8(v, v_transposed=True)``), descales (B, Hkv) fp32.
    CPU tensors run in the interpreter (inside ``flashattn.interpret.enabled()``)."""
    import torch
    from flashattn.dispatch import device_arch, launch_kernel, on_device
    from flashattn.kernels import hinted
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
    B, Hq, Nq, D = q8.shape
    Hkv, Nk = k8.shape[1], k8.shape[2]
    if tuple(v8t.shape) != (B, Hkv, D, Nk):
        raise ValueError(f"v8t must be (B, Hkv, D, Nk) = {(B, Hkv, D, Nk)}, got "
                         f"{tuple(v8t.shape)}")
    if config is None:
        config = variant_config(variant, device_arch(q8.device), D)
    out = torch.empty((B, Hq, Nq, D), dtype=out_dtype or torch.bfloat16, device=q8.device)
    consts = variant_constants(variant, config, head_dim=D, causal=causal,
                               even_k=Nk % config.TILE_N == 0)
    args = SPEC.args(dict(Q=q8, K=k8, V=v8t, Out=out, QDescale=q_descale, KDescale=k_descale,
                          VDescale=v_descale),
                     dict(qk_scale=1.0 / math.sqrt(D), input_pos=0, num_heads=Hq,
                          group_size=Hq // Hkv), consts)
    with on_device(q8.device):
        launch_kernel(q8.device, (-(-Nq // config.TILE_M), B * Hq, 1),
                      hinted(SPEC.kernel(), config.hints()), args)
    return out
