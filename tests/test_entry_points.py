"""Every entry point checks its input as the API does, tried as a new user would (issue 21,
item 8): the command line's --head-dim, non-tensor arguments of the public functions, meta
tensors in attention_varlen, nbrun given something that is not a notebook, profile without a
GPU at a recorded seqlen, record --quick without --out, and note_tables reading .json.xz.

All on a CPU, fast: nothing here compiles or launches a kernel (the compile test fails before
compile_step, which is replaced by one that fails the test if it is reached)."""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import flashattn
import flashbook
from flashattn import aot
from flashbook import nbrun
from flashattn.contract import MAX_HEAD_DIM, check_head_dim, head_dim_arg
from flashbook.data import results
from flashbook.data.schema import read_json
from flashbook.measure import ncu as P
from flashbook.measure import record
from scripts import load

REPO = Path(__file__).resolve().parents[1]
BAD_HEAD_DIMS = (0, -8, 257, 512)


def _f16(*shape, device="cpu"):
    return torch.zeros(*shape, dtype=torch.float16, device=device)


# --- 1. compile --head-dim: the API's rule, before any compilation -------------------------------
@pytest.fixture
def no_compile(monkeypatch):
    def compile_step(*a, **kw):
        raise AssertionError("compile_step reached: --head-dim was not checked first")
    monkeypatch.setattr(aot, "compile_step", compile_step)


@pytest.mark.parametrize("d", BAD_HEAD_DIMS)
def test_compile_cli_refuses_a_head_dim_the_api_refuses(d, no_compile, capsys):
    with pytest.raises(SystemExit) as e:
        aot.main(["--step", "baseline", "--arch", "sm_90", "--head-dim", str(d)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --head-dim: head dim must be between 1 and {MAX_HEAD_DIM}, got {d}" in err
    # The same words as the API's (contract.check_head_dim, used by check_shapes).
    with pytest.raises(ValueError, match=f"between 1 and {MAX_HEAD_DIM}, got {d}"):
        flashattn.contract.check_shapes((1, 1, 8, d), (1, 1, 8, d), (1, 1, 8, d), causal=False,
                                        scale=None, input_pos=0)


def test_compile_cli_through_the_package_entry_point(no_compile, capsys):
    from flashattn.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["compile", "--head-dim", "257"])
    assert e.value.code == 2 and "got 257" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["compile", "--head-dim", "eighty"])
    assert e.value.code == 2 and "takes an integer, got 'eighty'" in capsys.readouterr().err


