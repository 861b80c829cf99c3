"""The interpreter's ``cuda.tile`` module: ``tile``'s names plus the memory operations."""
from __future__ import annotations

import sys
import types

import flashattn.interpret.rebind as rebind
import flashattn.interpret.runner as runner
import flashattn.interpret.tile as tile

_MODULE = None

_FROM_RUNNER = ("load", "store", "gather", "scatter", "atomic_add", "atomic_xchg", "atomic_max",
                "atomic_min", "atomic_cas", "atomic_and", "atomic_or", "atomic_xor", "bid",
                "num_blocks", "num_tiles",
                "grid_dependency_control_wait", "grid_dependency_control_launch_dependents")


def launch(stream, grid, kernel, kernel_args, /, *, programmatic_dependent_launch=False):
    """``ct.launch`` of the shim: the stream is ignored, and launches run one after another
    (so a programmatic dependent launch is an ordinary one)."""
    module()
    runner.run(grid, kernel, kernel_args, bind=rebind.rebound)


def install_shim() -> bool:
    """Register the shim as ``cuda.tile`` if cuda-tile is not installed (True if it did)."""
    if "cuda.tile" in sys.modules or rebind.real_ct() is not None:
        return False
    if "cuda" not in sys.modules:
        pkg = types.ModuleType("cuda")
        pkg.__path__ = []
        sys.modules["cuda"] = pkg
    sys.modules["cuda.tile"] = module()
    sys.modules["cuda"].tile = sys.modules["cuda.tile"]
    return True


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
        m.launch = launch
        m.Array = runner.Array
        m.Tile = tile.Tile
        m.ScalarInt64 = tile.typing.Annotated[int, _ScalarAnnotation(tile.int64)]
        m.__interpreter_shim__ = True

        def __getattr__(name):
            raise AttributeError(f"cuda.tile.{name} is not implemented by flashattn's "
                                 "interpreter (flashattn.interpret)")
        m.__getattr__ = __getattr__
        _MODULE = m
        tile.SHIM_MODULE = m
    return _MODULE


class _ScalarAnnotation:
    def __init__(self, dtype):
        self.dtype = dtype
