"""FlexAttention in cuTile: a score function and a mask compiled into the fused forward kernel.

``make_flex_kernel(score_fn, mask_fn)`` builds one ``@ct.kernel`` per pair of mods: the mods
are plain ``def``s captured in the factory's closure (cuTile reads their source through
``inspect``; a ``lambda`` has none), inlined by the compiler. The tensors a mod reads (document
ids, ALiBi slopes, a bias table) come as one tuple of arrays per mod (``ST`` for the score
function, ``MT`` for the mask; FlashAttention-4's ``aux_tensors``), spread after the mod's
FlexAttention arguments. ``mod_callers`` is where a mod's tile function enters any flex kernel;
``mask_row``/``listed_block``/``listed_tile`` walk a BlockMask's lists (the backward's too).

Layout (``scaled_dot_product_attention``'s)::

    Q, Out: (B, Hq, Nq, D)     K, V: (B, Hkv, Nk, D)     Lse: fp32 (B, Hq, Nq) (or a stand-in)
    KvNum, FullNum:  int32 (Bm, Hm, Q_BLOCKS)            PyTorch's BlockMask, Bm in {1, B},
    KvIdx, FullIdx:  int32 (Bm, Hm, Q_BLOCKS, KV_BLOCKS) Hm in {1, Hq}
    Sink: fp32 (Hq,) per-head sink logits (or a stand-in)

Grid: ``(cdiv(Nq, TILE_M), B * Hq, 1)``, one program per query tile per (batch, head). With a
block mask, a program visits only the key blocks its query block lists: first the partial ones
(``KvIdx``: the mask function is evaluated), then the full ones (``FullIdx``: only the ragged
end of K is masked). A block absent from both lists costs nothing. ``Q_BLOCK = TILE_M *
Q_TILES_PER_BLOCK`` and ``KV_BLOCK = TILE_N * KV_TILES_PER_BLOCK``: the tiles divide the
BlockMask's block size.

Mod conventions (FlexAttention's arguments, as tiles):

    score_fn(score, b, h, q_idx, kv_idx, *score_tensors) -> fp32 [TILE_M, TILE_N]
    mask_fn(b, h, q_idx, kv_idx, *mask_tensors)           -> bool, broadcast to [TILE_M, TILE_N]

``score`` is ``q . k * scale`` (fp32 [TILE_M, TILE_N]), ``b`` and ``h`` int32 scalars (h: the
query head), ``q_idx`` int32 [TILE_M, 1] and ``kv_idx`` int32 [1, TILE_N] absolute positions.
The mask is applied in the safe form ``where(mask, score, -inf)``; a row that sees no key keeps
m = -inf and gets output 0 and LSE -inf, as FlexAttention returns it (``GUARD``).

BLASST (opt-in, ``BLASST``): after S = QK^T and the masks, a key tile whose row maxima all fall
more than ``BLASST_T`` (log2 units) below the running maxima is dropped: no exponentials, no V
load, no P.V.
"""
import math

import cuda.tile as ct
from cuda.tile import RoundingMode as RMd

from .common import INV_LOG_2, ConstBool, ConstInt, mask_scores, online_softmax_update

ConstFloat = ct.Constant[float]


def identity_score(score, b, h, q_idx, kv_idx):
    """The score function of plain attention (never called: HAS_SCORE=False folds it away)."""
    return score


def no_mask(b, h, q_idx, kv_idx):
    """The mask of plain attention (never called: HAS_MASK=False folds it away)."""
    return kv_idx >= 0


def score_caller(fn):
    """``call_score(score, b, h, q_idx, kv_idx, ST)``: ``fn`` with the tuple of arrays ``ST``
    spread after FlexAttention's arguments (a closure: cuTile inlines ``fn`` from its source)."""
    def call_score(score, b, h, q_idx, kv_idx, ST):
        return fn(score, b, h, q_idx, kv_idx, *ST)
    return call_score


def mask_caller(fn):
    """``call_mask(b, h, q_idx, kv_idx, MT)``, as ``score_caller``."""
    def call_mask(b, h, q_idx, kv_idx, MT):
        return fn(b, h, q_idx, kv_idx, *MT)
    return call_mask


def mod_callers(score_fn=None, mask_fn=None, grad_fn=None):
    """(call_score, call_grad, call_mask) of a mod pair, the identity, one and no mask standing
    in for a missing one: the one place a mod's tile function enters a kernel."""
    return (score_caller(score_fn if score_fn is not None else identity_score),
            score_caller(grad_fn if grad_fn is not None else one_grad),
            mask_caller(mask_fn if mask_fn is not None else no_mask))


def one_grad(score, b, h, q_idx, kv_idx):
    """d score / d score of an additive score function (never called: HAS_GRAD=False)."""
    return score


def block_count(Num, mb, mh, row):
    """How many blocks row ``row`` of a BlockMask list (``kv_num_blocks`` or ``q_num_blocks``,
    or their ``full_`` twins), for batch ``mb`` and head ``mh`` of the mask."""
    return ct.gather(Num, (mb, mh, row)).item()


