"""flashbook.chapter.decode: the data, tables and figures of chapter 12 (decoding) and of its
experiment record (``book/appendix/decoding_experiments``).

Everything here reads the recorded decode measurements of one GPU (``results/<gpu>/decode/``
and the Nsight Compute profile ``results/<gpu>/profiles/decode/``) or computes from the launch
rules of ``flashattn.kernels`` (no GPU):

    d = decode.load()                       # DecodeData: frames of the four parts, meta, profile
    decode.intensity(G=4, Nq=1)             # FLOP per byte of K/V read: G * Nq
    decode.split_table(d)                   # what decode_num_splits picks for the measured shapes
    decode.results_table(d), decode.targets(d)
    decode.split_sweep(), decode.combine_sweep()   # experiments E18a and E18b (26-decode-sweep)
    decode.kernel_times(d, "decode-b1"), decode.varlen_profile(d)
    decode.bandwidth_figure(d), decode.roofline_figure(d)

Columns of the decode rows (``flashbook.data.schema``, DECODE_FIELDS): ``median_ms`` (GPU time
per call, idle start), ``gbps`` (bytes of K/V the step must read / time), ``frac_peak`` (over
the datasheet's HBM peak, ``meta["hbm_peak_tbps"]``), ``ratio_best_torch`` (the fastest
PyTorch row's time over this row's: >= 1 is as fast as every PyTorch path).
"""
from __future__ import annotations

import ast
import inspect
import math
import re
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pandas as pd

from .page import DEFAULT_GPU

__all__ = ["DecodeData", "load", "intensity", "ridge", "gqa_bytes", "split_plan", "split_table",
           "results_table", "targets", "target_summary", "crossover_table", "path_table",
           "host_table", "varlen_table", "paging_cost", "profile_frame", "bandwidth_figure",
           "roofline_figure", "crossover_figure", "kernel_listing", "merge_demo", "live_step",
           "split_sweep", "split_sweep_table", "combine_sweep", "combine_sweep_table",
           "combine_run_comparison", "combine_kinds", "varlen_qtiles", "varlen_qtiles_cfg", "varlen_backward_times",
           "kernel_times", "FINAL_RUN",
           "varlen_profile", "varlen_tile_sweep",
           "SWEEP_RUN", "OURS", "TORCH", "LABELS", "PEAK_TFLOPS"]

from ..hardware import HBM_TBS, PEAK_TFLOPS  # noqa: E402  (the roofline roof, defined once)
SWEEP_RUN = "26-decode-sweep"  # experiments/data/<run>/: E18a (splits), E18b (combine), varlen
OURS = ("decode", "decode_paged16", "decode_paged64")
TORCH = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "flex")
LABELS = {"decode": "decode (ours, contiguous)", "decode_paged16": "decode (ours, pages of 16)",
          "decode_paged64": "decode (ours, pages of 64)",
          "square_best": "square kernel (attention, best step)", "sdpa_flash": "SDPA flash",
          "sdpa_cudnn": "SDPA cuDNN", "sdpa_efficient": "SDPA efficient",
          "sdpa_math": "SDPA math", "flex": "FlexAttention"}
COLORS = {"decode": "#1f77b4", "decode_paged16": "#9ecae1", "decode_paged64": "#6baed6",
          "square_best": "#9467bd", "sdpa_flash": "#b15928", "sdpa_cudnn": "#000000",
          "sdpa_math": "#7f7f7f", "flex": "#1b7837"}


@dataclass
class DecodeData:
    """The recorded decode measurements of one GPU.

    decode: every row of the decode part (errors included: ``error`` not null); crossover,
    varlen, host: the rows of those parts; meta: the decode document's metadata (GPU, peak);
    profile: the long Nsight Compute frame of ``profiles/decode`` (``step``, ``kernel``, metric
    columns); profile_meta: its metadata; profiles: the further profiles by name (wide frames,
    one row per step and kernel): ``"decode-b1"`` (B=1, 128K), ``"varlen"`` (32 x 1K, causal)
    and ``"varlen-before"`` (the same, recorded before E18's varlen grid and tile,
    ``experiments/data/26-decode-sweep/profiles-before/varlen/``).
    """
    decode: pd.DataFrame
    crossover: pd.DataFrame
    varlen: pd.DataFrame
    host: pd.DataFrame
    meta: dict
    profile: pd.DataFrame = field(default_factory=pd.DataFrame)
    profile_meta: dict = field(default_factory=dict)
    profiles: dict = field(default_factory=dict)

    @property
    def ok(self) -> pd.DataFrame:
        """The decode rows that ran (no error)."""
        d = self.decode
        return d[d["error"].isna() & d["median_ms"].notna()]

    @property
    def peak_tbps(self) -> float:
        return float(self.meta.get("hbm_peak_tbps") or 4.8)

    @property
    def sm_count(self) -> int:
        return int(self.meta.get("sm_count") or 132)

    @property
    def gpu(self) -> str:
        return str(self.meta.get("gpu", "")).replace("NVIDIA ", "")

    def row(self, impl: str, B: int, Nk: int, Nq: int) -> pd.Series:
        """The decode row of one implementation and shape. KeyError if it was not measured."""
        d = self.ok
        m = d[(d["impl"] == impl) & (d["B"] == B) & (d["Nk"] == Nk) & (d["Nq"] == Nq)]
        if m.empty:
            raise KeyError(f"no recorded decode row for {impl} at B={B}, Nk={Nk}, Nq={Nq}")
        return m.iloc[0]

    def value(self, impl: str, B: int, Nk: int, Nq: int, column: str) -> float:
        return float(self.row(impl, B, Nk, Nq)[column])


