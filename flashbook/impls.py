"""Every implementation the book measures, in one registry: the steps, the experiments,
``best``, and the library baselines.

    IMPLS["sdpa_cudnn"]     Impl(name, kind, order, label, color, linestyle, option, backend)
    ORDER                   names in book order (rows of every table and legend)
    color_of(name)          the plot colour (steps in one family, each library its own)
    PATHS["decode"]         the backward and decode benchmarks' own rows (our kernels under
                            the names those documents give them), each its label and colour
    label_of(name, chapter) a legend label: the chapter's short one where it has one

The benchmarks (``measure.bench``) call a library through its ``backend`` (a
``torch.nn.attention.SDPBackend`` member, ``"flex"`` for FlexAttention, ``"tilegym"`` for
TileGym's cuTile kernels, timed only when named: ``OPT_IN_LIBRARIES``) and a step through
``flashattn.launch``; the profiler, the plots, the results reader and ``experiments/`` read
names, order and colours from here.
"""
from __future__ import annotations

from dataclasses import dataclass

from flashbook.steps import EXPERIMENTS, STEP_NAMES, STEPS


@dataclass(frozen=True)
class Impl:
    name: str               # the row name in results ("baseline", "sdpa_cudnn")
    kind: str               # "step" | "experiment" | "best" | "library"
    label: str              # for legends
    color: str
    linestyle: object = "-"     # a matplotlib line style: "-", "--", ":", or (offset, dashes)
    option: str | None = None    # libraries: the name ``bench --baselines`` takes ("cudnn")
    backend: str | None = None   # libraries: SDPBackend member, or "flex"


# One colour per step (a sequential run of hues in book order), per experiment, per library.
_STEP_COLORS = {
    "naive": "#9e9e9e", "baseline": "#1f77b4", "large_tiles": "#d62728",
    "fast_math": "#ff7f0e", "loop_split": "#bcbd22", "remap": "#2ca02c",
    "autotune": "#17becf", "arch_tuned": "#9467bd", "warp_groups": "#6a3d9a",
}
_EXPERIMENT_COLORS = {
    "lazy_rescale": "#8c564b", "pair": "#e377c2", "exp_poly": "#c49c94",
    "persistent": "#bc80bd", "unchecked_kv": "#aec7e8",
}
_LIBRARIES = (
    # name, option, backend, label, colour, line style: each library its own colour and dash,
    # apart from the steps' hues (cuDNN, the reference of every ratio, stays black).
    ("sdpa_flash", "flash", "FLASH_ATTENTION", "FlashAttention-2 (SDPA)", "#b15928", "-."),
    ("sdpa_cudnn", "cudnn", "CUDNN_ATTENTION", "cuDNN (SDPA)", "#000000", "--"),
    ("sdpa_efficient", "efficient", "EFFICIENT_ATTENTION", "mem-efficient (SDPA)", "#c51b7d",
     (0, (5, 2, 1, 2))),
    ("sdpa_math", "math", "MATH", "math (SDPA)", "#7f7f7f", ":"),
    ("flex", "flex", "flex", "FlexAttention", "#1b7837", (0, (1, 1))),
    # NVIDIA's cuTile kernels (flashbook.measure.tilegym): their own autotuning, as shipped.
    ("tilegym", "tilegym", "tilegym", "TileGym (cuTile)", "#35978f", (0, (3, 1, 1, 1, 1, 1))),
)
# Libraries a run times only when named (--baselines ...,tilegym): not part of PyTorch, so
# installed apart (pip install --no-deps tilegym==1.5.1); without it their rows say so.
OPT_IN_LIBRARIES = ("tilegym",)
_EXTRA = ["#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d"]

IMPLS: dict[str, Impl] = {}
for _n in STEP_NAMES:
    IMPLS[_n] = Impl(_n, "step", _n, _STEP_COLORS.get(_n, _EXTRA[len(IMPLS) % len(_EXTRA)]))
for _n in EXPERIMENTS:
    IMPLS[_n] = Impl(_n, "experiment", _n,
                     _EXPERIMENT_COLORS.get(_n, _EXTRA[len(IMPLS) % len(_EXTRA)]))
IMPLS["best"] = Impl("best", "best", "best", _STEP_COLORS["arch_tuned"])
for _n, _opt, _be, _label, _c, _ls in _LIBRARIES:
    IMPLS[_n] = Impl(_n, "library", _label, _c, _ls, _opt, _be)

