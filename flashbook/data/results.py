"""Recorded measurements, as DataFrames for the notebooks.

    from flashbook.data import results
    r = results.load("h200")
    r.tflops_table("fp16-causal-d128")     # impl x N, book order
    r.ratio_table("fp16-causal-d128")      # the same over cuDNN
    r.compile, r.tile_grid                 # compile reports: per arch, and the tile-shape grid
    r.profile, r.profile_at("n1024")       # Nsight Compute: N=4K (every step), N=1K (chapter 8)
    r.experiment("02-hopper-experiments")  # an experiment run of chapter 10 (bench rows)
    results.load_experiment_profile("12-profiles", "d128-summary.json")   # a profile of a run
    results.load_experiment_table("13-timing-crosscheck", "timing-crosscheck.json")
    results.load_experiment_log_table("12-profiles", "prof-d256.log")    # a printed profile table
    results.seed_b200()                    # the seed's B200 TFLOPS (quoted, not measured)
    results.tilegym_table("fwd_causal")    # NVIDIA TileGym beside ours: impl x N, over cuDNN
    results.tilegym_range("bwd_causal")    # (min, max) of TileGym's ratio to cuDNN
    results.source_line(r.meta)            # "H200 (132 SMs), driver 580.159, CUDA 13.0, ..."

Files (formats in results/README.md)::

    results/<gpu>/bench/<workload>.json     python -m flashbook record --part bench
    results/<gpu>/profiles/summary.json     python -m flashbook record --part profile
    results/<gpu>/compile/<arch>.json       python -m flashbook record --part compile
    results/<gpu>/compile/tiles.json        python experiments/tile_grid.py
    experiments/data/<run>/<workload>.json  python experiments/sweep.py <run> (bench documents)
    experiments/data/<run>/<other>.json     other records of a run: profile summaries, tables
    results/quoted/seed-b200.json           numbers quoted from the seed walkthrough
    results/<gpu>/tilegym/<part>.json       TileGym timed beside ours (experiments/tilegym_bench.sh)

The root is the repository's ``results/`` folder, or ``$FLASHATTN_RESULTS``; experiment runs are
under the repository's ``experiments/data/``, or ``$FLASHATTN_EXPERIMENTS``. Parts that were not
recorded load as empty DataFrames.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..impls import LIBRARY_IMPLS, RATIO_REF, rank
from flashbook.steps import STEP_NAMES
from .schema import json_path, read_json, to_frame

DEFAULT_WORKLOAD = "fp16-causal-d128"
TILE_GRID_FILE = "tiles.json"      # compile/tiles.json: the tile-shape grid, not an arch report
SEED_B200_FILE = "quoted/seed-b200.json"


def results_root(root=None) -> Path:
    if root is not None:
        return Path(root)
    env = os.environ.get("FLASHATTN_RESULTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "results"


def experiments_root(root=None) -> Path:
    """Where experiment runs live: ``root``, ``$FLASHATTN_EXPERIMENTS`` or the repository's
    ``experiments/data/``."""
    if root is not None:
        return Path(root)
    env = os.environ.get("FLASHATTN_EXPERIMENTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "experiments" / "data"


def available(root=None) -> list[str]:
    """The GPUs with recorded results ("h200", ...), sorted."""
    r = results_root(root)
    if not r.is_dir():
        return []
    return sorted(d.name for d in r.iterdir()
                  if d.is_dir() and any((d / p).exists() for p in ("bench", "profiles",
                                                                    "compile")))


def _read(path: Path) -> dict | None:
    try:
        return read_json(path)               # path, or path.xz
    except (OSError, ValueError):
        return None


def json_docs(folder) -> list[Path]:
    """The JSON documents of ``folder``, each by its plain name (``NAME.json``) whether it is
    committed plain or compressed (``NAME.json.xz``; ``read_json`` reads either), sorted.
    What a script globs for instead of ``*.json``, which misses the compressed ones."""
    folder = Path(folder)
    names = {f.name for f in folder.glob("*.json")}
    names |= {f.name[:-3] for f in folder.glob("*.json.xz")}
    return [folder / n for n in sorted(names)]


_json_docs = json_docs


def _step_key(step) -> tuple:
    """Profiles: the book's steps in order, then everything else by name."""
    return (STEP_NAMES.index(step) if step in STEP_NAMES else len(STEP_NAMES), str(step))


