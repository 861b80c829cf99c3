"""Every output that nbval compares is stable on any machine (issue 22, item 9).

nbval re-executes every notebook on the CPU and compares each cell's output with the committed
one (``NBVAL_IGNORE_OUTPUT`` cells excepted). A floating-point error computed on the CPU (a
reference against a kernel in the interpreter, two summation orders, fp64 against fp32) depends
on the BLAS build and the processor: printed as a number it can change in its last digits on
another machine, and the README's test command fails there (it once did, on a difference of
machine epsilon). So such an error is printed as a bound or a verdict: ``max |p - q| < 1e-15``,
``within twice PyTorch's error: yes``.

The check, on the committed outputs (CPU, a second): in every compared output, a number of
``1e-5`` or below, and on a line that speaks of an error (``err``, ``error``, ``|a - b|``) any
small number (a decimal below 0.01 too), stands only as a bound (after ``<``, ``≤``, ``below``, ``to``, ``within``, ``at
most``); a glued value whose key names an error (``..._err...``) is a bound, a power of ten.
``STABLE`` lists the few exceptions, each with why its printed digits cannot move.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = (sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")) + sorted((ROOT / "book").glob("*.ipynb"))
         + sorted((ROOT / "book" / "appendix").glob("*.ipynb")))
GLUE_MIME = "application/papermill.record/text/plain"

ERROR_LINE = re.compile(r"\berr(?:or)?s?\b|_err\b|\|[^|\n]*[-−][^|\n]*\|", re.I)
SMALL = re.compile(r"(?<![\w.])(?:\d(?:\.\d+)?e-\d+|0\.0\d*[1-9]\d*)(?![\w.])", re.I)
TINY = re.compile(r"(?<![\w.])\d+(?:\.\d+)?e-(?:0[5-9]|[1-9]\d)(?![\w.])", re.I)   # <= 1e-5
BOUND = re.compile(r"(?:<|≤|\bbelow|\bto|\bwithin|\bat most|\bunder)\s*$", re.I)
POWER_OF_TEN = re.compile(r"1e-\d+")

# (page, glue key or text) -> why its digits are the same on every machine.
STABLE = {
    ("15_summary.ipynb", "ch11_err_mat_lo"):
        "the smallest max |error| the H200 recording holds for naive and sdpa_math, read from "
        "results/h200 (six digits as recorded), not computed on this machine",
    ("15_summary.ipynb", "ch11_err_mat_hi"):
        "the largest of those recorded errors, read from results/h200 likewise",
    ("experiments.ipynb", "ch10_poly_err"):
        "the cubic's approximation error (8.6e-05) in fp64, two digits: rounding moves it by 1e-16",
    ("experiments.ipynb", "max relative error of the cubic"):
        "the same value, printed",
    ("02_online_softmax.ipynb", "safe softmax"):
        "fp16 values, each exactly rounded, printed at fp16's four digits",
    ("02_online_softmax.ipynb", "fp64 reference"):
        "an fp64 softmax of four values printed at four digits: rounding moves it by 1e-16",
    ("06_fast_math.ipynb", "largest flushed value"):
        "exp2 of a float32 input, an exact power of two, printed at four digits",
    ("06_fast_math.ipynb", "bound on the change of a row sum"):
        "16384 times that power of two, two digits",
}


def _compared_outputs(nb: dict):
    """(cell index, glue key or None, text) of every output nbval compares."""
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        if "NBVAL_IGNORE_OUTPUT" in src or "NBVAL_SKIP" in src:
            continue
        for o in cell.get("outputs", []):
            data = o.get("data", {})
            key = (o.get("metadata", {}).get("scrapbook") or {}).get("name")
            if key is not None:
                yield i, key, "".join(data.get(GLUE_MIME, ""))
            elif "text" in o:
                yield i, None, "".join(o["text"])
            elif "text/plain" in data:
                yield i, None, "".join(data["text/plain"])


def unstable_errors(nb: dict, page: str = "") -> list[str]:
    """Descriptions of the compared outputs that print a small error as a value."""
    bad = []
    for i, key, text in _compared_outputs(nb):
        if key is not None:
            value = text.strip().strip("'\"")
            if re.search(r"err", key, re.I) and SMALL.fullmatch(value) \
                    and not POWER_OF_TEN.fullmatch(value) and (page, key) not in STABLE:
                bad.append(f"cell {i}: glued {key} = {value} (glue the bound, a power of ten)")
            continue
        for line in text.split("\n"):
            if any(p == page and line.strip().startswith(t) for p, t in STABLE):
                continue
            # anywhere: a number of 1e-5 or below; on a line about an error: any small number
            for m in (SMALL if ERROR_LINE.search(line) else TINY).finditer(line):
                if not BOUND.search(line[:m.start()]):
                    bad.append(f"cell {i}: {line.strip()[:100]!r} prints {m[0]}")
    return bad


def test_the_check_catches_a_printed_error():
    def nb(*texts, glue=None):
        outs = [{"output_type": "stream", "name": "stdout", "text": t} for t in texts]
        if glue:
            outs.append({"output_type": "display_data", "metadata": {"scrapbook": {"name": glue[0]}},
                         "data": {GLUE_MIME: repr(glue[1])}})
        return {"cells": [{"cell_type": "code", "source": "x", "outputs": outs}]}
    assert unstable_errors(nb("max |p - softmax(x)| = 2.2e-16\n")) != []
    assert unstable_errors(nb("dQ, dK, dV against autograd: ['4.4e-16', '4.4e-16']\n")) != []
    assert unstable_errors(nb("rowsum(P o dP) - delta: 3.552713678800501e-15\n")) != []
    assert unstable_errors(nb("max abs error: 0.00049\n")) != []
    assert unstable_errors(nb("x", glue=("ch_err", "4.4e-16"))) != []
    assert unstable_errors(nb("max |p - softmax(x)| < 1e-15\n", "equal to 1e-12: yes\n")) == []
    assert unstable_errors(nb("error within 2e-3: yes\n", "TFLOPS 0.005\n")) == []
    assert unstable_errors(nb("x", glue=("ch_err", "1e-15"))) == []


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_compared_outputs_print_no_rounding_noise(path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    bad = unstable_errors(nb, path.name)
    assert not bad, (f"{path.name}: outputs that nbval compares print a floating-point error as a "
                     "value; print a bound or a verdict instead (max |a - b| < 1e-15, ... : yes):"
                     "\n  " + "\n  ".join(bad))


def test_stable_entries_are_used():
    used = set()
    for path in PAGES:
        nb = json.loads(path.read_text(encoding="utf-8"))
        for _, key, text in _compared_outputs(nb):
            for page, what in STABLE:
                if page == path.name and (key == what or (key is None and what in text)):
                    used.add((page, what))
    assert used == set(STABLE), f"unused STABLE entries: {sorted(set(STABLE) - used)}"