def load(gpu: str = DEFAULT_GPU, root=None) -> DecodeData:
    """Read ``results/<gpu>/decode/*.json`` (the ``.xz`` twins too) and the decode profile."""
    from ..data.results import results_root
    from ..data.schema import read_json, to_frame
    base = (results_root() if root is None else root) / gpu
    dec = read_json(base / "decode" / "decode.json")
    cv = to_frame(read_json(base / "decode" / "crossover-varlen.json"))
    host = to_frame(read_json(base / "decode" / "host.json"))
    prof, prof_meta, profiles = pd.DataFrame(), {}, {}
    try:
        from ..data.results import load as load_results
        r = load_results(gpu) if root is None else load_results(gpu, root=root)
        prof, _units, _rules, prof_meta = r.profile_at("decode")
        for name in ("decode-b1", "varlen"):
            p = r.profile_at(name)[0]
            if not p.empty:
                profiles[name] = p
    except Exception:        # a dataset without the profile: the tables that need it say so
        pass
    if root is None:
        try:
            from ..data.results import load_experiment_profile
            profiles["varlen-before"] = load_experiment_profile(
                SWEEP_RUN, "profiles-before/varlen/summary.json")
        except (FileNotFoundError, ValueError):
            pass
    return DecodeData(decode=to_frame(dec), crossover=cv[cv["part"] == "crossover"].copy(),
                      varlen=cv[cv["part"] == "varlen"].copy(), host=host,
                      meta=dict(dec.get("meta", {})), profile=prof, profile_meta=prof_meta or {},
                      profiles=profiles)


