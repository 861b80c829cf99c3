"""The notebook tooling that needs no GPU: the mode banner, glue, nbrun, interleaved timing."""
import json

import nbformat
import pytest

from flashattn import book, timing


def test_recorded_mode_banner_names_the_gpu_and_date(monkeypatch):
    monkeypatch.setenv("FLASHATTN_BOOK_MODE", "recorded")
    book.gpu_available.cache_clear()
    try:
        text = book.banner_text()
    finally:
        book.gpu_available.cache_clear()
    assert text.startswith("**Mode: recorded.**")
    assert "H200" in text and "2026-" in text and "results/h200/" in text


def test_glue_returns_the_formatted_value():
    assert book.glue("test_value", 3.14159, ".2f") == "3.14"


def test_nbrun_executes_a_notebook_and_keeps_outputs(tmp_path):
    from flashattn.nbrun import run
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"),
                nbformat.v4.new_code_cell("x = 6 * 7\nprint(x)"),
                nbformat.v4.new_code_cell("import matplotlib.pyplot as plt\nplt.plot([1, 2])\nx"),
                nbformat.v4.new_code_cell("raise ValueError('stop here')"),
                nbformat.v4.new_code_cell("print('never')")]
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    assert run(str(src), str(out)) == 1                     # the failing cell stops the run
    cells = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    assert cells[0]["outputs"][0]["text"] == "42\n"
    kinds = {k for o in cells[1]["outputs"] for k in o.get("data", {})}
    assert "image/png" in kinds                             # figures are kept as PNG
    assert cells[1]["outputs"][-1]["output_type"] == "execute_result"
    assert cells[2]["outputs"][-1]["output_type"] == "error"
    assert cells[3]["outputs"] == []


def test_time_interleaved_alternates_and_rotates(monkeypatch):
    calls = []

    def fake_event_times(fn, reps, flush=True):
        calls.append((fn.__name__, reps))
        return [1.0] * reps

    monkeypatch.setattr(timing, "event_times", fake_event_times)
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)

    def a():
        pass

    def b():
        pass
    res = timing.time_interleaved({"a": a, "b": b}, {"a": 8, "b": 3}, rounds=4)
    assert [n for n, _ in calls] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert res["a"].reps == 8 and res["b"].reps == 4     # b: ceil(3/4) = 1 per round
    assert res["a"].median_ms == 1.0


def test_summarize_quartiles():
    t = timing.summarize([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (t.min_ms, t.median_ms, t.max_ms, t.reps) == (1.0, 3.0, 5.0, 5)
    assert t.q1_ms <= t.median_ms <= t.q3_ms
