"""The decode benchmark's sweep as data, no GPU: its shapes and implementations per part, the
varlen mixes, the HBM peaks and the time estimate (``decode-bench --plan``). ``bench_decode``
measures these plans and re-exports every name here."""
from __future__ import annotations

import itertools

from ..data.schema import SKIPPED
from ..hardware import HBM_TBS
from .harness import IDLE_MS, SAMPLE_MS
from .harness import LIBRARIES as HARNESS_LIBRARIES

# HBM peak bandwidth per GPU (TB/s = 1e12 bytes/s), with where the number comes from: the
# vendor's datasheet, not a measurement. frac_peak divides by it; other GPUs get no fraction.
HBM_PEAK_TBPS = {
    "h200": (HBM_TBS, "NVIDIA H200 Tensor Core GPU datasheet: 141 GB HBM3e at 4.8 TB/s"),
    "h100": (3.35, "NVIDIA H100 Tensor Core GPU datasheet, SXM5: 80 GB HBM3 at 3.35 TB/s"),
    "b200": (8.0, "NVIDIA Blackwell (HGX B200) datasheet: 8 TB/s HBM3e per GPU"),
}
H200_HBM_PEAK_TBPS = HBM_PEAK_TBPS["h200"][0]

DEFAULT_PARTS = ("decode", "host")
DEFAULT_BATCHES = (1, 8, 64)
DEFAULT_CACHE_LENS = (1024, 4096, 16384, 32768, 131072)
DEFAULT_NQ = (1, 4)
DEFAULT_GQA = (32, 8)
DEFAULT_HEAD_DIM = 128
DEFAULT_PAGE_SIZES = (16, 64)
# B x Nk of one cache copy: at B=64, Nk=128K a copy of K and V is 34 GB (and the paged caches
# are two more): the sweep stops B=64 at 32K.
MAX_CACHE_TOKENS = 64 * 32768
# The libraries of the decode part (backends from ``harness.LIBRARIES``), in this order.
LIBRARIES = {n: HARNESS_LIBRARIES[n]
             for n in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "flex")}
DECODE_IMPLS = ("decode", "decode_paged16", "decode_paged64", "square_best", *LIBRARIES)
# Measured only when named (--impls ...,tilegym): TileGym's fmha_decode (installed apart).
OPT_IN_DECODE = ("tilegym",)
SKIP_TILEGYM_NQ = f"{SKIPPED}: TileGym's fmha_decode takes one new token per sequence (Nq = 1)"
FLEX_SHAPES = ((8, 4096, 1), (8, 32768, 1))          # (B, Nk, Nq) where --flex default runs it
FLEX_CHOICES = ("default", "all", "none")
HOST_SHAPE = dict(B=8, Nk=32768, Nq=1)
HOST_IMPLS = ("decode", "decode_paged64", "square_best", "sdpa_flash")
CROSSOVER_NQ = (1, 4, 16)
CROSSOVER_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
CROSSOVER_BATCH = 8
CROSSOVER_IMPLS = ("decode", "square_best")
VARLEN_TOTAL = 32768
VARLEN_MIXES = ("equal_8x4096", "equal_32x1024", "uniform_1_4096", "skewed")
VARLEN_IMPLS = ("varlen", "square_padded")

ROUNDS = 15               # half the forward's: the sweep has many more shapes
SETUP_S = 0.5             # per implementation and shape: check, capture, host time (estimate)
FLEX_COMPILE_S = 30.0     # torch.compile of flex_attention for a new shape (estimate)
CUTILE_COMPILE_S = 5.0    # tileiras, one new kernel variant (estimate)
AUTOTUNE_S = 1.5          # the square kernel's search on a new shape: 4 configs x 8 rounds


