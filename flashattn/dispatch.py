"""Where a launch runs: on the GPU through ``ct.launch``, or, for CPU tensors with the
interpreter opted in (``FLASHATTN_INTERPRET=1``, read at each call, or
``with flashattn.interpret.enabled():``), through ``flashattn.interpret.launch``.

    launch_kernel(q.device, grid, kernel, args)     # every launch site of the package
    device_arch(q.device), device_sm_count(q.device)   # "sm_90", 132 for an interpreted H200
    target = target_of(q.device)    # all of that asked once at a call's entry, passed down

Interpreted, the public operators run the real kernels with the configurations a GPU of
``flashattn.interpret.arch()`` gets; a tuned step times nothing there (the winner cached for
that GPU, else its space's first). Nothing here imports ``cuda.tile`` before a GPU launch, so
the interpreter works without cuda-tile. ``expect`` warns before a call the interpreter would
take more than ``LONG_CALL_S`` seconds over.
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from dataclasses import dataclass

__all__ = ["Target", "target_of", "interpreting", "launch_kernel", "record_launches",
           "launch_key", "on_device", "device_arch", "device_sm_count",
           "device_name", "capturing", "expect", "attention_steps", "SlowInterpreterWarning",
           "STEP_COST_S", "LONG_CALL_S"]

# The interpreter's cost of one (query tile, key tile) step of a kernel, in seconds: measured
# 0.6-2.0 ms on a 2-core CPU for 64x64 to 128x128 tiles at D = 64-128.
STEP_COST_S = 1.5e-3
# Calls estimated above this many seconds warn before they start.
LONG_CALL_S = 60.0


class SlowInterpreterWarning(UserWarning):
    """A call that the CPU interpreter will take long over (more than ``LONG_CALL_S``)."""


@dataclass(frozen=True, eq=False)
class Target:
    """Where one call's launches run, asked once at the call's entry and passed down: the
    tensors' ``device``, whether the interpreter runs them, and, looked up on first use, the
    GPU's architecture, SM count and name (for an interpreted CPU device, the GPU it stands in
    for). Every function here that takes a device takes a Target as well."""
    device: object
    interpreting: bool

    @functools.cached_property
    def arch(self) -> str:
        """"sm_90" for an H100/H200, ...; interpreted: the interpreter's ``arch()``."""
        if self.interpreting:
            from . import interpret
            return interpret.arch()
        return cuda_properties(_cuda_index(self.device))[0]

    @functools.cached_property
    def sm_count(self) -> int:
        if self.interpreting:
            from . import interpret
            return interpret.sm_count()
        return cuda_properties(_cuda_index(self.device))[1]

    @functools.cached_property
    def name(self) -> str:
        """``torch.cuda.get_device_name``; interpreted, the name of the GPU it stands in for,
        as that GPU reports it ("NVIDIA H200"): the key of its autotune cache."""
        if self.interpreting:
            from . import interpret
            return interpret.ARCH_NAMES[self.arch]
        import torch
        return torch.cuda.get_device_name(self.device)


def target_of(device) -> Target:
    """The ``Target`` of tensors on ``device`` (a Target is its own)."""
    if isinstance(device, Target):
        return device
    return Target(device, interpreting(device))


def _device(device):
    """The device itself, of a device or a ``Target``."""
    return device.device if isinstance(device, Target) else device


def interpreting(device) -> bool:
    """True when the launches for tensors on ``device`` go to the interpreter: a CPU device,
    and ``flashattn.interpret.active()`` (``FLASHATTN_INTERPRET=1`` or inside
    ``flashattn.interpret.enabled()``). Installs the interpreter's ``cuda.tile`` shim then (a
    no-op where cuda-tile is installed), so that the kernel modules import."""
    if isinstance(device, Target):
        return device.interpreting
    if getattr(device, "type", device) != "cpu":
        return False
    from . import interpret
    if not interpret.active():
        return False
    interpret.install_shim()
    return True


