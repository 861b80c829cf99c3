"""Run a kernel's own source against the NumPy ``cuda.tile``.

A kernel reads ``ct`` (and ``from cuda.tile import X as Y`` names) from its module's globals,
and so does every helper it calls, in its module or another. ``rebound(f)`` makes a copy of a
function whose globals map each of those to ``flashattn.interpret.tile``, with every helper
function it names rebound the same way (once, cached), and the builtins ``max``, ``min`` and
``range`` replaced by cuTile's meaning of them (element-wise on tiles; a loop index that is an
int32 scalar). Closures (a kernel made by a factory) are rebound cell by cell.
"""
from __future__ import annotations

import builtins
import importlib.util
import sys
import types

import flashattn.interpret.tile as T

_CACHE: dict = {}


def real_ct():
    """cuda.tile if it is installed (and is not the shim), else None."""
    mod = sys.modules.get("cuda.tile")
    if mod is not None:
        return None if getattr(mod, "__interpreter_shim__", False) else mod
    try:
        if importlib.util.find_spec("cuda") is None or importlib.util.find_spec("cuda.tile") is None:
            return None
    except (ImportError, ValueError):
        return None
    import cuda.tile as ct
    return ct


def _real_names() -> dict:
    ct = real_ct()
    if ct is None:
        return {}
    out = {}
    for name in dir(ct):
        try:
            out[id(getattr(ct, name))] = name
        except Exception:                                            # pragma: no cover
            pass
    return out


_REAL_IDS: dict | None = None


def _shim_module():
    if T.SHIM_MODULE is None:
        raise RuntimeError("flashattn.interpret.shim.module() must be made before rebinding")
    return T.SHIM_MODULE


def _is_ct_module(v) -> bool:
    return isinstance(v, types.ModuleType) and (
        v.__name__ == "cuda.tile" or getattr(v, "__interpreter_shim__", False))


def _uses_ct(g: dict) -> bool:
    return any(_is_ct_module(v) for v in g.values())


def _translate(v):
    global _REAL_IDS
    if _REAL_IDS is None:
        _REAL_IDS = _real_names()
    if _is_ct_module(v):
        return _shim_module()
    name = _REAL_IDS.get(id(v))
    if name is not None and hasattr(_shim_module(), name):
        return getattr(_shim_module(), name)
    if isinstance(v, types.FunctionType) and _uses_ct(v.__globals__):
        return rebound(v)
    if hasattr(v, "_pyfunc") and isinstance(v._pyfunc, types.FunctionType):
        return rebound(v._pyfunc)                                   # a kernel called as a helper
    return v


def _range(*args):
    """cuTile's ``range``: the loop index is an int32 scalar."""
    ints = [int(a) for a in args]
    for i in builtins.range(*ints):
        yield T.Tile(i, T.int32)


def _elementwise(builtin, pairwise, reduce):
    """cuTile's ``max``/``min``: element-wise over tiles (a single tile: its reduction), the
    builtin otherwise."""
    def f(*args, **kwargs):
        if len(args) >= 2 and not kwargs and any(isinstance(a, T.Tile) for a in args):
            r = args[0]
            for a in args[1:]:
                r = pairwise(r, a)
            return r
        if len(args) == 1 and isinstance(args[0], T.Tile):
            return reduce(args[0])
        return builtin(*args, **kwargs)
    f.__name__ = builtin.__name__
    return f


_max = _elementwise(builtins.max, T.maximum, T.max)
_min = _elementwise(builtins.min, T.minimum, T.min)


OVERRIDES = {"max": _max, "min": _min, "range": _range}


def rebound(f: types.FunctionType) -> types.FunctionType:
    """``f`` with its cuTile names, helpers and builtins bound for the interpreter."""
    hit = _CACHE.get(f)
    if hit is not None:
        return hit
    g = dict(f.__globals__)
    new = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, f.__closure__)
    _CACHE[f] = new                                                  # before recursing: cycles
    for k, v in list(g.items()):
        if k.startswith("__"):
            continue
        g[k] = _translate(v)
    g.update(OVERRIDES)
    if f.__closure__:
        cells = tuple(types.CellType(_translate(c.cell_contents)) if _has(c) else c
                      for c in f.__closure__)
        new = types.FunctionType(f.__code__, g, f.__name__, f.__defaults__, cells)
        _CACHE[f] = new
    new.__kwdefaults__ = f.__kwdefaults__
    new.__qualname__ = f.__qualname__
    new.__module__ = f.__module__
    new.__doc__ = f.__doc__
    new.__wrapped_kernel__ = f
    return new


def _has(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False
