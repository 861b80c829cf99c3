"""Nsight Compute profiles of the steps (chapter 4 and the "evidence" part of every chapter).

    python -m flashbook profile --step baseline --step remap [--seqlen 4096] [--out DIR]

On a machine with a CUDA GPU and ``ncu`` this runs Nsight Compute once over
``python -m flashbook.measure.target`` (one warm-up and one measured launch per step, the
measured one inside the NVTX range ``step:NAME``) and turns the report into a tidy summary::

    {"meta":  {...},                                   # workload, GPU, ncu version, command
     "rows":  [{"step", "kernel", "metric", "value", "unit"}, ...],
     "rules": [{"step", "kernel", "section", "rule", "type", "message"}, ...]}

written to ``DIR/summary.json`` (merged: rows of the steps profiled again are replaced). Elsewhere
it prints the ``ncu`` command it would run and the recorded summary of each step under
``results/<gpu>/profiles/`` (``summary.json``, ``n1024/summary.json``, ...) at the asked shape,
or, when the step was recorded at other shapes only, the closest one, saying which
(``show_recorded``), and exits 0.

How kernels are selected. By default ncu profiles only kernels launched inside an NVTX push/pop
range whose name matches ``step:.*`` (``--nvtx --nvtx-include "regex:step:.*/"``; the trailing
``/`` marks a push/pop range of the default domain, ``Domain@Range/`` one of a named domain), so
warm-up launches, autotune searches and PyTorch's own kernels are skipped. Each profiled kernel
keeps its NVTX state, which is how a kernel is mapped to its step. ``--filter kernel`` is the
fallback if NVTX filtering ever selects nothing: ncu then profiles every launch of a kernel named
like ours (``-k regex:...``, warm-ups included, still with ``--nvtx``) and the summary keeps only
the launches inside a ``step:`` range; without NVTX information it maps launches to steps by order,
from the manifest ``profile_target`` writes (launches per warm-up and per measured range).

Clocks are never locked: every command passes ``--clock-control none`` (ncu's default, ``base``,
locks them to base clocks and makes ncu's durations disagree with CUDA-event timings).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..data.schema import json_path, read_json
from .target import nvtx_decode

SECTIONS = ("LaunchStats", "Occupancy", "SpeedOfLight", "ComputeWorkloadAnalysis",
            "MemoryWorkloadAnalysis", "WarpStateStats", "SchedulerStats")
# Collected on top of the sections: DRAM bytes for the roofline, local-memory (spill) traffic.
# Instructions executed (chapter 7: the loop split's saving) and SM-active cycles against the
# elapsed ones (chapter 8: the idle SMs of the last wave).
EXTRA_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum",
                 "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
                 "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
                 "smsp__inst_executed.sum", "sm__cycles_active.avg", "sm__cycles_elapsed.avg")
NVTX_INCLUDE = "regex:step:.*/"
# The cuTile kernels of flashattn.kernels (fused, and the three of the naive step).
KERNEL_FILTER = "regex:fmha_kernel|scores_kernel|softmax_kernel|pv_kernel"

# Metrics kept in the summary: any whose name matches one of these.
METRIC_PATTERNS = (
    r"^launch__(?!(context_id|device_id|stream_id|function_pcs)$)",
    r"^sm__maximum_warps_per_active_cycle_pct$",
    r"^sm__warps_active\.avg\.pct_of_peak_sustained_active$",
    r"^sm__throughput\.avg\.pct_of_peak_sustained_elapsed$",
    r"^gpu__dram_throughput\.avg\.pct_of_peak_sustained_elapsed$",
    r"^gpu__compute_memory_throughput\.avg\.pct_of_peak_sustained_elapsed$",
    r"^gpu__time_duration\.sum$",
    r"^dram__bytes_(read|write)\.sum$",
    r"^dram__bytes\.sum(\.per_second)?$",
    # ComputeWorkloadAnalysis: instructions and busy cycles per pipe (tensor, fma, alu, xu=MUFU...)
    r"^sm__inst_executed_pipe_\w+\.avg\.pct_of_peak_sustained_active$",
    r"^sm__pipe_\w+_cycles_active\.avg\.pct_of_peak_sustained_(active|elapsed)$",
    r"^sm__instruction_throughput\.avg\.pct_of_peak_sustained_active$",
    r"^smsp__inst_executed\.(sum|avg\.per_cycle_active)$",
    r"^sm__cycles_(elapsed|active)\.(avg|min|max)(\.per_second)?$",
    r"^gpc__cycles_elapsed\.max$",
    # The memory chart's busiest paths (MemoryWorkloadAnalysis): L2 to SM crossbar, sectors
    r"^lts__lts2xbar_cycles_active\.avg\.pct_of_peak_sustained_elapsed$",
    r"^lts__t_sectors\.sum$",
    r"^l1tex__m_xbar2l1tex_read_sectors\.sum$",
    r"^l1tex__data_pipe_lsu_wavefronts\.sum$",
    # Local memory = register spills and stack (MemoryWorkloadAnalysis and the extra metrics)
    r"^l1tex__t_bytes_pipe_lsu_mem_local_op_(ld|st)\.sum$",
    r"^derived__local_spilling_requests(_pct)?$",
    r"^sass__inst_executed_register_spilling",
    r"^lts__t_sector_hit_rate\.pct$",
    # WarpStateStats (why warps stall, per issued instruction) and SchedulerStats (issue rate)
    r"^smsp__average_warps_issue_stalled_\w+_per_issue_active\.ratio$",
    r"^smsp__average_warp_latency_per_inst_issued\.ratio$",
    r"^smsp__issue_active\.avg\.(pct_of_peak_sustained_active|per_cycle_active)$",
    r"^smsp__warps_(eligible|active)\.avg\.per_cycle_active$",
    r"^l1tex__t_sector_hit_rate\.pct$",
)
_METRIC_RE = re.compile("|".join(METRIC_PATTERNS))

# Short names for the table printed on the command line and shown in the book.
KEY_METRICS = {
    "registers": "launch__registers_per_thread",
    "smem_static_B": "launch__shared_mem_per_block_static",
    "smem_dynamic_B": "launch__shared_mem_per_block_dynamic",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "waves": "launch__waves_per_multiprocessor",
    "occ_theory_%": "sm__maximum_warps_per_active_cycle_pct",
    "occ_achieved_%": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "sm_%": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_%": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "mem_%": "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "local_ld_B": "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "local_st_B": "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    "duration_ns": "gpu__time_duration.sum",
}

DEVICE_ATTRS = ("device__attribute_display_name", "device__attribute_multiprocessor_count")
MSG_TYPES = {0: "NONE", 1: "OK", 2: "OPTIMIZATION", 3: "WARNING", 4: "ERROR"}
# The CSV pages abbreviate rule types.
CSV_TYPES = {"OPT": "OPTIMIZATION", "WRN": "WARNING", "WARN": "WARNING", "ERR": "ERROR",
             "INF": "OK", "INFO": "OK"}
REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------
def target_args(steps, *, seqlen=4096, batch=4, heads=32, kv_heads=None, head_dim=128,
                dtype="float16", causal=True, manifest=None) -> list[str]:
    """Arguments of ``python -m flashbook.measure.target`` for these steps and shape."""
    args = ["-m", "flashbook.measure.target", "--step", ",".join(steps), "--seqlen", str(seqlen),
            "--batch", str(batch), "--heads", str(heads), "--head-dim", str(head_dim),
            "--dtype", dtype, "--causal" if causal else "--no-causal"]
    if kv_heads is not None and kv_heads != heads:
        args += ["--gqa", f"{heads}:{kv_heads}"]
    if manifest is not None:
        args += ["--manifest", str(manifest)]
    return args


def ncu_command(steps, out_base, *, ncu="ncu", python=None, filter="nvtx", **shape) -> list[str]:
    """The exact ncu argv that profiles ``steps`` into ``out_base.ncu-rep``.

    ``filter="nvtx"`` selects kernels by NVTX range (default), ``"kernel"`` by kernel name.
    ``shape`` takes the keywords of ``target_args`` (seqlen, batch, heads, kv_heads, ...).
    """
    cmd = [ncu, "--clock-control", "none", "--nvtx"]
    if filter == "nvtx":
        cmd += ["--nvtx-include", NVTX_INCLUDE]
    elif filter == "kernel":
        cmd += ["-k", KERNEL_FILTER]
    else:
        raise ValueError(f"filter must be 'nvtx' or 'kernel', got {filter!r}")
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += ["--metrics", ",".join(EXTRA_METRICS)]
    cmd += ["-o", str(out_base), "-f", python or sys.executable]
    return cmd + target_args(steps, **shape)


def ncu_version(ncu="ncu") -> str:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    m = re.search(r"Version\s+(\S+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1] if out.strip() else "unknown"


def have_gpu_and_ncu(ncu="ncu") -> tuple[bool, str]:
    """(True, '') where a CUDA GPU and ncu are both present, else (False, why not)."""
    if shutil.which(ncu) is None and not Path(ncu).is_file():
        return False, f"{ncu!r} is not on PATH"
    try:
        import torch
        if not torch.cuda.is_available():
            return False, "no CUDA GPU visible to PyTorch"
    except ImportError:
        return False, "PyTorch is not installed"
    return True, ""


def profile_steps(steps, out_dir, *, seqlen=4096, causal=True, batch=4, heads=32,
                  kv_heads=None, head_dim=128, dtype="float16", ncu="ncu", name=None,
                  filter="nvtx") -> Path:
    """Profile ``steps`` in one ncu run; returns the report path ``out_dir/NAME.ncu-rep``.

    NAME defaults to the step's name for one step, else ``steps``. A manifest of what ran is
    written beside it (``NAME.manifest.json``). Raises RuntimeError if ncu fails.
    """
    steps = list(steps)
    out_dir = Path(out_dir).resolve()      # ncu runs from the repository root
    out_dir.mkdir(parents=True, exist_ok=True)
    name = name or (steps[0] if len(steps) == 1 else "steps")
    base = out_dir / name
    manifest = out_dir / f"{name}.manifest.json"
    cmd = ncu_command(steps, base, ncu=ncu, filter=filter, seqlen=seqlen, batch=batch,
                      heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                      causal=causal, manifest=manifest)
    print("running: " + shlex.join(cmd), file=sys.stderr)
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    (out_dir / f"{name}.ncu.log").write_text(res.stdout + res.stderr)
    report = base.with_name(base.name + ".ncu-rep")
    if res.returncode != 0 or not report.exists():
        tail = "\n".join((res.stdout + res.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"ncu failed (exit {res.returncode}); the end of its output:\n{tail}")
    if "No kernels were profiled" in res.stdout + res.stderr:
        raise RuntimeError("ncu profiled no kernels: check the NVTX filter (try --filter kernel)")
    return report


# ---------------------------------------------------------------------------------------------
# Reading a report
# ---------------------------------------------------------------------------------------------
_LINK = re.compile(r"@(url|sass|source|section):([^@]*)@")


def clean_message(msg: str) -> str:
    """Drop ncu's link markup (``@url:text:link@``, ``@section:id:text@``) and keep the text."""
    def repl(m):
        kind, body = m.group(1), m.group(2)
        return body.split(":", 1)[0] if kind == "url" else body.rsplit(":", 1)[-1]
    return re.sub(r"\s+", " ", _LINK.sub(repl, msg or "")).strip()


