"""Run a chapter notebook top to bottom without Jupyter: ``python -m flashbook nbrun IN [OUT]``.

For machines with no Jupyter kernel machinery (the offline H200 host used for the book). Each
code cell runs in one IPython shell, in order, in the notebook's folder; its stdout, stderr, rich
outputs (text, Markdown, PNG figures) and errors are written into OUT as ordinary notebook
outputs, so the executed notebook can be opened or rendered. Stops at the first failing cell
(exit status 1), like ``jupyter execute``. Without IPython, a plain runner does the same with
``exec`` (magics skipped; ``IPython.display`` and ``ipywidgets.interact`` stood in for: an
interactive figure is drawn once at its initial values).
"""
from __future__ import annotations

import json
import os
import sys
import time


def _outputs(cap, result, formatter) -> list[dict]:
    outs = []
    if cap.stdout:
        outs.append({"output_type": "stream", "name": "stdout", "text": cap.stdout})
    if cap.stderr:
        outs.append({"output_type": "stream", "name": "stderr", "text": cap.stderr})
    for o in cap.outputs:
        outs.append({"output_type": "display_data", "data": o.data,
                     "metadata": o.metadata or {}})
    if result is not None and result.result is not None:
        # The shell's formatter: it holds the PNG printer for figures (a fresh DisplayFormatter
        # has none and stores a figure as its text repr only).
        data, md = formatter.format(result.result)
        outs.append({"output_type": "execute_result", "data": data, "metadata": md,
                     "execution_count": result.execution_count})
    return outs


def _code_cells(nb: dict):
    """(execution number, cell, source) of each code cell of ``nb``, in order."""
    n = 0
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            n += 1
            src = cell["source"]
            yield n, cell, "".join(src) if isinstance(src, list) else src


def _importable(name: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _have_ipython() -> bool:
    return _importable("IPython")


def run(path_in: str, path_out: str | None = None) -> int:
    import matplotlib
    matplotlib.use("Agg")
    if not _have_ipython():
        return _run_plain(path_in, path_out)
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    nb = json.load(open(path_in))
    from IPython.core.pylabtools import select_figure_formats
    shell = InteractiveShell.instance()
    shell.enable_gui = lambda gui=None: None              # `%matplotlib inline` needs no GUI
    select_figure_formats(shell, {"png"}, bbox_inches="tight")   # PNG, as inline
    shell.displayhook.write_output_prompt = lambda: None  # results go into the notebook only
    shell.displayhook.write_format_data = lambda *a, **k: None
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path_in)))
    status = 0
    try:
        for n, cell, src in _code_cells(nb):
            t0 = time.perf_counter()
            with capture_output() as cap:
                res = shell.run_cell(src, store_history=True)
                import matplotlib.pyplot as plt
                from IPython.display import display
                for num in plt.get_fignums():      # what %matplotlib inline would show
                    display(plt.figure(num))
                plt.close("all")
            cell["outputs"] = _outputs(cap, res, shell.display_formatter)
            cell["execution_count"] = n
            ok = res.success
            lost = lost_figures(cell["outputs"]) if ok else []
            if lost:
                res.error_in_exec = RuntimeError(
                    f"a figure was stored as text without an image ({lost[0]!r}): nbrun's PNG "
                    f"formatter did not run")
                ok = False
            print(f"cell {n}: {'ok' if ok else 'FAILED'} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
            if not ok:
                err = res.error_in_exec or res.error_before_exec
                print(f"  {type(err).__name__}: {err}", file=sys.stderr)
                cell["outputs"].append({"output_type": "error", "ename": type(err).__name__,
                                        "evalue": str(err), "traceback": []})
                status = 1
                break
    finally:
        os.chdir(here)
    if path_out:
        with open(path_out, "w") as f:
            json.dump(nb, f, indent=1)
    return status


def lost_figures(outputs: list[dict]) -> list[str]:
    """The text reprs of matplotlib figures in ``outputs`` stored without an image: what a
    runner without a PNG formatter leaves (the page then shows ``<Figure size ...>``)."""
    lost = []
    for o in outputs:
        data = o.get("data", {})
        text = data.get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else text
        if text.startswith("<Figure size") and not any(k.startswith("image/") for k in data):
            lost.append(text.strip())
    return lost


# --- without IPython ---------------------------------------------------------------------------

def _bundle(obj) -> dict:
    """A MIME bundle of ``obj``, as IPython's formatter would give the common cases."""
    import base64
    import io
    data = {"text/plain": repr(obj)}
    if hasattr(obj, "savefig"):                                  # a matplotlib figure
        buf = io.BytesIO()
        obj.savefig(buf, format="png", bbox_inches="tight")
        data["image/png"] = base64.b64encode(buf.getvalue()).decode()
        data["text/plain"] = f"<Figure size {obj.get_size_inches()}>"
    for meth, mime in (("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown")):
        f = getattr(obj, meth, None)
        if callable(f):
            try:
                v = f()
            except Exception:                                    # noqa: BLE001 (as IPython)
                v = None
            if v is not None:
                data[mime] = v
    return data


def _stand_ins(sink: list):
    """Modules ``IPython.display`` and ``ipywidgets`` enough for the chapters (installed only
    where the real ones are missing)."""
    import types
    mods = {}

    class _Text:
        mime = "text/plain"

        def __init__(self, data):
            self.data = data

        def __repr__(self):
            return self.data

    class Markdown(_Text):
        def _repr_markdown_(self):
            return self.data

    class HTML(_Text):
        def _repr_html_(self):
            return self.data

    def display(*objs, **_):
        for o in objs:
            sink.append({"output_type": "display_data", "data": _bundle(o), "metadata": {}})

    disp = types.ModuleType("IPython.display")
    disp.display, disp.Markdown, disp.HTML = display, Markdown, HTML
    ipy = types.ModuleType("IPython")
    ipy.display = disp
    ipy.get_ipython = lambda: None                 # matplotlib asks: no shell, no display hook
    ipy.version_info = (9, 0, 0, "")              # ... and a recent one (no backend fix-up)
    mods.update({"IPython": ipy, "IPython.display": disp})
    if not _importable("ipywidgets"):
        w = types.ModuleType("ipywidgets")

        class _Widget:
            def __init__(self, value=None, options=None, min=None, **kw):  # noqa: A002
                self.value = value if value is not None else (
                    list(options)[0] if options else min)

        w.IntSlider = w.FloatSlider = w.Dropdown = w.Checkbox = _Widget

        def interact(f, **kw):
            vals = {k: (v.value if isinstance(v, _Widget) else v) for k, v in kw.items()}
            f(**vals)
            return None
        w.interact = interact
        mods["ipywidgets"] = w
    return mods, display


def _run_plain(path_in: str, path_out: str | None) -> int:
    import ast
    import contextlib
    import io
    import traceback
    import matplotlib.pyplot as plt
    plt.switch_backend("Agg")                      # before the stand-ins: matplotlib asks IPython
    nb = json.load(open(path_in))
    sink: list = []
    mods, display = _stand_ins(sink)
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    ns = {"__name__": "__main__", "display": display}
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path_in)))
    status = 0
    try:
        for n, cell, src in _code_cells(nb):
            src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln
                             for ln in src.split("\n"))
            t0 = time.perf_counter()
            sink.clear()
            out, err = io.StringIO(), io.StringIO()
            ok, result = True, None
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    tree = ast.parse(src)
                    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) \
                        else None
                    exec(compile(tree, f"<cell {n}>", "exec"), ns)
                    if last is not None:
                        result = eval(compile(ast.Expression(last.value), f"<cell {n}>", "eval"),
                                      ns)
                    import matplotlib.pyplot as plt
                    for num in plt.get_fignums():
                        display(plt.figure(num))
                    plt.close("all")
            except Exception as exc:                                 # noqa: BLE001
                ok, error = False, exc
                tb = traceback.format_exc()
            outs = []
            if out.getvalue():
                outs.append({"output_type": "stream", "name": "stdout", "text": out.getvalue()})
            if err.getvalue():
                outs.append({"output_type": "stream", "name": "stderr", "text": err.getvalue()})
            outs += list(sink)
            if result is not None:
                outs.append({"output_type": "execute_result", "data": _bundle(result),
                             "metadata": {}, "execution_count": n})
            cell["outputs"], cell["execution_count"] = outs, n
            print(f"cell {n}: {'ok' if ok else 'FAILED'} ({time.perf_counter() - t0:.1f} s)",
                  file=sys.stderr, flush=True)
            if not ok:
                print(tb, file=sys.stderr)
                cell["outputs"].append({"output_type": "error",
                                        "ename": type(error).__name__, "evalue": str(error),
                                        "traceback": tb.splitlines()})
                status = 1
                break
    finally:
        os.chdir(here)
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    if path_out:
        with open(path_out, "w") as f:
            json.dump(nb, f, indent=1)
    return status


