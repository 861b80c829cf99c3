"""The score functions and masks people use, each as one object that runs in both worlds.

A ``ScoreMod`` or ``MaskMod`` carries two functions of FlexAttention's arguments and the tensors
they read:

* ``tile``: a plain ``def`` written with Python operators and ``cuda.tile`` functions, compiled
  into the cuTile kernel (``flashattn.flex_attention``); the tensors come as extra arguments, in
  order, as kernel arrays (read them with ``ct.gather``);
* ``torch``: the same function on torch tensors, so the object itself is a FlexAttention mod:
  ``torch.nn.attention.flex_attention.create_block_mask(mods.causal(), ...)`` builds the block
  mask from it, and PyTorch's ``flex_attention(score_mod=mods.softcap(30.0))`` runs it.

    from flashattn import mods
    from torch.nn.attention.flex_attention import create_block_mask
    mask = mods.sliding_window(256)                        # causal, 256 keys back
    bm = create_block_mask(mask, None, None, N, N, device="cuda")
    out = flashattn.flex_attention(q, k, v, score_mod=mods.softcap(30.0), block_mask=bm)

Shipped: ``causal``, ``sliding_window`` (causal or two-sided), ``chunked`` (local attention in
fixed chunks), ``prefix_lm``, ``document`` (per-token document ids, optionally causal),
``softcap``, ``alibi`` (with ``alibi_slopes``), ``relative_bias`` (a per-head table of biases
by key - query distance), ``dense_mask`` (any mask given as a (B, Nq, Nk) tensor, e.g.
padding); ``and_masks``/``or_masks`` compose masks (PyTorch's names). A mod reads any number of
tensors (the kernels take them as a tuple). The learnable attention
sink (gpt-oss) is not a score function (it joins the softmax's denominator): it is
``flex_attention(..., sinks=logits)``, and ``sink_reference`` its PyTorch reference.

A plain function written with torch operations, as FlexAttention's users write it
(``torch.where``, ``torch.exp2``, ``bias[h, q_idx - kv_idx]``, ``and_masks``), may be passed as
it is: it is traced into tile code and, for a score, its derivative (``flashattn.modtrace``).
Mods with the same parameters share one ``tile`` function, hence one compiled kernel.
"""
from __future__ import annotations

import functools
import math

try:
    import cuda.tile as ct         # the tile functions below are cuTile code
except ImportError:                # the interpreter's module, not registered as cuda.tile
    from .interpret.shim import module as _interpreter_ct
    ct = _interpreter_ct()

__all__ = ["ScoreMod", "MaskMod", "causal", "sliding_window", "chunked", "prefix_lm", "document",
           "dense_mask", "and_masks", "or_masks", "softcap", "alibi", "alibi_slopes",
           "relative_bias", "sink_reference", "as_mod"]


