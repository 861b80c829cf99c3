"""``flashattn.flex_attention``: PyTorch's FlexAttention interface on the cuTile kernel (chapter 13).

    from torch.nn.attention.flex_attention import create_block_mask
    from flashattn import flex_attention, mods
    bm = create_block_mask(mods.sliding_window(1024), None, None, N, N, device="cuda")
    out = flex_attention(q, k, v, score_mod=mods.softcap(50.0), block_mask=bm)

The signature and the semantics are those of ``torch.nn.attention.flex_attention
.flex_attention``: ``score_mod(score, b, h, q_idx, kv_idx)`` changes each scaled score, the
``BlockMask`` (PyTorch's own, from ``create_block_mask``) lists which key blocks each query
block visits and carries the ``mask_mod``; a row that sees no key gets output 0 and LSE -inf;
the LSE is in natural-log units. Two keyword extras: ``sinks`` (a learnable per-head logit in
every row's denominator, gpt-oss) and ``blasst_threshold`` (dynamic tile skipping, opt-in).

How a mod reaches the kernel: a mod is a ``flashattn.mods.ScoreMod``/``MaskMod`` (a cuTile
``def``, its torch twin and the tensors it reads) or a plain function written with torch
operations (traced into tile code and a derivative, ``flashattn.modtrace``). ``kernels/flex.py``
compiles one kernel per (score function, mask function) pair; it is built once and cached
here (``_KERNELS``), and cuTile caches its compilation on disk. The mod's tensors are kernel
arguments. Before a mod's first use it is run once on small tiles by
the interpreter's NumPy ``cuda.tile`` (``_probe``): a mod that cannot run on tiles, or returns
the wrong type or shape, gets a ``TypeError``/``ModError`` naming it before anything compiles;
a compiler failure on the GPU is re-raised as ``ModError`` naming the mods, with the compiler's
message.

Backward: ``kernels/flex_bwd.py`` (dQ; dK/dV over the BlockMask's column lists, GQA summed in
the kernel), through the torch.library operators of ``flex_op.py`` (``flashattn::flex_fwd``,
``flashattn::flex_bwd``): autograd and ``torch.compile(fullgraph=True)``. A score function
needs a derivative (``ScoreMod.grad``) or ``additive=True``; the sink gets its gradient.
"""
from __future__ import annotations

import math
import threading

from .contract import (DENSE_DTYPE_HINT, DENSE_LAYOUT, check_groups, check_head_dims,
                       check_kernel_device, check_kernel_dtype, check_one_device,
                       check_one_dtype, check_rank, check_same_shape, check_scale,
                       check_torch_tensors)
from .dispatch import attention_steps, device_arch, expect, interpreting, launch_kernel, \
    on_device
from .config import Config          # tiles and launch hints, as every kernel's

__all__ = ["flex_attention", "ModError", "flex_plan", "FLEX_CONFIGS", "flex_kernel",
           "block_mask_tiles", "attention_masked", "compile_flex", "compile_flex_bwd",
           "flex_bwd_kernels", "FLEX_BWD_CONFIGS", "FLEX_BWD_CONFIGS_T", "FLEX_BWD_VARIANTS",
           "flex_bwd_configs", "flex_bwd_plan"]


from .modtrace import ModError  # noqa: E402  (the tracer raises it too)


# Tiles and launch hints per architecture (the forward steps' first configurations, arch_tuned);
# the tiles shrink to divide a BlockMask's block size. Timings: a GPU run (experiments/
# flex_bench.py); not measured yet.
FLEX_CONFIGS: dict[str, Config] = {
    "sm_90": Config(64, 128, occupancy=2),
    "sm_100": Config(128, 128, occupancy=2),
    "sm_120": Config(64, 64),
}
DEFAULT_CONFIG = Config(64, 64)
KERNEL_OPTIONS = ("BLOCK_M", "BLOCK_N", "BLASST_THRESHOLD", "BWD_VARIANT")

_KERNELS: dict = {}
_PROBED: dict = {}
_LAUNCHED: set = set()
_LOCK = threading.Lock()


# --- the kernels --------------------------------------------------------------------------------
def flex_kernel(score=None, mask=None):
    """The ``@ct.kernel`` for a ScoreMod/MaskMod pair (None: none), built once per pair of tile
    functions and tensor counts."""
    key = (score.tile if score else None, len(score.tensors) if score else 0,
           mask.tile if mask else None, len(mask.tensors) if mask else 0)
    with _LOCK:
        k = _KERNELS.get(key)
        if k is None:
            from .interpret import install_shim
            install_shim()
            from .kernels.flex import make_flex_kernel
            k = make_flex_kernel(key[0], key[2], key[1], key[3])
            _KERNELS[key] = k
    return k


def _probe(mod, kind: str):
    """Run ``mod.tile`` once on 16 x 16 tiles in the interpreter's NumPy cuda.tile and check what
    it returns (cached per tile function and tensor shapes)."""
    key = (mod.tile, tuple((tuple(t.shape), t.dtype) for _, t in mod.tensors), kind)
    if key in _PROBED:
        return
    import numpy as np
    from .interpret import shim
    shim.module()
    from .interpret import runner
    from .interpret import tile as T
    from .interpret.rebind import rebound
    tm = tn = 16
    q_idx = T.Tile(np.arange(tm, dtype=np.int32)[:, None], T.int32)
    kv_idx = T.Tile(np.arange(tn, dtype=np.int32)[None, :], T.int32)
    b = T.Tile(0, T.int32)
    h = T.Tile(0, T.int32)
    arrays = [runner.Array(runner._Root(t.detach().cpu(), n), (slice(None),) * t.dim(), n)
              for n, t in mod.tensors]
    args = (T.Tile(np.zeros((tm, tn), np.float32), T.float32),) if kind == "score" else ()
    what = f"{kind}_mod {mod.name!r}"
    try:
        res = rebound(mod.tile)(*args, b, h, q_idx, kv_idx, *arrays)
    except Exception as e:
        raise ModError(f"{what} cannot run on cuTile tiles (q_idx int32 [TILE_M, 1], kv_idx "
                       f"int32 [1, TILE_N], b and h int32 scalars, its tensors as arrays read "
                       f"with ct.gather): {type(e).__name__}: {e}") from e
    if not isinstance(res, T.Tile):
        raise TypeError(f"{what} returned a {type(res).__name__}, not a tile: a {kind}_mod must "
                        "return " + ("a bool tile (True: attend)" if kind == "mask" else
                                     "the float32 score tile"))
    if kind == "mask":
        if res.dtype != T.bool_:
            raise TypeError(f"{what} returned a {res.dtype.name} tile; a mask_mod must return a "
                            "bool tile (True: attend), e.g. q_idx >= kv_idx")
        try:
            np.broadcast_shapes(res.shape, (tm, tn))
        except ValueError:
            raise TypeError(f"{what} returned a tile of shape {res.shape}, which does not "
                            f"broadcast to the [TILE_M, TILE_N] = ({tm}, {tn}) scores") from None
    else:
        if res.dtype != T.float32 or tuple(res.shape) != (tm, tn):
            raise TypeError(f"{what} returned a {res.dtype.name} tile of shape {res.shape}; a "
                            f"score_mod must return the float32 [TILE_M, TILE_N] = ({tm}, {tn}) "
                            "score tile (cast with .astype(ct.float32))")
    _PROBED[key] = True


