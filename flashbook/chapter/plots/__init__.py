"""The book's figures and tables, from plain DataFrames (matplotlib only).

Every function takes the DataFrames of ``flashbook.data.results.load(gpu)`` (``.bench``,
``.profile``, ``.compile``) or arrays, and returns a matplotlib Figure (tables: a DataFrame or
pandas Styler). Pass ``meta`` (the results' metadata dict: ``gpu``, ...) to put the GPU in titles.

Colours are fixed per implementation (``PALETTE``) so a step has the same colour in every chapter.

A module per kind of figure: ``style`` (colours, titles, length labels), ``bench``
(TFLOPS, waterfall, roofline), ``profiles`` (Nsight Compute tables, the card, bars),
``schedules`` (causal tiles, work per program), ``kernels`` (compile reports, the
online-softmax state, the tile explorer). Everything is importable from here.
"""
from __future__ import annotations

from .bench import min_bytes, roofline, tflops_vs_seqlen, waterfall
from .kernels import (COMPILE_FIELDS, compile_table, online_softmax_state, online_softmax_states,
                      tile_explorer)
from .profiles import (CARD_SECTIONS, PROFILE_FIELDS, fmt_bytes, ncu_card, per_step, profile_bars,
                       profile_table)
from .schedules import causal_tiles, work_per_program
from .style import KIND_COLORS, KIND_NAMES, PALETTE, color_of, fmt_n
# The helpers other chapter modules and tests reach as plots._name.
from .profiles import _card_fmt, _wide  # noqa: F401,E402
from .style import _linestyle, _plt, _title  # noqa: F401,E402

__all__ = ["PALETTE", "KIND_COLORS", "KIND_NAMES", "PROFILE_FIELDS", "CARD_SECTIONS",
           "COMPILE_FIELDS", "color_of", "fmt_n", "fmt_bytes", "tflops_vs_seqlen", "waterfall",
           "min_bytes", "roofline", "per_step", "profile_table", "ncu_card", "profile_bars",
           "causal_tiles", "work_per_program", "compile_table", "online_softmax_state",
           "online_softmax_states", "tile_explorer"]
