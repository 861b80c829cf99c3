"""Small helpers that more than one chapter calls, so each lives once and is tested.

    from flashbook import chapter
    chapter.below(err, "1e-15")                      # chapters 2, 3: an error shown as a bound
    chapter.tile_kinds("loop_split", 16384, cfg)     # chapters 4, 7: the tile grid of a launch
    chapter.time_steps(["fast_math", "loop_split"], cfg, N=8192)   # chapters 5, 7, 8 (GPU)
    chapter.table(df, units={"time": "ms"})          # a table for people: ints, no NaN, yes/no

Everything here but ``time_steps`` runs on a CPU.
"""
from __future__ import annotations

import numpy as np

# Tile kinds, as ``plots.causal_tiles`` draws them.
SKIPPED, FULL, MASKED = 0, 1, 2


def below(err: float, tol: str) -> str:
    """``tol`` if ``err < float(tol)``, else AssertionError: a small error shown as a bound.

    The last bits of a tiny floating-point error depend on the machine's ``exp`` or BLAS; the
    bound does not, so a notebook that prints ``below(err, "1e-15")`` reads the same on every
    machine. ``tol`` is the text to print ("1e-15").
    """
    if not float(err) < float(tol):         # NaN fails too
        raise AssertionError(f"error {err!r} is not below {tol}")
    return tol


