"""A kernel configuration: a tile shape and the launch hints, and the GPU
architectures the library compiles for. A leaf: it imports nothing from the package.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Config", "ARCHS"]

# Architectures we compile for. sm_80: Ampere, sm_90: Hopper (H100/H200),
# sm_100: datacenter Blackwell (B200), sm_120: consumer Blackwell (RTX 50).
ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120")


@dataclass(frozen=True)
class Config:
    """A tile shape and launch hints. ``None`` hints leave the choice to the compiler."""
    TILE_M: int
    TILE_N: int
    occupancy: int | None = None
    num_ctas: int | None = None
    num_worker_warps: int | None = None   # warps per CUDA-core warp group (warp-specialised)

    HINTS = ("occupancy", "num_ctas", "num_worker_warps")
    _SHORT = {"occupancy": "occ", "num_ctas": "ctas", "num_worker_warps": "nww"}

    def hints(self) -> dict:
        """The kernel hints for ``kernel.replace_hints(**hints)``; unset hints are left out."""
        return {k: getattr(self, k) for k in self.HINTS if getattr(self, k) is not None}

    def label(self) -> str:
        """"64x128 occ=2", "128x128 occ=1 nww=8": the inverse of ``Config.parse``."""
        return " ".join([f"{self.TILE_M}x{self.TILE_N}"] +
                        [f"{self._SHORT[k]}={v}" for k, v in self.hints().items()])

    def as_tuple(self) -> tuple:
        return (self.TILE_M, self.TILE_N, *(getattr(self, k) for k in self.HINTS))

    @classmethod
    def parse(cls, text: str) -> "Config":
        """"128x128", "128x128 occ=1 nww=8" or "128x128,occ=1,nww=8" -> Config."""
        parts = text.replace(",", " ").replace(":", " ").split()
        try:
            tm, tn = (int(x) for x in parts[0].lower().split("x"))
        except (IndexError, ValueError):
            raise ValueError(f"a configuration is TILE_MxTILE_N [occ=N] [ctas=N] [nww=N], "
                             f"got {text!r}") from None
        long = {v: k for k, v in cls._SHORT.items()}
        hints = {}
        for p in parts[1:]:
            k, _, v = p.partition("=")
            if long.get(k, k) not in cls.HINTS or not v.isdigit():
                raise ValueError(f"unknown hint {p!r} in {text!r}; hints: occ=N, ctas=N, nww=N")
            hints[long.get(k, k)] = int(v)
        for name, v in (("TILE_M", tm), ("TILE_N", tn)):
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name} must be a power of two >= 16, got {v}")
        return cls(tm, tn, **hints)