# ---------------------------------------------------------------------------------------------
# The arithmetic: intensity, bytes, splits
# ---------------------------------------------------------------------------------------------
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
    from ..data.schema import kv_bytes
    packed = kv_bytes(B, Hkv, Nk, D, elem_bytes)
    return {"packed": packed, "per query head": packed * (Hq // Hkv), "ratio": Hq // Hkv}


def split_plan(B: int, Nk: int, Nq: int, *, Hq: int = 32, Hkv: int = 8, D: int = 128,
               sm_count: int = 132, page_size: int | None = None, arch: str = "sm_90") -> dict:
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
    sm = d.sm_count if d is not None else 132
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


def _fmt_n(n: int) -> str:
    n = int(n)
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------
def results_table(d: DecodeData, impls=("decode", "decode_paged64", "square_best", "sdpa_flash",
                                        "sdpa_cudnn"), Nq: int | None = None) -> pd.DataFrame:
    """Shape x implementation: latency (µs), GB/s, % of HBM peak, x the fastest PyTorch row."""
    ok = d.ok[d.ok["impl"].isin(impls)]
    if Nq is not None:
        ok = ok[ok["Nq"] == Nq]
    t = pd.DataFrame({
        "B": ok["B"].astype(int), "Nk": ok["Nk"].map(_fmt_n), "Nq": ok["Nq"].astype(int),
        "impl": ok["impl"], "µs": (ok["median_ms"] * 1e3).round(1),
        "GB/s": ok["gbps"].round(0).astype(int), "% peak": (100 * ok["frac_peak"]).round(1),
        "× best PyTorch": ok["ratio_best_torch"].round(2)})
    t["_n"] = ok["Nk"].astype(int)
    t["_o"] = t["impl"].map({k: i for i, k in enumerate(impls)})
    t = t.sort_values(["B", "_n", "Nq", "_o"]).drop(columns=["_n", "_o"])
    return t.set_index(["B", "Nk", "Nq", "impl"])


def targets(d: DecodeData) -> pd.DataFrame:
    """The three targets per shape: decode >= 1.0x the fastest PyTorch path (every shape),
    >= 80 % of HBM peak at B=8 with a cache >= 32K, varlen within 5 % of the padded square
    kernel on equal lengths. Columns: target, shape, value, threshold, status."""
    rows = []
    ok = d.ok[d.ok["impl"] == "decode"].sort_values(["B", "Nk", "Nq"])
    for _, r in ok.iterrows():
        shape = f"B={int(r.B)}, Nk={_fmt_n(r.Nk)}, Nq={int(r.Nq)}"
        v = float(r.ratio_best_torch)
        rows.append(dict(target="decode ≥ 1.0× fastest PyTorch", shape=shape, value=v,
                         threshold=1.0, status="met" if v >= 1.0 else "not met",
                         B=int(r.B), Nk=int(r.Nk), Nq=int(r.Nq)))
    for _, r in ok[(ok["B"] == 8) & (ok["Nk"] >= 32768)].iterrows():
        shape = f"B={int(r.B)}, Nk={_fmt_n(r.Nk)}, Nq={int(r.Nq)}"
        v = float(r.frac_peak)
        rows.append(dict(target="decode ≥ 80 % of HBM peak (B=8, cache ≥ 32K)", shape=shape,
                         value=v, threshold=0.8, status="met" if v >= 0.8 else "not met",
                         B=int(r.B), Nk=int(r.Nk), Nq=int(r.Nq)))
    vt = varlen_table(d)
    for mix, r in vt[vt.index.str.startswith("equal")].iterrows():
        v = float(r["slowdown %"])
        rows.append(dict(target="varlen within 5 % of padded (equal lengths)", shape=mix,
                         value=v, threshold=5.0, status="met" if v <= 5.0 else "not met",
                         B=int(r["sequences"]), Nk=int(r["longest"]), Nq=0))
    return pd.DataFrame(rows)


def target_summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per target: shapes, met, not met, and the range of values."""
    g = t.groupby("target", sort=False)
    return pd.DataFrame({"shapes": g.size(), "met": g["status"].apply(lambda s: (s == "met").sum()),
                         "not met": g["status"].apply(lambda s: (s != "met").sum()),
                         "lowest": g["value"].min().round(3), "highest": g["value"].max().round(3)})


def paging_cost(d: DecodeData, page: int = 64) -> pd.Series:
    """Per measured shape: how much longer the paged decode takes than the contiguous one
    (time ratio - 1, as a fraction)."""
    ok = d.ok
    a = ok[ok["impl"] == "decode"].set_index(["B", "Nk", "Nq"])["median_ms"]
    b = ok[ok["impl"] == f"decode_paged{page}"].set_index(["B", "Nk", "Nq"])["median_ms"]
    return (b / a - 1).dropna().sort_index()


def crossover_table(d: DecodeData) -> pd.DataFrame:
    """Nq x Nk: the decode kernels' speed over the square kernel's (square time / decode time),
    B=8; > 1: decode is faster."""
    c = d.crossover
    t = c.pivot_table(index=["Nq", "Nk"], columns="impl", values="median_ms", aggfunc="first")
    s = (t["square_best"] / t["decode"]).unstack("Nk")
    s.columns = [_fmt_n(n) for n in s.columns]
    s.index = [f"Nq={n}" for n in s.index]
    return s


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


FINAL_RUN = "34-final"   # experiments/data/<run>/: the last GPU call of session 6


def host_table(d: DecodeData | None = None, *, run: str | None = None, root=None) -> pd.DataFrame:
    """Per implementation and mode: the kernel time, the host time of one call, the wall time of
    a call on an idle GPU and the overhead (wall - kernel), in µs; of the recorded dataset
    ``d``, or of a second host run kept with an experiment (``run``, e.g. ``FINAL_RUN``:
    ``host-2.json``)."""
    if run is not None:
        from ..data.results import experiments_root
        from ..data.schema import read_json, to_frame
        h = to_frame(read_json(experiments_root(root) / run / "host-2.json"))
    else:
        h = d.host
    t = pd.DataFrame({"impl": h["impl"], "CUDA graph": h["graph"].fillna(False).astype(bool),
                      "kernel µs": h["median_ms"] * 1e3, "host µs (call returns)": h["host_ms"] * 1e3,
                      "wall µs": h["wall_ms"].astype(float) * 1e3,
                      "overhead µs": h["overhead_ms"].astype(float) * 1e3})
    return t.set_index(["impl", "CUDA graph"]).round(1)


def varlen_backward_times(run: str = FINAL_RUN, name: str = "varlen_bwd.json",
                          root=None) -> pd.DataFrame:
    """The packed varlen forward + backward (autograd; the backward runs the square backward
    once per sequence, its loop on the host) against ``flashattn.attention``'s forward +
    backward on the sequences padded to the longest, causal, 32K tokens, both timed as eager
    batches in the same rounds: per mix, both times (ms) and the speed of packed over padded
    (padded time / packed time, > 1: packed faster) with its 95 % interval."""
    from ..data.results import load_experiment_file
    doc = load_experiment_file(run, name, root)
    out = {}
    for r in doc["rows"]:
        e = out.setdefault(r["mix"], {"sequences": int(r["B"]), "longest": int(r["max_len"])})
        e[f"{r['impl']} ms"] = float(r["median_ms"])
        if r["impl"] == "packed":
            e["speed"], e["lo"], e["hi"] = (float(r["ratio_padded"]), float(r["ratio_padded_lo"]),
                                            float(r["ratio_padded_hi"]))
    t = pd.DataFrame(out).T
    t.index.name = "mix"
    return t.astype({"sequences": int, "longest": int})


def varlen_table(d: DecodeData) -> pd.DataFrame:
    """Per mix (equal total tokens): sequences, longest, packed and padded time (ms), the padded
    tokens' share, and the packed kernel's slowdown over padded (%, negative: faster)."""
    v = d.varlen.copy()
    v["mix"] = v["config"].str.split(":").str[0]
    rows = {}
    for mix, g in v.groupby("mix", sort=False):
        pk, pd_ = g[g["impl"] == "varlen"].iloc[0], g[g["impl"] == "square_padded"].iloc[0]
        lens = list(pk["lens"])
        padded = len(lens) * max(lens)
        rows[mix] = {"sequences": len(lens), "longest": max(lens),
                     "padding %": round(100 * (1 - sum(lens) / padded), 1),
                     "packed ms": round(float(pk["median_ms"]), 3),
                     "padded ms": round(float(pd_["median_ms"]), 3),
                     "slowdown %": 100 * (float(pk["median_ms"]) / float(pd_["median_ms"]) - 1),
                     "speed-up": float(pd_["median_ms"]) / float(pk["median_ms"])}
    t = pd.DataFrame(rows).T
    t["slowdown %"] = t["slowdown %"].astype(float).round(1)
    t["speed-up"] = t["speed-up"].astype(float).round(2)
    return t


# ---------------------------------------------------------------------------------------------
# Experiments E18a (split count), E18b (combine), the varlen grid and tile (26-decode-sweep)
# ---------------------------------------------------------------------------------------------
_WAVES_IMPL = re.compile(r"waves(\d+)(_floor)?(?:_occ(\d+))?")


def split_sweep(run: str = SWEEP_RUN, name: str = "splits.json", root=None) -> pd.DataFrame:
    """E18a: ``flashattn.decode`` at the split counts of 1, 2, 4 and 8 waves, rounded up (the
    rule before E18: ``impl`` ``waves<w>``) and down (``waves<w>_floor``, timed only where the
    two differ after the kernel deals its runs), each also at two programs per SM (``_occ2``),
    beside SDPA flash and cuDNN in the same rounds (Nq=1, GQA 32:8, D=128, fp16).

    One row per (B, Nk, impl): ``waves`` (NaN for the libraries), ``rounding`` ("up", "down";
    "" for the libraries), ``occupancy``, ``splits``, ``programs`` (split kernel's grid),
    ``ms`` (median), ``x_cudnn`` (cuDNN's time over the row's: > 1 is faster), ``rule`` (True
    on the row of today's rule, ``decode_num_splits``: one wave rounded down, occupancy 1) and
    ``x_rule`` (the row's time over the rule's: > 1 is slower). ValueError if a shape has no
    rule row.
    """
    from ..data.results import load_experiment_file
    doc = load_experiment_file(run, name, root)
    sm = int(doc.get("meta", {}).get("sm_count") or 132)
    rows = []
    for r in doc["rows"]:
        impl = str(r["impl"])
        m = _WAVES_IMPL.fullmatch(impl)
        splits = r.get("num_splits")
        rows.append(dict(B=int(r["B"]), Nk=int(r["Nk"]), impl=impl,
                         waves=float(m.group(1)) if m else np.nan,
                         rounding=("down" if m.group(2) else "up") if m else "",
                         occupancy=float(m.group(3) or 1) if m else np.nan,
                         splits=float(splits) if splits is not None else np.nan,
                         ms=float(r["median_ms"])))
    s = pd.DataFrame(rows)
    s["programs"] = [split_plan(b, n, 1, sm_count=sm)["base"] * k if k == k else np.nan
                     for b, n, k in zip(s["B"], s["Nk"], s["splits"])]
    s["x_cudnn"] = np.nan
    s["rule"] = False
    s["x_rule"] = np.nan
    for (b, n), g in s.groupby(["B", "Nk"]):
        cudnn = g.loc[g["impl"] == "sdpa_cudnn", "ms"]
        if len(cudnn):
            s.loc[g.index, "x_cudnn"] = float(cudnn.iloc[0]) / g["ms"]
        want = split_plan(b, n, 1, sm_count=sm)["splits"]
        rule = g[(g["waves"] == 1) & (g["occupancy"] == 1) & (g["splits"] == want)]
        if len(rule) != 1:
            raise ValueError(f"{run}/{name}: no single row of the rule ({want} splits) at "
                             f"B={b}, Nk={n}")
        s.loc[rule.index, "rule"] = True
        s.loc[g.index, "x_rule"] = g["ms"] / float(rule["ms"].iloc[0])
    return s


def split_sweep_table(s: pd.DataFrame | None = None) -> pd.DataFrame:
    """E18a per shape: the rule's splits, time and speed over cuDNN, then each other variant as
    "time over the rule's (splits)" (occupancy 1; a rounded-down count that equals the
    rounded-up one was timed once and is shown in both columns), and the rule's split count at
    two programs per SM."""
    s = split_sweep() if s is None else s
    out = {}
    for (b, n), g in s.groupby(["B", "Nk"]):
        rule = g[g["rule"]].iloc[0]
        row = {"rule: splits": int(rule.splits), "rule: ms": round(rule.ms, 4),
               "rule: × cuDNN": round(rule.x_cudnn, 2)}
        ours = g[g["occupancy"] == 1]
        for w in (1, 2, 4, 8):
            for rnd, arrow in (("down", "↓"), ("up", "↑")):
                m = ours[(ours["waves"] == w) & (ours["rounding"] == rnd)]
                if m.empty and rnd == "down":
                    m = ours[(ours["waves"] == w) & (ours["rounding"] == "up")]
                if w == 1 and rnd == "down":
                    continue                       # the rule itself
                key = f"{w} wave{'s' if w > 1 else ''} {arrow}"
                row[key] = "–" if m.empty else f"{m.x_rule.iloc[0]:.2f} ({int(m.splits.iloc[0])})"
        occ2 = g[(g["occupancy"] == 2) & (g["waves"] == 1) & (g["splits"] == rule.splits)]
        row["rule at 2 / SM"] = "–" if occ2.empty else f"{occ2.x_rule.iloc[0]:.2f}"
        out[(int(b), _fmt_n(n))] = row
    t = pd.DataFrame(out).T
    t.index.names = ["B", "Nk"]
    return t.astype({"rule: splits": int, "rule: ms": float, "rule: × cuDNN": float})


def combine_sweep(run: str = SWEEP_RUN, name: str = "combine.json", root=None) -> pd.DataFrame:
    """E18b: ``flashattn.decode`` with the one-row combine that was tried (one program per
    packed row, merging ``TILE_S`` splits per step: ``impl`` ``rule``), the same kernel merging
    one split per step (``rule_s1``), twice and half the rule's splits (``rule_x2``,
    ``rule_half``), beside SDPA flash and cuDNN in the same rounds (Nq=1). One row per (B, Nk,
    impl): ``splits``, ``ms``, ``x_cudnn`` (speed over cuDNN, > 1 faster: the run's own paired
    ratio ``ratio_sdpa_cudnn``, the median of the per-round ratios, where it was recorded; else
    the ratio of the medians)."""
    from ..data.results import load_experiment_file
    doc = load_experiment_file(run, name, root)
    c = pd.DataFrame([dict(B=int(r["B"]), Nk=int(r["Nk"]), impl=str(r["impl"]),
                           splits=float(r["num_splits"]) if r.get("num_splits") else np.nan,
                           ms=float(r["median_ms"]),
                           x_cudnn=float(r["ratio_sdpa_cudnn"])
                           if r.get("ratio_sdpa_cudnn") is not None else np.nan)
                      for r in doc["rows"]])
    for _, g in c.groupby(["B", "Nk"]):
        cudnn = g.loc[g["impl"] == "sdpa_cudnn", "ms"]
        if len(cudnn):
            miss = g.index[g["x_cudnn"].isna()]
            c.loc[miss, "x_cudnn"] = float(cudnn.iloc[0]) / c.loc[miss, "ms"]
    return c


COMBINE_LABELS = {"rule": "TILE_S splits per step", "rule_s1": "one split per step",
                  "rule_x2": "twice the splits", "rule_half": "half the splits",
                  "sdpa_flash": "SDPA flash"}


def combine_sweep_table(c: pd.DataFrame | None = None) -> pd.DataFrame:
    """E18b per shape: the rule's splits and each variant's speed over cuDNN (> 1: faster)."""
    c = combine_sweep() if c is None else c
    t = c[c["impl"].isin(COMBINE_LABELS)].pivot_table(index=["B", "Nk"], columns="impl",
                                                       values="x_cudnn", aggfunc="first")
    t = t[[k for k in COMBINE_LABELS if k in t.columns]].rename(columns=COMBINE_LABELS)
    sp = c[c["impl"] == "rule"].set_index(["B", "Nk"])["splits"]
    t.insert(0, "splits", sp.reindex(t.index).astype(int))
    t.index = pd.MultiIndex.from_tuples([(int(b), _fmt_n(n)) for b, n in t.index],
                                        names=["B", "Nk"])
    t.columns.name = None
    return t.round(3)


MULTIROW_RUN = ("33-decode-rerecord", "decode-multirow.json")  # session 5's recording


def combine_run_comparison(d: DecodeData, run: str = SWEEP_RUN,
                           name: str = "decode-onerow-combine.json", root=None,
                           Hq: int = 32, Hkv: int = 8, D: int = 128,
                           baseline=MULTIROW_RUN) -> pd.DataFrame:
    """The whole decode benchmark run with E18b's one-row combine everywhere against the same
    benchmark with the multi-row combine everywhere (``baseline``: the recording of session 5,
    before E21 chose between them; column "final"), per (B, Nk, Nq) of the contiguous
    ``decode`` rows: both times (ms), their ratio (one-row / final: > 1, the one-row combine was
    slower), the rule's splits, and the combine's programs in each (one-row: one per packed row
    whenever it ran, even at one split; final: one per row block of a group, none at one split,
    where the split kernel writes the output). ``d`` gives the GPU's SM count."""
    from ..data.results import experiments_root
    from ..data.schema import read_json, to_frame
    from flashattn.kernels import decode_combine_constants, decode_combine_grid, decode_tiles
    base = experiments_root(root) / run / name
    one = to_frame(read_json(base))
    one = one[(one["impl"] == "decode") & one["error"].isna() & one["median_ms"].notna()]
    fin = to_frame(read_json(experiments_root(root) / baseline[0] / baseline[1]))
    fin = fin[(fin["impl"] == "decode") & fin["error"].isna() & fin["median_ms"].notna()
              & (fin["part"] == "decode")]
    a = one.set_index(["B", "Nk", "Nq"])["median_ms"]
    b = fin.set_index(["B", "Nk", "Nq"])["median_ms"]
    t = pd.DataFrame({"one-row ms": a, "final ms": b}).dropna()
    t["one-row / final"] = t["one-row ms"] / t["final ms"]
    sm = d.sm_count
    splits, p_one, p_fin = [], [], []
    for B, Nk, Nq in t.index:
        p = split_plan(int(B), int(Nk), int(Nq), Hq=Hq, Hkv=Hkv, D=D, sm_count=sm)
        rows = (Hq // Hkv) * int(Nq)
        splits.append(p["splits"])
        p_one.append(int(B) * Hkv * rows)
        tm = decode_combine_constants(split_tile_m=decode_tiles(rows=rows, head_dim=D)[0],
                                      head_dim=D)["TILE_M"]
        g = decode_combine_grid(B=int(B), Hkv=Hkv, rows=rows, tile_m=tm)
        p_fin.append(0 if p["splits"] == 1 else g[0] * g[1] * g[2])
    t["splits"], t["combine programs (one-row)"], t["combine programs (final)"] = \
        splits, p_one, p_fin
    t.index = t.index.set_levels([lvl.astype(int) for lvl in t.index.levels])
    return t.sort_index()


COMBINE_RUN = "32-decode-fused"   # E23: the three merges and SDPA in the same rounds (E21's too)
MERGES = ("block", "row", "fused")


def combine_kinds(run: str = COMBINE_RUN, name: str = "combine.json", root=None,
                  Hq: int = 32, Hkv: int = 8) -> pd.DataFrame:
    """E21/E23: the three merges of a decode step (``block``: the multi-row combine kernel,
    ``row``: the one-row combine kernel, ``fused``: the merge in the split kernel) and cuDNN,
    timed in the same rounds, per (B, Nq, Nk): the split count, each one's time over the
    multi-row combine's (> 1: faster; cuDNN only for Nq=1, where SDPA needs no mask), and the
    merge ``kernels.decode_combine_kind`` picks for the shape."""
    from ..data.results import load_experiment_file
    from flashattn.kernels import decode_combine_kind
    doc = load_experiment_file(run, name, root)
    rows = {}
    for r in doc["rows"]:
        key = (int(r["B"]), int(r["Nq"]), int(r["Nk"]))
        e = rows.setdefault(key, {"splits": int(r["num_splits"])})
        label = "cuDNN" if r["impl"] == "sdpa_cudnn" else r["impl"]
        if label in (*MERGES, "cuDNN"):
            e[label] = float(r["ratio_block"])
    t = pd.DataFrame(rows).T
    t.index = pd.MultiIndex.from_tuples([(b, q, _fmt_n(n)) for b, q, n in t.index],
                                        names=["B", "Nq", "Nk"])
    t["rule"] = [decode_combine_kind(B=b, Hkv=Hkv, rows=Hq // Hkv * q, num_splits=int(s))
                 for (b, q, _), s in zip(t.index, t["splits"])]
    t["splits"] = t["splits"].astype(int)
    return t[["splits", *MERGES, "cuDNN", "rule"]]


QTILES_RUN = "31-varlen-qtiles"   # E22


def varlen_qtiles(run: str = QTILES_RUN, name: str = "qtiles.json", root=None) -> pd.DataFrame:
    """E22: packed varlen prefill with ``Q_TILES`` query tiles per program, each one's speed
    over the padded square kernel timed in the same rounds (padded time / packed time: > 1,
    packed faster), per mix and causal; columns 1, 2, 4, 8, 16 (the tiles per program)."""
    from ..data.results import load_experiment_file
    doc = load_experiment_file(run, name, root)
    out = {}
    for r in doc["rows"]:
        if not r["impl"].startswith("varlen q_tiles="):
            continue
        qt = int(r["impl"].split("=")[1])
        out.setdefault((r["mix"], "causal" if r["causal"] else "full"), {})[qt] = \
            float(r["ratio_square_padded"])
    t = pd.DataFrame(out).T
    t.index.names = ["mix", "mask"]
    return t[sorted(t.columns)]


def varlen_qtiles_cfg(run: str = "35-varlen-qtiles-cfg", name: str = "qtiles_cfg.json",
                      root=None) -> pd.DataFrame:
    """E25: each Hopper tile of the varlen search space with 1, 4 and 8 query tiles per
    program, causal, speed over the padded square kernel of the same rounds (> 1: packed
    faster); rows (mix, tile), columns the tiles per program."""
    from ..data.results import load_experiment_file
    doc = load_experiment_file(run, name, root)
    out = {}
    for r in doc["rows"]:
        if " q_tiles=" not in r["impl"]:
            continue
        cfg, qt = r["impl"].rsplit(" q_tiles=", 1)
        out.setdefault((r["mix"], cfg), {})[int(qt)] = float(r["ratio_square_padded"])
    t = pd.DataFrame(out).T
    t.index.names = ["mix", "tile"]
    return t[sorted(t.columns)]


def _profile_of(d: DecodeData, name: str) -> pd.DataFrame:
    if name == "decode":
        p = d.profile
    else:
        p = d.profiles.get(name)
    if p is None or p.empty:
        raise KeyError(f"no recorded profile {name!r}")
    return p


def kernel_times(d: DecodeData, name: str = "decode-b1") -> pd.DataFrame:
    """One row per (step, kernel) of a recorded profile (``"decode"``, ``"decode-b1"``,
    ``"varlen"``, ``"varlen-before"``): duration under the profiler (µs), programs, DRAM bytes
    read (MB), L2 hit rate (%), DRAM throughput (% of peak). KeyError if not recorded."""
    p = _profile_of(d, name)
    col = lambda c: p[c] if c in p else pd.Series(np.nan, index=p.index)   # noqa: E731
    t = pd.DataFrame({"step": p["step"], "kernel": p["kernel"].astype(str),
                      "µs": col("gpu__time_duration.sum") / 1e3,
                      "programs": col("launch__grid_size"),
                      "DRAM read MB": col("dram__bytes_read.sum") / 1e6,
                      "L2 hit %": col("lts__t_sector_hit_rate.pct"),
                      "DRAM %": col("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")})
    return t.set_index(["step", "kernel"])


def varlen_profile(d: DecodeData) -> pd.DataFrame:
    """The varlen profile (32 sequences of 1K, causal, GQA 32:8) before E18's grid order and
    tile and now: per recording and step, programs, DRAM bytes read (MB), L2 hit rate and the
    duration under the profiler. KeyError if either recording is missing."""
    parts = {}
    for label, name in (("before", "varlen-before"), ("now", "varlen")):
        k = kernel_times(d, name).reset_index()
        k = k[k["step"].isin(("varlen", "varlen_square_padded"))]
        parts[label] = k.set_index("step")[["programs", "DRAM read MB", "L2 hit %", "µs"]]
    t = pd.concat(parts, names=["recording", "step"])
    return t


_VARLEN_LINE = re.compile(r"^(equal_\S+)\s+(square_padded|varlen\s+(.+?))\s+([\d.]+) ms\b")


def varlen_tile_sweep(run: str = SWEEP_RUN, before: str = "varlen.json",
                      after: str = "varlen-grid.log", root=None) -> pd.DataFrame:
    """E18's varlen tile sweep on equal lengths (8 x 4K, 32 x 1K; causal, GQA 32:8): each tile's
    speed over the padded square kernel of the same rounds (padded time / packed time, > 1:
    packed faster), with the grid ordered (tiles, B, Hq) (``before``, a JSON document) and
    (tiles, Hq, B) (``after``: the run's printed lines, whose JSON did not come back)."""
    from ..data.results import experiments_root, load_experiment_file
    doc = load_experiment_file(run, before, root)
    b = {}
    for r in doc["rows"]:
        b[(r["mix"], r["impl"])] = float(r["median_ms"])
    a = {}
    text = (experiments_root(root) / run / after).read_text(encoding="utf-8")
    for line in text.splitlines():
        m = _VARLEN_LINE.match(line.strip())
        if m:
            a[(m.group(1), m.group(2).split(None, 1)[0] if m.group(3) is None
               else f"varlen {m.group(3).strip()}")] = float(m.group(4))
    if not a:
        raise ValueError(f"{run}/{after}: no timing lines")
    out = {}
    for label, ms in (("grid (tiles, B, Hq)", b), ("grid (tiles, Hq, B)", a)):
        for (mix, impl), t in ms.items():
            if impl == "square_padded":
                continue
            out.setdefault((mix, impl.removeprefix("varlen ")), {})[label] = \
                ms[(mix, "square_padded")] / t
    t = pd.DataFrame(out).T
    t.index.names = ["mix", "tile"]
    return t


PROFILE_ROWS = [
    ("grid (programs)", "launch__grid_size", "{:.0f}"),
    ("threads / program", "launch__block_size", "{:.0f}"),
    ("registers / thread", "launch__registers_per_thread", "{:.0f}"),
    ("waves per SM", "launch__waves_per_multiprocessor", "{:.2f}"),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active", "{:.1f}"),
    ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
    ("tensor pipe %", "tensor_pct", "{:.1f}"),
    ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "{:.1f}"),
    ("DRAM bytes (MB)", "dram_mb", "{:.0f}"),
    ("instructions (M)", "inst_m", "{:.1f}"),
    ("stall: long scoreboard", "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio", "{:.2f}"),
    ("duration (µs)", "duration_us", "{:.1f}"),
]
PROFILE_STEPS = ("decode", "decode_paged64", "square_decode", "sdpa_flash_decode")


def profile_frame(d: DecodeData, steps=PROFILE_STEPS, kernel: str = "main") -> pd.DataFrame:
    """Nsight Compute metrics of the decode profile, one column per step.

    ``kernel="main"``: each step's longest kernel (the split kernel, the square kernel, FA2's
    split-KV kernel); ``"all"``: times, bytes and instructions summed over the step's kernels.
    Raises KeyError when the dataset has no decode profile.
    """
    if d.profile is None or d.profile.empty:
        raise KeyError("no recorded decode profile (results/<gpu>/profiles/decode/)")
    from .plots import per_step
    p = d.profile[d.profile["step"].isin(steps)]
    if kernel == "main":
        p = p.loc[p.groupby("step")["gpu__time_duration.sum"].idxmax()]
    w = per_step(p, steps)
    inst = p.groupby("step")["smsp__inst_executed.sum"].sum() if \
        "smsp__inst_executed.sum" in p else pd.Series(dtype=float)
    w["inst_m"] = w["step"].map(inst) / 1e6
    w["duration_us"] = w["duration_ms"] * 1e3
    t = pd.DataFrame({r["step"]: [r.get(m, np.nan) for _, m, _ in PROFILE_ROWS]
                      for _, r in w.iterrows()}, index=[lbl for lbl, _, _ in PROFILE_ROWS])
    return t[[s for s in steps if s in t.columns]]


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def _plt():
    import matplotlib.pyplot as plt
    return plt


def bandwidth_figure(d: DecodeData, impls=("decode", "decode_paged64", "square_best",
                                           "sdpa_flash", "sdpa_cudnn"), Nqs=(1, 4)):
    """GB/s against cache length, one panel per (Nq, B), with the HBM peak as a line."""
    plt = _plt()
    Bs = sorted(int(b) for b in d.ok["B"].unique())
    fig, axes = plt.subplots(len(Nqs), len(Bs), figsize=(3.3 * len(Bs), 2.7 * len(Nqs)),
                             sharey=True, squeeze=False)
    peak = d.peak_tbps * 1e3
    for i, nq in enumerate(Nqs):
        for j, B in enumerate(Bs):
            ax = axes[i][j]
            sub = d.ok[(d.ok["B"] == B) & (d.ok["Nq"] == nq)]
            for impl in impls:
                s = sub[sub["impl"] == impl].sort_values("Nk")
                if s.empty:
                    continue
                ax.plot(s["Nk"], s["gbps"], marker="o", ms=3, lw=1.4,
                        ls="-" if impl in OURS else "--", color=COLORS.get(impl, "#999999"),
                        label=LABELS.get(impl, impl))
            ax.axhline(peak, color="#d62728", lw=1, ls=":")
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(sub["Nk"].unique()))
            ax.set_xticklabels([_fmt_n(n) for n in sorted(sub["Nk"].unique())], fontsize=7)
            ax.set_ylim(0, peak * 1.08)
            ax.set_title(f"B={B}, Nq={nq}", fontsize=9)
            if j == 0:
                ax.set_ylabel("GB/s of K/V")
            if i == len(Nqs) - 1:
                ax.set_xlabel("cache length Nk")
    axes[0][0].annotate(f"HBM peak {d.peak_tbps:g} TB/s", (0.02, peak * 1.01),
                        xycoords=("axes fraction", "data"), fontsize=7, color="#d62728",
                        va="bottom")
    h, lab = axes[0][-1].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"Decode bandwidth, GQA 32:8, D=128, fp16 — recorded on {d.gpu}", fontsize=10)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


def roofline_figure(d: DecodeData, impls=("decode", "square_best", "sdpa_flash", "sdpa_cudnn"),
                    B: int = 8):
    """The roofline of one decode step: measured TFLOPS at each implementation's arithmetic
    intensity (FLOPs over the bytes of K/V it must read), all cache lengths of one batch size,
    against the HBM slope and the tensor-core roof."""
    from flashattn.timing import attention_flops
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.2, 4.2))
    peak_tb = d.peak_tbps
    ii = np.logspace(-0.5, 3.5, 200)
    ax.plot(ii, np.minimum(PEAK_TFLOPS, peak_tb * ii), color="#444444", lw=1.5)
    r = ridge(PEAK_TFLOPS, peak_tb)
    ax.axvline(r, color="#bbbbbb", ls=":", lw=1)
    ax.annotate(f"ridge ≈ {r:.0f} FLOP/byte", (r * 1.1, 2.0), fontsize=8)
    ax.annotate(f"{peak_tb:g} TB/s", (0.5, peak_tb * 0.5 * 1.25), fontsize=8)
    ax.annotate(f"{PEAK_TFLOPS:.0f} TFLOPS", (1500, PEAK_TFLOPS * 1.1), fontsize=8, ha="center")
    ok = d.ok[(d.ok["B"] == B) & d.ok["impl"].isin(impls)]
    marks = {1: "o", 4: "^"}
    for impl in impls:
        for nq in (1, 4):
            s = ok[(ok["impl"] == impl) & (ok["Nq"] == nq)]
            if s.empty:
                continue
            fl = np.array([attention_flops(int(x.B), int(x.Hq), int(x.Nq), int(x.Nk), int(x.D),
                                           True, input_pos=int(x.Nk) - int(x.Nq))
                           for x in s.itertuples()])
            tf = fl / (s["median_ms"].to_numpy() * 1e-3) / 1e12
            x = fl / s["kv_bytes"].to_numpy()
            ax.scatter(x, tf, marker=marks[nq], s=28, color=COLORS.get(impl, "#999"),
                       alpha=0.85, label=f"{LABELS.get(impl, impl)}, Nq={nq}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(0.3, 3000)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of K/V)")
    ax.set_ylabel("TFLOPS")
    ax.set_title(f"Roofline of a decode step, B={B}, Nk 1K–128K — recorded on {d.gpu}",
                 fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=7)
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