def tile_kinds(step, N: int, config, input_pos: int = 0) -> np.ndarray:
    """The tiles a causal launch of ``step`` visits, as a grid for ``plots.causal_tiles``.

    ``N`` queries at positions ``input_pos .. input_pos + N - 1`` against ``N + input_pos`` keys
    (``input_pos`` keys already in a cache), tiled by ``config`` (its ``TILE_M`` x ``TILE_N``).
    Returns an int array [query tiles, key tiles]: 0 skipped (never loaded), 1 full (computed
    without a mask), 2 masked (the diagonal, or a ragged end), read from
    ``flashbook.ladder.emulate.schedule`` — the same loop bounds as the kernel.
    """
    from flashbook.ladder.emulate import schedule
    Nk = N + input_pos
    kinds = np.full((-(-N // config.TILE_M), -(-Nk // config.TILE_N)), SKIPPED, dtype=int)
    for prog in schedule(step, N, Nk, causal=True, config=config, input_pos=input_pos):
        for qt, keys in zip(prog.query_tiles, prog.key_tiles):
            for j, kind in keys:
                kinds[qt, j] = FULL if kind == "full" else MASKED
    return kinds


def time_steps(names, config, N: int, B: int = 4, H: int = 32, D: int = 128, reps: int = 10,
               *, causal: bool = True, device: str = "cuda"):
    """Time steps at one pinned ``config`` on this GPU; a DataFrame with one row per step.

    Every step runs on the same fresh fp16 inputs (B, H, N, D, seed 0), through
    ``flashattn.launch.launch`` with ``config`` as given (no autotuning), timed by
    ``measure.timing.time_cuda`` (3 warm-up calls, then ``reps``). Columns: step, config
    (``config.label()``), N, median_ms, tflops (``timing.attention_flops``: causal counts
    half), rounded to 3 decimals. Sequential timing: compare steps of one call only.
    """
    import pandas as pd
    import torch

    from flashattn.launch import launch
    from flashattn import timing
    from flashbook.steps import get_step
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, device=device, dtype=torch.float16) for _ in range(3))
    out = torch.empty_like(q)
    flops = timing.attention_flops(B, H, N, N, D, causal)
    rows = []
    for name in names:
        step = get_step(name)

        def fn(step=step):
            return launch(q, k, v, out, step, config, causal=causal, scale=D ** -0.5)
        t = timing.time_cuda(fn, warmup=3, reps=reps)
        rows.append(dict(step=name, config=config.label(), N=N, median_ms=t.median_ms,
                         tflops=timing.tflops(flops, t.median_ms)))
    return pd.DataFrame(rows).round(3)


def verdict(ok: bool, yes: str = "yes", no: str = "no") -> str:
    """A check printed as a word: ``verdict(err < 1e-5)`` -> "yes" (never Python's True)."""
    return yes if bool(ok) else no


def fmt_value(v, decimals: int = 2, na: str = "–", *, integer: bool | None = None) -> str:
    """One table cell for people: a count as an integer with thousands separators ("501,775,908",
    "128", never "128.00"), a fraction with ``decimals`` places, NaN or None as ``na``, a bool
    as yes/no; anything else as ``str``. ``integer``: True/False forces either form for a real
    number (a column's choice, see ``table``); None decides by the value."""
    import numbers
    if v is None:
        return na
    if isinstance(v, (bool, np.bool_)):
        return verdict(v)
    if isinstance(v, numbers.Integral):
        return f"{int(v):,}"
    if isinstance(v, numbers.Real):
        f = float(v)
        if f != f:
            return na
        if not np.isfinite(f):
            return "∞" if f > 0 else "−∞"
        as_int = (f.is_integer() and abs(f) < 1e15) if integer is None else integer
        return f"{round(f):,}" if as_int else f"{f:,.{decimals}f}"
    return str(v)


def _all_integral(values) -> bool:
    import numbers
    reals = [float(v) for v in values if isinstance(v, numbers.Real)
             and not isinstance(v, (bool, np.bool_)) and float(v) == float(v)]
    return bool(reals) and all(np.isfinite(f) and f.is_integer() for f in reals)


def table(df, decimals=2, *, units=None, na: str = "–", by: str = "column",
          caption: str | None = None, uid: str | None = None):
    """A DataFrame as a table for people (issue 22, item 4): integers as integers, fractions
    with ``decimals`` places, NaN as ``na``, yes/no for booleans (``fmt_value``), ``units``
    appended to column names ({"time": "ms"} -> "time (ms)"), an optional caption.

    ``by``: "column" when each column is one quantity (a column whose values are all whole
    numbers prints as integers, any other with ``decimals`` places); "row" when each row is
    one (a profile's metrics beside each other: counts, then percentages); in a percentage
    column or row (its label has "%") a whole value prints as an integer ("25" beside "18.75",
    never "25.00"); "cell" when each
    value decides alone (a whole number as an integer: a metrics table with a ratio column,
    where a count and its ratio share a row). ``decimals`` is one
    number or a dict {column or row label: places} (the others get 2). Returns a pandas Styler
    with a fixed table id (``uid``, else one derived from the labels), so the committed HTML
    that nbval compares is the same at every execution; ``df`` is not changed. Works on any
    frame, the chapters' own and those that ``method``, ``gap``, ``summary``, ``decode``
    return: ``chapter.table(frame)`` as a cell's last line.
    """
    import hashlib

    import pandas as pd
    if by not in ("column", "row", "cell"):
        raise ValueError(f"by is 'column', 'row' or 'cell', not {by!r}")
    out = df.copy()
    if units:
        unknown = set(units) - set(out.columns)
        if unknown:
            raise KeyError(f"units name no column: {sorted(map(str, unknown))}")
        out = out.rename(columns={c: f"{c} ({u})" for c, u in units.items()})
        if isinstance(decimals, dict):
            decimals = {(f"{c} ({units[c]})" if c in units else c): d for c, d in decimals.items()}
    places = decimals if isinstance(decimals, dict) else {}
    default = 2 if isinstance(decimals, dict) else int(decimals)
    sty = out.style
    labels = out.columns if by in ("column", "cell") else out.index
    for label in labels:
        values = out[label] if by in ("column", "cell") else out.loc[label]
        integer = None if by == "cell" else _all_integral(values.tolist())
        if integer is False and "%" in str(label):
            integer = None           # a whole percentage prints as one: "25", not "25.00"
        d = places.get(label, default)
        subset = [label] if by in ("column", "cell") else pd.IndexSlice[[label], :]
        sty = sty.format(lambda v, d=d, i=integer: fmt_value(v, d, na, integer=i),
                         subset=subset)
    if uid is None:
        key = "|".join(map(str, out.columns)) + "|" + "|".join(map(str, out.index)) + f"|{out.shape}"
        uid = "t-" + hashlib.sha1(key.encode()).hexdigest()[:10]
    sty = sty.set_uuid(uid)
    if caption:
        sty = sty.set_caption(caption)
    return sty


__all__ = ["below", "tile_kinds", "time_steps", "table", "fmt_value", "verdict",
           "SKIPPED", "FULL", "MASKED"]


def tile_registers(tm: int, tn: int, consumers: int = 128, tile_d: int = 128):
    """32-bit registers per consumer thread for S (fp32), P (fp16) and acc (fp32) of a
    ``tm x tn`` tile with head dimension ``tile_d``, if they sat in the registers of
    ``consumers`` threads (Hopper: one warp group, 128 threads). Chapter 5's estimate.

    Returns (s, p, acc), floats.
    """
    if tm < 1 or tn < 1 or consumers < 1 or tile_d < 1:
        raise ValueError(f"tile sizes and consumers must be >= 1, got {tm}, {tn}, "
                         f"{consumers}, {tile_d}")
    s = tm * tn * 4 / 4 / consumers            # S, fp32
    p = tm * tn * 2 / 4 / consumers            # P, fp16 (two per register)
    acc = tm * tile_d * 4 / 4 / consumers      # O accumulator, fp32
    return s, p, acc
