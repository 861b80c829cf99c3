"""The recorded decode measurements of one GPU (``results/<gpu>/decode/``, the decode
profiles) and the names of the runs the chapter reads: ``load()`` gives a ``DecodeData``."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ...hardware import HBM_TBS, SM_COUNT
from ..page import DEFAULT_GPU

SWEEP_RUN = "26-decode-sweep"  # experiments/data/<run>/: split count, combine, varlen grid
FINAL_RUN = "34-final"         # experiments/data/<run>/: the last recorded GPU run
OURS = ("decode", "decode_paged16", "decode_paged64")
TORCH = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_math", "flex")


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
        return float(self.meta.get("hbm_peak_tbps") or HBM_TBS)

    @property
    def sm_count(self) -> int:
        return int(self.meta.get("sm_count") or SM_COUNT)

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
    from ...data.results import results_root
    from ...data.schema import read_json, to_frame
    base = (results_root() if root is None else root) / gpu
    dec = read_json(base / "decode" / "decode.json")
    cv = to_frame(read_json(base / "decode" / "crossover-varlen.json"))
    host = to_frame(read_json(base / "decode" / "host.json"))
    prof, prof_meta, profiles = pd.DataFrame(), {}, {}
    try:
        from ...data.results import load as load_results
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
            from ...data.results import load_experiment_profile
            profiles["varlen-before"] = load_experiment_profile(
                SWEEP_RUN, "profiles-before/varlen/summary.json")
        except (FileNotFoundError, ValueError):
            pass
    return DecodeData(decode=to_frame(dec), crossover=cv[cv["part"] == "crossover"].copy(),
                      varlen=cv[cv["part"] == "varlen"].copy(), host=host,
                      meta=dict(dec.get("meta", {})), profile=prof, profile_meta=prof_meta or {},
                      profiles=profiles)
