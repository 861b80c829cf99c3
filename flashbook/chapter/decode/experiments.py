"""The decode experiments kept with the book (``experiments/data/<run>/``): the split count,
the combine, the merges, the varlen grid and tile, and the Nsight Compute profiles."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ...hardware import SM_COUNT
from .arith import _fmt_n, split_plan
from .data import SWEEP_RUN, DecodeData

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
    from ...data.results import load_experiment_file
    doc = load_experiment_file(run, name, root)
    sm = int(doc.get("meta", {}).get("sm_count") or SM_COUNT)
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
    from ...data.results import load_experiment_file
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
    from ...data.results import experiments_root
    from ...data.schema import read_json, to_frame
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
    from ...data.results import load_experiment_file
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
    from ...data.results import load_experiment_file
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
    from ...data.results import load_experiment_file
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
    from ...data.results import experiments_root, load_experiment_file
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
    from ..plots import per_step
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
