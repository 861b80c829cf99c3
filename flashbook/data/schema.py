"""The schema of recorded benchmark results, owned by the CPU-only reader.

A bench document is ``{"meta": {...}, "rows": [row, ...]}``, one row per implementation and
shape (``ROW_FIELDS``); ``results/README.md`` documents every field. ``measure.bench`` writes
rows through ``make_row`` and ``add_derived``; ``data.results`` reads them through ``to_frame``.
Nothing here needs a GPU or imports the measuring code.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from flashattn.contract import DTYPE_SHORT
from ..impls import RATIO_REF, base_name, rank
from flashbook.steps import STEP_NAMES
from flashattn.stats import ratio_ci

ROW_FIELDS = ("impl", "kind", "config", "B", "Hq", "Hkv", "Nq", "Nk", "D", "dtype", "causal",
              "median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "reps", "spread", "tflops",
              "speedup_prev", "ratio_cudnn", "max_abs_err", "error",
              # since the rounds method (chapter 3): 95 % intervals, per-round samples,
              # the host time of one call, and a discriminating error measure
              "ci_lo_ms", "ci_hi_ms", "ratio_cudnn_lo", "ratio_cudnn_hi", "method", "host_ms",
              "rel_rms_err", "samples_ms")
TIMING_FIELDS = ("median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "reps", "spread")
NUMERIC_FIELDS = ("median_ms", "q1_ms", "q3_ms", "min_ms", "max_ms", "spread", "tflops",
                  "speedup_prev", "ratio_cudnn", "max_abs_err", "ci_lo_ms", "ci_hi_ms",
                  "ratio_cudnn_lo", "ratio_cudnn_hi", "host_ms", "rel_rms_err")
SKIPPED = "skipped"        # errors starting with this are skips, not failures


def workload_name(dtype: str = "float16", causal: bool = True, head_dim: int = 128,
                  Hq: int = 32, Hkv: int | None = None) -> str:
    """"fp16-causal-d128", "bf16-full-d64", "fp16-causal-d128-gqa32x8"."""
    dtype = str(dtype).replace("torch.", "")
    name = f"{DTYPE_SHORT.get(dtype, dtype)}-{'causal' if causal else 'full'}-d{head_dim}"
    if Hkv is not None and Hkv != Hq:
        name += f"-gqa{Hq}x{Hkv}"
    return name


def make_row(impl: str, kind: str, *, B, Hq, Hkv, N, D, dtype, causal, config="", error=None,
         **values) -> dict:
    row = dict.fromkeys(ROW_FIELDS)
    row.update(impl=impl, kind=kind, config=config, B=B, Hq=Hq, Hkv=Hkv, Nq=N, Nk=N, D=D,
               dtype=dtype, causal=bool(causal), error=error)
    row.update(values)
    return row


def _ok(row: dict | None) -> bool:
    return bool(row) and not row.get("error") and row.get("tflops") not in (None, 0)


def add_derived(rows: list[dict]) -> list[dict]:
    """Fill ``speedup_prev`` and ``ratio_cudnn`` in place (and return ``rows``).

    speedup_prev: a step's TFLOPS over those of the step before it in ``STEP_NAMES`` at the
    same shape (None for the first step, for ``best`` and libraries, or when either is missing
    or failed). ratio_cudnn: TFLOPS over those of ``sdpa_cudnn`` at the same shape.
    """
    def key(r):
        return (r["B"], r["Hq"], r["Hkv"], r["Nq"], r["Nk"], r["D"], r["dtype"], r["causal"])
    by = {(r["impl"], key(r)): r for r in rows}
    for r in rows:
        r["speedup_prev"] = r["ratio_cudnn"] = None
        r["ratio_cudnn_lo"] = r["ratio_cudnn_hi"] = None
        if not _ok(r):
            continue
        if r["impl"] in STEP_NAMES:
            i = STEP_NAMES.index(r["impl"])
            prev = by.get((STEP_NAMES[i - 1], key(r))) if i > 0 else None
            if _ok(prev):
                r["speedup_prev"] = r["tflops"] / prev["tflops"]
        ref = by.get((RATIO_REF, key(r)))
        if _ok(ref):
            r["ratio_cudnn"] = r["tflops"] / ref["tflops"]
            if r.get("samples_ms") and ref.get("samples_ms"):
                # Timed in the same rounds: the paired estimate and its interval.
                r["ratio_cudnn"], r["ratio_cudnn_lo"], r["ratio_cudnn_hi"] = ratio_ci(
                    ref["samples_ms"], r["samples_ms"])
    return rows


def to_frame(doc: dict):
    """The rows of a bench document as a DataFrame, with a ``workload`` column."""
    import pandas as pd
    rows = doc.get("rows", []) if isinstance(doc, dict) else list(doc)
    df = pd.DataFrame(rows, columns=list(ROW_FIELDS) if not rows else None)
    for c in ROW_FIELDS:
        if c not in df.columns:
            df[c] = None
    wl = (doc.get("meta", {}).get("workload", {}) or {}).get("name") if isinstance(doc, dict) \
        else None
    df.insert(0, "workload", wl)
    for c in NUMERIC_FIELDS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def format_table(doc: dict) -> str:
    """Rows = implementations (book order), columns = N, cells = TFLOPS ('err', 'skip')."""
    rows = doc["rows"]
    ns = sorted({r["Nq"] for r in rows})
    impls = sorted({r["impl"] for r in rows}, key=rank)
    cell = {}
    for r in rows:
        if r.get("error"):
            cell[r["impl"], r["Nq"]] = "skip" if str(r["error"]).startswith(SKIPPED) else "err"
        else:
            cell[r["impl"], r["Nq"]] = f"{r['tflops']:.1f}"
    head = ["TFLOPS"] + [f"N={n}" for n in ns] + ["config"]
    configs = {}
    for r in rows:
        configs.setdefault(r["impl"], r.get("config") or "")
    body = [[i] + [cell.get((i, n), "") for n in ns] + [configs[i]] for i in impls]
    w = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    fmt = lambda row: "  ".join(str(x).rjust(w[j]) if 0 < j <= len(ns) else str(x).ljust(w[j])  # noqa: E731
                                for j, x in enumerate(row)).rstrip()
    errors = [f"  {r['impl']} N={r['Nq']}: {r['error']}" for r in rows
              if r.get("error") and not str(r["error"]).startswith(SKIPPED)]
    wl = doc.get("meta", {}).get("workload", {})
    title = (f"{wl.get('name', '')}: B={wl.get('B')} Hq={wl.get('Hq')} Hkv={wl.get('Hkv')} "
             f"D={wl.get('D')} {wl.get('dtype')} {'causal' if wl.get('causal') else 'full'}")
    out = [title, fmt(head)] + [fmt(b) for b in body]
    if errors:
        out += ["errors:"] + errors
    return "\n".join(out)


def _clean(x):
    """NaN/inf -> None, so the JSON is strict."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def dumps(doc: dict) -> str:
    return json.dumps(_clean(doc), indent=1, allow_nan=False)


