"""Run the real cuTile kernels on a CPU: an interpreter for the part of ``cuda.tile`` they use.

Like Triton's ``TRITON_INTERPRET=1``: every program of a launch grid runs, one after another, on
NumPy arrays that are the CPU tensors' memory. The kernel's own source runs unmodified: its
``ct`` (and every helper it calls, in any module) is rebound to ``flashattn.interpret.tile``, a
NumPy implementation of cuTile's tile semantics, strict where the GPU's behaviour is undefined::

    from flashattn import interpret
    interpret.launch(grid, kernel, args)                  # ct.launch without the stream
    interpret.launch(grid, kernel, args, shuffle=True)    # programs in a random order

    with interpret.enabled():                             # or FLASHATTN_INTERPRET=1
        o = flashattn.attention(q_cpu, k_cpu, v_cpu, causal=True)   # the real kernels, on CPU

    with interpret.trace() as tr:                         # which tiles each program touched
        interpret.launch(grid, kernel, args)
    tr.loads("K")                                         # {program: number of K tiles loaded}

    with interpret.intercept():                           # anyone's host code, unmodified:
        o = tilegym_attention(q_cpu, k_cpu, v_cpu)        # ct.launch runs interpret.launch

Every ``cuda.tile`` name it implements has cuda.tile's own signature (positional-only and
keyword parameters, defaults), so kernels written for cuTile run as written; ``intercept()``
also answers ``torch.cuda``'s device queries as the GPU of ``arch()`` (``host``'s docstring).

Environment: ``FLASHATTN_INTERPRET=1`` (the public operators run through the interpreter on CPU
tensors), ``FLASHATTN_INTERPRET_ARCH`` (the GPU it stands in for, default sm_90) and
``FLASHATTN_INTERPRET_STRICT_PADDING=1``: a float load that reads past its array with the
default ``PaddingMode.UNDETERMINED`` raises at that load (kernel, program, source line, tile
index and the elements outside) instead of reading NaN, to find the load behind a NaN output.

What is strict (each raises ``InterpreterError`` naming the kernel, the program and the tile):
a load past the array with no ``padding_mode`` reads NaN (a GPU reads whatever is there; with
``FLASHATTN_INTERPRET_STRICT_PADDING=1`` it raises, and always for a non-float array); a tile
wholly outside its array; ``check_bounds=False`` on a tile that leaves the array; an ``mma`` whose
operand or accumulator dtypes cuTile does not accept; a store of a tile whose dtype is not the
array's; two programs of one launch writing the same element (atomics excepted, applied in
program order). Tile dimensions must be powers of two, as on the GPU.

Works where cuda-tile does not install (macOS, say): then ``flashattn.interpret.tile`` is
registered as ``cuda.tile``, so the kernel modules import and run here all the same.
"""
from __future__ import annotations

import contextlib
import os
import threading

from .errors import InterpreterError

__all__ = ["launch", "enabled", "active", "arch", "sm_count", "device_name", "trace",
           "intercept", "InterpreterError", "ARCH_SMS", "install_shim", "ENV_STRICT_PADDING"]

# The GPU the interpreter stands in for, by architecture: its SM count (the persistent grid
# and the decode split count read it). sm_90: an H200, the machine the book measured.
ARCH_SMS = {"sm_80": 108, "sm_89": 128, "sm_90": 132, "sm_100": 148, "sm_103": 148,
            "sm_120": 170}
ARCH_NAMES = {"sm_80": "NVIDIA A100", "sm_89": "NVIDIA L40S", "sm_90": "NVIDIA H200",
              "sm_100": "NVIDIA B200", "sm_103": "NVIDIA B300", "sm_120": "NVIDIA RTX PRO 6000"}
DEFAULT_ARCH = "sm_90"
ENV_FLAG = "FLASHATTN_INTERPRET"
ENV_ARCH = "FLASHATTN_INTERPRET_ARCH"
ENV_STRICT_PADDING = "FLASHATTN_INTERPRET_STRICT_PADDING"

_state = threading.local()