def test_compile_cli_head_dim_as_a_new_user_types_it():
    # The real command line: exit status 2, one error line, nothing compiled (it would take
    # tens of seconds and print "compiled ..." first).
    r = subprocess.run([sys.executable, "-m", "flashattn", "compile", "--head-dim", "0"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert "head dim must be between 1 and 256, got 0" in r.stderr
    assert "compiled" not in r.stderr and r.stdout == ""


def test_head_dim_arg_takes_what_the_api_takes():
    assert [head_dim_arg(str(d)) for d in (1, 64, 80, 256)] == [1, 64, 80, 256]
    assert check_head_dim(128) == 128
    with pytest.raises(TypeError, match="head dim must be an int"):
        check_head_dim(64.0)


@pytest.mark.parametrize("add", ["target", "workload"])
def test_bench_and_profile_options_refuse_the_same_head_dims(add, capsys):
    # bench (workload.add_workload_args) and profile (target.add_shape_args) share the rule.
    import argparse

    from flashbook.measure import target, workload
    p = argparse.ArgumentParser(prog="x")
    if add == "target":
        target.add_shape_args(p)
    else:
        workload.add_workload_args(p, baselines=("cudnn",))
    assert p.parse_args(["--head-dim", "96"]).head_dim == 96
    for d in BAD_HEAD_DIMS:
        with pytest.raises(SystemExit) as e:
            p.parse_args(["--head-dim", str(d)])
        assert e.value.code == 2 and f"got {d}" in capsys.readouterr().err


# --- 2. non-tensor inputs: TypeError naming the argument ---------------------------------------
def test_sdpa_names_the_argument_that_is_not_a_tensor():
    q = _f16(1, 2, 8, 16)
    with pytest.raises(TypeError, match="query must be a torch.Tensor, got list"):
        flashattn.sdpa([1], [1], [1])
    with pytest.raises(TypeError, match="key must be a torch.Tensor, got list"):
        flashattn.sdpa(q, [1], q)
    with pytest.raises(TypeError, match="value must be a torch.Tensor, got NoneType"):
        flashattn.sdpa(q, q, None)
    with pytest.raises(TypeError, match="query must be a torch.Tensor, got ndarray"):
        flashattn.sdpa(q.numpy(), q.numpy(), q.numpy())


def test_sdpa_and_attention_check_their_other_arguments():
    q = _f16(1, 2, 8, 16, device="meta")        # shapes only: the operator's meta path
    with pytest.raises(TypeError, match="enable_gqa must be a bool, got str"):
        flashattn.sdpa(q, q, q, enable_gqa="no")
    with pytest.raises(TypeError, match="dropout_p must be a float, got str"):
        flashattn.sdpa(q, q, q, dropout_p="0.1")
    with pytest.raises(TypeError, match="causal must be a bool, got str"):
        flashattn.sdpa(q, q, q, is_causal="yes")
    for args in ((q, q, q), (_f16(1, 2, 8, 16),) * 3):       # meta and plain CPU tensors
        with pytest.raises(TypeError, match="step must be a str"):
            flashbook.attention(*args, step=3)
        with pytest.raises(TypeError, match="step must be a str"):
            flashbook.attention(*args, step=["baseline"])


@pytest.mark.parametrize("bad", [[1], None, 3.0])
def test_attention_decode_varlen_name_a_non_tensor(bad):
    q, k = _f16(1, 2, 8, 16), _f16(1, 2, 8, 16)
    kind = type(bad).__name__
    with pytest.raises(TypeError, match=f"q must be a torch.Tensor, got {kind}"):
        flashattn.attention(bad, k, k)
    with pytest.raises(TypeError, match=f"v must be a torch.Tensor, got {kind}"):
        flashattn.attention(q, k, bad)
    lens = torch.tensor([8], dtype=torch.int32)
    with pytest.raises(TypeError, match=f"q must be a torch.Tensor, got {kind}"):
        flashattn.decode(bad, k, k, lens)
    with pytest.raises(TypeError, match=f"cache_seqlens must be a torch.Tensor, got {kind}"):
        flashattn.decode(_f16(1, 2, 1, 16), k, k, bad)
    qv, cu = _f16(8, 2, 16), torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match=f"q must be a torch.Tensor, got {kind}"):
        flashattn.attention_varlen(bad, qv, qv, cu, cu, 8, 8)
    with pytest.raises(TypeError, match=f"cu_seqlens_k must be a torch.Tensor, got {kind}"):
        flashattn.attention_varlen(qv, qv, qv, cu, bad, 8, 8)


def test_decode_checks_its_other_arguments():
    q, k = _f16(1, 2, 1, 16), _f16(1, 2, 32, 16)
    lens = torch.tensor([20], dtype=torch.int32)
    with pytest.raises(TypeError, match="block_table must be a torch.Tensor, got list"):
        flashattn.decode(q, k, k, lens, block_table=[[0]])
    with pytest.raises(TypeError, match="check_values must be a bool, got str"):
        flashattn.decode(q, k, k, lens, check_values="no")
    # What is checked after the device rule: CPU tensors pass it in the interpreter (nothing
    # launches: each call fails on its argument first).
    with flashattn.interpret.enabled():
        with pytest.raises(TypeError, match="max_seqlen must be an int or None, got str"):
            flashattn.decode(q, k, k, lens, max_seqlen="32")
        with pytest.raises(ValueError, match="max_seqlen must be at least 0, got -1"):
            flashattn.decode(q, k, k, lens, max_seqlen=-1)
        with pytest.raises(ValueError, match="num_splits must be a positive integer, got 'x'"):
            flashattn.decode(q, k, k, lens, num_splits="x")
        with pytest.raises(TypeError, match="out must be a torch.Tensor or None, got list"):
            flashattn.decode(q, k, k, lens, out=[0.0])


def test_varlen_checks_its_other_arguments():
    q = _f16(8, 2, 16, device="meta")
    cu = torch.tensor([0, 8], dtype=torch.int32, device="meta")
    with pytest.raises(TypeError, match="check_values must be a bool, got str"):
        flashattn.attention_varlen(q, q, q, cu, cu, 8, 8, check_values="no")
    with pytest.raises(TypeError, match="out must be a torch.Tensor or None, got list"):
        flashattn.attention_varlen(q, q, q, cu, cu, 8, 8, out=[0.0])
    with pytest.raises(TypeError, match="config must be a flashattn.config.Config"):
        flashattn.attention_varlen(q, q, q, cu, cu, 8, 8, config="64x64")
    with pytest.raises(TypeError, match="max_seqlen_q must be an int, got float"):
        flashattn.attention_varlen(q, q, q, cu, cu, 8.0, 8)


# --- 3. attention_varlen on meta tensors: shapes, as attention ---------------------------------
def test_varlen_on_meta_tensors_gives_shapes_as_attention_does():
    dense = flashattn.attention(*(_f16(1, 2, 8, 16, device="meta"),) * 3, causal=True)
    assert dense.device.type == "meta"
    q = _f16(8, 4, 16, device="meta")
    k = _f16(12, 2, 16, device="meta")
    cu_q = torch.tensor([0, 3, 8], dtype=torch.int32, device="meta")
    cu_k = torch.tensor([0, 5, 12], dtype=torch.int32, device="meta")
    out = flashattn.attention_varlen(q, k, k, cu_q, cu_k, 5, 7, causal=True)
    assert out.shape == (8, 4, 16) and out.dtype == torch.float16 and out.device.type == "meta"
    # Differentiable there too: the backward gives meta gradients of the inputs' shapes.
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, k))
    flashattn.attention_varlen(qg, kg, vg, cu_q, cu_k, 5, 7).float().sum().backward()
    assert qg.grad.shape == q.shape and kg.grad.shape == k.shape and vg.grad.device.type == "meta"
    dq, dk, dv = flashattn.attention_varlen_backward(q, k, k, out, out, cu_q, cu_k, 5, 7)
    assert dq.shape == q.shape and dk.shape == dv.shape == k.shape


