"""Someone else's host code, unmodified, on CPU tensors: ``intercept()``.

A cuTile library's Python side (TileGym's, say) picks its tiles from
``torch.cuda.get_device_capability()``, sizes its grids from ``get_device_properties``, and
launches with ``ct.launch(torch.cuda.current_stream(), grid, kernel, args)``. Inside
``intercept()`` those calls answer as the GPU the interpreter stands in for (``arch()``), and
``cuda.tile.launch`` runs ``flashattn.interpret.launch(grid, kernel, args)``: the library's own
grid and arguments, its own kernel objects. Everything is put back on exit.

What it cannot reach: a ``launch`` imported by name before entering (``from cuda.tile import
launch``), and a library's autotuner, which times kernels on a GPU (TileGym: set
``TILEGYM_DISABLE_AUTOTUNE=1`` to take its first configuration, as its CI does).
"""
from __future__ import annotations

import contextlib
import sys
import types

__all__ = ["patched", "device_properties"]


class _Stream:
    """What ``torch.cuda.current_stream()`` returns inside ``intercept``: launches ignore it."""

    def __repr__(self):
        return "<interpreted stream>"

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass


def device_properties(name: str, arch: str, sm_count: int):
    """What ``torch.cuda.get_device_properties`` answers inside ``patched``."""
    major, minor = int(arch[3:-1]), int(arch[-1])
    return types.SimpleNamespace(name=name, major=major, minor=minor,
                                 multi_processor_count=sm_count, total_memory=141 * 2**30)


@contextlib.contextmanager
def patched(run, props):
    """Inside: ``cuda.tile.launch(stream, grid, kernel, args)`` calls ``run(grid, kernel,
    args)``, and ``torch.cuda``'s device queries (``current_stream``,
    ``get_device_capability``, ``get_device_properties``, ``get_device_name``,
    ``current_device``) answer with ``props`` (``device_properties``). Put back on exit.
    ``flashattn.interpret.intercept`` is this with the interpreter and its GPU."""
    import torch

    from .shim import module

    cap = (props.major, props.minor)

    def _launch(stream, grid, kernel, kernel_args, /, *, programmatic_dependent_launch=False):
        run((grid,) if isinstance(grid, int) else tuple(grid), kernel, kernel_args)

    targets = [module()]
    real = sys.modules.get("cuda.tile")
    if real is not None and real is not module():
        targets.append(real)
    saved = []
    try:
        for m in targets:
            saved.append((m, "launch", m.__dict__.get("launch")))
            m.launch = _launch
        fakes = {
            "current_stream": lambda device=None: _Stream(),
            "default_stream": lambda device=None: _Stream(),
            "get_device_capability": lambda device=None: cap,
            "get_device_properties": lambda device=None: props,
            "get_device_name": lambda device=None: props.name,
            "current_device": lambda: 0,
            "synchronize": lambda device=None: None,
        }
        for name, f in fakes.items():
            saved.append((torch.cuda, name, getattr(torch.cuda, name)))
            setattr(torch.cuda, name, f)
        yield props
    finally:
        for obj, name, old in reversed(saved):
            setattr(obj, name, old)
