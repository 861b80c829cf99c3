"""flashbook.chapter.mla (chapter 16) on the CPU: the decode arithmetic from its definition, the
compile table as the slow AOT test printed it, the absorption demo, and the recorded-data loader
(dry runs are not measurements)."""
import json

import pytest

from flashbook.chapter import mla
from flashbook.hardware import HBM_TBS, PEAK_TFLOPS


def test_step_arith_from_the_definition():
    a = mla.step_arith(mla.MLA)
    assert a["bytes"] == 576 * 2 and a["flops"] == 2 * 128 * (576 + 512)
    g = mla.step_arith(mla.GQA, Sq=4)
    assert g["bytes"] == 8 * 2 * 128 * 2 and g["intensity"] == pytest.approx(8 * 4)
    assert mla.step_arith(mla.MLA, Sq=2)["intensity"] == pytest.approx(2 * a["intensity"])
    assert mla.ridge() == pytest.approx(PEAK_TFLOPS / HBM_TBS)


def test_bound_is_the_larger_time():
    b = mla.bound_ms(mla.MLA, 64, 32768)
    assert b["mem_ms"] == pytest.approx(64 * 32768 * 1152 / (HBM_TBS * 1e12) * 1e3)
    assert b["floor_ms"] == max(b["mem_ms"], b["mma_ms"]) and 0 < b["max_frac_hbm"] <= 1
    assert mla.bound_ms(mla.GQA, 64, 32768)["max_frac_hbm"] == 1.0      # memory-bound
    assert mla.cache_gb(mla.MLA, 1000) == pytest.approx(61 * 1000 * 1152 / 1e9)


def test_sass_table_parses_every_row():
    df = mla.sass_table()
    lines = mla.SASS_TABLE.read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("step "))
    n = next(i for i, ln in enumerate(lines[start + 1:]) if not ln.strip())
    assert len(df) == n and set(df.arch) == {"sm_90", "sm_100", "sm_120"}
    assert set(df.kind) == {"bf16", "bf16 final", "fp8", "fp8 final", "combine"}
    s90 = df[(df.arch == "sm_90") & (df.kernel != "mla_combine")]
    assert (s90.STACK == 0).all() and all("HGMMA" in s for s in s90["MMA shapes"])
    assert mla.sass_meta()["tileiras"].count(".") == 2


def test_absorption_demo_forms_agree():
    d = mla.absorption_demo(H=2, n=70, Sq=1)
    assert d["out_diff"] < 1e-12 and d["lse_diff"] < 1e-12 and d["out_max"] > 0.01


def test_measurements_skip_dry_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(mla, "ROOT", tmp_path)
    assert mla.measurements() is None
    folder = tmp_path / "results" / "h200" / "mla"
    folder.mkdir(parents=True)
    (folder / "dry.json").write_text(json.dumps({"dry_run": True, "rows": []}))
    assert mla.measurements() is None
    (folder / "decode.json").write_text(json.dumps({"dry_run": False, "rows": [1]}))
    assert [d["rows"] for d in mla.measurements()] == [[1]]