def keep_metric(name: str) -> bool:
    return bool(_METRIC_RE.search(name))


def _numeric(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    if isinstance(v, str):
        try:
            return float(v.replace(",", ""))
        except ValueError:
            return None
    return None


def step_of_action(action) -> str | None:
    """The step whose NVTX range ``step:NAME`` encloses this profiled kernel, if any."""
    try:
        state = action.nvtx_state()
    except Exception:
        return None
    if state is None:
        return None
    for dom_id in state.domains():
        dom = state.domain_by_id(dom_id)
        if dom is None:
            continue
        for r in dom.push_pop_ranges():
            if r.startswith("step:"):
                return nvtx_decode(r[len("step:"):])
        for r in getattr(dom, "start_end_ranges", lambda: ())():
            if r.startswith("step:"):
                return nvtx_decode(r[len("step:"):])
    return None


def _order_labels(n_actions: int, manifest: dict | None, profiled_warmups: bool) -> list:
    """Step of each action by launch order, from the manifest; None for warm-ups / unknown."""
    labels: list = []
    if not manifest:
        return [None] * n_actions
    for s in manifest.get("steps", []):
        if profiled_warmups:
            labels += [None] * int(s.get("warmup_launches", 0))
        labels += [s["step"]] * int(s.get("launches", 0))
    return (labels + [None] * n_actions)[:n_actions]


def _dedupe(kernels: list[tuple[str, str]]) -> list[str]:
    """'k', 'k' within one step -> 'k', 'k#2' (the naive step launches per chunk)."""
    seen: dict = {}
    out = []
    for step, k in kernels:
        seen[(step, k)] = seen.get((step, k), 0) + 1
        out.append(k if seen[(step, k)] == 1 else f"{k}#{seen[(step, k)]}")
    return out


def _rule_dicts(action) -> list[dict]:
    if hasattr(action, "rule_results_as_dicts"):
        return list(action.rule_results_as_dicts())
    out = []
    for r in getattr(action, "rule_results", lambda: ())():
        out.append(dict(name=r.name(), rule_identifier=r.rule_identifier(),
                        section_identifier=r.section_identifier(), rule_message=r.rule_message()))
    return out


def summarize_context(ctx, manifest: dict | None = None, filter: str = "nvtx") -> dict:
    """Rows and rules from an ``ncu_report`` context (or any object with its interface)."""
    actions = []
    for i in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(i)
        for j in range(rng.num_actions()):
            actions.append(rng.action_by_idx(j))
    by_nvtx = [step_of_action(a) for a in actions]
    if any(s is not None for s in by_nvtx):
        steps = by_nvtx
    else:
        steps = _order_labels(len(actions), manifest, profiled_warmups=(filter == "kernel"))
    picked = [(s, a) for s, a in zip(steps, actions) if s is not None]
    names = _dedupe([(s, short_kernel(a.name())) for s, a in picked])
    rows, rules, device = [], [], {}
    for (step, a), kernel in zip(picked, names):
        for m in DEVICE_ATTRS:
            metric = a.metric_by_name(m) if m in a.metric_names() else None
            if metric is not None:
                device[m] = metric.value()
        for m in sorted(a.metric_names()):
            if not keep_metric(m):
                continue
            metric = a.metric_by_name(m)
            if metric is None:
                continue
            v = metric.value()
            num = _numeric(v)
            if num is None:
                continue
            unit = metric.unit() if hasattr(metric, "unit") else ""
            rows.append(dict(step=step, kernel=kernel, metric=m, value=num, unit=unit or ""))
        for r in _rule_dicts(a):
            msg = r.get("rule_message") or {}
            t = msg.get("type", 0)
            t = MSG_TYPES.get(int(t), str(t)) if not isinstance(t, str) else t
            text = clean_message(msg.get("message", ""))
            if not text:
                continue
            rule = dict(step=step, kernel=kernel, section=r.get("section_identifier", ""),
                        rule=r.get("rule_identifier") or r.get("name", ""), type=t,
                        message=text)
            sp = r.get("speedup_estimation")
            if sp and sp.get("speedup") is not None:
                rule["speedup_pct"] = float(sp["speedup"])
            rules.append(rule)
    meta = {}
    if "device__attribute_display_name" in device:
        meta["gpu_name"] = device["device__attribute_display_name"]
    if "device__attribute_multiprocessor_count" in device:
        meta["sm_count"] = _numeric(device["device__attribute_multiprocessor_count"])
    return dict(meta=meta, rows=rows, rules=rules)


def import_ncu_report(ncu="ncu"):
    """The ``ncu_report`` module: installed (the ``ncu-report`` wheel), else the one in ncu's
    own ``extras/python`` folder; None if neither is found."""
    try:
        import ncu_report
        return ncu_report
    except ImportError:
        pass
    exe = shutil.which(ncu)
    if exe:
        for root in (Path(exe).resolve().parent, Path(exe).resolve().parent.parent):
            extras = root / "extras" / "python"
            if (extras / "ncu_report.py").exists():
                sys.path.append(str(extras))
                try:
                    import ncu_report
                    return ncu_report
                except ImportError:
                    sys.path.remove(str(extras))
    return None


def report_metrics(report_path, metrics, *, ncu="ncu") -> dict:
    """{step: {metric: value}} read from a recorded report (``.ncu-rep`` or ``.ncu-rep.xz``):
    the first profiled kernel of each ``step:NAME`` NVTX range, NaN for a metric the report
    lacks (for counters the summary does not keep: the memory chart's units, per-SM cycles).
    RuntimeError without the ``ncu_report`` module."""
    import lzma
    import math
    import tempfile
    mod = import_ncu_report(ncu)
    if mod is None:
        raise RuntimeError("reading a report needs the ncu_report module (pip install ncu-report)")
    report = Path(report_path)

    def value(action, name):
        m = action.metric_by_name(name) if name in set(action.metric_names()) else None
        if m is None:
            return math.nan
        try:
            return float(m.value())
        except (TypeError, ValueError):
            return math.nan

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = report
        if report.suffix == ".xz":
            path = Path(tmp) / report.stem
            with lzma.open(report) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        ctx = mod.load_report(str(path))
        for ri in range(ctx.num_ranges()):
            rng = ctx.range_by_idx(ri)
            for ai in range(rng.num_actions()):
                a = rng.action_by_idx(ai)
                step = step_of_action(a)
                if step is not None and step not in rows:
                    rows[step] = {m: value(a, m) for m in metrics}
    return rows


def read_manifest(report_path) -> dict | None:
    p = Path(report_path)
    stem = p.name[:-len(".ncu-rep")] if p.name.endswith(".ncu-rep") else p.stem
    m = p.with_name(stem + ".manifest.json")
    return json.loads(m.read_text()) if m.exists() else None


def summarize(report_path, *, manifest: dict | None = None, ncu="ncu",
              filter="nvtx") -> dict:
    """The summary dict of one ``.ncu-rep``: ``{"meta", "rows", "rules"}``.

    Reads it with the ``ncu_report`` module (the ``ncu-report`` wheel, or ncu's own
    ``extras/python``); without it, with ``ncu -i REPORT --csv`` (see ``parse_raw_csv``).
    """
    report_path = Path(report_path)
    if manifest is None:
        manifest = read_manifest(report_path)
    ncu_report = import_ncu_report(ncu)
    if ncu_report is not None:
        s = summarize_context(ncu_report.load_report(str(report_path)), manifest, filter)
        s["meta"]["reader"] = "ncu_report"
    else:
        raw = subprocess.run([ncu, "-i", str(report_path), "--csv", "--page", "raw",
                              "--print-units", "base"], capture_output=True, text=True,
                             check=True).stdout
        det = subprocess.run([ncu, "-i", str(report_path), "--csv", "--page", "details",
                              "--print-units", "base"], capture_output=True, text=True,
                             check=True).stdout
        s = summarize_csv(raw, det, manifest, filter)
        s["meta"]["reader"] = "ncu --csv"
    s["meta"]["report"] = report_path.name
    if manifest:
        s["meta"]["shape"] = manifest.get("shape", {})
        s["meta"]["configs"] = {d["step"]: d.get("config", "") for d in manifest.get("steps", [])}
    return s


# --- the CSV fallback -------------------------------------------------------------------------
def parse_raw_csv(text: str) -> tuple[list[dict], dict]:
    """``ncu -i R --csv --page raw --print-units base``: (one dict per kernel, units per column).

    The first row names the columns (``ID``, ``Kernel Name``, then metrics), the second gives
    units, then one row per profiled kernel. Numbers may carry thousands separators.
    """
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    rd = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rd) < 2:
        return [], {}
    header, units = rd[0], rd[1]
    return [dict(zip(header, r)) for r in rd[2:]], dict(zip(header, units))


