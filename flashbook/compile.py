"""``python -m flashbook compile``: the library's ahead-of-time compiler (``flashattn.aot``) with
the book's ladder kernel registered, so every step of the book compiles, not only the kernels the
library ships (chapter 3: the compiler's report)."""
from __future__ import annotations

from flashattn import aot

from . import ladder  # noqa: F401  (registers the ladder kernel with flashattn.kernels)


def main(argv: list[str] | None = None) -> int:
    from .steps import STEPS
    return aot.main(argv, prog="python -m flashbook compile", default_steps=list(STEPS))
