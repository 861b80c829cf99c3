"""The chapter's tables of the recorded decode, crossover, host and varlen rows."""
from __future__ import annotations

import pandas as pd

from .arith import _fmt_n
from .data import FINAL_RUN, DecodeData


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


def host_table(d: DecodeData | None = None, *, run: str | None = None, root=None) -> pd.DataFrame:
    """Per implementation and mode: the kernel time, the host time of one call, the wall time of
    a call on an idle GPU and the overhead (wall - kernel), in µs; of the recorded dataset
    ``d``, or of a second host run kept with an experiment (``run``, e.g. ``FINAL_RUN``:
    ``host-2.json``)."""
    if run is not None:
        from ...data.results import experiments_root
        from ...data.schema import read_json, to_frame
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
    from ...data.results import load_experiment_file
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