# --- block masks --------------------------------------------------------------------------------
def _is_noop(fn) -> bool:
    from torch.nn.attention.flex_attention import noop_mask
    return fn is noop_mask


def _pow2_divisor(block: int, cap: int, what: str) -> int:
    """The largest power of two <= cap (at least 16) dividing ``block``."""
    t = 16
    while t * 2 <= cap and block % (t * 2) == 0:
        t *= 2
    if block % t:
        raise ValueError(f"the BlockMask's {what} block size {block} cannot be served: the "
                         f"kernel's {what} tile is a power of two from 16 to {max(cap, 16)} "
                         "and must divide it (use a BLOCK_SIZE that is a multiple of 16)")
    return t


def block_mask_tiles(block_size, config: Config, kernel_options=None) -> tuple[int, int]:
    """(TILE_M, TILE_N) serving a BlockMask of ``block_size`` = (Q_BLOCK, KV_BLOCK) (None: no
    block mask), from ``config`` and the BLOCK_M/BLOCK_N of ``kernel_options``."""
    ko = kernel_options or {}
    tm = int(ko.get("BLOCK_M", config.TILE_M))
    tn = int(ko.get("BLOCK_N", config.TILE_N))
    for n, t in (("BLOCK_M", tm), ("BLOCK_N", tn)):
        if t < 16 or t > 256 or t & (t - 1):
            raise ValueError(f"kernel_options {n}={t}: a tile is a power of two from 16 to 256")
    if block_size is None:
        return tm, tn
    qb, kb = block_size
    if "BLOCK_M" in ko and qb % tm:
        raise ValueError(f"kernel_options BLOCK_M={tm} does not divide the BlockMask's query "
                         f"block size {qb}")
    if "BLOCK_N" in ko and kb % tn:
        raise ValueError(f"kernel_options BLOCK_N={tn} does not divide the BlockMask's key "
                         f"block size {kb}")
    return _pow2_divisor(qb, tm, "query"), _pow2_divisor(kb, tn, "key")


