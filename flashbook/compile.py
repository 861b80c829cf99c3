"""``python -m flashbook compile``: the library's ahead-of-time compiler (``flashattn.aot``) with
the book's steps registered (those off the shipped flags carry the ladder kernel), so every step of
the book compiles, not only the kernels the library ships (chapter 3: the compiler's report)."""
from __future__ import annotations

from flashattn import aot


def main(argv: list[str] | None = None) -> int:
    from .steps import STEPS
    return aot.main(argv, prog="python -m flashbook compile", default_steps=list(STEPS))
