"""Run a chapter notebook top to bottom without Jupyter: ``python -m flashattn nbrun IN [OUT]``.

For GPU machines that have IPython but no Jupyter kernel machinery (the offline H200 host
used for the book). Each code cell runs in one IPython shell, in order, in the notebook's
folder; its stdout, stderr, rich outputs (text, Markdown, PNG figures) and errors are written
into OUT as ordinary notebook outputs, so the executed notebook can be opened or rendered.
Stops at the first failing cell (exit status 1), like ``jupyter execute``.
"""
from __future__ import annotations

import json
import os
import sys
import time


def _outputs(cap, result) -> list[dict]:
    outs = []
    if cap.stdout:
        outs.append({"output_type": "stream", "name": "stdout", "text": cap.stdout})
    if cap.stderr:
        outs.append({"output_type": "stream", "name": "stderr", "text": cap.stderr})
    for o in cap.outputs:
        outs.append({"output_type": "display_data", "data": o.data,
                     "metadata": o.metadata or {}})
    if result is not None and result.result is not None:
        from IPython.core.formatters import DisplayFormatter
        data, md = DisplayFormatter().format(result.result)
        outs.append({"output_type": "execute_result", "data": data, "metadata": md,
                     "execution_count": result.execution_count})
    return outs


def run(path_in: str, path_out: str | None = None) -> int:
    import matplotlib
    matplotlib.use("Agg")
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output
    nb = json.load(open(path_in))
    from IPython.core.pylabtools import select_figure_formats
    shell = InteractiveShell.instance()
    shell.enable_gui = lambda gui=None: None              # `%matplotlib inline` needs no GUI
    select_figure_formats(shell, {"png"})                 # figures display as PNG, as inline
    shell.displayhook.write_output_prompt = lambda: None  # results go into the notebook only
    shell.displayhook.write_format_data = lambda *a, **k: None
    here = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path_in)))
    status = 0
    try:
        n = 0
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            n += 1
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            t0 = time.perf_counter()
            with capture_output() as cap:
                res = shell.run_cell(src, store_history=True)
                import matplotlib.pyplot as plt
                from IPython.display import display
                for num in plt.get_fignums():      # what %matplotlib inline would show
                    display(plt.figure(num))
                plt.close("all")
            cell["outputs"] = _outputs(cap, res)
            cell["execution_count"] = n
            ok = res.success
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


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m flashattn nbrun",
                                description="Run a chapter notebook top to bottom without "
                                            "Jupyter, writing its outputs into OUT.",
                                epilog="example: python -m flashattn nbrun "
                                       "notebooks/03_first_kernel.ipynb /tmp/03.ipynb")
    p.add_argument("notebook", help="the notebook to run")
    p.add_argument("out", nargs="?", help="where to write the executed notebook")
    a = p.parse_args(argv)
    return run(a.notebook, a.out)


if __name__ == "__main__":
    sys.exit(main())
