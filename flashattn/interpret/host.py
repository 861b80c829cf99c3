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

__all__ = ["intercept"]


class _Stream:
    """What ``torch.cuda.current_stream()`` returns inside ``intercept``: launches ignore it."""

    def __repr__(self):
        return "<interpreted stream>"

    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass


def _props(arch: str):
    from . import ARCH_NAMES, ARCH_SMS
    major, minor = int(arch[3:-1]), int(arch[-1])
    return types.SimpleNamespace(name=ARCH_NAMES[arch], major=major, minor=minor,
                                 multi_processor_count=ARCH_SMS[arch],
                                 total_memory=141 * 2**30)


@contextlib.contextmanager
def intercept(arch: str | None = None):
    """Route ``cuda.tile.launch`` to the interpreter and answer ``torch.cuda``'s device queries
    (``current_stream``, ``get_device_capability``, ``get_device_properties``,
    ``get_device_name``, ``current_device``) as an interpreted GPU of ``arch`` (default:
    ``flashattn.interpret.arch()``), so that a cuTile library's host code runs unmodified on
    CPU tensors::

        with flashattn.interpret.intercept():
            o = tilegym.ops.cutile.attention.tile_fmha(q_cpu, k_cpu, v_cpu)
    """
    import torch

    from . import enabled, launch, install_shim
    from . import arch as current_arch
    from .shim import module

    install_shim()
    with enabled(arch):
        a = current_arch()
        props = _props(a)
        cap = (props.major, props.minor)

        def _launch(stream, grid, kernel, kernel_args, /, *, programmatic_dependent_launch=False):
            launch(tuple(grid) if not isinstance(grid, int) else (grid,), kernel, kernel_args)

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