@dataclass
class Results:
    """Everything recorded for one GPU. Missing parts are empty DataFrames / dicts."""
    gpu: str
    path: Path
    bench: "object" = None            # DataFrame: all bench rows + "workload"
    bench_meta: dict = field(default_factory=dict)   # workload -> meta
    profile: "object" = None          # DataFrame: one row per (step, kernel), metric columns
    profile_units: dict = field(default_factory=dict)  # metric -> unit
    profile_meta: dict = field(default_factory=dict)
    rules: "object" = None            # DataFrame: step, kernel, section, rule, type, message
    compile: "object" = None          # DataFrame: one row per (arch, step, kernel)
    compile_meta: dict = field(default_factory=dict)  # arch file stem -> meta
    tile_grid: "object" = None        # DataFrame: compile/tiles.json, one row per kernel
    tile_grid_meta: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    experiments_path: Path | None = None   # experiments/data/ (``experiment``)

    @property
    def workloads(self) -> list[str]:
        return list(self.bench_meta)

    def tflops_table(self, workload: str = DEFAULT_WORKLOAD, value: str = "tflops"):
        """impl x N of ``value`` (TFLOPS by default), rows in book order: steps, best, libraries.

        Failed or skipped measurements are NaN. Empty if the workload was not recorded.
        """
        import pandas as pd
        if self.bench is None or self.bench.empty:
            return pd.DataFrame()
        df = self.bench[self.bench["workload"] == workload]
        if df.empty:
            return pd.DataFrame()
        t = df.pivot_table(index="impl", columns="Nq", values=value, aggfunc="first",
                           dropna=False)
        t = t.reindex(sorted(df["impl"].unique(), key=rank))
        t = t.reindex(columns=sorted(df["Nq"].unique()))
        t.index.name, t.columns.name = "impl", "N"
        return t.astype(float)

    def ratio_table(self, workload: str = DEFAULT_WORKLOAD, ref: str = RATIO_REF):
        """``tflops_table`` divided by the row of ``ref`` (cuDNN): 1.0 = as fast as cuDNN.

        Empty if the workload or the reference was not recorded.
        """
        import pandas as pd
        t = self.tflops_table(workload)
        if t.empty or ref not in t.index:
            return pd.DataFrame()
        return t.div(t.loc[ref], axis=1)

    def row(self, impl: str, N: int, workload: str = DEFAULT_WORKLOAD) -> dict | None:
        """One bench row as a dict (None if absent)."""
        if self.bench is None or self.bench.empty:
            return None
        df = self.bench[(self.bench["workload"] == workload) & (self.bench["impl"] == impl)
                        & (self.bench["Nq"] == N)]
        return None if df.empty else df.iloc[0].to_dict()

    def profile_at(self, sub: str):
        """(wide DataFrame, units, rules, meta) of a further profile run recorded under
        ``profiles/<sub>/`` (``"n1024"``: chapter 8's steps at N=1K, ``record.TAIL_STEPS``)."""
        return _profile_frames(_read(self.path / "profiles" / sub / "summary.json") or {})

    @property
    def experiments(self) -> list[str]:
        """The experiment runs recorded on this GPU (names for ``experiment``), sorted."""
        root = self.experiments_path
        return [n for n in list_experiments(root)
                if _experiment_gpu(load_experiment_meta(n, root)) in (None, self.gpu)]

    def experiment(self, name: str):
        """The bench rows of the experiment run ``name`` (``experiments/data/<name>/``): one
        DataFrame over all its documents, with ``workload`` and ``document`` columns.

        Raises FileNotFoundError if there is no such run, ValueError if it was recorded on
        another GPU than this dataset's.
        """
        metas = load_experiment_meta(name, self.experiments_path)
        gpu = _experiment_gpu(metas)
        if gpu not in (None, self.gpu):
            raise ValueError(f"experiment {name!r} was recorded on {gpu}, not {self.gpu}")
        return load_experiment(name, self.experiments_path)


