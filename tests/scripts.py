"""Loading a Python file that is not a package module (an experiment script, a mutated copy of a
kernel module) as a module, for the tests that exercise one."""
import importlib.util
from pathlib import Path


def load(path, name: str | None = None):
    """The module that ``path`` defines, executed once, under ``name`` (default: its stem)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
