"""flashbook.measure.ncu: the ncu command, report parsing (real tiny fixtures + fakes), the CLI."""
import importlib
import json
import lzma
import shutil
from pathlib import Path

import pytest

from flashbook.measure import ncu as P

FIX = Path(__file__).parent / "fixtures" / "profile"


def test_ncu_command_exact():
    cmd = P.ncu_command(["baseline", "remap"], "/tmp/out/steps", ncu="ncu", python="python3",
                        seqlen=4096, batch=4, heads=32, kv_heads=8, head_dim=128,
                        dtype="float16", causal=True)
    assert cmd == [
        "ncu", "--clock-control", "none", "--nvtx", "--nvtx-include", "regex:step:.*/",
        "--section", "LaunchStats", "--section", "Occupancy", "--section", "SpeedOfLight",
        "--section", "ComputeWorkloadAnalysis", "--section", "MemoryWorkloadAnalysis",
        "--section", "WarpStateStats", "--section", "SchedulerStats",
        "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum,"
        "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,"
            "smsp__inst_executed.sum,sm__cycles_active.avg,sm__cycles_elapsed.avg",
        "-o", "/tmp/out/steps", "-f", "python3", "-m", "flashbook.measure.target",
        "--step", "baseline,remap", "--seqlen", "4096", "--batch", "4", "--heads", "32",
        "--head-dim", "128", "--dtype", "float16", "--causal", "--gqa", "32:8"]


def test_ncu_target_is_a_runnable_module():
    # ncu runs `python -m <target>` from the repository root: the module must exist there.
    import importlib.util
    cmd = P.ncu_command(["baseline"], "x")
    target = cmd[cmd.index("-m") + 1]
    spec = importlib.util.find_spec(target)
    assert spec is not None and spec.origin, target
    assert Path(spec.origin).resolve().is_relative_to(P.REPO)
    assert hasattr(importlib.import_module(target), "main")


def test_repo_is_the_repository_root():
    assert (P.REPO / "flashbook" / "measure" / "ncu.py").is_file()
    assert (P.REPO / "results").is_dir()


def test_ncu_command_kernel_filter_never_locks_clocks():
    cmd = P.ncu_command(["baseline"], "x", filter="kernel", causal=False)
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert "-k" in cmd and "--nvtx-include" not in cmd and "--no-causal" in cmd
    with pytest.raises(ValueError):
        P.ncu_command(["baseline"], "x", filter="bogus")


def test_clean_message_and_keep_metric():
    assert P.clean_message("See @url:the guide:https://x.y/z@ and "
                           "@section:Occupancy:Occupancy section@.") == \
        "See the guide and Occupancy section."
    assert P.keep_metric("launch__registers_per_thread")
    assert P.keep_metric("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")
    assert not P.keep_metric(
        "sm__pipe_tensor_op_hmma_cycles_active.max.pct_of_peak_sustained_active")
    assert not P.keep_metric("launch__stream_id")
    assert P.short_kernel("fmha_kernel_Kt2_A4f16_1s1_7v8l0_8t1_ci16_p16_B1") == "fmha_kernel"


def _check_real_summary(s):
    got = {(r["step"], r["kernel"]) for r in s["rows"]}
    assert got == {("baseline", "fmha_kernel"), ("naive", "scores_kernel"),
                   ("naive", "softmax_kernel"), ("naive", "pv_kernel")}
    v = {(r["step"], r["kernel"], r["metric"]): r["value"] for r in s["rows"]}
    assert v[("baseline", "fmha_kernel", "launch__registers_per_thread")] == 255
    assert v[("baseline", "fmha_kernel", "gpu__time_duration.sum")] > 0
    assert ("baseline", "fmha_kernel", "dram__bytes_read.sum") in v
    assert ("baseline", "fmha_kernel",
            "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum") in v
    assert s["meta"]["gpu_name"] == "NVIDIA H200" and s["meta"]["sm_count"] == 132
    assert s["rules"] and {r["type"] for r in s["rules"]} <= {"OPTIMIZATION", "WARNING", "OK",
                                                               "ERROR", "NONE"}
    assert all(r["message"] and "@url" not in r["message"] for r in s["rules"])


def test_summarize_csv_real_fixture():
    raw, det = (FIX / "raw.csv").read_text(), (FIX / "details.csv").read_text()
    s = P.summarize_csv(raw, det)                 # steps from the NVTX column
    _check_real_summary(s)


