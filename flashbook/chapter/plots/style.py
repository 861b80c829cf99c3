"""What every figure shares: the colours (the registry's), titles, axis labels of lengths,
line styles."""
from __future__ import annotations

from ...impls import IMPLS
from ...impls import color_of as _color_of
from flashbook.steps import STEP_NAMES

# Colours come from the implementation registry (``flashbook.impls``): one per step, per
# experiment and per library, the same in every chapter.
PALETTE = {name: impl.color for name, impl in IMPLS.items()}
KIND_COLORS = {0: "#eeeeee", 1: "#1f77b4", 2: "#ff7f0e"}   # skipped / full / masked tiles
KIND_NAMES = {0: "skipped", 1: "full", 2: "masked"}


def color_of(impl: str) -> str:
    """The colour of an implementation in every figure (``flashbook.impls.color_of``)."""
    return _color_of(impl)


def _plt():
    import matplotlib.pyplot as plt
    return plt


def _title(text: str, meta: dict | None = None) -> str:
    gpu = (meta or {}).get("gpu") or (meta or {}).get("gpu_name")
    return f"{text} — {gpu}" if gpu else text


def _book_rank(name: str) -> int:
    return STEP_NAMES.index(name) if name in STEP_NAMES else len(STEP_NAMES)


def fmt_n(n: int) -> str:
    """1024 -> "1K", 16384 -> "16K", 1000 -> "1000": sequence lengths on axes and in tables."""
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _pick_workload(df, workload):
    """Rows of one workload: the given one, else the most common one."""
    if "workload" not in df.columns or df.empty:
        return df, workload
    if workload is None:
        workload = df["workload"].value_counts().index[0]
    return df[df["workload"] == workload], workload


def _linestyle(impl: str) -> str:
    """A library's line style from the registry (each library its own), dashed if unknown."""
    from ...impls import get
    try:
        return get(impl).linestyle
    except KeyError:
        return "--"


def _is_library(df_rows) -> bool:
    return "kind" in df_rows.columns and (df_rows["kind"] == "library").all()