def mask_row(Num, batch_idx, head_idx, row, mask_bmul, mask_hmul):
    """(mb, mh, n): the BlockMask's batch and head of this program (0 on an axis the mask lacks)
    and how many blocks its row ``row`` lists."""
    mb = batch_idx * mask_bmul
    mh = head_idx * mask_hmul
    return mb, mh, block_count(Num, mb, mh, row)


def listed_block(Idx, mb, mh, row, i):
    """The ``i``-th block that row ``row`` of a BlockMask's index table lists."""
    return ct.gather(Idx, (mb, mh, row, i)).item()


def listed_tile(Idx, mb, mh, row, u, PER: ConstInt):
    """The ``u``-th kernel tile of row ``row``'s listed blocks, ``PER`` tiles to a block."""
    return listed_block(Idx, mb, mh, row, u // PER) * PER + u % PER


def make_flex_kernel(score_fn=None, mask_fn=None):
    """The flex forward kernel for one (score function, mask function) pair; ``None``: none."""
    call_score, _, call_mask = mod_callers(score_fn, mask_fn)

    def flex_tile(Q, K, V, q, j, m_i, l_i, acc, offs_m, offs_n_tile, batch_idx, head_idx,
                  kv_head, k_seqlen, qk_scale, sm_scale, partial, ST, MT,
                  TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, EVEN_K: ConstBool,
                  HAS_SCORE: ConstBool, HAS_MASK: ConstBool, GUARD: ConstBool,
                  BLASST: ConstBool, BLASST_T: ConstFloat):
        """One key tile ``j``: S = QK^T, the score function, the mask (``partial`` tiles), the
        online softmax and O += P V. Returns the updated m_i, l_i, acc."""
        k = ct.load(K, index=(batch_idx, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                    order=(0, 1, 3, 2), latency=2, padding_mode=ct.PaddingMode.ZERO)
        k = k.reshape((TILE_D, TILE_N))                              # [TILE_D, TILE_N]
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)        # [TILE_M, TILE_N]
        qk = ct.mma(q, k, qk)                                        # S = Q K^T
        offs_n = j * TILE_N + offs_n_tile                            # [1, TILE_N] kv_idx
        if HAS_SCORE:
            # FlexAttention's score is q . k * scale; the softmax then runs on it in base 2.
            qk = call_score(qk * sm_scale, batch_idx, head_idx, offs_m, offs_n, ST)                              # [TILE_M, TILE_N]
        if HAS_MASK:
            if partial:
                # Only partial blocks evaluate the mask (full blocks were proven all-True).
                keep = call_mask(batch_idx, head_idx, offs_m, offs_n, MT)
                qk = ct.where(keep, qk, -math.inf)                   # the safe form
        if not EVEN_K:
            if j >= k_seqlen // TILE_N:
                qk = mask_scores(qk, offs_m, offs_n, k_seqlen, False, False)  # keys past Nk
        if BLASST:
            # Dynamic skipping: keep the tile if some row's max comes within BLASST_T of its
            # running max (log2 units); a cross-warp reduction and a branch per tile.
            m_blk = ct.max(qk, axis=-1, keepdims=True) * qk_scale   # [TILE_M, 1]
            need = ct.sum(ct.where(m_blk > m_i - BLASST_T, 1, 0))   # rows that need it
            if need > 0:
                m_i, l_i, acc = flex_softmax_pv(V, qk, m_i, l_i, acc, j, batch_idx, kv_head,
                                                qk_scale, TILE_N, TILE_D, GUARD)
        else:
            m_i, l_i, acc = flex_softmax_pv(V, qk, m_i, l_i, acc, j, batch_idx, kv_head,
                                            qk_scale, TILE_N, TILE_D, GUARD)
        return m_i, l_i, acc

    @ct.kernel
    def flex_kernel(Q, K, V, Out, Lse, KvNum, KvIdx, FullNum, FullIdx, Sink, ST, MT,
                    sm_scale: float, num_heads: int, group_size: int, mask_bmul: int,
                    mask_hmul: int,
                    TILE_M: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt, EVEN_K: ConstBool,
                    HAS_SCORE: ConstBool, HAS_MASK: ConstBool, HAS_BLOCKS: ConstBool,
                    HAS_FULL: ConstBool, Q_TILES_PER_BLOCK: ConstInt,
                    KV_TILES_PER_BLOCK: ConstInt, TAIL: ConstBool,
                    HAS_SINK: ConstBool, GUARD: ConstBool, WRITE_LSE: ConstBool,
                    BLASST: ConstBool, BLASST_T: ConstFloat):
        """Flex forward: see the module docstring. sm_scale: the softmax scale; group_size =
        Hq // Hkv; mask_bmul/mask_hmul: 1 where the BlockMask has a batch/head axis, else 0."""
        # --- Program id -> (query tile, batch, head); GQA maps Hq heads onto Hkv ---
        bid_x = ct.bid(0)
        bid_y = ct.bid(1)
        batch_idx = bid_y // num_heads
        head_idx = bid_y % num_heads
        kv_head = head_idx // group_size
        if HAS_SCORE:
            qk_scale = INV_LOG_2                                     # the mod saw the scale
        else:
            qk_scale = sm_scale * INV_LOG_2                          # scale after the row max

        # --- Query tile and running state ---
        offs_m = bid_x * TILE_M + ct.arange(TILE_M, dtype=ct.int32)  # [TILE_M]
        offs_m = offs_m[:, None]                                     # [TILE_M, 1] q_idx
        offs_n_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]     # [1, TILE_N]
        if HAS_SINK:
            # A learnable sink (gpt-oss): a key of logit Sink[h] and value 0 in every row's
            # denominator; starting the row at m = sink, l = 1 counts it once.
            sink = ct.gather(Sink, (head_idx,)).item() * INV_LOG_2
            m_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32) + sink  # running max (log2)
            l_i = ct.full((TILE_M, 1), 1.0, dtype=ct.float32)        # running sum of exp2
        else:
            m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
            l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
        acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)       # unnormalised output
        q = ct.load(Q, index=(batch_idx, head_idx, bid_x, 0), shape=(1, 1, TILE_M, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
        k_seqlen = K.shape[2]

        if HAS_BLOCKS:
            # --- The key blocks the BlockMask lists for this query block ---
            qb = bid_x // Q_TILES_PER_BLOCK
            mb, mh, n_part = mask_row(KvNum, batch_idx, head_idx, qb, mask_bmul, mask_hmul)
            if HAS_FULL:
                n_full = block_count(FullNum, mb, mh, qb)
            else:
                n_full = 0 * n_part
            for i in range(0, n_part + n_full):
                partial = i < n_part
                if HAS_FULL:
                    if partial:
                        blk = listed_block(KvIdx, mb, mh, qb, i)
                    else:
                        blk = listed_block(FullIdx, mb, mh, qb, i - n_part)
                else:
                    blk = listed_block(KvIdx, mb, mh, qb, i)
                for t in range(0, KV_TILES_PER_BLOCK):
                    j = blk * KV_TILES_PER_BLOCK + t
                    # TAIL: a block straddles Nk; its tiles wholly past the end are not loaded.
                    if not TAIL or j * TILE_N < k_seqlen:
                        m_i, l_i, acc = flex_tile(
                            Q, K, V, q, j, m_i, l_i, acc, offs_m, offs_n_tile, batch_idx,
                            head_idx, kv_head, k_seqlen, qk_scale, sm_scale, partial,
                            ST, MT, TILE_M, TILE_N, TILE_D, EVEN_K,
                            HAS_SCORE, HAS_MASK, GUARD, BLASST, BLASST_T)
        else:
            # --- Dense: every key tile (no mask function) ---
            for j in range(0, ct.cdiv(k_seqlen, TILE_N)):
                m_i, l_i, acc = flex_tile(
                    Q, K, V, q, j, m_i, l_i, acc, offs_m, offs_n_tile, batch_idx, head_idx,
                    kv_head, k_seqlen, qk_scale, sm_scale, j < 0, ST, MT,
                    TILE_M, TILE_N, TILE_D, EVEN_K, HAS_SCORE, False, GUARD, BLASST, BLASST_T)

        # --- Normalise (0 for a row with no key) and store ---
        if GUARD:
            acc = ct.truediv(acc, ct.where(l_i > 0.0, l_i, 1.0), flush_to_zero=True,
                             rounding_mode=RMd.APPROX)               # [TILE_M, TILE_D]
        else:
            acc = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=RMd.APPROX)
        acc = acc.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype)
        ct.store(Out, index=(batch_idx, head_idx, bid_x, 0), tile=acc)
        if WRITE_LSE:
            # Natural-log LSE as FlexAttention returns it; -inf for a row with no key.
            lse = (m_i + ct.log2(l_i)) / INV_LOG_2                   # [TILE_M, 1]
            ct.store(Lse, index=(batch_idx, head_idx, bid_x), tile=lse.reshape((1, 1, TILE_M)))

    return flex_kernel


def flex_softmax_pv(V, qk, m_i, l_i, acc, j, batch_idx, kv_head, qk_scale,
                    TILE_N: ConstInt, TILE_D: ConstInt, GUARD: ConstBool):
    """The online softmax of one tile (``common.online_softmax_update``) and
    O += P V. With ``GUARD`` a row whose scores are all -inf so far keeps m = -inf without NaN."""
    p, m_i, l_i, acc = online_softmax_update(qk, m_i, l_i, acc, qk_scale, GUARD=GUARD,
                                             FLUSH=True)
    v = ct.load(V, index=(batch_idx, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                latency=4, padding_mode=ct.PaddingMode.ZERO)
    v = v.reshape((TILE_N, TILE_D))                                  # [TILE_N, TILE_D]
    acc = ct.mma(p.astype(V.dtype), v, acc)                           # O += P V
    return m_i, l_i, acc