def test_summarize_csv_by_launch_order_without_nvtx():
    import csv
    import io
    rows = list(csv.reader(io.StringIO((FIX / "raw.csv").read_text())))
    drop = [i for i, c in enumerate(rows[0]) if "Push/Pop" in c]
    text = "\n".join(",".join(f'"{c}"' for j, c in enumerate(r) if j not in drop) for r in rows)
    manifest = json.loads((FIX / "steps.manifest.json").read_text())
    s = P.summarize_csv(text, (FIX / "details.csv").read_text(), manifest)
    _check_real_summary(s)


def test_summarize_real_report(tmp_path):
    pytest.importorskip("ncu_report")
    rep = tmp_path / "steps.ncu-rep"
    rep.write_bytes(lzma.decompress((FIX / "steps.ncu-rep.xz").read_bytes()))
    shutil.copy(FIX / "steps.manifest.json", tmp_path / "steps.manifest.json")
    s = P.summarize(rep)
    _check_real_summary(s)
    assert s["meta"]["configs"] == {"baseline": "64x64", "naive": "64x64"}


# --- a fake ncu_report context: the interface summarize_context relies on ----------------------
class _M:
    def __init__(self, v, unit=""):
        self.v, self.u = v, unit

    def value(self):
        return self.v

    def unit(self):
        return self.u


class _Dom:
    def __init__(self, ranges):
        self.r = ranges

    def push_pop_ranges(self):
        return tuple(self.r)

    def start_end_ranges(self):
        return ()


class _State:
    def __init__(self, ranges):
        self.d = _Dom(ranges)

    def domains(self):
        return (0,)

    def domain_by_id(self, i):
        return self.d


class _Action:
    def __init__(self, name, ranges, metrics, rules=()):
        self.n, self.r, self.m, self.rules = name, ranges, metrics, rules

    def name(self):
        return self.n

    def nvtx_state(self):
        return _State(self.r) if self.r is not None else None

    def metric_names(self):
        return tuple(self.m)

    def metric_by_name(self, m):
        return _M(*self.m[m]) if m in self.m else None

    def rule_results_as_dicts(self):
        return list(self.rules)


class _Ctx:
    def __init__(self, actions):
        self.a = actions

    def num_ranges(self):
        return 1

    def range_by_idx(self, i):
        ctx = self

        class R:
            def num_actions(self):
                return len(ctx.a)

            def action_by_idx(self, j):
                return ctx.a[j]
        return R()


def _metrics(reg, dur):
    return {"launch__registers_per_thread": (reg, "register/thread"),
            "gpu__time_duration.sum": (dur, "ns"), "launch__kernel_name": ("x", ""),
            "device__attribute_display_name": ("NVIDIA H200", ""),
            "smsp__something_else": (1.0, "")}


def test_summarize_context_fake_nvtx():
    rule = dict(rule_identifier="TheoreticalOccupancy", name="Theoretical Occupancy",
                section_identifier="Occupancy",
                rule_message=dict(title="t", message="Limited by @url:registers:http://x@.",
                                  type=2), speedup_estimation=dict(type=1, speedup=50.0))
    ctx = _Ctx([_Action("pv_kernel_Kt2_A3", ["step:naive"], _metrics(128, 10.0)),
                _Action("pv_kernel_Kt2_A3", ["step:naive"], _metrics(128, 12.0)),
                _Action("fmha_kernel_Kt2_x", ["step:remap"], _metrics(255, 99.0), [rule]),
                _Action("other", None, _metrics(1, 1.0))])
    s = P.summarize_context(ctx)
    kernels = [(r["step"], r["kernel"]) for r in s["rows"]
               if r["metric"] == "launch__registers_per_thread"]
    assert kernels == [("naive", "pv_kernel"), ("naive", "pv_kernel#2"), ("remap", "fmha_kernel")]
    assert not any(r["metric"] in ("launch__kernel_name", "smsp__something_else")
                   for r in s["rows"])
    assert s["rules"] == [dict(step="remap", kernel="fmha_kernel", section="Occupancy",
                               rule="TheoreticalOccupancy", type="OPTIMIZATION",
                               message="Limited by registers.", speedup_pct=50.0)]
    assert s["meta"]["gpu_name"] == "NVIDIA H200"


