"""What the chapter notebooks share: setup, the provenance note, glue, code display, figures
and the small helpers more than one chapter uses.

    from flashbook import chapter
    r = chapter.setup()                 # plot style + the one-line "where the numbers come from" note
    chapter.glue("name", value, ".1f")  # a number for the prose
    chapter.show(code, "diff")          # coloured code
    chapter.below(err, "1e-15")         # helpers.py: below, tile_kinds, time_steps, table, verdict
    chapter.table(df, units={"time": "ms"})   # a DataFrame for people: ints, no NaN, yes/no

Figures and tables are in ``flashbook.chapter.plots``.
"""
from .helpers import below, fmt_value, table, tile_kinds, time_steps, verdict
from .page import (DEFAULT_GPU, banner_text, glue, gpu_available, mode, mode_note, needs_gpu,
                   note_text,
                   results, setup, show, source_line)

__all__ = ["setup", "glue", "show", "mode", "results", "source_line", "banner_text",
           "mode_note", "note_text",
           "gpu_available", "needs_gpu", "DEFAULT_GPU", "below", "tile_kinds", "time_steps", "table",
           "fmt_value", "verdict"]