__all__ = ["HBM_PEAK_TBPS", "H200_HBM_PEAK_TBPS", "DEFAULT_PARTS", "DEFAULT_BATCHES",
           "DEFAULT_CACHE_LENS", "DEFAULT_NQ", "DEFAULT_GQA", "DEFAULT_HEAD_DIM",
           "DEFAULT_PAGE_SIZES", "MAX_CACHE_TOKENS", "LIBRARIES", "DECODE_IMPLS", "FLEX_SHAPES",
           "FLEX_CHOICES", "OPT_IN_DECODE", "SKIP_TILEGYM_NQ", "HOST_SHAPE", "HOST_IMPLS",
           "CROSSOVER_NQ", "CROSSOVER_LENS",
           "CROSSOVER_BATCH", "CROSSOVER_IMPLS", "VARLEN_TOTAL", "VARLEN_MIXES", "VARLEN_IMPLS",
           "ROUNDS", "SETUP_S", "FLEX_COMPILE_S", "CUTILE_COMPILE_S", "AUTOTUNE_S",
           "default_impls", "check_decode_impl", "plan_decode", "plan_crossover", "plan_host",
           "varlen_mix", "plan_varlen", "estimate_seconds", "hbm_peak"]


# ---------------------------------------------------------------------------------------------
# The sweep, as data (no GPU)
# ---------------------------------------------------------------------------------------------
def _impl_page(name: str) -> int | None:
    return int(name[len("decode_paged"):]) if name.startswith("decode_paged") else None


def default_impls(page_sizes=DEFAULT_PAGE_SIZES) -> list[str]:
    """The decode part's implementations: decode, a paged decode per page size, the square
    kernel, the libraries."""
    return ["decode", *(f"decode_paged{p}" for p in page_sizes), "square_best", *LIBRARIES]


def check_decode_impl(name: str) -> None:
    """ValueError unless ``name`` is a decode-part implementation: decode, decode_pagedP (P a
    positive multiple of 16), square_best, sdpa_flash/efficient/cudnn/math, flex, tilegym."""
    page = None
    if name.startswith("decode_paged"):
        try:
            page = _impl_page(name)
        except ValueError:
            page = -1
        if page is None or page < 16 or page % 16:
            raise ValueError(f"{name!r}: a paged decode is decode_pagedP with P a positive "
                             "multiple of 16 (decode_paged16, decode_paged64)")
        return
    if name not in ("decode", "square_best", *LIBRARIES, *OPT_IN_DECODE):
        raise ValueError(f"unknown decode implementation {name!r}; choose from "
                         f"{', '.join((*DECODE_IMPLS, *OPT_IN_DECODE))} (or decode_pagedP)")


def plan_decode(batches=DEFAULT_BATCHES, cache_lens=DEFAULT_CACHE_LENS, nqs=DEFAULT_NQ,
                impls=DECODE_IMPLS, *, flex: str = "default",
                max_cache_tokens: int = MAX_CACHE_TOKENS) -> list[dict]:
    """The decode part's shapes, each {"B", "Nk", "Nq", "impls", "skip"}: ``skip`` maps an
    implementation to why it is not measured at that shape (a skip row is written for it).

    A shape with ``B x Nk > max_cache_tokens`` is left out entirely (memory and time); a paged
    implementation whose page size does not divide Nk is skipped; FlexAttention runs on
    ``FLEX_SHAPES`` (``flex="default"``), everywhere (``"all"``) or nowhere (``"none"``).
    """
    if flex not in FLEX_CHOICES:
        raise ValueError(f"flex must be one of {', '.join(FLEX_CHOICES)}, got {flex!r}")
    for name in impls:
        check_decode_impl(name)
    out = []
    for B, Nk, Nq in itertools.product(batches, cache_lens, nqs):
        if B < 1 or Nk < 1 or not 1 <= Nq <= 16:
            raise ValueError(f"a decode shape needs B >= 1, Nk >= 1 and 1 <= Nq <= 16, got "
                             f"B={B} Nk={Nk} Nq={Nq}")
        if B * Nk > max_cache_tokens:
            continue
        skip = {}
        for name in impls:
            page = _impl_page(name)
            if page is not None and Nk % page:
                skip[name] = f"{SKIPPED}: page size {page} does not divide Nk = {Nk}"
            if name == "flex" and (flex == "none" or
                                   (flex == "default" and (B, Nk, Nq) not in FLEX_SHAPES)):
                skip[name] = f"{SKIPPED}: flex runs on {FLEX_SHAPES} (B, Nk, Nq) only (--flex)"
            if name == "tilegym" and Nq != 1:
                skip[name] = SKIP_TILEGYM_NQ
        out.append(dict(B=B, Nk=Nk, Nq=Nq, impls=list(impls), skip=skip))
    return out


