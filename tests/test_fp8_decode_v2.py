"""experiments/fp8_decode_v2.py (E32): the FP8-MMA decode variants run end to end on the CPU
(``time --dry-run``: tiny shapes through the interpreter, fake timing), every row checked against
its reference before it is timed; the script the lead runs on the H200."""
import json
from pathlib import Path

import pytest

from scripts import load

torch = pytest.importorskip("torch")


def _load():
    path = Path(__file__).resolve().parents[1] / "experiments" / "fp8_decode_v2.py"
    mod = load(path, "fp8_decode_v2_test")
    return mod


@pytest.fixture(scope="module")
def mod():
    return _load()


@pytest.fixture(scope="module")
def dry(mod, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8dec2") / "fp8dec2.json"
    assert mod.main(["time", "--dry-run", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_dry_run_rows(mod, dry):
    fwd = [r for r in dry["rows"] if r["part"] == "forward"]
    # The forward part: the fp16 base, the library FP8 forward twice (control), the variants,
    # causal and not.
    assert {r["impl"] for r in fwd} == {"fwd-fp16", "fwd-fp8", "fwd-fp8#2"} | set(mod.FWD_VARIANTS)
    assert {r["causal"] for r in fwd} == {False, True}
    for r in fwd:
        assert r["median_ms"] > 0 and r["max_err"] <= mod._tol(r["impl"]), r
    dry = dict(dry, rows=[r for r in dry["rows"] if r["part"] == "decode"])
    impls = {r["impl"] for r in dry["rows"]}
    # The base, its control, the library fp8 decode twice (the control) and every variant.
    assert {"decode-fp16", "decode-fp16#2", "decode-fp8", "decode-fp8#2"} <= impls
    assert set(mod.VARIANTS) <= impls
    assert not dry["failed"] and not dry["skipped"]
    shapes = {(r["B"], r["L"]) for r in dry["rows"]}
    assert len(shapes) == 2
    for r in dry["rows"]:
        assert r["median_ms"] > 0
        # The library rows keep q in fp16 (~1e-4); the variants round q and P to e4m3.
        assert r["max_err"] <= (mod.TOL["v2"] if r["impl"].startswith("v2") else 2e-3), r
        elem = 2 if "fp16" in r["impl"] else 1
        assert r["kv_bytes"] == 2 * r["B"] * r["Hkv"] * r["L"] * r["D"] * elem
    meta = dry["meta"]
    assert meta["dry_run"] is True and meta["variants"] == list(mod.VARIANTS)
    assert {"torch", "cuda_tile", "python", "date", "command"} <= set(meta)


def test_a_row_above_tolerance_is_not_timed(mod, tmp_path, monkeypatch, capsys):
    # Tolerances below the e4m3 rounding of q: every variant row must be refused, not timed.
    monkeypatch.setitem(mod.TOL, "v2", 1e-6)
    out = tmp_path / "x.json"
    mod.main(["time", "--dry-run", "--out", str(out), "--part", "decode"])
    data = json.loads(out.read_text())
    assert {f["impl"] for f in data["failed"]} >= set(mod.VARIANTS)
    assert not {r["impl"] for r in data["rows"]} & set(mod.VARIANTS)
    assert "NOT TIMED" in capsys.readouterr().out


def test_decode_v2_checks_the_v_layout(mod):
    q = torch.zeros(1, 4, 1, 32, dtype=torch.float16)
    k8 = torch.zeros(1, 1, 64, 32).to(torch.float8_e4m3fn)
    one = torch.ones(1, 1)
    lens = torch.tensor([64], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\(B, Hkv, D, S\)"):
        mod.decode_v2(q, k8, k8, lens, k_descale=one, v_descale=one, variant="v2-qk8-pv8")
    with pytest.raises(ValueError, match="unknown variant"):
        mod.decode_v2(q, k8, k8, lens, k_descale=one, v_descale=one, variant="nope")
    vt = mod.transpose_v_cache(k8)
    assert vt.shape == (1, 1, 32, 64) and vt.dtype == k8.dtype


def test_exp2_fma_matches_exp2(mod):
    # The FMA-pipe exponential of the forward variant, through the interpreter's tile ops:
    # relative error <= 8.5e-4 (the cubic at f = -0.5) on the range P takes (x <= 8); 2^-125
    # (zero once cast to e4m3) far below.
    import numpy as np
    x = np.concatenate([np.linspace(-30, 8, 2001), [-1e30]]).astype(np.float32)
    from flashattn import interpret
    xt = torch.from_numpy(np.pad(x, (0, 2048 - x.size)))
    yt = torch.empty_like(xt)
    interpret.launch((1, 1, 1), mod.exp2_fma_kernel, (xt, yt, 2048))
    got = yt.numpy()[:x.size].astype(np.float64)
    want = np.exp2(np.maximum(x.astype(np.float64), -125))
    assert np.all(np.abs(got - want) <= 8.5e-4 * want)
    assert got[-1] < 1e-37


def test_sass_counts_finds_the_mma_loop(mod):
    sass = "\n".join([
        "        /*0000*/                   MOV R1, c[0x0][0x28] ;",
        "        /*0010*/                   QGMMA.64x128x32.F32.E4M3.E4M3 R24, R164, gdesc[UR8], RZ ;",
        "        /*0020*/                   MUFU.EX2 R3, R3 ;",
        "        /*0030*/              @P0 BRA 0x10 ;",
        "        /*0040*/                   LDS.128 R4, [R2] ;",
        "        /*0050*/              @P0 BRA 0x40 ;",
        "        /*0060*/                   EXIT ;"])
    c = mod.sass_counts(sass)
    assert c["lines"] == 7 and c["QGMMA"] == 1 and c["LDS.128"] == 1
    assert c["loop"] == 3 and c["loop_counts"]["MUFU.EX2"] == 1
    assert c["loop_counts"]["LDS.128"] == 0
    assert c["mma_forms"] == ["QGMMA.64x128x32.F32.E4M3.E4M3"]