def _load_bench(d: Path):
    return _load_bench_docs(d / "bench")


def is_bench_doc(doc) -> bool:
    """A bench document: ``{"meta": {...}, "rows": [{"impl": ..., ...}, ...]}``
    (a profile summary or another experiment's table is not one)."""
    rows = doc.get("rows") if isinstance(doc, dict) else None
    return isinstance(rows, list) and all(isinstance(r, dict) and "impl" in r for r in rows)


def _load_bench_docs(folder: Path, *, by_file: bool = False):
    """(DataFrame of every bench document in ``folder`` with a workload column, metas).

    metas: workload -> meta; with ``by_file``, file stem -> meta and a ``document`` column (the
    file stem), for folders that hold several documents of one workload (experiment runs).
    """
    import pandas as pd
    frames, metas = [], {}
    for f in _json_docs(folder):
        doc = _read(f)
        if not is_bench_doc(doc):
            continue
        meta = doc.get("meta", {})
        name = (meta.get("workload") or {}).get("name") or f.stem
        meta.setdefault("workload", {})["name"] = name
        metas[f.stem if by_file else name] = meta
        df = to_frame(doc)
        df["workload"] = name
        if by_file:
            df["document"] = f.stem
        frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["workload", "document"] if by_file else ["workload"]), metas
    return pd.concat(frames, ignore_index=True), metas


def _load_profile(d: Path):
    return _profile_frames(_read(d / "profiles" / "summary.json") or {})


def _profile_frames(doc: dict):
    """(wide DataFrame, units, rules DataFrame, meta) of a profile summary document
    (``python -m flashbook profile``: ``{"meta", "rows": [{step, kernel, metric, value, unit}],
    "rules"}``)."""
    import pandas as pd
    rows, rules = doc.get("rows", []), doc.get("rules", [])
    units = {}
    if rows:
        long = pd.DataFrame(rows)
        for c in ("step", "kernel", "metric", "value", "unit"):
            if c not in long.columns:
                long[c] = None
        units = {m: u for m, u in zip(long["metric"], long["unit"]) if u is not None}
        long["value"] = [_num(v) for v in long["value"]]
        long["kernel"] = long["kernel"].fillna("")
        # groupby/unstack keeps only the (step, kernel) pairs that exist (a pivot_table with
        # dropna=False would pair every step with every kernel).
        prof = long.groupby(["step", "kernel", "metric"], sort=False)["value"].first()
        prof = prof.unstack("metric")
        prof.columns.name = None
        prof = prof.reset_index()
        prof = prof.iloc[sorted(range(len(prof)),
                                key=lambda i: (_step_key(prof["step"].iloc[i]), i))]
        prof = prof.reset_index(drop=True)
    else:
        prof = pd.DataFrame(columns=["step", "kernel"])
    rules_df = pd.DataFrame(rules, columns=["step", "kernel", "section", "rule", "type",
                                            "message"]) if rules else \
        pd.DataFrame(columns=["step", "kernel", "section", "rule", "type", "message"])
    return prof, units, rules_df, doc.get("meta", {})


def _num(v):
    """Numbers stay numbers, numeric strings ("1,234.5") become floats, other text stays."""
    if isinstance(v, (int, float)) or v is None:
        return v
    try:
        return float(str(v).replace(",", ""))
    except ValueError:
        return v


def _compile_frame(kernels: list[dict], columns=("step", "arch", "kernel", "config")):
    """Compile reports as rows, ``sass`` flattened into ``sass_<OPCODE>`` columns (0 if absent)."""
    import pandas as pd
    rows = []
    for k in kernels:
        r = {key: val for key, val in k.items() if key not in ("sass", "sass_text")}
        for op, n in (k.get("sass") or {}).items():
            r[f"sass_{op}"] = n
        rows.append(r)
    if not rows:
        return pd.DataFrame(columns=list(columns))
    df = pd.DataFrame(rows)
    sass_cols = [c for c in df.columns if c.startswith("sass_") and c != "sass_lines"]
    df[sass_cols] = df[sass_cols].fillna(0).astype(int)
    return df


