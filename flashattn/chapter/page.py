"""What the chapter notebooks share: where their numbers come from, and how they say so.

Every notebook starts with ``chapter.setup()``: it decides the mode (a GPU that runs cuTile:
live measurements beside the recorded ones; otherwise the recorded dataset only) and shows a
banner saying which GPU, date and versions the recorded numbers come from. Numbers quoted in
prose go through ``chapter.glue`` (myst-nb's glue), so the text is always the data.
"""
from __future__ import annotations

import functools
import os

DEFAULT_GPU = os.environ.get("FLASHATTN_BOOK_GPU", "h200")


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when a CUDA GPU that cuTile can compile for is present (and not disabled)."""
    if os.environ.get("FLASHATTN_BOOK_MODE") == "recorded":
        return False
    try:
        import torch
        if not torch.cuda.is_available():
            return False
        import cuda.tile  # noqa: F401
        return True
    except Exception:
        return False


def mode() -> str:
    """"live" on a GPU (live measurements beside the recorded ones), else "recorded"."""
    return "live" if gpu_available() else "recorded"


@functools.lru_cache(maxsize=None)
def results(gpu: str = DEFAULT_GPU):
    """The recorded dataset (``flashattn.data.results.load``), loaded once per notebook."""
    from ..data.results import load
    return load(gpu)


def source_line(gpu: str = DEFAULT_GPU) -> str:
    from ..data.results import source_line
    return source_line(results(gpu).meta)


def banner_text(gpu: str = DEFAULT_GPU) -> str:
    r = results(gpu)
    rec = f"recorded on {source_line(gpu)} (`results/{gpu}/`)"
    if mode() == "live":
        import torch
        name = torch.cuda.get_device_name()
        return (f"**Mode: live.** This notebook runs its measurements on this machine's "
                f"{name}; the numbers in the prose and the figures marked *recorded* were {rec}.")
    return (f"**Mode: recorded.** No GPU that runs cuTile was found, so measurements come from "
            f"the dataset {rec}. Compiler evidence (registers, spills, SASS) is computed live: "
            f"it needs no GPU.")


def setup(gpu: str = DEFAULT_GPU):
    """Call first in every chapter: plot style, and the banner saying where numbers come from."""
    import matplotlib.pyplot as plt
    # No backend switch here: in a Jupyter kernel the inline backend shows the figures.
    plt.rcParams.update({"figure.dpi": 90, "savefig.dpi": 90, "figure.figsize": (7.5, 4.2),
                         "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3})
    from IPython.display import Markdown, display
    display(Markdown(banner_text(gpu)))
    return results(gpu)


def glue(name: str, value, spec: str | None = None, *, display: bool = False):
    """Glue a value for the prose (``{glue:text}`name```); formatted with ``spec`` if given.

    Outside a myst-nb build this is harmless: the value is only recorded in the output.
    """
    v = format(value, spec) if spec else value
    try:
        from myst_nb import glue as _glue
    except ImportError:      # running outside the book's toolchain (e.g. a bare GPU host)
        return v
    _glue(name, v, display=display)
    return v


def show(code: str, language: str = "python"):
    """Show code or a diff with colours (wraps ``flashattn.kernels.source.show``)."""
    from ..kernels.source import show as _show
    return _show(code, language)
