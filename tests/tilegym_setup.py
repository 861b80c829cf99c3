"""TileGym for the tests: installed from the package index without its dependencies when
missing (``pip install --no-deps tilegym==1.5.1``: its metadata pins another transformers; its
kernels need only torch and cuda-tile), its autotuning off (it times on a GPU)."""
import importlib
import os
import subprocess
import sys

import pytest


def tilegym_or_skip():
    """flashbook.measure.tilegym with TileGym importable, installing it once if needed; skips
    (saying why) where it cannot be installed (no network)."""
    from flashbook.measure import tilegym
    if tilegym.available() is None:
        return tilegym
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                        f"tilegym=={tilegym.VERSION}"], capture_output=True, text=True,
                       timeout=300)
    importlib.invalidate_caches()
    tilegym._CACHE.clear()
    if tilegym.available() is not None:
        said = (r.stderr or r.stdout).strip().splitlines()
        pytest.skip(f"TileGym could not be installed ({tilegym.INSTALL}): "
                    f"{said[-1] if said else tilegym.available()}")
    return tilegym


def no_autotune():
    """A generator for a fixture: TILEGYM_DISABLE_AUTOTUNE=1 while it is open."""
    old = os.environ.get("TILEGYM_DISABLE_AUTOTUNE")
    os.environ["TILEGYM_DISABLE_AUTOTUNE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TILEGYM_DISABLE_AUTOTUNE", None)
        else:
            os.environ["TILEGYM_DISABLE_AUTOTUNE"] = old