def _load_compile(d: Path):
    """The per-arch reports (``compile/<arch>.json``; not the tile grid)."""
    kernels, metas = [], {}
    for f in json_docs(d / "compile"):
        doc = _read(f)
        if f.name == TILE_GRID_FILE or not doc or "kernels" not in doc:
            continue
        metas[f.stem] = doc.get("meta", {})
        kernels += doc["kernels"]
    return _compile_frame(kernels), metas


def _load_tile_grid(d: Path):
    """``compile/tiles.json`` (experiments/tile_grid.py): one row per compiled kernel, with
    ``TILE_M`` and ``TILE_N`` columns; and its meta (``tile_m``, ``tile_n``: the grid)."""
    doc = _read(d / "compile" / TILE_GRID_FILE) or {}
    return (_compile_frame(doc.get("kernels", []),
                           ("step", "arch", "kernel", "config", "TILE_M", "TILE_N")),
            doc.get("meta", {}))


# ---------------------------------------------------------------------------------------------
# Experiment runs (chapter 10): bench documents under experiments/data/<run>/
# ---------------------------------------------------------------------------------------------
def list_experiments(root=None) -> list[str]:
    """The experiment runs under ``experiments_root(root)``: folders holding bench documents
    (folders of other records, profile summaries or logs, are not runs)."""
    d = experiments_root(root)
    if not d.is_dir():
        return []
    return sorted(x.name for x in d.iterdir()
                  if x.is_dir() and any(is_bench_doc(_read(f)) for f in _json_docs(x)))


def _experiment_dir(name: str, root=None) -> Path:
    d = experiments_root(root) / name
    if not d.is_dir() or not any(is_bench_doc(_read(f)) for f in _json_docs(d)):
        known = ", ".join(list_experiments(root)) or "none"
        raise FileNotFoundError(f"no experiment run {name!r} under {experiments_root(root)} "
                                f"(known: {known})")
    return d


def load_experiment(name: str, root=None):
    """The rows of the experiment run ``name`` as one DataFrame: every bench document of
    ``experiments/data/<name>/`` in file order, with ``workload`` and ``document`` (the file's
    stem; ``sweep.py`` names it after the workload) columns. ``Results.experiment`` is the same,
    checked against the dataset's GPU."""
    df, _ = _load_bench_docs(_experiment_dir(name, root), by_file=True)
    return df


def load_experiment_meta(name: str, root=None) -> dict:
    """document (file stem) -> meta of the experiment run ``name``."""
    return _load_bench_docs(_experiment_dir(name, root), by_file=True)[1]


def _experiment_gpu(metas: dict) -> str | None:
    """The results folder name ("h200") of the GPU a run's documents were recorded on."""
    from flashattn.env import gpu_slug
    gpus = {m.get("gpu") for m in metas.values() if m.get("gpu")}
    if len(gpus) > 1:
        raise ValueError(f"an experiment run mixes GPUs: {sorted(gpus)}")
    return gpu_slug(gpus.pop()) if gpus else None


def load_experiment_file(run: str, name: str, root=None):
    """The parsed JSON of ``experiments/data/<run>/<name>``: a record of an experiment that is
    not a bench document (a profile summary, a table of another method's timings).

    Raises FileNotFoundError if the file is missing, ValueError if it is not JSON.
    """
    path = experiments_root(root) / run / name
    if json_path(path) is None:
        raise FileNotFoundError(f"no file {name!r} in experiment {run!r} ({path})")
    try:
        return read_json(path)
    except ValueError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None


