"""What the chapter notebooks share: setup, the provenance banner, glue, code display, figures
and the small helpers more than one chapter uses.

    from flashattn import chapter
    r = chapter.setup()                 # plot style + "where the numbers come from" banner
    chapter.glue("name", value, ".1f")  # a number for the prose
    chapter.show(code, "diff")          # coloured code
    chapter.below(err, "1e-15")         # helpers.py: below, tile_kinds, time_steps

Figures and tables are in ``flashattn.chapter.plots``.
"""
from .helpers import below, tile_kinds, time_steps
from .page import (DEFAULT_GPU, banner_text, glue, gpu_available, mode, results, setup, show,
                   source_line)

__all__ = ["setup", "glue", "show", "mode", "results", "source_line", "banner_text",
           "gpu_available", "DEFAULT_GPU", "below", "tile_kinds", "time_steps"]
