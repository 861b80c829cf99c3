"""CPU tests of the pieces the GPU runs of issues 11 and 12 added: the benchmarks' shared
options (measure/workload.py), compressed JSON records (data.schema.read_json), and the record
parts and profile targets of the backward and decode kernels."""
import argparse
import json
import lzma

import pytest

from flashbook.data.schema import json_path, read_json
from flashbook.measure import record, target, workload


def _parser():
    p = argparse.ArgumentParser(prog="t", exit_on_error=False)
    p.error = lambda msg: (_ for _ in ()).throw(SystemExit(msg))
    return p


def test_workload_options_parse_and_refuse():
    p = _parser()
    workload.add_workload_args(p, baselines=("flash", "cudnn"))
    workload.add_output_args(p)
    a = p.parse_args([])
    assert a.seqlens == "1024,2048,4096,8192,16384" and a.causal and a.baselines == "flash,cudnn"
    assert workload.check_seqlens(p, " 1, 2,") == [1, 2]
    with pytest.raises(SystemExit, match="comma-separated integers"):
        workload.check_seqlens(p, "1,x")
    with pytest.raises(SystemExit, match="at least one positive"):
        workload.check_seqlens(p, "0")
    assert workload.check_baselines(p, "none", ("flash",)) == []
    with pytest.raises(SystemExit, match="unknown backward baseline 'x'"):
        workload.check_baselines(p, "flash,x", ("flash",), what="backward baseline")
    assert workload.check_gqa(p, "32:8") == (32, 8) and workload.check_gqa(p, None) is None
    with pytest.raises(SystemExit):
        workload.check_gqa(p, "32:7")


def test_read_json_reads_the_plain_file_or_its_xz_twin(tmp_path):
    doc = {"meta": {"a": 1}, "rows": [{"x": 2}]}
    plain = tmp_path / "s.json"
    assert json_path(plain) is None
    with pytest.raises(FileNotFoundError, match="s.json"):
        read_json(plain)
    (tmp_path / "s.json.xz").write_bytes(lzma.compress(json.dumps(doc).encode()))
    assert json_path(plain) == tmp_path / "s.json.xz" and read_json(plain) == doc
    plain.write_text(json.dumps({"meta": {}, "rows": []}))      # the plain file wins
    assert json_path(plain) == plain and read_json(plain)["rows"] == []
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError):
        read_json(tmp_path / "bad.json")


def test_recorded_compressed_records_load():
    from flashbook.data import results
    r = results.load("h200")
    for sub in ("backward", "backward-full", "decode"):
        prof = r.profile_at(sub)[0]                   # (wide frame, units, rules, meta)
        assert len(prof) > 0, sub
    steps = set(r.profile_at("backward")[0]["step"])
    assert {"backward", "backward_atomic", "sdpa_cudnn_backward", "sdpa_flash_backward"} <= steps
    assert len(read_json(record.Path(results.results_root()) / "h200" / "decode" /
                         "decode.json")["rows"]) > 100


def test_profile_parts_and_targets(monkeypatch, tmp_path):
    assert {"profile-backward", "profile-decode"} <= set(record.PARTS)
    assert set(target.EXTRA_TARGETS) == (set(target.BACKWARD_TARGETS) | set(target.DECODE_TARGETS)
                                         | set(target.VARLEN_TARGETS)
                                         | set(target.FLEX_FP8_TARGETS) - {"best"})
    calls = []
    from flashbook.measure import ncu
    monkeypatch.setattr(ncu, "record_profiles",
                        lambda out, steps, N, causal, **kw: calls.append(
                            (out.name, tuple(steps), N, causal, kw)) or out / "summary.json")
    record.record_profile_backward(tmp_path)
    record.record_profile_decode(tmp_path)
    assert calls[0][:4] == ("backward", target.BACKWARD_TARGETS, record.PROFILE_N, True)
    assert calls[1][:4] == ("backward-full", target.BACKWARD_TARGETS, record.PROFILE_N, False)
    d = record.DECODE_PROFILE
    assert calls[2] == ("decode", target.DECODE_TARGETS, d["N"], True,
                        dict(batch=d["batch"], heads=d["heads"], kv_heads=d["kv_heads"]))
    assert calls[3][:4] == ("decode-b1", target.DECODE_TARGETS, 131072, True)
    assert calls[3][4]["batch"] == 1
    assert calls[4][:4] == ("varlen", target.VARLEN_TARGETS, 1024, True)
    assert calls[4][4]["batch"] == 32