def crossover_figure(d: DecodeData):
    """Square kernel time over decode time against Nk, one line per Nq (B=8)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.3))
    c = d.crossover
    t = c.pivot_table(index=["Nq", "Nk"], columns="impl", values="median_ms", aggfunc="first")
    for nq, col in zip((1, 4, 16), ("#1f77b4", "#2ca02c", "#9467bd")):
        if nq not in t.index.get_level_values(0):
            continue
        s = t.loc[nq]
        ax.plot(s.index, s["square_best"] / s["decode"], marker="o", ms=3, color=col,
                label=f"Nq={nq}")
    from flashattn.api import DECODE_PATH_MIN_NK
    ax.axhline(1.0, color="#444", lw=1)
    ax.axvline(DECODE_PATH_MIN_NK, color="#d62728", ls=":", lw=1)
    ax.annotate("DECODE_PATH_MIN_NK", (DECODE_PATH_MIN_NK * 1.05, 0.62), fontsize=7,
                color="#d62728")
    ks = sorted(c["Nk"].unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([_fmt_n(k) for k in ks], fontsize=8)
    ax.set_xlabel("cache length Nk")
    ax.set_ylabel("square time / decode time")
    ax.set_title(f"Decode path against the square kernel, B=8 — recorded on {d.gpu}", fontsize=10)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    plt.close(fig)        # shown by the cell that ends with `fig`, once
    return fig


# ---------------------------------------------------------------------------------------------
# Listings, the CPU demo, the live step
# ---------------------------------------------------------------------------------------------
def kernel_listing(name: str) -> str:
    """The source of one function of ``flashbook/ladder/decode.py`` (the library's kernel with
    the fused merge the chapter discusses; read as text: the module is parsed, not imported, so
    no compiler is needed)."""
    import importlib.util
    from pathlib import Path
    path = Path(importlib.util.find_spec("flashbook.ladder.decode").origin)
    from ..source import shipped_source
    src = shipped_source(path.read_text(encoding="utf-8"))
    tree = ast.parse(src)
    lines = src.splitlines()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([node.lineno] + [dec.lineno for dec in node.decorator_list])
            return "\n".join(lines[start - 1:node.end_lineno])
    raise KeyError(f"no function {name!r} in flashbook/ladder/decode.py")


def merge_demo(seed: int = 0, length: int = 300, cuts=(128, 128)) -> dict:
    """The LSE merge on the CPU: one sequence, GQA 8:2, its keys cut at ``cuts`` (equal cuts:
    an empty split). Returns the partial LSEs, the merged and exact outputs and the error."""
    from flashattn.reference import decode as ref
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((1, 8, 1, 64))
    k, v = rng.standard_normal((2, 1, 2, length, 64))
    lens = np.array([length], np.int32)
    bounds = [0, *cuts, length]
    splits = [[(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]]
    o_parts, lse_parts = ref.split_partials(q, k, v, lens, splits=splits)
    merged, lse = ref.merge_partials(o_parts, lse_parts)
    exact, lse_exact = ref.decode_attention(q, k, v, lens, return_lse=True)
    return dict(splits=splits[0], lse_parts=lse_parts[:, 0, 0, 0], merged=merged, exact=exact,
                err=float(np.abs(merged - exact).max()),
                lse_err=float(np.abs(lse - lse_exact).max()))


def live_step(B: int = 8, Nk: int = 32768, Nq: int = 1, Hq: int = 32, Hkv: int = 8,
              D: int = 128, reps: int = 20) -> pd.DataFrame:
    """On a GPU: time one decode step of ``flashattn.decode`` and of PyTorch SDPA (flash) on the
    same cache (median of CUDA-event timings with L2 flushed), and the error against SDPA."""
    import torch
    import torch.nn.functional as F
    import flashattn
    from flashattn.timing import time_cuda
    from ..data.schema import kv_bytes
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, Hq, Nq, D, device="cuda", dtype=torch.float16, generator=g)
    k = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16, generator=g)
    v = torch.randn(B, Hkv, Nk, D, device="cuda", dtype=torch.float16, generator=g)
    lens = torch.full((B,), Nk, dtype=torch.int32, device="cuda")
    ours = lambda: flashattn.decode(q, k, v, lens)              # noqa: E731
    sdpa = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    err = (ours().float() - sdpa().float()).abs().max().item() if Nq == 1 else float("nan")
    rows = {}
    for name, fn in (("decode", ours), ("SDPA (default backend)", sdpa)):
        t = time_cuda(fn, reps=reps)
        rows[name] = {"µs": t.median_ms * 1e3,
                      "GB/s of K/V": kv_bytes(B, Hkv, Nk, D) / (t.median_ms * 1e-3) / 1e9}
    out = pd.DataFrame(rows).T.round(1)
    out.attrs["max_abs_err"] = err
    return out
