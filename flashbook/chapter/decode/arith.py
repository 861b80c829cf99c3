"""The launch arithmetic of a decode step, from ``flashattn.kernels``' rules (no GPU):
intensity, bytes, the split plan, which path ``attention`` takes."""
from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from ...hardware import HBM_TBS, PEAK_TFLOPS, SM_COUNT
from ..plots import fmt_n
from .data import DecodeData


def intensity(G: int = 4, Nq: int = 1, D: int = 128, Nk: int = 32768, elem_bytes: int = 2,
              with_q: bool = False) -> float:
    """FLOP per byte of one decode step of a GQA group with packing (K/V read once per group).

    FLOPs: ``4 * G * Nq * Nk * D`` (two matmuls of ``2 * rows * Nk * D``); bytes: K and V,
    ``2 * Nk * D * elem_bytes`` (with ``with_q`` also Q read and O written). Without q/o it is
    ``G * Nq`` for fp16: independent of D and Nk.
    """
    flops = 4.0 * G * Nq * Nk * D
    nbytes = 2.0 * Nk * D * elem_bytes + (2.0 * G * Nq * D * elem_bytes if with_q else 0.0)
    return flops / nbytes


def ridge(peak_tflops: float = PEAK_TFLOPS, peak_tbps: float = HBM_TBS) -> float:
    """The roofline's ridge point: FLOP per byte above which the tensor cores, not HBM, limit."""
    return peak_tflops / peak_tbps


def gqa_bytes(B: int, Hq: int, Hkv: int, Nk: int, D: int, elem_bytes: int = 2) -> dict:
    """Bytes of K/V one decode step moves to the SMs: packed (once per K/V head) and unpacked
    (once per query head, as a kernel with one program per query head reads them)."""
    from ...data.schema import kv_bytes
    packed = kv_bytes(B, Hkv, Nk, D, elem_bytes)
    return {"packed": packed, "per query head": packed * (Hq // Hkv), "ratio": Hq // Hkv}


def split_plan(B: int, Nk: int, Nq: int, *, Hq: int = 32, Hkv: int = 8, D: int = 128,
               sm_count: int = SM_COUNT, page_size: int | None = None, arch: str = "sm_90") -> dict:
    """The split kernel's launch for one shape, by ``flashattn.kernels``' rules (no GPU)."""
    from flashattn.kernels import decode_num_splits, decode_row_blocks, decode_tiles
    from flashattn.kernels import DECODE_WAVES
    rows = (Hq // Hkv) * Nq
    tile_m, tile_n = decode_tiles(rows=rows, head_dim=D, page_size=page_size, arch=arch)
    blocks = decode_row_blocks(rows, tile_m)
    base = B * Hkv * blocks
    splits = decode_num_splits(B=B, Hkv=Hkv, rows=rows, max_seqlen=Nk, head_dim=D,
                               sm_count=sm_count, page_size=page_size, arch=arch)
    n_tiles = -(-Nk // tile_n)
    return dict(B=B, Nk=Nk, Nq=Nq, rows=rows, TILE_M=tile_m, TILE_N=tile_n,
                base=base, wanted=max(1, DECODE_WAVES * sm_count // base), tiles=n_tiles,
                splits=splits, tiles_per_split=-(-n_tiles // splits), programs=base * splits,
                waves=base * splits / sm_count)


def split_table(d: DecodeData | None = None, *, Nq: int = 1, arch: str = "sm_90") -> pd.DataFrame:
    """What ``decode_num_splits`` picks at the measured shapes (B x Nk, one Nq), with the grid
    it gives; ``waves`` = programs / SMs (one program per SM fits: see the profile)."""
    sm = d.sm_count if d is not None else SM_COUNT
    if d is not None:
        shapes = sorted({(int(b), int(n)) for b, n in zip(d.ok["B"], d.ok["Nk"])})
    else:
        shapes = [(b, n) for b in (1, 8, 64) for n in (1024, 4096, 16384, 32768, 131072)]
    rows = []
    for B, Nk in shapes:
        p = split_plan(B, Nk, Nq, sm_count=sm, arch=arch)
        p16 = split_plan(B, Nk, Nq, sm_count=sm, arch=arch, page_size=16)
        rows.append({"B": B, "Nk": _fmt_n(Nk), "programs without splits": p["base"],
                     "wanted": p["wanted"], "key tiles": p["tiles"], "splits": p["splits"],
                     "tiles / split": p["tiles_per_split"], "programs": p["programs"],
                     "waves": round(p["waves"], 2), "splits (pages of 16)": p16["splits"]})
    return pd.DataFrame(rows).set_index(["B", "Nk"])


def _fmt_n(n) -> str:
    """``plots.fmt_n`` of a length read from a frame (numpy or float)."""
    return fmt_n(int(n))


class _Shape:
    """Shape, dtype and device of a CUDA tensor, without a GPU: what ``prefer_decode`` reads."""

    def __init__(self, *shape, dtype="torch.float16"):
        self.shape, self.dtype = tuple(shape), dtype
        self.device = SimpleNamespace(type="cuda", index=0)


def path_table(Nqs=(1, 2, 4, 8, 16), Nks=(512, 1024, 2048, 4096, 32768), *, B: int = 8,
               Hq: int = 32, Hkv: int = 8, D: int = 128) -> pd.DataFrame:
    """Which kernel ``flashattn.attention(q, k, v, causal=True, input_pos=Nk - Nq)`` runs for
    each (Nq, Nk) on a GPU: ``prefer_decode`` evaluated on the shapes alone (no GPU needed)."""
    from flashattn.api import prefer_decode
    out = {}
    for nk in Nks:
        out[_fmt_n(nk)] = ["decode" if prefer_decode(_Shape(B, Hq, nq, D), _Shape(B, Hkv, nk, D),
                                                     True, nk - nq) else "square"
                           for nq in Nqs]
    return pd.DataFrame(out, index=[f"Nq={n}" for n in Nqs])
