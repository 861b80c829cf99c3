"""NVIDIA TileGym's cuTile attention, as the book times it beside the other libraries.

    fwd, bwd, decode = tilegym.kernels()      # TileGym's own functions, unmodified
    tilegym.available()                       # None, or why not (the error rows' text)

TileGym (``pip install --no-deps tilegym==1.5.1``: its metadata pins a ``transformers`` other
than the book's, and the kernels import only torch and cuda-tile) ships three attention
entry points: ``tile_fmha`` (forward, inference), ``tile_fmha_with_backward`` (autograd:
forward with the LSE, then its preprocess, dK/dV and dQ kernels) and ``fmha_decode`` (split-KV
flash decode and its reduction). They run here as shipped, their autotuning included: the
first call on a new shape searches TileGym's own configurations (outside the timing, in the
harnesses' check), unless ``TILEGYM_DISABLE_AUTOTUNE=1``.
"""
from __future__ import annotations

import warnings

VERSION = "1.5.1"
INSTALL = f"pip install --no-deps tilegym=={VERSION}"

_CACHE: dict = {}


def _import():
    import cuda.tile as ct
    launch = ct.launch
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")          # "Triton backend import failed"
            from tilegym.ops.cutile import attention, flash_decode
    finally:
        # Importing tilegym replaces cuda.tile.launch process-wide with a wrapper of four
        # positional arguments (a one-time notice for its experimental kernels), which refuses
        # the programmatic_dependent_launch keyword flashattn's launches pass: put it back.
        ct.launch = launch
    return attention, flash_decode


def available() -> str | None:
    """None when TileGym's attention imports, else the reason (with the install command)."""
    if "mods" not in _CACHE:
        try:
            _CACHE["mods"] = _import()
        except Exception as e:                       # ImportError, or a broken install
            _CACHE["mods"] = None
            _CACHE["why"] = (f"tilegym is not importable ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}); {INSTALL}")
    return None if _CACHE["mods"] is not None else _CACHE["why"]


def kernels():
    """(forward, forward with autograd backward, decode): TileGym's ``tile_fmha``,
    ``tile_fmha_with_backward``, ``fmha_decode``. Raises ImportError saying how to install."""
    why = available()
    if why is not None:
        raise ImportError(why)
    attention, flash_decode = _CACHE["mods"]
    return attention.tile_fmha, attention.tile_fmha_with_backward, flash_decode.fmha_decode