def check_paths(path_in: str, path_out: str | None = None) -> None:
    """Raise ValueError, one line naming the path, unless ``path_in`` is a notebook (a JSON
    file with a list of cells) and ``path_out`` (if given) a file that can be written: what
    ``main`` checks before running a cell."""
    if not os.path.exists(path_in):
        raise ValueError(f"no such notebook: {path_in}")
    if os.path.isdir(path_in):
        raise ValueError(f"{path_in} is a directory; give one notebook (.ipynb) in it")
    try:
        with open(path_in, encoding="utf-8") as f:
            nb = json.load(f)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path_in} is not a notebook: not JSON ({e})") from None
    except OSError as e:
        raise ValueError(f"cannot read {path_in}: {e.strerror or e}") from None
    if not (isinstance(nb, dict) and isinstance(nb.get("cells"), list)):
        raise ValueError(f"{path_in} is not a notebook: JSON without a list of \"cells\"")
    if path_out:
        if os.path.isdir(path_out):
            raise ValueError(f"OUT {path_out} is a directory; give the executed notebook's file "
                             "name")
        parent = os.path.dirname(os.path.abspath(path_out))
        if not os.path.isdir(parent):
            raise ValueError(f"OUT {path_out}: no folder {parent}")


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashbook nbrun",
                                description="Run a chapter notebook top to bottom without "
                                            "Jupyter, writing its outputs into OUT.",
                                epilog="example: python -m flashbook nbrun "
                                       "notebooks/03_first_kernel.ipynb /tmp/03.ipynb")
    p.add_argument("notebook", help="the notebook to run")
    p.add_argument("out", nargs="?", help="where to write the executed notebook")
    a = p.parse_args(argv)
    try:
        check_paths(a.notebook, a.out)
    except ValueError as e:
        p.error(str(e))             # one line, exit status 2: no cell has run
    return run(a.notebook, a.out)


if __name__ == "__main__":
    sys.exit(main())