def test_varlen_on_meta_tensors_still_refuses_what_the_kernel_refuses():
    q = _f16(8, 2, 16, device="meta")
    cu = torch.tensor([0, 8], dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="head dim differs"):
        flashattn.attention_varlen(q, _f16(8, 2, 32, device="meta"),
                                   _f16(8, 2, 32, device="meta"), cu, cu, 8, 8)
    with pytest.raises(ValueError, match="between 1 and 256"):
        big = _f16(8, 2, 512, device="meta")
        flashattn.attention_varlen(big, big, big, cu, cu, 8, 8)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        flashattn.attention_varlen(q.float(), q.float(), q.float(), cu, cu, 8, 8)
    with pytest.raises(TypeError, match="must be int32"):
        flashattn.attention_varlen(q, q, q, cu.long(), cu.long(), 8, 8)
    with pytest.raises(ValueError, match="must be on one device"):     # meta q, CPU offsets
        cpu = torch.tensor([0, 8], dtype=torch.int32)
        flashattn.attention_varlen(q, q, q, cpu, cpu, 8, 8)


# --- 4. nbrun: one error line, exit status 2, no cell run ---------------------------------------
@pytest.fixture
def no_run(monkeypatch):
    monkeypatch.setattr(nbrun, "run", lambda *a, **k: pytest.fail("nbrun.run reached"))


