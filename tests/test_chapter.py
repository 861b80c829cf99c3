"""The notebook tooling that needs no GPU (flashbook.chapter, flashbook.nbrun): the mode
banner, glue, code display, nbrun. (Interleaved timing: test_timing.py.)"""
import json

import pytest

from flashbook import chapter


def test_recorded_mode_banner_names_the_gpu_and_date(monkeypatch):
    monkeypatch.setenv("FLASHATTN_BOOK_MODE", "recorded")
    chapter.gpu_available.cache_clear()
    try:
        text = chapter.banner_text()
    finally:
        chapter.gpu_available.cache_clear()
    assert text.startswith("**Mode: recorded.**")
    assert "H200" in text and "2026-" in text and "results/h200/" in text


def test_recorded_mode_note_is_one_small_line(monkeypatch):
    """Issue 22, item 4: the page says its mode once, in a small note (no "Mode: ..." banner)."""
    pytest.importorskip("IPython")
    monkeypatch.setenv("FLASHATTN_BOOK_MODE", "recorded")
    chapter.gpu_available.cache_clear()
    try:
        text, note = chapter.note_text(), chapter.mode_note()
    finally:
        chapter.gpu_available.cache_clear()
    assert "H200" in text and "2026-" in text and "results/h200/" in text
    assert "\n" not in text and "Mode:" not in text and "**" not in text
    assert note._repr_html_() == f'<p class="provenance-note">{text}</p>'
    assert repr(note) == text                       # what nbval compares: the note, no address


def test_glue_returns_the_formatted_value():
    assert chapter.glue("test_value", 3.14159, ".2f") == "3.14"


def test_nbrun_executes_a_notebook_and_keeps_outputs(tmp_path):
    nbformat = pytest.importorskip("nbformat")     # not on the GPU host
    from flashbook.nbrun import run
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


def test_nbrun_stores_a_closed_figure_as_an_image(tmp_path):
    """A chapter's figure cell closes its figure and ends with it (``plt.close(fig); fig``): the
    result must be stored as a PNG, not as the text ``<Figure size ...>`` (issue 34: chapter
    15 lost three figures so), also with MPLBACKEND=Agg."""
    nbformat = pytest.importorskip("nbformat")
    from flashbook.nbrun import lost_figures, run
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 2])\n"
        "plt.close(fig)\nfig")]
    src, out = tmp_path / "in.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    assert run(str(src), str(out)) == 0
    (cell,) = [c for c in json.loads(out.read_text())["cells"] if c["cell_type"] == "code"]
    assert "image/png" in cell["outputs"][-1]["data"]
    assert lost_figures(cell["outputs"]) == []
    assert lost_figures([{"data": {"text/plain": "<Figure size 640x480 with 1 Axes>"}}])


def test_chapter_reexports_its_modules():
    import importlib
    page, helpers = (importlib.import_module(f"flashbook.chapter.{m}") for m in ("page", "helpers"))
    for name in chapter.__all__:
        src = page if hasattr(page, name) else helpers
        assert getattr(chapter, name) is getattr(src, name), name
    for name in ("setup", "glue", "show", "mode", "results", "banner_text", "gpu_available"):
        assert getattr(chapter, name) is getattr(page, name), name


def test_show_wraps_kernel_source_show():
    pytest.importorskip("IPython")
    from flashbook import source
    assert chapter.show("x = 1\n") is not None
    assert type(chapter.show("x = 1\n")) is type(source.show("x = 1\n"))


def test_below_shows_a_small_error_as_a_bound():
    assert chapter.below(3e-16, "1e-15") == "1e-15"
    for bad in (1e-15, 2e-15, float("nan")):
        with pytest.raises(AssertionError, match="not below 1e-15"):
            chapter.below(bad, "1e-15")


@pytest.mark.parametrize("step,N,input_pos", [("loop_split", 1000, 0), ("baseline", 512, 0),
                                              ("remap", 300, 130), ("pair", 1024, 0)])
def test_tile_kinds_is_the_emulated_schedule(step, N, input_pos):
    from flashbook.chapter.helpers import FULL, MASKED, SKIPPED
    from flashbook.ladder import emulate
    from flashattn.config import Config
    config = Config(128, 64)
    kinds = chapter.tile_kinds(step, N, config, input_pos=input_pos)
    assert kinds.shape == (-(-N // 128), -(-(N + input_pos) // 64))
    c = emulate.tile_counts(step, N, N + input_pos, causal=True, input_pos=input_pos,
                            config=config)
    assert c == dict(full=int((kinds == FULL).sum()), masked=int((kinds == MASKED).sum()),
                     skipped=int((kinds == SKIPPED).sum()))