def launch_kernel(device, grid, kernel, args, *, stream: str = "device",
                  pdl: bool = False) -> None:
    """Launch ``kernel`` over ``grid`` with ``args``: in the interpreter for CPU tensors with the
    opt-in (``interpreting``), else ``ct.launch`` on a CUDA stream, ``stream="device"``:
    ``torch.cuda.current_stream(device)``, ``"current"``: ``torch.cuda.current_stream()`` (the
    current device's, what ``launch.launch`` has always used). ``pdl``: launch as a
    programmatic dependent of the previous kernel in the stream (the kernel waits for it with
    ``ct.grid_dependency_control_wait``); the interpreter runs launches in order regardless."""
    if _RECORDERS:
        skip = False
        for rec in _RECORDERS:
            skip |= rec(_device(device), grid, kernel, args)
        if skip:
            return
    if interpreting(device):
        from . import interpret
        interpret.launch(tuple(grid), kernel, args)
        return
    import cuda.tile as ct
    import torch
    if stream == "device":
        s = torch.cuda.current_stream(_device(device))
    elif stream == "current":
        s = torch.cuda.current_stream()
    else:
        raise ValueError(f"stream must be 'device' or 'current', got {stream!r}")
    if pdl:
        ct.launch(s, grid, kernel, args, programmatic_dependent_launch=True)
    else:
        ct.launch(s, grid, kernel, args)


# --- what a launch compiles: the hook of the compile-once test and of precompile ------------------
_RECORDERS: list = []


def _is_constant(annotation) -> bool:
    return any("Constant" in type(m).__name__ for m in getattr(annotation, "__metadata__", ()))


def launch_key(kernel, args) -> dict:
    """What a launch of ``kernel`` with ``args`` is compiled for: the kernel (module and
    function), its launch hints, its ``ct.Constant`` arguments by name, and each array
    argument's class as cuTile's JIT keys it (dtype, rank, and per dimension whether it is 1 or
    a multiple of 16: the JIT specialises on both), plus the rest of the arguments' types."""
    import inspect
    fn = getattr(kernel, "_pyfunc", None) or getattr(kernel, "__wrapped__", None) or kernel
    params = list(inspect.signature(fn).parameters.values())
    constants, arrays = {}, []
    for p, a in zip(params, args):
        if _is_constant(p.annotation):
            constants[p.name] = a
        elif hasattr(a, "shape") and hasattr(a, "dtype"):
            arrays.append((p.name, str(a.dtype).replace("torch.", ""),
                           tuple("1" if int(d) == 1 else ("16" if int(d) % 16 == 0 else "*")
                                 for d in a.shape)))
    opts = getattr(kernel, "_compiler_options", None)
    return dict(kernel=f"{fn.__module__}.{fn.__name__}", hints=repr(opts) if opts else "",
                constants=tuple(sorted(constants.items())), arrays=tuple(arrays),
                fn=fn, kernel_obj=kernel)


@contextlib.contextmanager
def record_launches(*, run: bool = True):
    """Record every launch inside as ``launch_key``'s dict, in a list (the context's value).
    ``run=False``: record only, launch nothing (the outputs are left unwritten: for
    enumerating what a call compiles, e.g. ``flashattn.precompile``)."""
    seen: list = []

    def rec(device, grid, kernel, args):
        seen.append(dict(launch_key(kernel, args), grid=tuple(grid)))
        return not run
    _RECORDERS.append(rec)
    try:
        yield seen
    finally:
        _RECORDERS.remove(rec)


def on_device(device):
    """``torch.cuda.device(device)`` for a CUDA device; nothing for a CPU one."""
    device = _device(device)
    if getattr(device, "type", None) == "cpu":
        return contextlib.nullcontext()
    import torch
    return torch.cuda.device(device)


@functools.lru_cache(maxsize=None)
def cuda_properties(index: int) -> tuple[str, int]:
    """("sm_90", SM count) of CUDA device ``index``, looked up once per process (a decode step's
    host time counts): the one place the library asks the driver for the architecture."""
    import torch
    props = torch.cuda.get_device_properties(index)
    return f"sm_{props.major}{props.minor}", props.multi_processor_count