def _nbrun_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        nbrun.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def test_nbrun_refuses_what_is_not_a_notebook(tmp_path, no_run, capsys):
    (tmp_path / "notes.txt").write_text("not json")
    (tmp_path / "data.json").write_text(json.dumps({"rows": []}))
    good = tmp_path / "ok.ipynb"
    good.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    missing = str(tmp_path / "missing.ipynb")
    assert _nbrun_error([missing], capsys).endswith(f"error: no such notebook: {missing}")
    assert "notes.txt is not a notebook: not JSON" in _nbrun_error(
        [str(tmp_path / "notes.txt")], capsys)
    assert f"{tmp_path} is a directory" in _nbrun_error([str(tmp_path)], capsys)
    assert 'data.json is not a notebook: JSON without a list of "cells"' in _nbrun_error(
        [str(tmp_path / "data.json")], capsys)
    assert "is a directory; give the executed notebook's file name" in _nbrun_error(
        [str(good), str(tmp_path)], capsys)
    assert "no folder" in _nbrun_error([str(good), str(tmp_path / "no" / "out.ipynb")], capsys)


def test_nbrun_runs_a_notebook_it_accepts(tmp_path, monkeypatch):
    good = tmp_path / "ok.ipynb"
    good.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    calls = []
    monkeypatch.setattr(nbrun, "run", lambda i, o: calls.append((i, o)) or 0)
    assert nbrun.main([str(good), str(tmp_path / "out.ipynb")]) == 0
    assert calls == [(str(good), str(tmp_path / "out.ipynb"))]


# --- 5. profile without a GPU: the recording of the asked seqlen, or say which ------------------
def _summary(path, steps, N):
    shape = dict(B=4, Hq=32, Hkv=32, N=N, D=128, dtype="float16", causal=True)
    rows = [dict(step=s, kernel=f"kernel_n{N}", metric="launch__registers_per_thread",
                 value=128, unit="register/thread") for s in steps]
    P.merge_summary(path, dict(meta=dict(gpu="NVIDIA H200", ncu_version="2025.3.1.0",
                                         shape=shape, configs={s: "64x64" for s in steps}),
                               rows=rows, rules=[]))


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(P, "have_gpu_and_ncu", lambda ncu="ncu": (False, "no GPU here"))
    monkeypatch.setattr(P, "REPO", tmp_path)
    prof = tmp_path / "results" / "h200" / "profiles"
    _summary(prof / "summary.json", ["baseline", "remap"], 4096)
    _summary(prof / "n1024" / "summary.json", ["remap"], 1024)
    return prof


def test_profile_shows_the_recording_of_the_asked_seqlen(recorded, capsys):
    assert P.main(["--step", "remap", "--seqlen", "1024"]) == 0
    out = capsys.readouterr().out
    shown = out.split("Recorded in", 1)[1]
    assert shown.startswith(" results/h200/profiles/n1024/summary.json")
    assert "N=1024 B=4 Hq=32 Hkv=32 D=128 float16 causal" in shown
    assert "kernel_n1024" in shown and "kernel_n4096" not in out and "instead" not in out
    assert P.main(["--step", "remap"]) == 0                 # the default seqlen, 4096
    out = capsys.readouterr().out
    assert "kernel_n4096" in out and "kernel_n1024" not in out and "instead" not in out


def test_profile_says_which_recording_it_shows_instead(recorded, capsys):
    assert P.main(["--step", "baseline", "--seqlen", "1024"]) == 0
    out = capsys.readouterr().out
    assert ("No recorded profile of baseline at the asked shape (N=1024 B=4 Hq=32 Hkv=32 D=128 "
            "float16 causal); showing the one recorded at N=4096 B=4 Hq=32 Hkv=32 D=128 float16 "
            "causal instead.") in out
    assert "Recorded in results/h200/profiles/summary.json" in out and "kernel_n4096" in out
    # Two steps, two recordings: each at its best shape, each said.
    assert P.main(["--step", "remap", "--step", "baseline", "--seqlen", "1024"]) == 0
    out = capsys.readouterr().out
    assert "n1024/summary.json" in out and "kernel_n1024" in out and "kernel_n4096" in out
    assert out.count("instead") == 1
    assert P.main(["--step", "naive", "--seqlen", "1024"]) == 0
    assert "no recorded profile for naive" in capsys.readouterr().out