def _check_block_mask(bm, *, B, Hq, Nq, Nk, device):
    """The BlockMask's tensors, checked: (kv_num, kv_idx, full_num, full_idx, (QB, KB), mod)."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask
    if not isinstance(bm, BlockMask):
        raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask (from "
                        f"create_block_mask), got {type(bm).__name__}")
    if tuple(bm.seq_lengths) != (Nq, Nk):
        raise ValueError(f"block_mask was built for (Q_LEN, KV_LEN) = {tuple(bm.seq_lengths)}, "
                         f"but the query has {Nq} rows and the key {Nk}: build it with "
                         f"create_block_mask(mask_mod, B, H, {Nq}, {Nk})")
    bs = bm.BLOCK_SIZE
    qb, kb = (bs, bs) if isinstance(bs, int) else tuple(int(x) for x in bs)
    n_qb, n_kb = -(-Nq // qb), -(-Nk // kb)
    num, idx = bm.kv_num_blocks, bm.kv_indices
    tensors = [("kv_num_blocks", num), ("kv_indices", idx)]
    if (bm.full_kv_num_blocks is None) != (bm.full_kv_indices is None):
        raise ValueError("block_mask: full_kv_num_blocks and full_kv_indices must both be given "
                         "or both be None")
    if bm.full_kv_num_blocks is not None:
        tensors += [("full_kv_num_blocks", bm.full_kv_num_blocks),
                    ("full_kv_indices", bm.full_kv_indices)]
    for name, t in tensors:
        if t.device != device:
            raise ValueError(f"block_mask.{name} is on {t.device} but the query on {device}: "
                             f"create the BlockMask with device={str(device)!r} (or .to() it)")
        if t.dtype != torch.int32:
            raise TypeError(f"block_mask.{name} must be int32, got {t.dtype}")
        rank = 3 if "num" in name else 4
        if t.dim() != rank:
            raise ValueError(f"block_mask.{name} must have {rank} dimensions (B, H, Q_BLOCKS"
                             f"{', KV_BLOCKS' if rank == 4 else ''}), got shape {tuple(t.shape)}")
        if t.shape[0] not in (1, B) or t.shape[1] not in (1, Hq) or t.shape[2] != n_qb:
            raise ValueError(f"block_mask.{name} has shape {tuple(t.shape)}: expected (1 or B="
                             f"{B}, 1 or Hq={Hq}, {n_qb} query blocks of {qb}"
                             f"{', ...' if rank == 4 else ''})")
    if num.shape[:2] != idx.shape[:2] or (bm.full_kv_num_blocks is not None and (
            bm.full_kv_num_blocks.shape[:2] != num.shape[:2] or
            bm.full_kv_indices.shape[:2] != num.shape[:2])):
        raise ValueError("block_mask: its tensors disagree on the (B, H) axes")
    if device.type == "cpu" and not torch.compiler.is_compiling():
        # Values (a synchronisation on a GPU, so checked where it is free): every listed block
        # index within the key blocks, counts within the index lists.
        for nname, iname, n, i in (("kv_num_blocks", "kv_indices", num, idx),
                                   ("full_kv_num_blocks", "full_kv_indices",
                                    bm.full_kv_num_blocks, bm.full_kv_indices)):
            if n is None:
                continue
            if int(n.min()) < 0 or int(n.max()) > i.shape[-1]:
                raise ValueError(f"block_mask.{nname} must lie in [0, {i.shape[-1]}]")
            used = torch.arange(i.shape[-1]) < n[..., None]
            if used.any() and (int(i[used].min()) < 0 or int(i[used].max()) >= n_kb):
                raise ValueError(f"block_mask.{iname} lists a key block outside [0, {n_kb})")
    mod = None if _is_noop(bm.mask_mod) else bm.mask_mod
    return tensors, (qb, kb), mod


# --- the plan -----------------------------------------------------------------------------------
def flex_plan(*, B, Hq, Hkv, Nq, Nk, D, block_size=None, has_full=False, score=None,
              mask=None, sinks=False, write_lse=False, blasst=None, arch=None,
              kernel_options=None) -> dict:
    """The launch plan (pure: no GPU): config, constants and grid."""
    from .contract import tile_d_for
    config = FLEX_CONFIGS.get(arch or "", DEFAULT_CONFIG)
    tm, tn = block_mask_tiles(block_size, config, kernel_options)
    qpb = block_size[0] // tm if block_size else 1
    tpb = block_size[1] // tn if block_size else 1
    has_blocks = block_size is not None
    consts = dict(
        TILE_M=tm, TILE_N=tn, TILE_D=tile_d_for(D), EVEN_K=Nk % tn == 0,
        HAS_SCORE=score is not None, HAS_MASK=mask is not None, HAS_BLOCKS=has_blocks,
        HAS_FULL=bool(has_full), QPB=qpb, TPB=tpb,
        TAIL=has_blocks and tpb > 1 and Nk % block_size[1] != 0,
        HAS_SINK=bool(sinks),
        GUARD=(has_blocks or score is not None) and not sinks,
        WRITE_LSE=bool(write_lse), BLASST=blasst is not None,
        BLASST_T=float(blasst) if blasst is not None else 0.0)
    hints = config.hints() if (config.TILE_M, config.TILE_N) == (tm, tn) else {}
    return dict(config=config, constants=consts, hints=hints, grid=(-(-Nq // tm), B * Hq, 1))


# --- the operator -------------------------------------------------------------------------------
def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None,
                   enable_gqa=False, return_lse=False, kernel_options=None, *, return_aux=None,
                   sinks=None, blasst_threshold=None):
    """FlexAttention (``torch.nn.attention.flex_attention.flex_attention``'s signature) on the
    cuTile kernel.

    Args:
        query: (B, Hq, Nq, D) float16 or bfloat16 CUDA tensor (or CPU, run by the interpreter
            with ``FLASHATTN_INTERPRET=1`` or inside ``flashattn.interpret.enabled()``).
        key, value: (B, Hkv, Nk, D), query's dtype and device; Hq != Hkv needs ``enable_gqa``
            (query head h reads key/value head h // (Hq // Hkv)). D up to 256.
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score`` on the scaled score: a
            ``flashattn.mods.ScoreMod`` or a ``def`` written with Python operators and
            ``cuda.tile`` functions; None: plain attention.
        block_mask: a ``BlockMask`` from PyTorch's ``create_block_mask`` for (Nq, Nk), on the
            query's device; its ``mask_mod`` (a ``MaskMod`` or such a ``def``) is compiled in and
            evaluated on the partial blocks only; blocks it does not list are never loaded. Its
            block sizes must be multiples of 16 (the kernel's tiles divide them).
        scale: softmax scale, default 1/sqrt(D).
        return_lse / return_aux: also return the natural-log LSE (fp32 (B, Hq, Nq); -inf for a
            row with no key): ``(out, lse)``, or ``(out, AuxOutput(lse=...))`` for
            ``return_aux=AuxRequest(lse=True)``. ``max_scores`` is not implemented (raises).
        kernel_options: ``{"BLOCK_M": int, "BLOCK_N": int, "BLASST_THRESHOLD": float,
            "BWD_VARIANT": str}``; other keys raise. ``BWD_VARIANT`` picks the backward's
            kernels from ``FLEX_BWD_VARIANTS`` (default "t").
        sinks: float (Hq,) per-head sink logits (gpt-oss): ``exp(sinks[h])`` joins every row's
            denominator (the LSE returned includes it). Not in PyTorch's FlexAttention.
        blasst_threshold: T > 0 (log2 units): drop a key tile whose row maxima all fall more
            than T below the running maxima (BLASST): approximate, off by default.

    Returns:
        (B, Hq, Nq, D) in query's dtype (and the LSE as asked). Differentiable in query, key,
        value and sinks (the flex backward kernels, through a ``torch.autograd.Function``) for
        any mask and a score_mod with a derivative (``ScoreMod.grad`` or ``additive``: the
        shipped ones); a score_mod without one, or BLASST, raises NotImplementedError when a
        gradient is needed. The LSE is not differentiable.

    Raises:
        TypeError, ValueError: bad tensors, block masks, mods or options (the message names
            which); ``ModError`` (a ValueError) for a mod that cannot run or compile.
    """
    return _flex(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
                 kernel_options, return_aux=return_aux, sinks=sinks,
                 blasst_threshold=blasst_threshold, checked=False)


def _flex(query, key, value, score_mod, block_mask, scale, enable_gqa, return_lse,
          kernel_options, *, return_aux, sinks, blasst_threshold, checked: bool):
    """``flex_attention``; ``checked``: the caller ran the dense contract on the tensors and the
    scale (``attention(window_size=...)``), so they are checked once per call."""
    import torch
    ko = dict(kernel_options or {})
    bad = [k for k in ko if k not in KERNEL_OPTIONS]
    if bad:
        raise ValueError(f"kernel_options {bad} are not supported by flashattn.flex_attention "
                         f"(supported: {', '.join(KERNEL_OPTIONS)})")
    if "BLASST_THRESHOLD" in ko:
        if blasst_threshold is not None:
            raise ValueError("give the BLASST threshold once: blasst_threshold= or "
                             "kernel_options['BLASST_THRESHOLD']")
        blasst_threshold = ko.pop("BLASST_THRESHOLD")
    if "BWD_VARIANT" in ko and ko["BWD_VARIANT"] not in FLEX_BWD_VARIANTS:
        raise ValueError(f"kernel_options BWD_VARIANT={ko['BWD_VARIANT']!r}: choose from "
                         f"{', '.join(map(repr, FLEX_BWD_VARIANTS))}")
    if blasst_threshold is not None:
        if isinstance(blasst_threshold, bool) or not isinstance(blasst_threshold, (int, float)) \
                or not blasst_threshold > 0 or not math.isfinite(blasst_threshold):
            raise ValueError(f"blasst_threshold must be a positive finite number of log2 units, "
                             f"got {blasst_threshold!r}")
    want_lse = bool(return_lse)
    if return_aux is not None:
        if return_lse:
            raise ValueError("give return_lse or return_aux, not both (return_lse is deprecated "
                             "in PyTorch for return_aux=AuxRequest(lse=True))")
        if getattr(return_aux, "max_scores", False):
            raise NotImplementedError("flashattn.flex_attention does not return max_scores")
        want_lse = bool(getattr(return_aux, "lse", False))
    from .flex_inputs import adapt       # PyTorch's broadcast K/V, Dv != D, empty BlockMask
    query, key, value, block_mask, scale, dv = adapt(query, key, value, block_mask, scale)
    if not checked:
        # The dense family's rules (contract), under the names of torch's flex_attention.
        check_torch_tensors(query=query, key=key, value=value)
        for n, t in (("query", query), ("key", key), ("value", value)):
            check_rank(n, t.shape, 4, DENSE_LAYOUT)
        check_kernel_dtype("query", query, "flashattn kernels take", DENSE_DTYPE_HINT)
        check_one_dtype(query=query, key=key, value=value)
        check_one_device(query=query, key=key, value=value)
        check_kernel_device(query, interpreting(query.device), "flashattn kernels run",
                            "torch.nn.attention.flex_attention.flex_attention")
    device = query.device
    B, Hq, Nq, D = query.shape
    Bk, Hkv, Nk, Dk = key.shape
    if not checked:
        check_same_shape("key", "value", key.shape, value.shape)
        if Bk != B:
            raise ValueError(f"batch size differs: query has {B}, key and value have {Bk}")
        check_head_dims(D, Dk, "key and value")
        if Hq != Hkv:
            if not enable_gqa:
                raise ValueError(f"query has {Hq} heads and key {Hkv}: pass enable_gqa=True for "
                                 "grouped-query attention")
            check_groups(Hq, Hkv)
        check_scale(scale, positive=False)      # any finite scale, as torch's flex_attention
    if scale is None:
        scale = 1.0 / math.sqrt(D)

    from .mods import as_mod
    score = as_mod(score_mod, "score") if score_mod is not None else None
    tensors, block_size, mask = [], None, None
    if block_mask is not None:
        tensors, block_size, mask_fn = _check_block_mask(block_mask, B=B, Hq=Hq, Nq=Nq, Nk=Nk,
                                                         device=device)
        mask = as_mod(mask_fn, "mask") if mask_fn is not None else None
    for m in (score, mask):
        if m is None:
            continue
        for n, t in m.tensors:
            if t.device != device:
                raise ValueError(f"{m.kind}_mod {m.name!r}: its tensor {n} is on {t.device} but "
                                 f"the query on {device} (mod.to(device))")
        if not torch.compiler.is_compiling():      # the compiled kernel checks it then
            _probe(m, m.kind)
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (Hq,):
            raise ValueError(f"sinks must be a ({Hq},) tensor (one logit per query head), got "
                             f"{tuple(sinks.shape) if isinstance(sinks, torch.Tensor) else sinks!r}")
        if sinks.device != device:
            raise ValueError(f"sinks is on {sinks.device} but query on {device}")
        sinks = sinks.to(torch.float32).contiguous()

    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (query, key, value)) or
        (sinks is not None and sinks.requires_grad))
    if sinks is not None and not needs_grad:
        sinks = sinks.detach()
    plan_args = dict(score=score, mask=mask, tensors=tensors, block_size=block_size,
                     scale=float(scale), blasst=blasst_threshold, ko=ko,
                     block_mask=block_mask)
    if needs_grad or torch.compiler.is_compiling():
        # Through the torch.library operator: autograd, and torch.compile sees one opaque op.
        if needs_grad:
            _check_differentiable(score, block_mask, blasst_threshold)
        elif blasst_threshold is not None:
            raise NotImplementedError("blasst_threshold under torch.compile: call it eagerly")
        from . import flex_op
        flex_op._IMPL.update(forward=_forward, backward=_backward)
        out, lse = flex_op.forward(query, key, value, sinks, score=score, mask=mask,
                                   block_mask=block_mask, ko=ko, scale=float(scale))
        if not want_lse:
            lse = None
    else:
        out, lse = _forward(query, key, value, sinks, want_lse=want_lse, **plan_args)
    if dv is not None:
        out = out[..., :dv].contiguous()     # V was padded to the query's head dim
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return out, AuxOutput(lse=lse, max_scores=None)
    return (out, lse) if want_lse else out


FLEX_CONSTANTS = ("TILE_M", "TILE_N", "TILE_D", "EVEN_K", "HAS_SCORE", "HAS_MASK", "HAS_BLOCKS",
                  "HAS_FULL", "QPB", "TPB", "TAIL", "HAS_SINK", "GUARD", "WRITE_LSE", "BLASST",
                  "BLASST_T")


def _visited_steps(bm, B, Hq, Nq, Nk, c) -> int:
    """(query tile, key tile) steps a block-masked call runs (the interpreter's estimate)."""
    n = bm.kv_num_blocks.sum().item()
    if bm.full_kv_num_blocks is not None:
        n += bm.full_kv_num_blocks.sum().item()
    rep = (B // bm.kv_num_blocks.shape[0]) * (Hq // bm.kv_num_blocks.shape[1])
    return int(n * rep * c["QPB"] * c["TPB"])


# --- ahead of time (tileiras; no GPU) ---------------------------------------------------------
def _spec_for(score=None, mask=None):
    """A KernelSpec of the flex kernel for these mods (its arrays' ranks and dtypes)."""
    from .kernels.spec import Array, KernelSpec

    class FlexSpec(KernelSpec):
        def check_signature(self):          # a factory's kernel: no module-level source
            return None

    def slots(prefix, mod):
        ts = list(mod.tensors) if mod else []
        out = [Array(f"{prefix}{i}", t.dim(), "int32" if t.dtype.is_floating_point is False
                     else "float32") for i, (_, t) in enumerate(ts)]
        return out + [Array(f"{prefix}{i}", 1, "int32") for i in range(len(ts), 3)]
    arrays = (Array("Q", 4), Array("K", 4), Array("V", 4), Array("Out", 4),
              Array("Lse", 3, "float32"), Array("KvNum", 3, "int32"), Array("KvIdx", 4, "int32"),
              Array("FullNum", 3, "int32"), Array("FullIdx", 4, "int32"),
              Array("Sink", 1, "float32"), *slots("S", score), *slots("M", mask))
    return FlexSpec("flex", "flashattn.kernels.flex", "flex_kernel", arrays=arrays,
                    scalars=(("sm_scale", float), ("num_heads", int), ("group_size", int),
                             ("mask_bmul", int), ("mask_hmul", int)),
                    constants=FLEX_CONSTANTS)


def compile_flex(arch: str, *, score=None, mask=None, block_size=(128, 128), head_dim=128,
                 Nk=8192, has_full=True, sinks=False, write_lse=False, blasst=None,
                 config: Config | None = None, dtype="float16", keep_sass=False):
    """Compile the flex kernel for ``arch`` with tileiras and read the cubin back
    (``flashattn.aot.KernelReport``; errors in ``.error``). ``block_size=None``: no block mask
    (the dense path). ``config``: tiles and hints (default ``FLEX_CONFIGS[arch]``)."""
    import hashlib
    import json
    from . import aot
    from .aot import KernelReport
    from .interpret import install_shim
    install_shim()
    score = _as_opt(score, "score")
    mask = _as_opt(mask, "mask")
    cfg = config or FLEX_CONFIGS.get(arch, DEFAULT_CONFIG)
    ko = {"BLOCK_M": cfg.TILE_M, "BLOCK_N": cfg.TILE_N}
    plan = flex_plan(B=4, Hq=32, Hkv=32, Nq=Nk, Nk=Nk, D=head_dim, block_size=block_size,
                     has_full=has_full and block_size is not None, score=score,
                     mask=mask if block_size is not None else None, sinks=sinks,
                     write_lse=write_lse, blasst=blasst, arch=arch, kernel_options=ko)
    consts = plan["constants"]
    hints = cfg.hints()
    spec = _spec_for(score, mask)
    names = "+".join(m.name for m in (score, mask) if m) or "identity"
    rep = KernelReport(step=f"flex[{names}]", arch=arch, kernel="flex",
                       config=cfg.label())

    key = hashlib.sha256(json.dumps([aot._source_hash(), names, _mod_key(score), _mod_key(mask),
                                     sorted(consts.items()),
                                     sorted(hints.items()), arch, dtype,
                                     [(a.name, a.ndim, a.dtype) for a in spec.arrays]],
                                    default=str).encode()).hexdigest()[:20]
    cubin = aot._cache_dir() / f"flex-{arch}-{key}.cubin"
    from .kernels import hinted
    return aot.compile_into(
        rep, cubin,
        lambda: hinted(flex_kernel(score, mask if block_size is not None else None), hints),
        lambda: spec.signature(dtype=dtype, constants=consts,
                               align=8 if head_dim % 8 == 0 else 1),
        arch, keep_sass=keep_sass, full_error=True)


def _mod_key(m):
    """A mod's own code and parameters, for a cubin's cache key (mods.py is not hashed)."""
    import inspect
    if m is None:
        return None
    try:
        src = inspect.getsource(m.tile)
    except (OSError, TypeError):
        src = repr(m.tile)
    cells = [repr(c.cell_contents) for c in (m.tile.__closure__ or ())]
    return [src, cells, sorted(m.params.items())]


def _as_opt(m, kind):
    if m is None:
        return None
    from .mods import as_mod
    return as_mod(m, kind)


# --- flash-attn's keywords: attention(..., window_size=, softcap=) -----------------------------
_BLOCK_MASKS: dict = {}
_BLOCK_MASK_CACHE = 32


def _check_window(window_size):
    if window_size is None:
        return -1, -1
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or any(
            isinstance(w, bool) or not isinstance(w, int) for w in window_size):
        raise TypeError(f"window_size must be a (left, right) pair of ints (-1: unbounded), "
                        f"got {window_size!r}")
    left, right = (int(w) for w in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size entries must be >= -1 (-1: unbounded), got {window_size}")
    return left, right


def _check_softcap(softcap):
    if softcap is None:
        return 0.0
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or \
            not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    return float(softcap)


def cached_block_mask(mask, Nq: int, Nk: int, device, block_size):
    """``create_block_mask(mask, None, None, Nq, Nk, device, BLOCK_SIZE)``, built once per mask
    tile function and shape (the host cost of a BlockMask is paid once per shape)."""
    from torch.nn.attention.flex_attention import create_block_mask
    key = (mask.tile, tuple(mask.params.items()), Nq, Nk, str(device), tuple(block_size))
    bm = _BLOCK_MASKS.get(key)
    if bm is None:
        bm = create_block_mask(mask, None, None, Nq, Nk, device=device,
                               BLOCK_SIZE=tuple(block_size))
        if len(_BLOCK_MASKS) >= _BLOCK_MASK_CACHE:
            _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
        _BLOCK_MASKS[key] = bm
    return bm


def attention_masked(q, k, v, *, causal, scale, input_pos, step, window_size, softcap):
    """``flashattn.attention`` with flash-attn's ``window_size``/``softcap``: the flex kernel
    with ``mods.sliding_window`` (or ``mods.causal``) as a BlockMask and ``mods.softcap`` as the
    score function. None when both are off (window (-1, -1), softcap 0): the dense path then.

    Query row i sits at position ``p = input_pos + i`` (``attention``'s convention) and sees
    keys ``p - left .. p + right`` (-1: unbounded), and none past ``p`` when causal. Only
    ``step="best"`` routes here: a named step's kernel has no window or softcap, so naming one
    with them raises (nothing is silently dropped). Differentiable (the flex backward)."""
    import torch
    from . import mods
    left, right = _check_window(window_size)
    cap = _check_softcap(softcap)
    if (left, right) == (-1, -1) and cap == 0.0:
        return None
    if step != "best":
        raise ValueError(f"step={step!r} has no window_size/softcap: these run on the flex "
                         "kernels, which step='best' (the default) selects")
    if torch.compiler.is_compiling():
        raise NotImplementedError("window_size/softcap under torch.compile: the flex kernels are "
                                  "not a torch.library operator yet; call it eagerly")
    from .contract import check_tensors
    check_tensors(q, k, v, causal=causal, scale=scale, input_pos=input_pos,
                  interpret=interpreting(getattr(q, "device", None)))
    if causal:
        right = 0 if right == -1 else min(right, 0)
    B, Hq, Nq, D = q.shape
    Nk = k.shape[2]
    mask = None
    if (left, right) != (-1, -1):
        mask = mods.sliding_window(left, right, offset=int(input_pos))
    score = mods.softcap(cap) if cap else None
    bm = None
    if mask is not None:
        arch = device_arch(q.device)
        cfg = FLEX_CONFIGS.get(arch, DEFAULT_CONFIG)
        bm = cached_block_mask(mask, Nq, Nk, q.device, (cfg.TILE_M, cfg.TILE_N))
    return _flex(q, k, v, score, bm, scale, q.shape[1] != k.shape[1], False, None,
                 return_aux=None, sinks=None, blasst_threshold=None, checked=True)



def _forward(query, key, value, sinks, *, score, mask, tensors, block_size, scale, blasst, ko,
             block_mask, want_lse):
    """Launch the flex forward kernel: (out, lse or None)."""
    import torch
    B, Hq, Nq, D = query.shape
    Hkv, Nk = key.shape[1], key.shape[2]
    device = query.device
    interp = interpreting(device)
    blasst_threshold = blasst
    out = torch.empty((B, Hq, Nq, D), dtype=query.dtype, device=device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=device) if want_lse else None
    if out.numel() and Nk == 0:
        out.zero_()
        if lse is not None:
            lse.fill_(-math.inf if sinks is None else 0.0)
            if sinks is not None:
                lse.copy_(sinks.view(1, Hq, 1).expand(B, Hq, Nq))
    elif out.numel():
        arch = device_arch(device)
        plan = flex_plan(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D, block_size=block_size,
                         has_full=len(tensors) == 4, score=score, mask=mask,
                         sinks=sinks is not None, write_lse=want_lse, blasst=blasst_threshold,
                         arch=arch, kernel_options=ko)
        c = plan["constants"]
        q, k, v = (t if t.is_contiguous() else t.contiguous() for t in (query, key, value))
        i32 = dict(dtype=torch.int32, device=device)
        dummy = torch.zeros(1, **i32)
        tm = {n: t for n, t in tensors}
        kv_num = tm.get("kv_num_blocks", torch.zeros(1, 1, 1, **i32))
        kv_idx = tm.get("kv_indices", torch.zeros(1, 1, 1, 1, **i32))
        f_num = tm.get("full_kv_num_blocks", torch.zeros(1, 1, 1, **i32))
        f_idx = tm.get("full_kv_indices", torch.zeros(1, 1, 1, 1, **i32))
        kv_num, kv_idx, f_num, f_idx = (t.contiguous() for t in (kv_num, kv_idx, f_num, f_idx))
        st = [t.contiguous() for t in (score.tensor_values() if score else ())]
        mt = [t.contiguous() for t in (mask.tensor_values() if mask else ())]
        st += [dummy] * (3 - len(st))
        mt += [dummy] * (3 - len(mt))
        lse_arg = lse if lse is not None else torch.empty(1, 1, 1, dtype=torch.float32,
                                                          device=device)
        sink_arg = sinks if sinks is not None else torch.zeros(1, dtype=torch.float32,
                                                               device=device)
        args = (q, k, v, out, lse_arg, kv_num, kv_idx, f_num, f_idx, sink_arg, *st, *mt,
                float(scale), Hq, Hq // Hkv, int(kv_num.shape[0] > 1), int(kv_num.shape[1] > 1),
                *(c[n] for n in FLEX_CONSTANTS))
        kernel = flex_kernel(score, mask)
        if plan["hints"] and not interp:
            from .kernels import hinted
            kernel = hinted(kernel, plan["hints"])
        steps = lambda: _visited_steps(block_mask, B, Hq, Nq, Nk, c) \
            if block_mask is not None else \
            B * Hq * attention_steps(Nq, Nk, c["TILE_M"], c["TILE_N"], causal=False)
        launch_key = (id(kernel), tuple(sorted(c.items())), str(query.dtype))
        with on_device(device), expect(device, steps, f"flex_attention({B}x{Hq}x{Nq}x{D})"):
            try:
                launch_kernel(device, plan["grid"], kernel, args)
            except Exception as e:
                if interp or launch_key in _LAUNCHED:
                    raise
                names = " and ".join(f"{m.kind}_mod {m.name!r}" for m in (score, mask) if m) \
                    or "no mod"
                raise ModError(f"the flex kernel with {names} failed to compile or launch: "
                               f"{type(e).__name__}: {e}") from e
        _LAUNCHED.add(launch_key)
    return out, lse


# --- the backward -------------------------------------------------------------------------------
# (dK/dV, dQ) per architecture and padded head dim (the entry for the smallest key >= TILE_D), as
# the dense backward's kernels.BWD_CONFIGS: dK/dV's TILE_N is its own key tile and TILE_M its
# inner query tile, dQ's TILE_M its own query tile. Chosen from the compiler's report as the dense
# table (no spills, causal and softcap; chapter 13, the flex backward's SASS); not timed yet.
FLEX_BWD_CONFIGS: dict[str, dict[int, tuple[Config, Config]]] = {
    # Hopper: two consumer warp groups (num_worker_warps=8) share each tile; without the hint
    # one warp group holds dQ at 255 registers and dK/dV's loop goes through shared memory
    # barriers. dK/dV at the dense 64x128 spills with a score function: 128 queries x 64 keys.
    "sm_90": {128: (Config(128, 64, num_worker_warps=8), Config(128, 64, num_worker_warps=8)),
              256: (Config(64, 64, num_worker_warps=8), Config(64, 64, num_worker_warps=8))},
    # Datacenter Blackwell: tensor-memory MMAs; dK/dV at 64x128 spills, 128x64 does not.
    "sm_100": {128: (Config(128, 64), Config(128, 64))},
}
BWD_CONFIG = Config(64, 64)     # elsewhere, and where an entry's tiles do not divide the blocks
# The same for the kernels of ``kernels/flex_bwd.make_flex_bwd_kernels_t`` (the dense backward's
# shape): dK/dV on transposed [keys, queries] tiles takes the dense table's 64 queries x 128 keys,
# each warp group owning 64 keys' rows of dK and dV (chapter 13, the flex backward's SASS).
FLEX_BWD_CONFIGS_T: dict[str, dict[int, tuple[Config, Config]]] = {
    "sm_90": {128: (Config(64, 128, num_worker_warps=8), Config(128, 64, num_worker_warps=8)),
              256: (Config(64, 64, num_worker_warps=8), Config(64, 64, num_worker_warps=8))},
    "sm_100": {128: (Config(64, 128), Config(128, 64))},
    # Consumer Blackwell: the largest transposed dK/dV found without spills at D=128 (64x32 and
    # 32x32 spill, as does the current pair's 64x64); with a score function it spills at every
    # tile tried, so "t" keeps the current dK/dV there (dkdv_score).
    "sm_120": {128: (Config(32, 16), Config(32, 32))},
}
# The backward's variants (kernel_options["BWD_VARIANT"]): which kernel pair computes dQ and
# dK/dV ("mn": make_flex_bwd_kernels, score tiles [queries, keys]; "t": make_flex_bwd_kernels_t)
# and how Delta = rowsum(dO o O) is computed ("torch": fp32 copies of dO and O, multiplied and
# summed by torch; "kernel": the dense backward's bwd_preprocess_kernel, one read of each).
# "dkdv_score": the dK/dV pair with a score function, where it differs (sm_90's transposed
# 64x128 dK/dV spills with softcap's tanh and its derivative).
FLEX_BWD_VARIANTS: dict[str, dict[str, str]] = {
    "mn": dict(dq="mn", dkdv="mn", delta="torch"),
    "mn+delta": dict(dq="mn", dkdv="mn", delta="kernel"),
    "t-dq": dict(dq="t", dkdv="mn", delta="kernel"),
    "t": dict(dq="t", dkdv="t", dkdv_score="mn", delta="kernel"),
    "t-all": dict(dq="t", dkdv="t", delta="kernel"),     # "t" with transposed dK/dV always
}
DEFAULT_BWD_VARIANT = "t"      # the dense backward's shape: as fast as it on causal (chapter 13)
_BWD_TABLES = {"mn": FLEX_BWD_CONFIGS, "t": FLEX_BWD_CONFIGS_T}
_BWD_KERNELS: dict = {}


def flex_bwd_configs(arch: str | None, head_dim: int, kind: str = "mn"
                     ) -> tuple[Config, Config]:
    """(dK/dV config, dQ config) for ``arch`` and ``head_dim`` (BWD_CONFIG where none), from the
    table of the kernel pair ``kind`` ("mn" or "t")."""
    from .contract import tile_d_for
    table = _BWD_TABLES[kind].get(arch or "", {})
    keys = [d for d in table if d >= tile_d_for(head_dim)]
    return table[min(keys)] if keys else (BWD_CONFIG, BWD_CONFIG)


def _bwd_variant(kernel_options) -> dict:
    name = (kernel_options or {}).get("BWD_VARIANT", DEFAULT_BWD_VARIANT)
    if name not in FLEX_BWD_VARIANTS:
        raise ValueError(f"kernel_options BWD_VARIANT={name!r}: choose from "
                         f"{', '.join(map(repr, FLEX_BWD_VARIANTS))}")
    return FLEX_BWD_VARIANTS[name]


def flex_bwd_plan(*, B, Hq, Hkv, Nq, Nk, D, block_size=None, has_full=False, score=None,
                  mask=None, arch=None, kernel_options=None, configs=None) -> dict:
    """The backward's launch plan (pure: no GPU): per kernel ("dq", "dkdv") its config,
    constants, hints, grid and kernel pair ("kind"), and "delta" (how Delta is computed), for
    the variant ``kernel_options["BWD_VARIANT"]`` (default "t"). A config whose tiles the
    BlockMask's blocks (or kernel_options) change falls back to BWD_CONFIG's tiles, without
    hints. ``configs``: (dK/dV, dQ) in place of the tables'."""
    from .contract import tile_d_for
    variant = _bwd_variant(kernel_options)
    plans = {"delta": variant["delta"]}
    for i, name in enumerate(("dkdv", "dq")):
        kind = variant[name]
        if name == "dkdv" and score is not None:
            kind = variant.get("dkdv_score", kind)
        cfg = (configs or flex_bwd_configs(arch, D, kind))[i]
        tm, tn = block_mask_tiles(block_size, cfg, kernel_options)
        if (tm, tn) != (cfg.TILE_M, cfg.TILE_N):
            cfg = BWD_CONFIG
            tm, tn = block_mask_tiles(block_size, cfg, kernel_options)
        qpb = block_size[0] // tm if block_size else 1
        tpb = block_size[1] // tn if block_size else 1
        if kind == "t":
            # These kernels branch on the bounds only where a listed block can hold a
            # sub-tile wholly past the end, and mask the ragged rest: "even" is per block.
            even_k, even_m = Nk % (tn * tpb) == 0, Nq % (tm * qpb) == 0
        else:
            even_k, even_m = Nk % tn == 0, Nq % tm == 0
        consts = dict(TILE_M=tm, TILE_N=tn, TILE_D=tile_d_for(D), EVEN_K=even_k,
                      EVEN_M=even_m, HAS_SCORE=score is not None,
                      HAS_GRAD=score is not None and score.grad is not None,
                      HAS_MASK=mask is not None, HAS_BLOCKS=block_size is not None,
                      HAS_FULL=bool(has_full), QPB=qpb, TPB=tpb)
        hints = cfg.hints() if (cfg.TILE_M, cfg.TILE_N) == (tm, tn) else {}
        grid = (-(-Nq // tm), B * Hq, 1) if name == "dq" else (-(-Nk // tn), B * Hkv, 1)
        plans[name] = dict(config=cfg, constants=consts, hints=hints, grid=grid, kind=kind)
    return plans


def _check_differentiable(score, block_mask, blasst):
    if score is not None and not score.differentiable:
        raise NotImplementedError(
            f"score_mod {score.name!r} has no derivative: it is forward-only. Give it one "
            "(flashattn.mods.ScoreMod(name, tile, torch_fn, grad=def d_score) or additive=True "
            "for a bias), or call under torch.no_grad()")
    if blasst is not None:
        raise NotImplementedError("blasst_threshold is forward-only (an approximation); drop it "
                                  "for training")
    if block_mask is not None and block_mask.q_num_blocks is None:
        raise ValueError("block_mask has no q_num_blocks/q_indices (the backward's column "
                         "lists): build it with create_block_mask")


def flex_bwd_kernels(score=None, mask=None, kind: str = "mn"):
    """(dq kernel, dkdv kernel) of the pair ``kind`` ("mn": ``make_flex_bwd_kernels``, "t":
    ``make_flex_bwd_kernels_t``) for a ScoreMod/MaskMod pair, built once."""
    grad = score.grad if score is not None else None
    key = (score.tile if score else None, grad, len(score.tensors) if score else 0,
           mask.tile if mask else None, len(mask.tensors) if mask else 0, kind)
    with _LOCK:
        ks = _BWD_KERNELS.get(key)
        if ks is None:
            from .interpret import install_shim
            install_shim()
            from .kernels import flex_bwd
            make = {"mn": flex_bwd.make_flex_bwd_kernels,
                    "t": flex_bwd.make_flex_bwd_kernels_t}[kind]
            ks = make(key[0], key[1], key[3], key[2], key[4])
            _BWD_KERNELS[key] = ks
    return ks


def _backward(q, k, v, out, dout, lse, sinks, *, score, mask, tensors, block_size, scale,
              blasst, ko, block_mask):
    """(dq, dk, dv, dsinks or None) of the flex forward."""
    import torch
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    device = q.device
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    lse = lse.contiguous()
    i32 = dict(dtype=torch.int32, device=device)
    z3, z4 = torch.zeros(1, 1, 1, **i32), torch.zeros(1, 1, 1, 1, **i32)
    dummy = torch.zeros(1, **i32)
    st = [t.contiguous() for t in (score.tensor_values() if score else ())]
    mt = [t.contiguous() for t in (mask.tensor_values() if mask else ())]
    st += [dummy] * (3 - len(st))
    mt += [dummy] * (3 - len(mt))
    has_full = False
    kvt, qt = [z3, z4, z3, z4], [z3, z4, z3, z4]
    if block_mask is not None:
        bm = block_mask
        has_full = bm.full_kv_num_blocks is not None and bm.full_q_num_blocks is not None
        kvt = [bm.kv_num_blocks, bm.kv_indices,
               bm.full_kv_num_blocks if has_full else z3, bm.full_kv_indices if has_full else z4]
        qt = [bm.q_num_blocks, bm.q_indices,
              bm.full_q_num_blocks if has_full else z3, bm.full_q_indices if has_full else z4]
        kvt, qt = [t.contiguous() for t in kvt], [t.contiguous() for t in qt]
    bmul = int(kvt[0].shape[0] > 1)
    hmul = int(kvt[0].shape[1] > 1)
    plan = flex_bwd_plan(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=D,
                         block_size=block_size if block_mask is not None else None,
                         has_full=has_full, score=score, mask=mask,
                         arch=device_arch(device), kernel_options=ko)
    pq, pkv = plan["dq"], plan["dkdv"]
    dq = torch.empty_like(q)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    from .kernels import hinted
    dq_kernel = flex_bwd_kernels(score, mask, pq["kind"])[0]
    dkdv_kernel = flex_bwd_kernels(score, mask, pkv["kind"])[1]
    with on_device(device):
        if plan["delta"] == "kernel":
            # One read of dO and O (the dense backward's preprocess), no fp32 copies of them.
            from .contract import tile_d_for
            from .kernels.fmha_bwd import bwd_preprocess_kernel
            delta = torch.empty((B, Hq, Nq), dtype=torch.float32, device=device)
            launch_kernel(device, (-(-Nq // 64), B * Hq, 1), bwd_preprocess_kernel,
                          (out, dout, delta, Hq, 64, tile_d_for(D)))
        else:
            delta = (dout.float() * out.float()).sum(-1).contiguous()         # (B, Hq, Nq)
        launch_kernel(device, pq["grid"], hinted(dq_kernel, pq["hints"]),
                      (q, k, v, dout, lse, delta, dq, *kvt, *st, *mt, float(scale), Hq,
                       Hq // Hkv, bmul, hmul, *pq["constants"].values()))
        launch_kernel(device, pkv["grid"], hinted(dkdv_kernel, pkv["hints"]),
                      (q, k, v, dout, lse, delta, dk, dv, *qt, *st, *mt, float(scale), Hkv,
                       Hq // Hkv, bmul, hmul, *pkv["constants"].values()))
    dsinks = None
    if sinks is not None:
        # The sink is a key of logit sinks[h] and value 0: dL/dsink = -sum_i P_sink,i Delta_i.
        p_sink = torch.exp(sinks.view(1, Hq, 1).float() - lse)
        dsinks = -(p_sink * delta).sum((0, 2))
    return dq, dk, dv, dsinks




def compile_flex_bwd(arch: str, *, score=None, mask=None, block_size=(128, 128), head_dim=128,
                     Nk=8192, dtype="float16", configs: tuple[Config, Config] | None = None,
                     keep_sass=False, variant: str = DEFAULT_BWD_VARIANT):
    """Compile the two backward kernels for ``arch`` (tileiras); a KernelReport each (dQ, then
    dK/dV). ``configs``: (dK/dV, dQ) tiles and hints (default: the variant's tables);
    ``variant``: a key of ``FLEX_BWD_VARIANTS``."""
    import hashlib
    import json
    from . import aot
    from .aot import KernelReport
    from .kernels import hinted
    from .kernels.spec import Array, KernelSpec
    from .interpret import install_shim
    install_shim()
    score = _as_opt(score, "score")
    mask = _as_opt(mask, "mask") if block_size is not None else None

    class Spec(KernelSpec):
        def check_signature(self):
            return None

    def slots(prefix, mod):
        ts = list(mod.tensors) if mod else []
        out = [Array(f"{prefix}{i}", t.dim(), "float32" if t.dtype.is_floating_point else
                     "int32") for i, (_, t) in enumerate(ts)]
        return out + [Array(f"{prefix}{i}", 1, "int32") for i in range(len(ts), 3)]
    plan = flex_bwd_plan(B=4, Hq=32, Hkv=32, Nq=Nk, Nk=Nk, D=head_dim, block_size=block_size,
                         has_full=block_size is not None, score=score, mask=mask, arch=arch,
                         configs=configs, kernel_options={"BWD_VARIANT": variant})
    blocks = [Array(n, r, "int32") for n, r in (("A", 3), ("B", 4), ("C", 3), ("D", 4))]
    common = (Array("Q", 4), Array("K", 4), Array("V", 4), Array("dO", 4),
              Array("Lse", 3, "float32"), Array("Delta", 3, "float32"))
    scal = (("sm_scale", float), ("heads", int), ("group_size", int), ("mask_bmul", int),
            ("mask_hmul", int))
    names = "+".join(m.name for m in (score, mask) if m) or "identity"
    kernels = {"dq": flex_bwd_kernels(score, mask, plan["dq"]["kind"])[0],
               "dkdv": flex_bwd_kernels(score, mask, plan["dkdv"]["kind"])[1]}
    outs = {"dq": (Array("dQ", 4),), "dkdv": (Array("dK", 4), Array("dV", 4))}
    reps = []
    for name in ("dq", "dkdv"):
        p = plan[name]
        consts, hints = p["constants"], p["hints"]
        spec = Spec(f"flex_{name}", "", "", arrays=(*common, *outs[name], *blocks,
                                                    *slots("S", score), *slots("M", mask)),
                    scalars=scal, constants=tuple(consts))
        rep = KernelReport(step=f"flex_bwd[{names}]", arch=arch,
                           kernel=spec.name + ("_t" if p["kind"] == "t" else ""),
                           config=p["config"].label() if hints else
                           f"{consts['TILE_M']}x{consts['TILE_N']}")
        key = hashlib.sha256(json.dumps([aot._source_hash(), spec.name, p["kind"], names,
                                         _mod_key(score),
                                         _mod_key(mask), sorted(consts.items()),
                                         sorted(hints.items()), arch, dtype,
                                         [(a.name, a.ndim, a.dtype) for a in spec.arrays]],
                                        default=str).encode()).hexdigest()[:20]
        reps.append(aot.compile_into(
            rep, aot._cache_dir() / f"{spec.name}-{arch}-{key}.cubin",
            lambda k=kernels[name], h=hints: hinted(k, h),
            lambda s=spec, c=consts: s.signature(dtype=dtype, constants=c),
            arch, keep_sass=keep_sass, full_error=True))
    return reps