class _Mod:
    """What ScoreMod and MaskMod share: a name, the tile function, the torch function, the
    tensors (in the order both functions take them) and the key of the compiled kernel."""
    kind = ""

    def __init__(self, name, tile, torch_fn=None, tensors=(), *, params=None, grad=None,
                 additive=False):
        if not callable(tile) or getattr(tile, "__name__", "") == "<lambda>":
            raise TypeError(f"{self.kind}_mod {name!r}: the tile function must be a def (cuTile "
                            "reads its source; a lambda has none), got "
                            f"{getattr(tile, '__name__', type(tile).__name__)}")
        tensors = tuple(tensors)
        for tn, t in tensors:
            _check_tensor(name, tn, t)
        self.name = name
        self.tile = tile
        self.torch_fn = torch_fn if torch_fn is not None else tile
        self.tensors = tensors
        self.params = params or {}
        # The backward: ``grad`` a tile def of d score_mod / d score (same arguments); or
        # ``additive``: score + something independent of the score (derivative 1).
        self.grad = grad
        self.additive = bool(additive)

    @property
    def differentiable(self) -> bool:
        return self.grad is not None or self.additive

    def tensor_values(self):
        return tuple(t for _, t in self.tensors)

    def with_values(self, values):
        """The same mod reading ``values`` (its tensors' replacements, in order)."""
        values = tuple(values)
        if len(values) != len(self.tensors):
            raise ValueError(f"{self.kind}_mod {self.name!r} reads {len(self.tensors)} tensors, "
                             f"got {len(values)}")
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.tensors = tuple((n, t) for (n, _), t in zip(self.tensors, values))
        return new

    def to(self, device):
        """The same mod with its tensors on ``device``."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.tensors = tuple((n, t.to(device)) for n, t in self.tensors)
        return new

    def __repr__(self):
        args = ", ".join([f"{k}={v!r}" for k, v in self.params.items()] +
                         [f"{n}=<{tuple(t.shape)} {t.dtype}>" for n, t in self.tensors])
        return f"{type(self).__name__}({self.name}: {args})"


class ScoreMod(_Mod):
    """A score function ``(score, b, h, q_idx, kv_idx) -> score`` for both torch and cuTile."""
    kind = "score"

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.torch_fn(score, b, h, q_idx, kv_idx, *self.tensor_values())


class MaskMod(_Mod):
    """A mask ``(b, h, q_idx, kv_idx) -> bool`` (True: attend) for both torch and cuTile."""
    kind = "mask"

    def __call__(self, b, h, q_idx, kv_idx):
        return self.torch_fn(b, h, q_idx, kv_idx, *self.tensor_values())


def _check_tensor(mod, name, t):
    import torch
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"mod {mod!r}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.float32):
        raise TypeError(f"mod {mod!r}: {name} must be int32 (indices) or float32 (values), got "
                        f"{t.dtype}")
    if t.numel() == 0:
        raise ValueError(f"mod {mod!r}: {name} is empty")


def as_mod(fn, kind: str):
    """A ScoreMod/MaskMod as it is, or a plain function made one: written with torch operations
    it is traced into tile code and its derivative (``flashattn.modtrace``); a ``def`` written in
    cuda.tile is its own tile and torch function (the kernel cache keys on the function)."""
    cls = {"score": ScoreMod, "mask": MaskMod}[kind]
    if isinstance(fn, cls):
        return fn
    other = MaskMod if cls is ScoreMod else ScoreMod
    if isinstance(fn, other):
        raise TypeError(f"{fn.name!r} is a {other.kind} mod, passed as a {kind} mod")
    if not callable(fn):
        raise TypeError(f"{kind}_mod must be a function or a flashattn.mods.{cls.__name__}, got "
                        f"{type(fn).__name__}")
    from .modtrace import to_mod
    return to_mod(fn, cls)


# === masks ====================================================================================
def _causal_tile(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def causal() -> MaskMod:
    """Key ``kv_idx`` visible from query ``q_idx`` iff ``kv_idx <= q_idx`` (top-left aligned, as
    FlexAttention's examples and ``scaled_dot_product_attention(is_causal=True)``)."""
    return MaskMod("causal", _causal_tile)


@functools.lru_cache(maxsize=None)
def _window_tile(left: int, right: int, offset: int):
    # One distance d = p - kv_idx per score (p = q_idx + offset: a [TILE_M, 1] column, hoisted
    # out of the per-score work) and the window as a range test on it: the compiler folds the
    # two comparisons of a range into one (an unsigned compare of d + right against
    # left + right), so a window costs what causal does. Writing the two sides as two
    # differences (p - kv_idx <= left, kv_idx - p <= right) doubled the mask's SASS (two
    # subtractions, two compares, two selects per score; experiments/data/40-flex/sass.md).
    neg_right = -right
    if left < 0 and right < 0:
        def window(b, h, q_idx, kv_idx):
            return kv_idx >= 0
    elif left < 0:
        def window(b, h, q_idx, kv_idx):
            return (q_idx + offset) - kv_idx >= neg_right
    elif right < 0:
        def window(b, h, q_idx, kv_idx):
            return (q_idx + offset) - kv_idx <= left
    else:
        def window(b, h, q_idx, kv_idx):
            d = (q_idx + offset) - kv_idx
            return (d <= left) & (d >= neg_right)
    return window


def sliding_window(left: int, right: int = 0, *, offset: int = 0) -> MaskMod:
    """Query at position ``p = q_idx + offset`` sees keys ``p - left .. p + right``:
    ``sliding_window(W)`` is causal with W keys back (Mistral, Gemma); ``sliding_window(L, R)``
    two-sided; -1 means unbounded on that side (flash-attn's ``window_size``)."""
    for n, v in (("left", left), ("right", right), ("offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"sliding_window: {n} must be an int, got {type(v).__name__}")
    if left < -1 or right < -1:
        raise ValueError(f"sliding_window: left and right must be >= -1 (-1: unbounded), got "
                         f"({left}, {right})")
    return MaskMod(f"sliding_window({left},{right})", _window_tile(left, right, offset),
                   params=dict(left=left, right=right, offset=offset))


@functools.lru_cache(maxsize=None)
def _chunk_tile(chunk: int, causal: bool):
    # Integer division by a constant: a shift when the chunk is a power of two.
    if causal:
        def chunked_causal(b, h, q_idx, kv_idx):
            return (q_idx // chunk == kv_idx // chunk) & (q_idx >= kv_idx)
        return chunked_causal

    def chunked(b, h, q_idx, kv_idx):
        return q_idx // chunk == kv_idx // chunk
    return chunked


def chunked(chunk: int, *, causal: bool = True) -> MaskMod:
    """Chunked local attention (Llama 4's local layers): positions are cut into chunks of
    ``chunk`` tokens and a query sees only keys of its own chunk (causally by default): unlike
    a sliding window, the first query of a chunk sees one key."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise TypeError(f"chunked: chunk must be an int >= 1, got {chunk!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"chunked: causal must be a bool, got {type(causal).__name__}")
    return MaskMod(f"chunked({chunk},{'causal' if causal else 'full'})",
                   _chunk_tile(chunk, causal), params=dict(chunk=chunk, causal=causal))


@functools.lru_cache(maxsize=None)
def _prefix_tile(prefix: int):
    def prefix_lm_mask(b, h, q_idx, kv_idx):
        return (kv_idx < prefix) | (q_idx >= kv_idx)
    return prefix_lm_mask


def _prefix_tensor_tile(b, h, q_idx, kv_idx, prefix_len):
    return (kv_idx < ct.gather(prefix_len, (b,))) | (q_idx >= kv_idx)


def _prefix_tensor_torch(b, h, q_idx, kv_idx, prefix_len):
    return (kv_idx < prefix_len[b]) | (q_idx >= kv_idx)


def prefix_lm(prefix):
    """Prefix-LM: every query sees the first ``prefix`` keys (bidirectional) and is causal
    after them. ``prefix``: an int, or an int32 tensor (B,) of per-sequence prefix lengths."""
    import torch
    if isinstance(prefix, torch.Tensor):
        if prefix.dim() != 1:
            raise ValueError(f"prefix_lm: the prefix lengths must be a (B,) tensor, got shape "
                             f"{tuple(prefix.shape)}")
        return MaskMod("prefix_lm(tensor)", _prefix_tensor_tile, _prefix_tensor_torch,
                       (("prefix_len", prefix.to(torch.int32)),))
    if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise TypeError(f"prefix_lm: prefix must be an int >= 0 or an int32 tensor, got "
                        f"{prefix!r}")
    return MaskMod(f"prefix_lm({prefix})", _prefix_tile(prefix), params=dict(prefix=prefix))


def _doc_tile(b, h, q_idx, kv_idx, doc_ids):
    return ct.gather(doc_ids, (q_idx,)) == ct.gather(doc_ids, (kv_idx,))


def _doc_causal_tile(b, h, q_idx, kv_idx, doc_ids):
    return (ct.gather(doc_ids, (q_idx,)) == ct.gather(doc_ids, (kv_idx,))) & (q_idx >= kv_idx)


def _doc_torch(b, h, q_idx, kv_idx, doc_ids):
    return doc_ids[q_idx] == doc_ids[kv_idx]


def _doc_causal_torch(b, h, q_idx, kv_idx, doc_ids):
    return (doc_ids[q_idx] == doc_ids[kv_idx]) & (q_idx >= kv_idx)


def _doc2_tile(b, h, q_idx, kv_idx, doc_ids):
    return ct.gather(doc_ids, (b, q_idx)) == ct.gather(doc_ids, (b, kv_idx))


def _doc2_causal_tile(b, h, q_idx, kv_idx, doc_ids):
    return (ct.gather(doc_ids, (b, q_idx)) == ct.gather(doc_ids, (b, kv_idx))) & \
        (q_idx >= kv_idx)


def _doc2_torch(b, h, q_idx, kv_idx, doc_ids):
    return doc_ids[b, q_idx] == doc_ids[b, kv_idx]


def _doc2_causal_torch(b, h, q_idx, kv_idx, doc_ids):
    return (doc_ids[b, q_idx] == doc_ids[b, kv_idx]) & (q_idx >= kv_idx)


def document(doc_ids, *, causal: bool = False) -> MaskMod:
    """Document masking for packed sequences: query and key attend iff they carry the same
    document id. ``doc_ids``: int tensor (N,) shared by the batch, or (B, N), over positions
    (queries and keys share one packing: Nq == Nk). ``causal``: also mask future keys."""
    import torch
    if not isinstance(doc_ids, torch.Tensor):
        raise TypeError(f"document: doc_ids must be a tensor, got {type(doc_ids).__name__}")
    if doc_ids.dtype.is_floating_point or doc_ids.dtype == torch.bool:
        raise TypeError(f"document: doc_ids must be an integer tensor, got {doc_ids.dtype}")
    if doc_ids.dim() not in (1, 2):
        raise ValueError(f"document: doc_ids must be (N,) or (B, N), got shape "
                         f"{tuple(doc_ids.shape)}")
    ids = (("doc_ids", doc_ids.to(torch.int32).contiguous()),)
    c = bool(causal)
    if doc_ids.dim() == 1:
        tile, fn = (_doc_causal_tile, _doc_causal_torch) if c else (_doc_tile, _doc_torch)
    else:
        tile, fn = (_doc2_causal_tile, _doc2_causal_torch) if c else (_doc2_tile, _doc2_torch)
    return MaskMod("document" + ("_causal" if c else ""), tile, fn, ids,
                   params=dict(causal=c))


def _dense_tile(b, h, q_idx, kv_idx, allowed):
    return ct.gather(allowed, (b, q_idx, kv_idx)) != 0


def _dense_torch(b, h, q_idx, kv_idx, allowed):
    return allowed[b, q_idx, kv_idx] != 0


def dense_mask(allowed) -> MaskMod:
    """Any mask given as a tensor: ``allowed`` (B, Nq, Nk) bool or integer (nonzero: attend),
    e.g. a padding mask combined with causality. The kernel reads it where a block is partial;
    ``create_block_mask(dense_mask(m), B, None, Nq, Nk)`` skips the blocks it wholly masks.
    Costs B x Nq x Nk int32 of memory: prefer a structured mask where one exists."""
    import torch
    if not isinstance(allowed, torch.Tensor):
        raise TypeError(f"dense_mask: allowed must be a tensor, got {type(allowed).__name__}")
    if allowed.dtype.is_floating_point or allowed.is_complex():
        raise TypeError(f"dense_mask: allowed must be bool or integer, got {allowed.dtype}")
    if allowed.dim() != 3:
        raise ValueError(f"dense_mask: allowed must be (B, Nq, Nk), got shape "
                         f"{tuple(allowed.shape)}")
    return MaskMod("dense_mask", _dense_tile, _dense_torch,
                   (("allowed", (allowed != 0).to(torch.int32).contiguous()),))


def _compose_tile(fa, fb, na: int, op: str):
    """The tile function of ``fa op fb``, ``fa`` reading the first ``na`` tensors."""
    if op == "and":
        def and_mask(b, h, q_idx, kv_idx, *ts):
            return fa(b, h, q_idx, kv_idx, *ts[:na]) & fb(b, h, q_idx, kv_idx, *ts[na:])
        return and_mask

    def or_mask(b, h, q_idx, kv_idx, *ts):
        return fa(b, h, q_idx, kv_idx, *ts[:na]) | fb(b, h, q_idx, kv_idx, *ts[na:])
    return or_mask


_compose_tile = functools.lru_cache(maxsize=None)(_compose_tile)   # one kernel per composition


def _compose(masks, op: str) -> MaskMod:
    ms = [as_mod(m, "mask") for m in masks]
    if not ms:
        raise ValueError(f"{op}_masks needs at least one mask")
    out = ms[-1]
    for m in reversed(ms[:-1]):
        out = MaskMod(f"{m.name} {op} {out.name}",
                      _compose_tile(m.tile, out.tile, len(m.tensors), op),
                      _compose_tile(m.torch_fn, out.torch_fn, len(m.tensors), op),
                      m.tensors + out.tensors,
                      params={"masks": repr((m.name, sorted(m.params.items()), out.name,
                                            sorted(out.params.items())))})
    return out


def and_masks(*masks) -> MaskMod:
    """The mask that attends where every one of ``masks`` does (MaskMods or plain defs), as
    ``torch.nn.attention.flex_attention.and_masks``; their tensors concatenated."""
    return _compose(masks, "and")


def or_masks(*masks) -> MaskMod:
    """The mask that attends where any of ``masks`` does, as PyTorch's ``or_masks``."""
    return _compose(masks, "or")


# === score functions ==========================================================================
@functools.lru_cache(maxsize=None)
def _softcap_tile(cap: float, approx: bool):
    inv = 1.0 / cap
    if approx:
        def softcap_score(score, b, h, q_idx, kv_idx):
            return ct.tanh(score * inv, rounding_mode=ct.RoundingMode.APPROX) * cap
    else:
        def softcap_score(score, b, h, q_idx, kv_idx):
            return ct.tanh(score * inv) * cap
    return softcap_score


@functools.lru_cache(maxsize=None)
def _softcap_grad(cap: float):
    inv = 1.0 / cap

    def softcap_grad(score, b, h, q_idx, kv_idx):
        t = ct.tanh(score * inv)
        return 1.0 - t * t
    return softcap_grad


@functools.lru_cache(maxsize=None)
def _softcap_torch(cap: float):
    def softcap_score(score, b, h, q_idx, kv_idx):
        import torch
        return torch.tanh(score / cap) * cap
    return softcap_score


def softcap(cap: float, *, approx: bool = False) -> ScoreMod:
    """Logit soft-capping (Gemma 2): ``cap * tanh(score / cap)`` on the scaled score.
    ``approx``: the hardware's tanh (MUFU.TANH, ``RoundingMode.APPROX``: one instruction per
    score instead of an exp and a reciprocal, absolute error ~5e-4 x cap in the logit)."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0 \
            or not math.isfinite(cap):
        raise ValueError(f"softcap: cap must be a positive finite number, got {cap!r}")
    cap = float(cap)
    return ScoreMod(f"softcap({cap:g}{', approx' if approx else ''})",
                    _softcap_tile(cap, bool(approx)), _softcap_torch(cap),
                    params=dict(cap=cap, approx=bool(approx)), grad=_softcap_grad(cap))


def _alibi_tile(score, b, h, q_idx, kv_idx, slopes):
    return score + ct.gather(slopes, (h,)) * (kv_idx - q_idx).astype(ct.float32)


def _alibi_torch(score, b, h, q_idx, kv_idx, slopes):
    return score + slopes[h] * (kv_idx - q_idx)


def alibi_slopes(num_heads: int):
    """ALiBi's head slopes (Press et al.): 2^(-8 i / n) for the closest power of two n, the
    interleaved rest for other head counts. float32 (num_heads,)."""
    import torch

    def pow2(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]
    if num_heads & (num_heads - 1) == 0:
        s = pow2(num_heads)
    else:
        c = 2 ** math.floor(math.log2(num_heads))
        s = pow2(c) + pow2(2 * c)[0::2][:num_heads - c]
    return torch.tensor(s, dtype=torch.float32)


def alibi(slopes) -> ScoreMod:
    """ALiBi: ``score + slopes[h] * (kv_idx - q_idx)``; ``slopes``: float32 (Hq,) (see
    ``alibi_slopes``)."""
    import torch
    if not isinstance(slopes, torch.Tensor) or slopes.dim() != 1:
        raise ValueError(f"alibi: slopes must be a (Hq,) tensor, got "
                         f"{tuple(slopes.shape) if isinstance(slopes, torch.Tensor) else slopes!r}")
    return ScoreMod("alibi", _alibi_tile, _alibi_torch,
                    (("slopes", slopes.to(torch.float32).contiguous()),), additive=True)


@functools.lru_cache(maxsize=None)
def _relbias_tile(center: int):
    def relative_bias_score(score, b, h, q_idx, kv_idx, table):
        return score + ct.gather(table, (h, kv_idx - q_idx + center))
    return relative_bias_score


@functools.lru_cache(maxsize=None)
def _relbias_torch(center: int):
    def relative_bias_score(score, b, h, q_idx, kv_idx, table):
        return score + table[h, kv_idx - q_idx + center]
    return relative_bias_score


def relative_bias(table) -> ScoreMod:
    """A learned bias by relative position: ``score + table[h, kv_idx - q_idx + L - 1]``;
    ``table``: float32 (Hq, 2L - 1), distances -(L-1) .. L-1 (L >= max(Nq, Nk))."""
    import torch
    if not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[1] % 2 != 1:
        raise ValueError("relative_bias: table must be a (Hq, 2L - 1) tensor, got " +
                         (str(tuple(table.shape)) if isinstance(table, torch.Tensor)
                          else type(table).__name__))
    center = (table.shape[1] - 1) // 2
    return ScoreMod("relative_bias", _relbias_tile(center), _relbias_torch(center),
                    (("table", table.to(torch.float32).contiguous()),),
                    params=dict(max_len=center + 1), additive=True)


# === the attention sink =======================================================================
def sink_reference(out, lse, sinks):
    """A sink's effect on attention computed without it (PyTorch's ``flex_attention`` has
    none): the sink adds ``exp(sinks[h])`` to each row's denominator, so ``out`` scales by
    ``sigmoid(lse - sink)`` and the LSE becomes ``logaddexp(lse, sink)``. out: (B, Hq, Nq, D),
    lse: (B, Hq, Nq) natural log, sinks: (Hq,). Returns (out, lse)."""
    import torch
    s = sinks.to(torch.float32).view(1, -1, 1)
    w = torch.sigmoid(lse.float() - s)                               # 0 where lse = -inf
    return (out.float() * w[..., None]).to(out.dtype), torch.logaddexp(lse.float(), s)
