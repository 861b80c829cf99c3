"""From mods to flex kernels: a mod checked on tiles before its first use (``probe``), and the
forward and backward kernels built once per pair of tile functions (``flex_kernel``,
``flex_bwd_kernels``) from ``kernels/flex.py`` and ``kernels/flex_bwd.py``.

A user's function becomes a mod (its tile code) in one place, ``mods.as_mod``; the kernels see
only ``mod.tile`` and ``mod.grad``.
"""
from __future__ import annotations

import threading

from .modtrace import ModError  # the tracer raises it too

__all__ = ["ModError", "flex_kernel", "flex_bwd_kernels", "probe"]

_KERNELS: dict = {}
_BWD_KERNELS: dict = {}
_PROBED: dict = {}
_LOCK = threading.Lock()


def _built(cache: dict, key: tuple, factory: str):
    """``kernels.<module>.<function>(*key)`` (``factory`` = "module.function"), built once."""
    with _LOCK:
        k = cache.get(key)
        if k is None:
            import importlib
            from .interpret import install_shim
            install_shim()          # the kernels' cuda.tile: the interpreter's where it is missing
            module, function = factory.rsplit(".", 1)
            make = getattr(importlib.import_module(f"{__package__}.kernels.{module}"), function)
            k = cache[key] = make(*key)
    return k


def flex_kernel(score=None, mask=None):
    """The forward ``@ct.kernel`` for a ScoreMod/MaskMod pair (None: none), built once per pair
    of tile functions."""
    return _built(_KERNELS, (score.tile if score else None, mask.tile if mask else None),
                  "flex.make_flex_kernel")


def flex_bwd_kernels(score=None, mask=None):
    """(dq kernel, dkdv kernel) for a ScoreMod/MaskMod pair, built once."""
    return _built(_BWD_KERNELS, (score.tile if score else None, score.grad if score else None,
                                 mask.tile if mask else None), "flex_bwd.make_flex_bwd_kernels")


def probe(mod, kind: str):
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