def _stack() -> list:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def _check_arch(a: str) -> str:
    if a not in ARCH_SMS:
        raise ValueError(f"unknown architecture {a!r} for the interpreter; one of "
                         f"{', '.join(ARCH_SMS)}")
    return a


def active() -> bool:
    """True inside ``enabled()`` or when ``FLASHATTN_INTERPRET=1`` (read at call time)."""
    if _stack():
        return _stack()[-1] is not None
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def enabled(arch: str = None, *, on: bool = True):
    """Run ``flashattn``'s public operators on CPU tensors through the interpreter, choosing
    configurations as on a GPU of ``arch`` (default ``FLASHATTN_INTERPRET_ARCH`` or sm_90).
    ``enabled(on=False)`` switches it off inside, whatever the environment says."""
    if arch is not None:
        _check_arch(arch)
    _stack().append((arch or "") if on else None)
    try:
        yield
    finally:
        _stack().pop()


def arch() -> str:
    """The architecture the interpreter stands in for: ``enabled(arch=...)``, else
    ``FLASHATTN_INTERPRET_ARCH``, else sm_90."""
    for a in reversed(_stack()):
        if a:
            return a
    return _check_arch(os.environ.get(ENV_ARCH, "").strip() or DEFAULT_ARCH)


_current_arch = arch          # for functions whose ``arch`` argument hides it


def sm_count(a: str | None = None) -> int:
    """SMs of the GPU the interpreter stands in for."""
    return ARCH_SMS[_check_arch(a or arch())]


def device_name(a: str | None = None) -> str:
    """The name of that GPU, as ``torch.cuda.get_device_name`` gives it, marked interpreted."""
    return ARCH_NAMES[_check_arch(a or arch())] + " (interpreted)"


def install_shim() -> bool:
    """Register ``flashattn.interpret.tile`` as ``cuda.tile`` when cuda-tile is not installed
    (True if it did). Called by ``launch``; harmless when cuda-tile is there."""
    from .shim import install_shim as _install
    return _install()


def launch(grid, kernel, args, *, shuffle: bool = False, seed: int | None = None) -> None:
    """Run ``kernel`` (a ``@ct.kernel`` object) over ``grid`` on CPU tensors, as
    ``ct.launch(stream, grid, kernel, args)`` does on a GPU.

    grid: 1 to 3 positive ints; args: the kernel's arguments in order (CPU torch tensors for
    arrays, Python scalars, constants). Programs run in grid order (x fastest) or, with
    ``shuffle``, in a random order drawn from ``seed``.
    """
    from .rebind import rebound
    from .runner import run
    from .shim import module
    module()
    run(grid, kernel, args, bind=rebound, shuffle=shuffle, seed=seed)


def trace():
    """A context manager recording every load, store and atomic of the launches inside it."""
    from .runner import Trace
    return Trace()


@contextlib.contextmanager
def intercept(arch: str | None = None):
    """Run a cuTile library's host code unmodified on CPU tensors: inside, ``cuda.tile.launch``
    runs ``launch(grid, kernel, args)`` (the library's own grid, kernel objects and arguments),
    and ``torch.cuda``'s device queries (``current_stream``, ``get_device_capability``,
    ``get_device_properties``, ``get_device_name``) answer as an interpreted GPU of ``arch``
    (default ``arch()``), with ``enabled(arch)`` on. Yields that GPU's properties::

        with flashattn.interpret.intercept():          # TileGym picks its sm_90 tiles
            o = tilegym.ops.cutile.attention.tile_fmha(q_cpu, k_cpu, v_cpu)

    Not reached: a ``launch`` imported by name (``from cuda.tile import launch``) before, and
    an autotuner that times kernels (TileGym's: ``TILEGYM_DISABLE_AUTOTUNE=1`` takes its first
    configuration)."""
    from .host import device_properties, patched
    install_shim()
    with enabled(arch):
        a = _current_arch()
        with patched(launch, device_properties(ARCH_NAMES[a], a, ARCH_SMS[a])) as props:
            yield props