def test_profile_finds_the_repository_s_1024_recording():
    prof = REPO / "results" / "h200" / "profiles"
    if not P.json_path(prof / "n1024" / "summary.json"):
        pytest.skip("no recorded N=1024 profile")
    shape = dict(N=1024, B=4, Hq=32, Hkv=32, D=128, dtype="float16", causal=True)
    got = P.find_recorded(prof, ["remap", "baseline"], shape)
    assert got["remap"]["path"] == prof / "n1024" / "summary.json" and got["remap"]["exact"]
    assert got["baseline"]["path"] == prof / "summary.json" and not got["baseline"]["exact"]
    assert got["baseline"]["shape"]["N"] == 4096


# --- 6. record --quick without --out: not into the repository ------------------------------------
def test_record_quick_without_out_writes_outside_the_repository(monkeypatch, capsys):
    seen = []

    def record_compile(out, *, quick=False, command=None, **kw):
        seen.append(Path(out))
        return [Path(out) / "compile" / "sm_90-quick.json"]
    monkeypatch.setattr(record, "record_compile", record_compile)
    before = sorted(p.name for p in (REPO / "results").iterdir())
    try:
        assert record.main(["--part", "compile", "--quick"]) == 0
        (out,) = seen
        assert REPO.resolve() not in out.resolve().parents
        assert Path(tempfile.gettempdir()).resolve() in out.resolve().parents
        err = capsys.readouterr().err
        assert f"no --out: writing to {out} (a temporary folder" in err
        assert sorted(p.name for p in (REPO / "results").iterdir()) == before
    finally:
        for p in seen:
            if p.is_dir() and not any(p.iterdir()):
                os.rmdir(p)


def test_record_with_out_writes_there(monkeypatch, tmp_path, capsys):
    seen = []
    monkeypatch.setattr(record, "record_compile",
                        lambda out, **kw: seen.append(Path(out)) or [])
    assert record.main(["--part", "compile", "--quick", "--out", str(tmp_path)]) == 0
    assert seen == [tmp_path] and "no --out" not in capsys.readouterr().err


# --- 7. note_tables backward reads the compressed documents --------------------------------------
def test_json_docs_lists_plain_and_compressed_documents(tmp_path):
    import lzma
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.json.xz").write_bytes(lzma.compress(b'{"x": 1}'))
    (tmp_path / "c.txt").write_text("")
    docs = results.json_docs(tmp_path)
    assert docs == [tmp_path / "a.json", tmp_path / "b.json"]
    assert read_json(docs[1]) == {"x": 1}


def test_note_tables_backward_has_the_recorded_rows():
    folder = REPO / "results" / "h200" / "bench-backward"
    if not results.json_docs(folder):
        pytest.skip("no recorded backward documents")
    assert not list(folder.glob("*.json")) or list(folder.glob("*.json.xz"))
    mod = load(REPO / "experiments" / "note_tables.py", "experiments_note_tables")
    table = mod.backward(None).splitlines()
    assert len(table) > 2                                  # header, rule, and rows
    names = {line.split("|")[1].strip() for line in table[2:]}
    assert {f.name.removesuffix(".json") for f in results.json_docs(folder)} <= names


def test_library_compile_names_the_books_command_for_a_ladder_step():
    # The ladder kernel is the book's: the library's compile says where to go, no traceback.
    r = subprocess.run([sys.executable, "-m", "flashattn", "compile", "--step", "baseline"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "python -m flashbook compile --step baseline" in r.stderr
    assert "Traceback" not in r.stderr