def parse_details_csv(text: str) -> list[dict]:
    """Rule rows of ``ncu -i R --csv --page details``: the ones with a rule name and no metric."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    out = []
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        rule = r.get("Rule Name") or ""
        if not rule or (r.get("Metric Name") or "").strip():
            continue
        out.append(dict(id=r.get("ID", ""), kernel=r.get("Kernel Name", ""),
                        section=r.get("Section Name", ""), rule=rule,
                        type=CSV_TYPES.get((r.get("Rule Type") or "").upper(),
                                           (r.get("Rule Type") or "").upper()),
                        message=clean_message(r.get("Rule Description", "")),
                        speedup_pct=_numeric(r.get("Estimated Speedup", ""))))
    return out


def short_kernel(name: str) -> str:
    """'fmha_kernel_Kt2_A4f16_...' (cuTile appends the signature) or 'f(int)' -> 'fmha_kernel'."""
    name = re.sub(r"^(void|static|__global__)\s+", "", name.strip())  # 'void flash_fwd_kernel<..>'
    m = re.match(r"[^(<\s]+", name)
    name = m.group(0) if m else name.strip()
    return re.sub(r"_Kt\d+_\w*$", "", name)


def summarize_csv(raw: str, details: str = "", manifest: dict | None = None,
                  filter: str = "nvtx") -> dict:
    """The summary from ncu's CSV pages; kernels are mapped to steps by the manifest's order."""
    kernels, units = parse_raw_csv(raw)
    nvtx_col = next((c for c in (units or {})
                     if "nvtx" in c.lower() or "push/pop" in c.lower()), None)
    steps = None
    if nvtx_col:
        steps = []
        for k in kernels:
            m = re.search(r"step:([\w.@=#~-]+)", k.get(nvtx_col, ""))
            steps.append(nvtx_decode(m.group(1)) if m else None)
        if not any(steps):
            steps = None
    if steps is None:
        steps = _order_labels(len(kernels), manifest, profiled_warmups=(filter == "kernel"))
        if manifest is None:   # nothing to map with: one unnamed run, kernels in order
            steps = ["?"] * len(kernels)
    picked = [(s, k) for s, k in zip(steps, kernels) if s is not None]
    names = _dedupe([(s, short_kernel(k.get("Kernel Name", ""))) for s, k in picked])
    id_to = {k.get("ID", ""): (s, n) for (s, k), n in zip(picked, names)}
    rows, meta = [], {}
    for (step, k), kernel in zip(picked, names):
        if k.get("device__attribute_display_name"):
            meta["gpu_name"] = k["device__attribute_display_name"]
        if _numeric(k.get("device__attribute_multiprocessor_count", "")) is not None:
            meta["sm_count"] = _numeric(k["device__attribute_multiprocessor_count"])
        for col, val in k.items():
            if not keep_metric(col):
                continue
            num = _numeric(val)
            if num is not None:
                rows.append(dict(step=step, kernel=kernel, metric=col, value=num,
                                 unit=units.get(col, "")))
    rules = []
    for r in parse_details_csv(details) if details else []:
        if r["id"] not in id_to:
            continue
        step, kernel = id_to[r["id"]]
        rule = dict(step=step, kernel=kernel, section=r["section"], rule=r["rule"],
                    type=r["type"], message=r["message"])
        if r["speedup_pct"] is not None:
            rule["speedup_pct"] = r["speedup_pct"]
        rules.append(rule)
    return dict(meta=meta, rows=rows, rules=rules)


# ---------------------------------------------------------------------------------------------
# summary.json
# ---------------------------------------------------------------------------------------------
def _metadata(command: str) -> dict:
    try:
        from flashattn.env import metadata
        return dict(metadata(command))
    except Exception:  # env.py absent or failing: a minimal record
        import platform
        return dict(command=command, python=platform.python_version(),
                    date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def merge_summary(path, new: dict) -> dict:
    """Write ``new`` into the summary at ``path``, replacing rows/rules of the same steps."""
    path = Path(path)
    old = read_json(path) if json_path(path) else dict(meta={}, rows=[], rules=[])
    steps = {r["step"] for r in new["rows"]} | {r["step"] for r in new["rules"]}
    steps |= set(new.get("meta", {}).get("configs", {}))
    merged = dict(
        meta={**old.get("meta", {}), **{k: v for k, v in new.get("meta", {}).items()
                                        if k not in ("configs", "per_step")}},
        rows=[r for r in old.get("rows", []) if r["step"] not in steps] + new["rows"],
        rules=[r for r in old.get("rules", []) if r["step"] not in steps] + new["rules"])
    per_step = dict(old.get("meta", {}).get("per_step", {}))
    for s in sorted(steps):
        per_step[s] = dict(config=new.get("meta", {}).get("configs", {}).get(s, ""),
                           shape=new.get("meta", {}).get("shape", {}),
                           report=new.get("meta", {}).get("report", ""),
                           date=new.get("meta", {}).get("date", ""))
    merged["meta"]["per_step"] = per_step
    merged["meta"].pop("configs", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1, default=str))
    return merged


def _run_and_summarize(steps, out_dir, *, name, ncu, filter, command, **shape) -> Path:
    report = profile_steps(steps, out_dir, name=name, ncu=ncu, filter=filter, **shape)
    s = summarize(report, ncu=ncu, filter=filter)
    s["meta"] = {**_metadata(command), **s["meta"], "ncu_version": ncu_version(ncu),
                 "clock_control": "none", "filter": filter}
    missing = [st for st in steps if not any(r["step"] == st for r in s["rows"])]
    if missing:
        print(f"warning: no profiled kernel for step(s) {', '.join(missing)}", file=sys.stderr)
    merge_summary(Path(out_dir) / "summary.json", s)
    return report


def record_profiles(out_dir, steps, N=4096, causal=True, *, batch=4, heads=32, kv_heads=None,
                    head_dim=128, dtype="float16", ncu="ncu", filter="nvtx") -> Path:
    """Profile all ``steps`` in one ncu run into ``out_dir/steps.ncu-rep``; merge the summary
    into ``out_dir/summary.json`` and return that path."""
    steps = list(steps)
    command = shlex.join(ncu_command(steps, Path(out_dir) / "steps", ncu=ncu, filter=filter,
                                     python="python3", seqlen=N, batch=batch, heads=heads,
                                     kv_heads=kv_heads, head_dim=head_dim, dtype=dtype,
                                     causal=causal))
    _run_and_summarize(steps, out_dir, name="steps", ncu=ncu, filter=filter, command=command,
                       seqlen=N, causal=causal, batch=batch, heads=heads, kv_heads=kv_heads,
                       head_dim=head_dim, dtype=dtype)
    return Path(out_dir) / "summary.json"


def load_summary(path):
    """(rows, rules) DataFrames of a summary.json: rows long (step, kernel, metric, value,
    unit), rules (step, kernel, section, rule, type, message)."""
    import pandas as pd
    d = read_json(path)                       # summary.json or summary.json.xz
    rows = pd.DataFrame(d.get("rows", []), columns=["step", "kernel", "metric", "value", "unit"])
    rules = pd.DataFrame(d.get("rules", []))
    for c in ("step", "kernel", "section", "rule", "type", "message"):
        if c not in rules.columns:
            rules[c] = pd.Series(dtype=object)
    return rows, rules


def wide(rows):
    """Long rows -> one row per (step, kernel), one column per metric, steps in book order."""
    import pandas as pd
    if rows.empty:
        return pd.DataFrame(columns=["step", "kernel"])
    w = rows.pivot_table(index=["step", "kernel"], columns="metric", values="value",
                         aggfunc="first").reset_index()
    w.columns.name = None
    return _book_order(w)


def _book_order(df):
    from ..impls import STEP_IMPLS
    order = {s: i for i, s in enumerate([*STEP_IMPLS, "sdpa_cudnn", "sdpa_flash"])}
    return (df.assign(_o=df["step"].map(lambda s: order.get(s, len(order))))
              .sort_values(["_o", "kernel"], kind="stable").drop(columns="_o")
              .reset_index(drop=True))


def format_summary(rows, steps=None) -> str:
    """The key metrics of ``rows`` (long DataFrame) as a text table, one line per kernel."""
    if steps:
        rows = rows[rows["step"].isin(steps)]
    if rows.empty:
        return "(no profiled kernels)"
    w = wide(rows)
    cols = ["step", "kernel"] + [k for k, m in KEY_METRICS.items() if m in w.columns]
    table = [cols]
    for _, r in w.iterrows():
        line = [r["step"], r["kernel"]]
        for k in cols[2:]:
            v = r[KEY_METRICS[k]]
            line.append("" if v != v else (f"{v:.1f}" if isinstance(v, float) and v % 1
                                           else f"{int(v)}"))
        table.append(line)
    widths = [max(len(str(t[i])) for t in table) for i in range(len(cols))]
    return "\n".join("  ".join(str(v).rjust(widths[i]) if i >= 2 else str(v).ljust(widths[i])
                               for i, v in enumerate(t)) for t in table)


def format_rules(rules, steps=None, types=("OPTIMIZATION", "WARNING", "ERROR"),
                 width: int = 110) -> str:
    if steps:
        rules = rules[rules["step"].isin(steps)]
    rules = rules[rules["type"].isin(types)]
    out = []
    for _, r in rules.iterrows():
        msg = r["message"] if len(r["message"]) <= width else r["message"][:width - 1] + "…"
        out.append(f"[{r['step']}/{r['kernel']}] {r['section']}.{r['rule']} ({r['type']}): {msg}")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The recorded profiles (what the command shows without a GPU)
# ---------------------------------------------------------------------------------------------
SHAPE_KEYS = ("N", "B", "Hq", "Hkv", "D", "dtype", "causal")


def describe_shape(shape: dict | None) -> str:
    """"N=4096 B=4 Hq=32 Hkv=32 D=128 float16 causal" (a summary's ``meta.shape``)."""
    if not shape:
        return "an unrecorded shape"
    parts = [f"{k}={shape[k]}" for k in SHAPE_KEYS[:5] if k in shape]
    if "dtype" in shape:
        parts.append(str(shape["dtype"]))
    if "causal" in shape:
        parts.append("causal" if shape["causal"] else "not causal")
    return " ".join(parts)


def recorded_summaries(folder) -> list[Path]:
    """The profile summaries under ``folder`` (``results/<gpu>/profiles``), each by its plain
    name ``.../summary.json`` (read_json reads ``summary.json.xz`` too): the top-level one
    first, then the subfolders' (n1024/, backward/, decode/, ...) by name."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = {f.with_name("summary.json") for f in folder.rglob("summary.json*")
             if f.name in ("summary.json", "summary.json.xz")}
    return sorted(found, key=lambda p: (p.parent != folder, str(p)))


def recorded_shape(meta: dict, step: str) -> dict | None:
    """The shape ``step`` was profiled at in a summary's meta (its own, else the summary's)."""
    return (meta.get("per_step", {}).get(step, {}).get("shape") or meta.get("shape")) or None


def find_recorded(folder, steps, shape: dict) -> dict:
    """For each of ``steps``, the recorded summary to show for ``shape`` (keys ``SHAPE_KEYS``):
    ``{step: dict(path, shape, exact)}``, or ``{step: None}`` when no summary has the step.

    A summary recorded at exactly ``shape`` wins; otherwise the one whose shape agrees on the
    most keys (``exact`` False: the caller says it shows another shape), the top-level summary
    first among equals; a summary without a recorded shape comes last."""
    docs = []
    for path in recorded_summaries(folder):
        try:
            doc = read_json(path)
        except (OSError, ValueError):
            continue
        docs.append((path, doc.get("meta", {}), {r.get("step") for r in doc.get("rows", [])}))
    want = {k: shape.get(k) for k in SHAPE_KEYS}
    chosen = {}
    for step in steps:
        best, best_score = None, None
        for path, meta, have in docs:
            if step not in have:
                continue
            got = recorded_shape(meta, step)
            score = -1 if got is None else sum(got.get(k) == v for k, v in want.items())
            if best_score is None or score > best_score:
                best, best_score = dict(path=path, shape=got, exact=score == len(want)), score
        chosen[step] = best
    return chosen


def _shown(path) -> str:
    try:
        return str(Path(path).relative_to(REPO))
    except ValueError:
        return str(path)


def show_recorded(folder, steps, shape: dict, *, rules: bool = False) -> None:
    """Print the recorded summary of ``steps`` at ``shape`` (``find_recorded``), saying so when
    a step was recorded at another shape only, or not at all."""
    summaries = recorded_summaries(folder)
    if not summaries:
        print(f"No recorded profiles in {_shown(folder)}.")
        return
    chosen = find_recorded(folder, steps, shape)
    missing = [s for s, c in chosen.items() if c is None]
    groups: dict = {}
    for s, c in chosen.items():
        if c is not None:
            groups.setdefault(c["path"], []).append(s)
    asked = describe_shape(shape)
    for path, have in groups.items():
        doc_meta = read_json(path).get("meta", {})
        other = [s for s in have if not chosen[s]["exact"]]
        if other:
            at = "; ".join(sorted({describe_shape(chosen[s]["shape"]) for s in other}))
            print(f"No recorded profile of {', '.join(other)} at the asked shape ({asked}); "
                  f"showing the one recorded at {at} instead.\n")
        shapes = {describe_shape(chosen[s]["shape"]) for s in have}
        print(f"Recorded in {_shown(path)}"
              + (f" ({doc_meta.get('gpu_name') or doc_meta.get('gpu', '')}, ncu "
                 f"{doc_meta.get('ncu_version', '?')})" if doc_meta else "")
              + f", at {'; '.join(sorted(shapes))}:\n")
        rows, rule_rows = load_summary(path)
        print(format_summary(rows, have))
        if rules and not rule_rows.empty:
            print("\n" + format_rules(rule_rows, have))
        print()
    if missing:
        recorded = set()
        for p in summaries:
            try:
                recorded |= {r.get("step") for r in read_json(p).get("rows", [])}
            except (OSError, ValueError):
                pass
        print(f"(no recorded profile for {', '.join(missing)} in {_shown(folder)}; recorded "
              f"steps: {', '.join(sorted(recorded)) or 'none'})")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    from ..impls import IMPLS, STEP_IMPLS
    from flashattn.contract import parse_gqa
    from .target import add_shape_args
    p = argparse.ArgumentParser(
        prog="python -m flashbook profile",
        description="Profile one launch per step with Nsight Compute (clocks not locked) and "
                    "summarize the report; without a GPU or ncu, print the command and the "
                    "recorded summary.")
    p.add_argument("--step", action="append", required=True,
                   choices=[*STEP_IMPLS, "best",
                            *(n for n, i in IMPLS.items() if i.kind == "library"
                              and i.backend not in ("flex", "MATH"))],
                   help="step (or SDPA library) to profile (repeatable)")
    add_shape_args(p)
    p.add_argument("--out", help="output folder (default ./profiles; the recorded dataset is "
                                 "written by 'python -m flashbook record --part profile')")
    p.add_argument("--ncu", default="ncu", help="path of the ncu executable")
    p.add_argument("--gpu", default="h200",
                   help="results/<gpu>/profiles/summary.json to show without a GPU")
    p.add_argument("--filter", choices=["nvtx", "kernel"], default="nvtx",
                   help="select kernels by NVTX range (default) or by kernel name")
    p.add_argument("--rules", action="store_true", help="also print ncu's rule messages")
    a = p.parse_args(argv)
    hq, hkv = parse_gqa(a.gqa, a.heads)
    shape = dict(seqlen=a.seqlen, batch=a.batch, heads=hq, kv_heads=hkv, head_dim=a.head_dim,
                 dtype=a.dtype, causal=a.causal)
    # Not results/<gpu>/ by default: a reader's own profile must not overwrite the recorded one.
    out = Path(a.out) if a.out else Path("profiles")
    name = a.step[0] if len(a.step) == 1 else "steps"
    cmd = ncu_command(a.step, out / name, ncu=a.ncu, filter=a.filter, **shape)
    ok, why = have_gpu_and_ncu(a.ncu)
    if not ok:
        print(f"Not profiling here ({why}). On a GPU machine this runs:\n\n    "
              + shlex.join(cmd) + "\n")
        asked = dict(N=a.seqlen, B=a.batch, Hq=hq, Hkv=hkv, D=a.head_dim, dtype=a.dtype,
                     causal=a.causal)
        show_recorded(REPO / "results" / a.gpu / "profiles", a.step, asked, rules=a.rules)
        return 0
    report = _run_and_summarize(a.step, out, name=name, ncu=a.ncu, filter=a.filter,
                                command=shlex.join(cmd), **shape)
    rows, rules = load_summary(out / "summary.json")
    print(f"report: {report}\nsummary: {out / 'summary.json'}\n")
    print(format_summary(rows, a.step))
    if a.rules and not rules.empty:
        print("\n" + format_rules(rules, a.step))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
