"""What the chapter notebooks share: where their numbers come from, and how they say so.

Every notebook starts with ``chapter.setup()``: it decides the mode (a GPU that runs cuTile:
live measurements beside the recorded ones; otherwise the recorded dataset only) and shows, once
per page, a one-line note (``mode_note``, class ``provenance-note``, small type in book.css)
saying which GPU, date and versions the recorded numbers come from. Numbers quoted in
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


def needs_gpu(gpu: str = DEFAULT_GPU) -> None:
    """What a live cell prints where no GPU runs cuTile (its ``else`` branch): that it needs one,
    and where the page's numbers come from instead."""
    line = (f"This cell needs a GPU that runs cuTile, and none was found here, so it measured "
            f"nothing. The page's numbers are the recorded ones (results/{gpu}/).")
    print(line)


@functools.lru_cache(maxsize=None)
def results(gpu: str = DEFAULT_GPU):
    """The recorded dataset (``flashbook.data.results.load``), loaded once per notebook."""
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


def note_text(gpu: str = DEFAULT_GPU) -> str:
    """The page's provenance in one line of plain text (what ``mode_note`` shows)."""
    r = results(gpu)
    rec = f"{source_line(gpu)} (results/{gpu}/)"
    if mode() == "live":
        import torch
        return (f"Live: measured on this machine's {torch.cuda.get_device_name()}; "
                f"numbers in the prose and figures marked recorded: {rec}.")
    return f"Numbers recorded on {rec}; this page runs on a CPU from that data."


def mode_note(gpu: str = DEFAULT_GPU):
    """The page's provenance note: an HTML line (class ``provenance-note``) whose plain-text form
    is ``note_text``; ``setup`` displays it once at the top of every chapter."""
    import html
    from IPython.display import HTML

    class _Note(HTML):
        def __repr__(self):                  # text/plain: the note itself, not an object repr
            return note_text(gpu)

    text = html.escape(note_text(gpu))
    return _Note(f'<p class="provenance-note">{text}</p>')


def setup(gpu: str = DEFAULT_GPU):
    """Call first in every chapter: plot style, and the one-line note saying where numbers
    come from (``mode_note``; ``banner_text`` is the longer form, kept for other callers)."""
    import matplotlib.pyplot as plt
    # No backend switch here: in a Jupyter kernel the inline backend shows the figures.
    plt.rcParams.update({"figure.dpi": 90, "savefig.dpi": 90, "figure.figsize": (7.5, 4.2),
                         "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3})
    _figures_as_png()
    from IPython.display import display
    display(mode_note(gpu))
    return results(gpu)


def _figures_as_png() -> None:
    """Make a figure shown in a cell an image in any IPython shell. Under ``MPLBACKEND=Agg`` a
    Jupyter kernel has no PNG printer for figures and stores ``<Figure size ...>`` text only
    (nbval compares text, so nothing notices); the inline backend's own printer is kept."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is None:
        return
    from matplotlib.figure import Figure
    png = ip.display_formatter.formatters["image/png"]
    if Figure not in png.type_printers:
        from IPython.core.pylabtools import select_figure_formats
        select_figure_formats(ip, {"png"}, bbox_inches="tight")   # as inline


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
    """Show code or a diff with colours (wraps ``flashbook.source.show``)."""
    from ..source import show as _show
    return _show(code, language)
