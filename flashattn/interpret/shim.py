"""The interpreter's ``cuda.tile`` module: ``tile``'s names plus the memory operations."""
from __future__ import annotations

import types

from . import runner, tile

_MODULE = None

_FROM_RUNNER = ("load", "store", "gather", "scatter", "atomic_add", "atomic_xchg", "atomic_max",
                "atomic_min", "atomic_cas", "bid", "num_blocks", "num_tiles", "launch")


def module() -> types.ModuleType:
    """The shim as a module named ``cuda.tile`` (one object, made once)."""
    global _MODULE
    if _MODULE is None:
        m = types.ModuleType("cuda.tile", "flashattn's NumPy interpreter standing in for cuda.tile")
        for k, v in vars(tile).items():
            if not k.startswith("_") and k not in ("annotations", "np", "math", "enum",
                                                   "typing", "InterpreterError"):
                setattr(m, k, v)
        for k in _FROM_RUNNER:
            setattr(m, k, getattr(runner, k))
        m.Array = runner.Array
        m.Tile = tile.Tile
        m.ScalarInt64 = tile.typing.Annotated[int, _ScalarAnnotation(tile.int64)]
        m.__interpreter_shim__ = True

        def __getattr__(name):
            raise AttributeError(f"cuda.tile.{name} is not implemented by flashattn's "
                                 "interpreter (flashattn.interpret)")
        m.__getattr__ = __getattr__
        _MODULE = m
    return _MODULE


class _ScalarAnnotation:
    def __init__(self, dtype):
        self.dtype = dtype
