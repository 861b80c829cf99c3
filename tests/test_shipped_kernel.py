"""One source of truth for the forward kernel: the library's ``flashattn/kernels/fmha.py`` is the
book's ladder kernel (``flashbook/ladder/fmha.py``) with the shipped flags folded away, as code
(docstrings and comments aside), so every diff the book shows is a diff of the real kernel."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from flashattn.kernels import FMHA
from flashbook import source
from flashbook.ladder import LADDER, SHIPPED_FLAGS

REPO = Path(__file__).resolve().parents[1]


def test_the_library_kernel_is_the_ladder_folded():
    folded = source.shipped_kernel_source()
    shipped = source.normalized(source.kernel_source("shipped"))
    assert folded == shipped, "flashattn/kernels/fmha.py is not the ladder with SHIPPED_FLAGS " \
                              "folded away: regenerate it or fold the change into the ladder"


@pytest.mark.parametrize("flag,value", [("FAST_MATH", False), ("SPLIT_LOOP", False),
                                        ("REMAP", False), ("EXP_POLY", 4), ("PAIR", True)])
def test_other_flags_give_another_kernel(flag, value):
    # The check can fail: folding with any other flag value is not the library's kernel.
    folded = source.shipped_kernel_source(dict(SHIPPED_FLAGS, **{flag: value}))
    assert folded != source.normalized(source.kernel_source("shipped"))


def test_the_library_kernel_has_only_shipped_constants():
    FMHA.check_signature()
    src = source.kernel_source("shipped")
    names = {n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name)}
    assert not names & set(SHIPPED_FLAGS), sorted(names & set(SHIPPED_FLAGS))
    assert set(FMHA.constants) < set(LADDER.constants)
    assert len(LADDER.constants) - len(FMHA.constants) == len(SHIPPED_FLAGS) == 9


def test_the_library_does_not_ship_the_ladder():
    # The wheel's flashattn has no ladder kernel: its forward holds only the shipped flags.
    assert not (REPO / "flashattn" / "kernels" / "ladder.py").exists()
    code = ("import sys, flashattn, flashattn.kernels as K\n"
            "print(len(K.FMHA.constants), 'flashbook' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["8", "False"]


def test_a_ladder_step_without_the_book_says_so():
    # The book's steps are not registered; the library's steps name no ladder flag.
    code = ("import flashattn.kernels as K, flashattn.registry as S\n"
            "try:\n    S.get_step('baseline')\n"
            "except ValueError as e:\n    print(e)\n"
            "print(sorted(S.get_step('arch_tuned').flags))\n"
            "print(K.fmha_spec(S.get_step('warp_groups')).module)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "unknown step 'baseline'" in lines[0] and "import flashbook first" in lines[0]
    assert lines[1] == "['K_LAT', 'V_LAT']"
    assert res.stdout.strip().endswith("flashattn.kernels.fmha")


def test_flashbook_attention_runs_a_ladder_step_and_the_shipped_one():
    import torch

    import flashattn
    import flashbook
    q = torch.randn(1, 2, 40, 16, generator=torch.Generator().manual_seed(0)).half()
    ref = flashattn.reference.attention(q.double(), q.double(), q.double(), causal=True)
    with flashattn.interpret.enabled():
        for step in ("baseline", "remap", "best"):
            o = flashbook.attention(q, q, q, causal=True, step=step)
            assert (o.double() - ref).abs().max() < 2e-3, step


# The decode and backward kernels: the library's are the book's (flashbook/ladder/decode.py,
# fmha_bwd.py) with the off switches folded away, the parameters only they read dropped.
SWITCHES = {"FUSED": False, "PDL": 0}


@pytest.mark.parametrize("name", ("decode", "fmha_bwd"))
def test_the_library_decode_and_backward_are_the_ladder_folded(name):
    import importlib.util
    ladder = Path(importlib.util.find_spec(f"flashbook.ladder.{name}").origin).read_text()
    library = Path(importlib.util.find_spec(f"flashattn.kernels.{name}").origin).read_text()
    folded = source.prune_unused(source.specialize(ladder, SWITCHES),
                                 (*SWITCHES, "Counter"))
    assert source.normalized(folded) == source.normalized(library), name
    # The check can fail: the switch on is another kernel.
    on = source.prune_unused(source.specialize(ladder, {"FUSED": True, "PDL": 1}), ())
    assert source.normalized(on) != source.normalized(library)
    text = library
    for word in ("FUSED", "PDL", "Counter", "grid_dependency"):
        assert word not in text, (name, word)
    if name == "decode":
        assert "atomic_add" not in text   # the fused merge's count (the backward's atomic
                                          # variant ships: deterministic=False)