def json_path(path) -> Path | None:
    """``path`` if it exists, else its xz-compressed twin ``path.xz`` if that exists, else None.
    Large recorded documents (profile summaries, decode tables) are committed compressed to
    keep the repository small; every reader goes through ``read_json``."""
    path = Path(path)
    if path.exists():
        return path
    xz = path.with_name(path.name + ".xz")
    return xz if xz.exists() else None


def read_json(path):
    """The parsed JSON at ``path`` or at ``path.xz`` (``json_path``). Raises FileNotFoundError
    when neither exists, ValueError when it is not JSON."""
    found = json_path(path)
    if found is None:
        raise FileNotFoundError(f"no file {path} (nor {Path(path).name}.xz)")
    if found.suffix == ".xz":
        import lzma
        text = lzma.decompress(found.read_bytes()).decode()
    else:
        text = found.read_text()
    return json.loads(text)


def write_json(path, doc: dict) -> Path:
    """Write ``doc`` as JSON atomically (a temporary file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(dumps(doc) + "\n")
    os.replace(tmp, path)
    return path




# --- decode and varlen benchmarks (measure/bench_decode.py, issue 12) -----------------------------
# A decode-bench document has the same shape, {"meta": {...}, "rows": [row, ...]}: every row has
# the ROW_FIELDS (Nq = new tokens per sequence, Nk = cache length; tflops stays None: decoding is
# memory-bound) plus DECODE_FIELDS. ``meta["hbm_peak_tbps"]`` is the peak that ``frac_peak``
# divides by, ``meta["parts"]`` what was measured.
DECODE_FIELDS = ("part", "page_size", "kv_bytes", "gbps", "frac_peak", "ratio_best_torch",
                 "graph", "wall_ms", "overhead_ms", "total_tokens", "lens")
DECODE_NUMERIC_FIELDS = ("page_size", "kv_bytes", "gbps", "frac_peak", "ratio_best_torch",
                         "wall_ms", "overhead_ms", "total_tokens")
DECODE_PARTS = ("decode", "host", "crossover", "varlen")


def kv_bytes(B: int, Hkv: int, Nk: int, D: int, elem_bytes: int = 2) -> int:
    """Bytes of K and V a decode step must read: every visible key and value once
    (``B x Hkv x Nk x D`` of each, ``elem_bytes`` per element: 2 for fp16/bf16)."""
    return 2 * int(B) * int(Hkv) * int(Nk) * int(D) * int(elem_bytes)


def make_decode_row(impl: str, kind: str, *, part: str, B, Hq, Hkv, Nq, Nk, D, dtype,
                    causal=True, config="", error=None, **values) -> dict:
    """A row of a decode-bench document: ``make_row``'s fields with Nq and Nk set apart, and
    the DECODE_FIELDS (missing ones None)."""
    row = make_row(impl, kind, B=B, Hq=Hq, Hkv=Hkv, N=Nq, D=D, dtype=dtype, causal=causal,
                   config=config, error=error)
    row["Nk"] = Nk
    row.update(dict.fromkeys(DECODE_FIELDS))
    row["part"] = part
    row.update(values)
    return row


def add_decode_derived(rows: list[dict], *, peak_tbps: float | None) -> list[dict]:
    """Fill ``gbps`` (kv_bytes / median time), ``frac_peak`` (over ``peak_tbps``; None without
    a known peak) and ``ratio_best_torch`` (the fastest PyTorch row's time over this row's, at
    the same part and shape: > 1 means faster than every PyTorch path) in place."""
    def key(r):
        return (r.get("part"), r["B"], r["Hq"], r["Hkv"], r["Nq"], r["Nk"], r["D"], r["dtype"],
                r.get("total_tokens"))
    best = {}
    for r in rows:
        ok = not r.get("error") and r.get("median_ms")
        if ok and r.get("kind") == "library":
            k = key(r)
            best[k] = min(best.get(k, math.inf), r["median_ms"])
    for r in rows:
        if r.get("error") or not r.get("median_ms"):
            continue
        if r.get("kv_bytes"):
            r["gbps"] = r["kv_bytes"] / (r["median_ms"] * 1e-3) / 1e9
            r["frac_peak"] = r["gbps"] / (peak_tbps * 1e3) if peak_tbps else None
        ref = best.get(key(r))
        r["ratio_best_torch"] = ref / r["median_ms"] if ref else None
    return rows


def decode_frame(doc: dict):
    """The rows of a decode-bench document as a DataFrame (ROW_FIELDS + DECODE_FIELDS)."""
    import pandas as pd
    rows = doc.get("rows", []) if isinstance(doc, dict) else list(doc)
    cols = list(ROW_FIELDS) + list(DECODE_FIELDS)
    df = pd.DataFrame(rows, columns=cols if not rows else None)
    for c in cols:
        if c not in df.columns:
            df[c] = None
    for c in NUMERIC_FIELDS + DECODE_NUMERIC_FIELDS:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def format_decode_table(doc: dict) -> str:
    """One line per row: part, shape, implementation, time, GB/s, fraction of peak, ratio to
    the fastest PyTorch path (or the error)."""
    head = ("part", "B", "Nq", "Nk", "impl", "ms", "GB/s", "peak", "vs torch", "config")
    body = []
    for r in doc.get("rows", []):
        if r.get("error"):
            cells = ["skip" if str(r["error"]).startswith(SKIPPED) else "err", "", "", "",
                     str(r["error"])[:60]]
        else:
            def f(x, fmt):
                return "" if x is None else format(x, fmt)
            ms = r.get("median_ms")
            if r.get("part") == "host":
                cells = [f(ms, ".4f"), "", "", "",
                         f"host {f(r.get('host_ms'), '.4f')} ms, overhead "
                         f"{f(r.get('overhead_ms'), '.4f')} ms"]
            else:
                cells = [f(ms, ".4f"), f(r.get("gbps"), ".0f"), f(r.get("frac_peak"), ".0%"),
                         f(r.get("ratio_best_torch"), ".2f") + ("x" if r.get(
                             "ratio_best_torch") is not None else ""), r.get("config") or ""]
        nk = r.get("Nk") if r.get("part") != "varlen" else r.get("total_tokens")
        body.append([r.get("part") or "", r["B"], r["Nq"], nk, r["impl"], *cells])
    w = [max(len(str(x)) for x in col) for col in zip(head, *body)] if body else \
        [len(h) for h in head]
    line = lambda row: "  ".join(str(x).ljust(w[j]) for j, x in enumerate(row)).rstrip()  # noqa: E731
    meta = doc.get("meta", {})
    title = (f"decode-bench on {meta.get('gpu')}: HBM peak {meta.get('hbm_peak_tbps')} TB/s "
             f"({meta.get('hbm_peak_source') or 'unknown GPU: no fraction of peak'})")
    return "\n".join([title, line(head)] + [line(b) for b in body])