def _cuda_index(device) -> int:
    """The CUDA device index of ``device`` (an index, "cuda:1", or a torch.device); the current
    device when it names none."""
    import torch
    if isinstance(device, int):
        return device
    index = torch.device(device).index if isinstance(device, str) else getattr(device, "index", None)
    return index if index is not None else torch.cuda.current_device()


def device_arch(device) -> str:
    """``target_of(device).arch``: every path of the library detects the architecture there."""
    return target_of(device).arch


def device_sm_count(device) -> int:
    """``target_of(device).sm_count``."""
    return target_of(device).sm_count


def device_name(device) -> str:
    """``target_of(device).name``."""
    return target_of(device).name


def capturing(device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream (never for a CPU
    device, where ``torch.cuda`` is not asked)."""
    if getattr(_device(device), "type", None) != "cuda":
        return False
    import torch
    return bool(torch.cuda.is_current_stream_capturing())


# --- the estimate of a long call --------------------------------------------------------------
def attention_steps(len_q: int, len_k: int, tile_m: int, tile_n: int, *, causal: bool,
                    offset: int = 0) -> int:
    """(query tile, key tile) pairs one head of one sequence visits: every key tile for each
    query tile, or with ``causal`` those up to the tile's last row, which sits at position
    ``offset + row`` (``input_pos``; ``len_k - len_q`` for the bottom-right alignment)."""
    len_q, len_k = int(len_q), int(len_k)
    if len_q <= 0 or len_k <= 0:
        return 0
    nk = -(-len_k // tile_n)
    nq = -(-len_q // tile_m)
    if not causal:
        return nq * nk
    total = 0
    for i in range(nq):
        last = int(offset) + min((i + 1) * tile_m, len_q) - 1     # the tile's last row's position
        total += max(0, min(nk, -(-(last + 1) // tile_n)))
    return total


_state = threading.local()


def _caller_stacklevel() -> int:
    """The stacklevel of the first frame outside flashattn and torch (the user's call)."""
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    skip = [here]
    files = {os.path.abspath(contextlib.__file__)}          # the ``with`` of ``expect``
    torch_mod = sys.modules.get("torch")
    if torch_mod is not None and getattr(torch_mod, "__file__", None):
        skip.append(os.path.dirname(os.path.abspath(torch_mod.__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if (path not in files and not any(path.startswith(p + os.sep) for p in skip)
                and not frame.f_code.co_filename.startswith("<frozen")):
            return level
        frame, level = frame.f_back, level + 1
    return 2


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


_QUIET = contextlib.nullcontext()


def expect(device, steps, what):
    """A context manager around the launches of one call. When the interpreter runs them and
    ``steps`` (query tile, key tile) steps at ``STEP_COST_S`` each come to more than
    ``LONG_CALL_S``, it warns (``SlowInterpreterWarning``) before they start; calls nested
    inside (the square kernels a varlen backward runs per sequence) do not warn again.
    ``steps`` and ``what`` (the call, for the message) may be zero-argument callables: they are
    evaluated only for the interpreter, so a GPU call pays nothing for the estimate."""
    if not interpreting(device):
        return _QUIET
    return _expect(steps, what)


@contextlib.contextmanager
def _expect(steps, what):
    if not getattr(_state, "depth", 0):
        steps = int(steps() if callable(steps) else steps)
        seconds = steps * STEP_COST_S
        if seconds > LONG_CALL_S:
            what = what() if callable(what) else what
            warnings.warn(
                f"{what} in the CPU interpreter: about {steps:,} (query tile, key tile) "
                f"steps at ~{STEP_COST_S * 1e3:g} ms each, roughly {_duration(seconds)} before "
                "it returns; smaller shapes run faster (or use a GPU, or "
                "flashattn.reference for the values only)",
                SlowInterpreterWarning, stacklevel=_caller_stacklevel())
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