ORDER: tuple[str, ...] = tuple(IMPLS)
STEP_IMPLS: tuple[str, ...] = (*STEP_NAMES, *EXPERIMENTS)       # runnable by flashattn.launch
LIBRARY_IMPLS: tuple[str, ...] = tuple(n for n, i in IMPLS.items() if i.kind == "library")
LIBRARY_OPTIONS: dict[str, str] = {IMPLS[n].option: n for n in LIBRARY_IMPLS}  # "cudnn" -> impl
RATIO_REF = "sdpa_cudnn"            # every ratio in the book is to cuDNN
# Names other sources use for the same libraries (papers, the seed's tables).
ALIASES = {"cudnn": "sdpa_cudnn", "flash": "sdpa_flash", "fa2": "sdpa_flash",
           "efficient": "sdpa_efficient", "math": "sdpa_math", "torch_naive": "sdpa_math",
           "flexattention": "flex", "flex_attention": "flex", "tile_gym": "tilegym"}

# The rows of the backward (``measure.bench_bwd``) and decode (``measure.bench_decode``)
# documents that are not forward implementations: kept out of ORDER, so the forward tables and
# legends are unchanged, but labelled and coloured here like every other implementation.
_PATHS = (
    # name, kind, label, colour
    ("fmha_bwd", "backward", "flashattn (ours)", _STEP_COLORS["arch_tuned"]),
    ("fmha_bwd_atomic", "backward", "flashattn, dQ by atomics", "#6baed6"),
    ("fmha_fwd", "backward", "flashattn forward (no LSE)", _STEP_COLORS["arch_tuned"]),
    ("fmha_fwd_lse", "backward", "flashattn forward (with LSE)", "#6a3d9a"),
    ("decode", "decode", "decode (ours, contiguous)", "#1f77b4"),
    ("decode_paged16", "decode", "decode (ours, pages of 16)", "#9ecae1"),
    ("decode_paged64", "decode", "decode (ours, pages of 64)", "#6baed6"),
    ("square_best", "decode", "square kernel (attention, best step)", _STEP_COLORS["arch_tuned"]),
    ("varlen", "decode", "varlen (ours, packed)", "#1f77b4"),
    ("square_padded", "decode", "square kernel, padded", _STEP_COLORS["arch_tuned"]),
)
PATHS: dict[str, Impl] = {n: Impl(n, kind, label, c) for n, kind, label, c in _PATHS}
# Chapters that name the libraries more briefly than the forward legends do.
SHORT_LABELS = {
    "decode": {"sdpa_flash": "SDPA flash", "sdpa_cudnn": "SDPA cuDNN",
               "sdpa_efficient": "SDPA efficient", "sdpa_math": "SDPA math",
               "flex": "FlexAttention", "tilegym": "TileGym"},
    "backward": {"sdpa_cudnn": "cuDNN", "sdpa_flash": "FlashAttention-2",
                 "sdpa_efficient": "memory-efficient", "tilegym": "TileGym"},
}

assert set(_STEP_COLORS) <= set(STEPS) and set(_EXPERIMENT_COLORS) <= set(EXPERIMENTS)


def base_name(name: str) -> str:
    """The registered implementation a result row belongs to: "arch_tuned@128x128 occ=1" and
    the control copy "arch_tuned#2" -> "arch_tuned"; aliases -> their library."""
    name = str(name)
    for sep in ("@", "#"):
        name = name.split(sep, 1)[0]
    return ALIASES.get(name, name)


def get(name: str) -> Impl:
    """The Impl of a name, a variant ("step@config") or a control copy ("step#2")."""
    b = base_name(name)
    if b not in IMPLS:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(ORDER)}")
    return IMPLS[b]


def rank(name: str) -> tuple:
    """Sort key in book order; unknown names last, alphabetically."""
    b = base_name(name)
    return (ORDER.index(b) if b in ORDER else len(ORDER), str(name))


def color_of(name: str) -> str:
    """The plot colour of an implementation (any spelling); a stable extra colour otherwise."""
    b = base_name(name)
    if b in IMPLS:
        return IMPLS[b].color
    if b in PATHS:
        return PATHS[b].color
    low = b.lower()
    for key, impl in (("cudnn", "sdpa_cudnn"), ("flex", "flex"), ("flash", "sdpa_flash"),
                      ("efficient", "sdpa_efficient"), ("math", "sdpa_math"),
                      ("tilegym", "tilegym")):
        if key in low:
            return IMPLS[impl].color
    return _EXTRA[sum(map(ord, name)) % len(_EXTRA)]


def label_of(name: str, chapter: str | None = None) -> str:
    """The legend label of an implementation: ``chapter``'s short one (``SHORT_LABELS``) where
    it has one, else the registry's; the name itself when unknown."""
    b = base_name(name)
    short = SHORT_LABELS.get(chapter, {}) if chapter is not None else {}
    if b in short:
        return short[b]
    impl = IMPLS.get(b) or PATHS.get(b)
    return impl.label if impl is not None else str(name)