def load_experiment_profile(run: str, name: str = "summary.json", root=None):
    """A profile summary recorded with an experiment run (``experiments/data/<run>/<name>``,
    written by ``python -m flashbook profile``) in the form of ``Results.profile``: one row per
    (step, kernel), one column per metric, steps in book order. ``.attrs`` holds ``meta`` (with
    ``configs``: step -> configuration profiled), ``units`` (metric -> unit) and ``rules`` (a
    DataFrame of Nsight Compute's rule messages)."""
    doc = load_experiment_file(run, name, root)
    if not isinstance(doc, dict) or not all(isinstance(r, dict) and "metric" in r
                                            for r in doc.get("rows", [None])):
        raise ValueError(f"{run}/{name} is not a profile summary")
    prof, units, rules, meta = _profile_frames(doc)
    prof.attrs.update(meta=meta, units=units, rules=rules)
    return prof


def load_experiment_table(run: str, name: str, root=None):
    """The rows of a ``{"meta": {...}, "rows": [{...}, ...]}`` record of an experiment run that
    is not a bench document (e.g. ``13-timing-crosscheck/timing-crosscheck.json``: N, method,
    ms per implementation, ratio) as a DataFrame, in file order; ``.attrs["meta"]`` holds its
    meta."""
    import pandas as pd
    doc = load_experiment_file(run, name, root)
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{run}/{name} has no list of rows")
    df = pd.DataFrame(rows)
    df.attrs["meta"] = doc.get("meta", {})
    return df


def load_experiment_log_table(run: str, name: str, root=None):
    """The summary table a ``python -m flashbook profile`` run printed into its log
    (``experiments/data/<run>/<name>``, e.g. ``12-profiles/prof-d256.log``), for runs whose
    summary JSON did not come back: one row per (step, kernel), the printed columns
    (``registers``, ``block``, ``occ_theory_%``, ``sm_%``, ``duration_ns``, ...), numbers as
    numbers. The table is the block of lines from the header (first word ``step``) to the next
    blank line; raises ValueError if the log has none."""
    import pandas as pd
    path = experiments_root(root) / run / name
    if not path.is_file():
        raise FileNotFoundError(f"no file {name!r} in experiment {run!r} ({path})")
    lines = path.read_text().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["step"]), None)
    if start is None:
        raise ValueError(f"{run}/{name} has no printed profile table")
    head = lines[start].split()
    rows = []
    for ln in lines[start + 1:]:
        if not ln.strip():
            break
        cells = ln.split()
        if len(cells) != len(head):
            raise ValueError(f"{run}/{name}: a row of {len(cells)} cells under {len(head)} "
                             f"columns: {ln!r}")
        rows.append([_num(c) for c in cells])
    return pd.DataFrame(rows, columns=head)


# ---------------------------------------------------------------------------------------------
# NVIDIA TileGym's cuTile attention timed beside ours (results/<gpu>/tilegym/)
# ---------------------------------------------------------------------------------------------
TILEGYM_DIR = "tilegym"
# The recorded parts: forward causal and non-causal, the causal backward, and decode.
TILEGYM_PARTS = ("fwd_causal", "fwd_full", "bwd_causal", "decode")
# Our row in each part: the forward's ``best``, the backward's kernel, the decode kernel.
TILEGYM_OURS = {"fwd_causal": "best", "fwd_full": "best", "bwd_causal": "fmha_bwd",
                "decode": "decode"}
TILEGYM_LABELS = {"best": "ours (best)", "best#2": "ours (best, control)", "fmha_bwd": "ours",
                  "fmha_bwd_atomic": "ours, atomics", "decode": "ours (flashattn.decode)",
                  "square_best": "ours, square forward", "tilegym": "TileGym (cuTile)",
                  "sdpa_cudnn": "cuDNN", "sdpa_flash": "FlashAttention-2"}


def tilegym_doc(part: str, gpu: str = "h200", root=None) -> dict:
    """The recorded document of one TileGym comparison ``part`` (``TILEGYM_PARTS``)."""
    if part not in TILEGYM_PARTS:
        raise ValueError(f"unknown TileGym part {part!r}; expected one of {TILEGYM_PARTS}")
    path = results_root(root) / gpu / TILEGYM_DIR / f"{part}.json"
    doc = _read(path)
    if not doc or "rows" not in doc:
        raise FileNotFoundError(f"no TileGym recording at {path}(.xz)")
    return doc