def test_summarize_context_fake_by_order():
    manifest = {"steps": [dict(step="baseline", warmup_launches=1, launches=1),
                          dict(step="remap", warmup_launches=1, launches=1)]}
    acts = [_Action(f"fmha_kernel_Kt2_{i}", None, _metrics(i, i)) for i in range(4)]
    s = P.summarize_context(_Ctx(acts), manifest, filter="kernel")   # warm-ups profiled too
    regs = {r["step"]: r["value"] for r in s["rows"]
            if r["metric"] == "launch__registers_per_thread"}
    assert regs == {"baseline": 1, "remap": 3}


def test_merge_and_load_summary(tmp_path):
    p = tmp_path / "summary.json"
    row = lambda s, v: dict(step=s, kernel="fmha_kernel", metric="gpu__time_duration.sum",  # noqa
                            value=v, unit="ns")
    P.merge_summary(p, dict(meta={"gpu": "x", "configs": {"a": "64x64"}},
                            rows=[row("a", 1), row("b", 2)], rules=[]))
    P.merge_summary(p, dict(meta={"configs": {"a": "64x128"}}, rows=[row("a", 3)],
                            rules=[dict(step="a", kernel="fmha_kernel", section="S", rule="R",
                                        type="WARNING", message="m")]))
    rows, rules = P.load_summary(p)
    assert sorted(zip(rows["step"], rows["value"])) == [("a", 3), ("b", 2)]
    assert list(rules["rule"]) == ["R"]
    meta = json.loads(p.read_text())["meta"]
    assert meta["gpu"] == "x" and meta["per_step"]["a"]["config"] == "64x128"
    assert "fmha_kernel" in P.format_summary(rows)
    assert "R (WARNING)" in P.format_rules(rules)


def test_cli_without_gpu_prints_command(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(P, "have_gpu_and_ncu", lambda ncu="ncu": (False, "no GPU here"))
    monkeypatch.setattr(P, "REPO", tmp_path)
    assert P.main(["--step", "baseline", "--seqlen", "1024"]) == 0
    out = capsys.readouterr().out
    assert "ncu --clock-control none --nvtx --nvtx-include 'regex:step:.*/'" in out
    assert "--step baseline --seqlen 1024" in out and "No recorded profiles" in out


def test_cli_without_gpu_shows_recorded_summary(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(P, "have_gpu_and_ncu", lambda ncu="ncu": (False, "no GPU here"))
    monkeypatch.setattr(P, "REPO", tmp_path)
    s = P.summarize_csv((FIX / "raw.csv").read_text(), (FIX / "details.csv").read_text())
    s["meta"].update(gpu="NVIDIA H200", ncu_version="2025.3.1.0")
    P.merge_summary(tmp_path / "results" / "h200" / "profiles" / "summary.json", s)
    assert P.main(["--step", "naive", "--rules"]) == 0
    out = capsys.readouterr().out
    assert "softmax_kernel" in out and "fmha_kernel" not in out.split("Recorded")[1]
    assert "registers" in out and "OPTIMIZATION" in out
    assert P.main(["--step", "remap"]) == 0
    assert "no recorded profile for remap" in capsys.readouterr().out


def test_cli_via_package_entry_point(capsys, monkeypatch):
    from flashbook.__main__ import main
    monkeypatch.setattr(P, "have_gpu_and_ncu", lambda ncu="ncu": (False, "no GPU here"))
    assert main(["profile", "--step", "remap", "--gqa", "32:8", "--no-causal"]) == 0
    assert "--no-causal --gqa 32:8" in capsys.readouterr().out


def _gpu_and_ncu():
    try:
        import torch
        return torch.cuda.is_available() and shutil.which("ncu") is not None
    except ImportError:
        return False


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_and_ncu(), reason="needs a CUDA GPU and Nsight Compute (ncu)")
def test_profile_baseline_on_gpu(tmp_path):
    report = P.profile_steps(["baseline"], tmp_path, seqlen=256, batch=1, heads=2)
    assert report.exists()
    s = P.summarize(report)
    v = {r["metric"]: r["value"] for r in s["rows"] if r["step"] == "baseline"}
    assert v["launch__registers_per_thread"] > 0
    assert v["gpu__time_duration.sum"] > 0
    summary = P.record_profiles(tmp_path / "rec", ["baseline"], N=256, batch=1, heads=2)
    rows, _ = P.load_summary(summary)
    assert set(rows["step"]) == {"baseline"}
    assert (tmp_path / "rec" / "steps.ncu-rep").exists()
