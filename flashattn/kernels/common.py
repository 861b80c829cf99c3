"""The attention math every kernel shares, written once: cuTile inlines these helpers into the
kernels that import them (forward ``fmha.py``, backward ``fmha_bwd.py``, decoding ``decode.py``,
packed varlen ``varlen.py``, flex ``flex.py``/``flex_bwd.py``, FP8 ``fp8.py``), so a helper
costs no call.

Scores are in log2 units after ``qk_scale * INV_LOG_2``: the hardware has exp2 (MUFU.EX2).
"""
import math

import cuda.tile as ct

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

INV_LOG_2 = 1.0 / math.log(2)  # exp(x) = exp2(x * log2(e)): the hardware has exp2 (MUFU.EX2)


def mask_scores(qk, offs_m, offs_n, k_seqlen, CAUSAL: ConstBool, EVEN_K: ConstBool):
    """-inf where key ``offs_n`` is past ``k_seqlen`` (unless EVEN_K) or, if causal, after query
    position ``offs_m``. ``offs_m`` and ``offs_n`` broadcast to
    ``qk``'s shape ([TILE_M, 1] and [1, TILE_N]; the backward's transposed tiles the other way).

    The safe form: ``where(mask, qk, -inf)`` selects, so a masked score that is NaN or inf (a
    cache slot past the sequence, a non-finite future key) cannot leak as ``qk + -inf`` would.
    """
    mask = ct.full(qk.shape, True, dtype=ct.bool_)
    if not EVEN_K:
        mask = mask & (offs_n < k_seqlen)                            # keys past the end
    if CAUSAL:
        mask = mask & (offs_m >= offs_n)                             # future keys
    return ct.where(mask, qk, -math.inf)


def online_softmax_update(qk, m_i, l_i, acc, qk_scale, GUARD: ConstBool, FLUSH: ConstBool,
                          P_SHIFT: ConstInt = 0):
    """One block of the online softmax: returns p and the updated m_i, l_i, acc.

    qk: [TILE_M, TILE_N] masked raw scores; m_i, l_i: [TILE_M, 1] running max (scaled by
    qk_scale, log2 units) and running sum; acc: [TILE_M, TILE_D] unnormalised output, returned
    rescaled (the caller adds P V).
    GUARD: a row whose scores are all -inf so far (it sees no key yet) keeps m_i = -inf and
        p = 0 instead of -inf - -inf = NaN.
    FLUSH: denormals to zero, so exp2 is one MUFU.EX2 with no range fix-up.
    P_SHIFT: p = 2^(s - m + P_SHIFT), in [0, 2^P_SHIFT], so an FP8 P keeps its small
        probabilities; l_i carries the same factor, the final division cancels it.
    """
    # The scale is applied after the row max: one multiply per row instead of per element.
    m_ij = max(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale)  # [TILE_M, 1]
    m_use = m_ij
    if GUARD:
        m_use = ct.where(m_ij == -math.inf, 0.0, m_ij)
    if P_SHIFT:
        p = ct.exp2(qk * qk_scale - (m_use - P_SHIFT), flush_to_zero=FLUSH)  # [TILE_M, TILE_N]
    else:
        p = ct.exp2(qk * qk_scale - m_use, flush_to_zero=FLUSH)          # [TILE_M, TILE_N]
    alpha = ct.exp2(m_i - m_use, flush_to_zero=FLUSH)                # [TILE_M, 1]
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)            # [TILE_M, 1]
    acc = acc * alpha                                                # [TILE_M, TILE_D]
    return p, m_ij, l_i, acc


def key_tile_range(all_see, last_sees, k_seqlen, TILE_N: ConstInt, CAUSAL: ConstBool):
    """(Tc, mask_start): a query tile visits key tiles ``0 .. Tc - 1`` and masks those from
    ``mask_start`` on. Causal: ``last_sees`` keys are visible to its last row (the
    tiles after them are fully masked: skipped), ``all_see`` (or fewer) to every row. Not
    causal: every key tile, the mask only on the ragged end of K."""
    if CAUSAL:
        Tc = ct.cdiv(min(last_sees, k_seqlen), TILE_N)
        mask_start = min(all_see // TILE_N, k_seqlen // TILE_N)
    else:
        Tc = ct.cdiv(k_seqlen, TILE_N)
        mask_start = k_seqlen // TILE_N
    return Tc, mask_start


def merge_lse(m, l, acc, lse, o, REDUCE: ConstBool):
    """Fold partial results into a running merge, the LSE algebra as an online softmax:
    ``lse = log2(sum_s 2^lse_s)``, ``o = sum_s 2^(lse_s - lse) o_s``. m, l: [R, 1] running
    max of lse_s and sum of 2^(lse_s - m); acc: [R, TILE_D] sum of 2^(lse_s - m) o_s. lse, o:
    one partial per row ([R, 1], [R, TILE_D]), or with REDUCE ``S`` partials of one row
    ([S, 1], [S, TILE_D], R = 1). A row whose partials are all -inf keeps weight 0 (no NaN)."""
    if REDUCE:
        m_new = max(m, ct.max(lse, axis=0, keepdims=True))
    else:
        m_new = max(m, lse)
    m_use = ct.where(m_new == -math.inf, 0.0, m_new)                 # all -inf so far: weights 0
    alpha = ct.exp2(m - m_use)
    w = ct.exp2(lse - m_use)
    if REDUCE:
        l = l * alpha + ct.sum(w, axis=0, keepdims=True)
        acc = acc * alpha + ct.sum(w * o, axis=0, keepdims=True)
    else:
        l = l * alpha + w
        acc = acc * alpha + w * o
    return m_new, l, acc


def guard_lse(lse):
    """The backward's LSE with a row that sees no key (LSE -inf, the forward's log 0) turned
    into +inf, so its recomputed P is 0 (no inf - inf)."""
    return ct.where(lse == -math.inf, math.inf, lse)


def recompute_p(logits2, lse2):
    """The backward's P = exp2(logits2 - lse2) (both in log2 units), denormals flushed."""
    return ct.exp2(logits2 - lse2, flush_to_zero=True)


def dscores(p, dp, delta):
    """dS = P (dP - Delta), Delta = rowsum(dO o O): the softmax's derivative."""
    return p * (dp - delta)