def tilegym_frame(part: str, gpu: str = "h200", root=None):
    """The timed rows of one TileGym ``part`` (error rows and rows without a time dropped);
    ``.attrs["meta"]`` holds the document's meta (its date and ``build``)."""
    doc = tilegym_doc(part, gpu, root)
    df = to_frame(doc)
    ok = df["error"].isna() | (df["error"].fillna("") == "") if "error" in df else True
    df = df[ok & df["median_ms"].notna()].reset_index(drop=True)
    df.attrs["meta"] = doc.get("meta", {})
    return df


def tilegym_range(part: str, impl: str | None = None, value: str = "ratio_cudnn",
                  gpu: str = "h200", root=None) -> tuple[float, float]:
    """(min, max) of ``value`` over the lengths of ``part`` for ``impl`` (default: TileGym).
    For decode, whose rows carry times, ``value="speed_cudnn"`` is cuDNN's time over the row's."""
    df = tilegym_frame(part, gpu, root)
    d = df[df["impl"] == (impl or "tilegym")]
    if d.empty:
        raise KeyError(f"no {impl or 'tilegym'!r} rows in TileGym part {part!r}")
    if value == "speed_cudnn":
        ref = df[df["impl"] == "sdpa_cudnn"].set_index("Nk")["median_ms"]
        v = ref.reindex(d["Nk"]).to_numpy() / d["median_ms"].to_numpy()
    else:
        v = d[value].to_numpy()
    return float(v.min()), float(v.max())


def tilegym_tiles(gpu: str = "h200", root=None) -> dict[str, list[str]]:
    """The tiles TileGym's own autotuner chose, per part, from the recorded log
    (``tilegym_bench.log``: its chosen configuration is the line starting with ``*``):
    ``{"fwd_causal": ["128x128 occ=2"], "bwd_causal": ["64x64"], ...}``."""
    import re
    path = results_root(root) / gpu / TILEGYM_DIR / "tilegym_bench.log"
    if not path.exists():
        raise FileNotFoundError(f"no TileGym log at {path}")
    out: dict[str, list[str]] = {}
    part = None
    for line in path.read_text().splitlines():
        head = re.match(r"==> .*/(\w+)\.txt <==", line)
        if head:
            part = head.group(1)
            continue
        chosen = re.match(r"\* namespace\((.*)\):", line)
        if chosen and part:
            kv = dict(re.findall(r"(\w+)=(\d+)", chosen.group(1)))
            tile = f"{kv['TILE_M']}x{kv['TILE_N']}"
            if "occupancy" in kv:
                tile += f" occ={kv['occupancy']}"
            if tile not in out.setdefault(part, []):
                out[part].append(tile)
    return out


def tilegym_table(part: str, gpu: str = "h200", root=None, labels: bool = True):
    """Rows: implementation (ours, its control, TileGym, the libraries); columns: N (keys for
    decode); values: the speed over cuDNN's (cuDNN's time over the row's, paired by round for
    the forward and backward, medians for decode)."""
    df = tilegym_frame(part, gpu, root)
    n = "Nk" if part == "decode" else "Nq"
    if part == "decode":
        ref = df[df["impl"] == "sdpa_cudnn"].set_index(n)["median_ms"]
        df = df.assign(ratio_cudnn=ref.reindex(df[n]).to_numpy() / df["median_ms"].to_numpy())
    t = df.pivot_table(index="impl", columns=n, values="ratio_cudnn", sort=False)
    order = [TILEGYM_OURS[part], "best#2", "tilegym", "sdpa_cudnn", "sdpa_flash"]
    t = t.reindex([i for i in order if i in t.index] + [i for i in t.index if i not in order])
    t.columns = [f"{c // 1024}K" for c in t.columns]
    if labels:
        t.index = [TILEGYM_LABELS.get(i, i) for i in t.index]
    t.index.name, t.columns.name = "impl", ("keys" if part == "decode" else "N")
    return t