def plan_crossover(batch: int = CROSSOVER_BATCH, nqs=CROSSOVER_NQ,
                   cache_lens=CROSSOVER_LENS) -> list[dict]:
    """The crossover part's shapes: decode against the square kernel, short caches."""
    return [dict(B=batch, Nk=nk, Nq=nq, impls=list(CROSSOVER_IMPLS), skip={})
            for nq in nqs for nk in cache_lens if nk >= nq]


def plan_host(shape=None) -> list[dict]:
    s = dict(HOST_SHAPE, **(shape or {}))
    return [dict(s, impls=list(HOST_IMPLS), skip={})]


def varlen_mix(name: str, total: int = VARLEN_TOTAL, seed: int = 0) -> list[int]:
    """Sequence lengths of a varlen mix, summing to ``total``.

    equal_BxN: B sequences of N (B x N must be ``total``); uniform_A_B: lengths uniform in
    [A, B] (seeded), the last one cut to the total; skewed: one sequence of total/4 and the rest
    in sequences of total/32.
    """
    import random
    if name.startswith("equal_"):
        b, n = (int(x) for x in name[len("equal_"):].split("x"))
        if b * n != total:
            raise ValueError(f"{name}: {b} x {n} != total {total}")
        return [n] * b
    if name.startswith("uniform_"):
        lo, hi = (int(x) for x in name[len("uniform_"):].split("_"))
        rng = random.Random(seed)
        lens = []
        while sum(lens) < total:
            lens.append(min(rng.randint(lo, hi), total - sum(lens)))
        return lens
    if name == "skewed":
        return [total // 4] + [total // 32] * 24
    raise ValueError(f"unknown varlen mix {name!r}; one of {', '.join(VARLEN_MIXES)}, "
                     "equal_BxN or uniform_A_B")


def plan_varlen(mixes=VARLEN_MIXES, total: int = VARLEN_TOTAL) -> list[dict]:
    out = []
    for m in mixes:
        lens = varlen_mix(m, total)
        out.append(dict(mix=m, lens=lens, B=len(lens), Nq=max(lens), Nk=max(lens),
                        impls=list(VARLEN_IMPLS), skip={}))
    return out


def estimate_seconds(plans: dict, *, rounds: int = ROUNDS) -> float:
    """Seconds a run of these plans ({part: plan}) should take on an H200, from the method's
    constants: each measured implementation and shape ``rounds x (IDLE_MS + SAMPLE_MS)`` plus
    ``SETUP_S``; FlexAttention ``FLEX_COMPILE_S`` per shape; the square kernel's autotune
    search ``AUTOTUNE_S`` per shape; ``CUTILE_COMPILE_S`` per distinct
    cuTile variant (decode: split + combine per (rows, page size); varlen: one per mix's
    kernel; the square kernel: one per Nq). An estimate, not a measurement."""
    per = rounds * (IDLE_MS + SAMPLE_MS) / 1e3 + SETUP_S
    total, variants = 0.0, set()
    for part, plan in plans.items():
        for s in plan:
            for name in s["impls"]:
                if name in s["skip"]:
                    continue
                total += per
                if name == "flex":
                    total += FLEX_COMPILE_S
                if name.startswith("decode"):
                    variants.add(("decode", s["Nq"], _impl_page(name)))
                elif name in ("square_best", "square_padded"):
                    variants.add(("square", part, s["Nq"] if part != "varlen" else 0))
                    total += AUTOTUNE_S
                elif name == "varlen":
                    variants.add(("varlen",))
        if part == "host":
            total += 4 * 0.5                     # host and wall times of the graph variants
    return total + CUTILE_COMPILE_S * 2 * len(variants)


def hbm_peak(gpu_name: str | None) -> tuple[float | None, str | None]:
    """(TB/s, source) of the GPU's HBM peak from ``HBM_PEAK_TBPS``, (None, None) if unknown."""
    from flashattn.env import gpu_slug
    return HBM_PEAK_TBPS.get(gpu_slug(gpu_name), (None, None))