# ---------------------------------------------------------------------------------------------
# Numbers quoted from others (not measured by us)
# ---------------------------------------------------------------------------------------------
def seed_b200(root=None):
    """The seed walkthrough's B200 TFLOPS, impl (book order) x N: quoted, not measured by us.

    From ``results/quoted/seed-b200.json`` (a bench document of the seed's workload, causal,
    B=4, H=32, D=128, fp16, with only ``tflops`` set; its ``meta`` says where each table is in
    the seed text). Values are the seed's integers. ``.attrs["meta"]`` holds that meta.
    """
    path = results_root(root) / SEED_B200_FILE
    doc = _read(path)
    if not doc or "rows" not in doc:
        raise FileNotFoundError(f"no quoted seed numbers at {path}")
    df = to_frame(doc)
    t = df.pivot(index="impl", columns="Nq", values="tflops")
    t = t.reindex(sorted(t.index, key=rank))
    t = t.reindex(columns=sorted(t.columns))
    t.index.name, t.columns.name = "impl", "N"
    t.attrs["meta"] = doc.get("meta", {})
    return t


_SUMMARY_KEYS = ("gpu", "sm_count", "compute_capability", "arch", "driver", "cuda", "torch",
                 "cuda_tile", "tileiras", "python", "platform", "date")


def _merge_meta(*metas: dict) -> dict:
    """The first non-empty value of each summary key, over bench, profile and compile metas."""
    out = {}
    for key in _SUMMARY_KEYS:
        for m in metas:
            if m and m.get(key) not in (None, "", "unknown"):
                out[key] = m[key]
                break
        else:
            out[key] = None
    return out


def load(gpu: str = "h200", root=None, *, experiments=None) -> Results:
    """The results recorded for ``gpu`` under ``root`` (default: the repo's results/);
    ``experiments``: where ``Results.experiment`` looks (default ``experiments_root()``)."""
    d = results_root(root) / gpu
    bench, bench_meta = _load_bench(d)
    profile, units, rules, profile_meta = _load_profile(d)
    comp, compile_meta = _load_compile(d)
    tiles, tiles_meta = _load_tile_grid(d)
    meta = _merge_meta(*bench_meta.values(), profile_meta, *compile_meta.values())
    meta["results"] = gpu
    return Results(gpu=gpu, path=d, bench=bench, bench_meta=bench_meta, profile=profile,
                   profile_units=units, profile_meta=profile_meta, rules=rules, compile=comp,
                   compile_meta=compile_meta, tile_grid=tiles, tile_grid_meta=tiles_meta,
                   meta=meta, experiments_path=experiments_root(experiments))


def source_line(meta) -> str:
    """Where numbers come from, in one line for a notebook:
    "H200 (132 SMs), driver 580.159, CUDA 13.0, torch 2.11.0, cuda-tile 1.7.0, tileiras 13.4.92,
    2026-11-30". Accepts a meta dict or a ``Results``."""
    if isinstance(meta, Results):
        meta = meta.meta
    meta = meta or {}
    gpu = meta.get("gpu")
    parts = []
    if gpu:
        name = str(gpu)
        if name.startswith("NVIDIA "):
            name = name[len("NVIDIA "):]
        parts.append(f"{name} ({meta['sm_count']} SMs)" if meta.get("sm_count") else name)
    else:
        parts.append("no GPU")
    for key, label in (("driver", "driver"), ("cuda", "CUDA"), ("torch", "torch"),
                       ("cuda_tile", "cuda-tile"), ("tileiras", "tileiras")):
        if meta.get(key):
            parts.append(f"{label} {meta[key]}")
    if meta.get("date"):
        parts.append(str(meta["date"])[:10])
    return ", ".join(parts)


__all__ = ["load", "available", "Results", "source_line", "results_root", "DEFAULT_WORKLOAD",
           "LIBRARY_IMPLS", "experiments_root", "list_experiments", "load_experiment",
           "load_experiment_meta", "load_experiment_file", "load_experiment_profile",
           "load_experiment_table", "load_experiment_log_table", "seed_b200", "TILE_GRID_FILE", "SEED_B200_FILE",
           "json_docs"]
