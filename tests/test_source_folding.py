"""Folding a step's kernel source (flashbook.source): parameters that only folded-away
code reads leave the rendered signatures and calls (issue 13), and the forward's LSE output
(issue 11) never shows in a step's listing. CPU only: the source is read, not imported."""
import ast
import difflib
import textwrap

import pytest

from flashbook.ladder import LADDER as FMHA   # the ladder kernel every listing folds
from flashbook.source import (LATE_FLAGS, OUTPUT_PARAMS, prune_unused, specialize, step_diff,
                                     step_source)
from flashbook.steps import EXPERIMENTS, STEPS

FUSED = [n for n, s in {**STEPS, **EXPERIMENTS}.items() if s.kernel == "fmha"]
SHAPES = [(None, None), (True, True), (False, False), (True, False)]


def _params(src: str, fn: str) -> list[str]:
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name == fn:
            return [a.arg for a in node.args.args]
    raise KeyError(fn)


def _unused(src: str) -> list[tuple[str, str]]:
    """(function, parameter) pairs whose parameter no statement of the function reads."""
    out = []
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef):
            names = {n.id for s in node.body for n in ast.walk(s) if isinstance(n, ast.Name)}
            out += [(node.name, a.arg) for a in node.args.args if a.arg not in names]
    return out


@pytest.mark.parametrize("causal,even_k", SHAPES)
@pytest.mark.parametrize("step", FUSED)
def test_the_lse_output_is_not_in_any_steps_listing(step, causal, even_k):
    src = step_source(step, causal=causal, even_k=even_k)
    assert "Lse" not in src and "WRITE_LSE" not in src and "log2(l_i)" not in src
    # The rendered kernel takes the spec's parameters, less the LSE output and its flag.
    assert _params(src, "fmha_kernel") == [p for p in FMHA.params
                                           if p not in OUTPUT_PARAMS + LATE_FLAGS]
    compile(src, step, "exec")


@pytest.mark.parametrize("step", FUSED)
def test_with_the_lse_only_the_lse_lines_change(step):
    # The listing without the LSE is the listing with it, less exactly its lines and arguments:
    # the pruning keeps every other line as written (layout, comments, wrapping).
    plain = step_source(step, causal=True).splitlines()
    lse = step_source(step, causal=True, write_lse=True).splitlines()
    assert "Lse" in "\n".join(lse) and "WRITE_LSE" not in "\n".join(lse)   # folded to True
    assert _params("\n".join(lse), "fmha_kernel") == [p for p in FMHA.params
                                                       if p != "WRITE_LSE" and p not in LATE_FLAGS]
    # Take out the LSE block (its statements and the comment above them) and the argument.
    i = next(n for n, ln in enumerate(lse) if "lse = (m_i + ct.log2(l_i))" in ln)
    assert "ct.store(Lse" in lse[i + 1]
    start = i
    while lse[start - 1].lstrip().startswith("#"):
        start -= 1
    rest = lse[:start] + lse[i + 2:]
    assert [ln.replace(", Lse", "") for ln in rest] == plain, "\n".join(
        difflib.unified_diff(plain, [ln.replace(", Lse", "") for ln in rest], lineterm=""))
    assert step_diff(step, step, write_lse=True) == ""


def test_prune_true_drops_every_unused_parameter():
    src = step_source("baseline", causal=True, even_k=True, prune=True)
    compile(src, "baseline", "exec")
    assert _unused(src) == []
    kernel = _params(src, "fmha_kernel")
    for later in ("PAIR", "PERSISTENT", "LAZY_RESCALE", "EXP_POLY", "REMAP", "FAST_MATH",
                  "CAUSAL", "EVEN_K", "num_m_blocks", "Lse"):
        assert later not in kernel, later
    assert kernel[:4] == ["Q", "K", "V", "Out"] and "TILE_M" in kernel
    # The call passes exactly the helper's parameters.
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "attend_query_tile"]
    assert calls and all(len(c.args) == len(_params(src, "attend_query_tile")) for c in calls)
    # Default: only the LSE output is pruned, the book's listings are unchanged.
    assert "PERSISTENT: ConstBool" in step_source("baseline", causal=True, even_k=True)


@pytest.mark.parametrize("step", FUSED)
def test_prune_true_leaves_valid_python_for_every_step(step):
    for causal, even_k in SHAPES:
        src = step_source(step, causal=causal, even_k=even_k, prune=True)
        compile(src, step, "exec")
        assert _unused(src) == []


CASES = {
    # parameter last on a line with more before it; first on a line; last before ")".
    "layouts": ('''
def helper(a, X,
           b, c,
           Y):
    return a + b + c


def outer(a, b, c, X, Y,
          Z):
    helper(a, X,
           b, c,
           Y)
    return Z
''', ("X", "Y"), '''
def helper(a,
           b, c):
    return a + b + c


def outer(a, b, c,
          Z):
    helper(a,
           b, c)
    return Z
'''),
    # a keyword argument, a parameter alone on its line, and one used only after folding.
    "keywords": ('''
def f(x, FLAG, G):
    if FLAG:
        return x * G
    return x


def g(x,
      FLAG,
      G):
    return f(x, FLAG=FLAG, G=G)
''', None, '''
def f(x):
    return x


def g(x):
    return f(x)
'''),
}


@pytest.mark.parametrize("case", CASES)
def test_prune_unused_keeps_the_layout(case):
    src, names, want = CASES[case]
    got = prune_unused(specialize(textwrap.dedent(src), {"FLAG": False}), names)
    assert got == want


def test_prune_unused_leaves_used_and_unnamed_parameters():
    src = "def f(a, b):\n    return a\n\n\ndef g(c):\n    return f(c, c)\n"
    assert prune_unused(src, ("a",)) == src                  # a is read
    assert prune_unused(src, ("zzz",)) == src                # b is unused but not named
    assert prune_unused(src) == "def f(a):\n    return a\n\n\ndef g(c):\n    return f(c)\n"
    starred = "def f(a, b):\n    return a\n\n\ndef g(c):\n    return f(*c)\n"
    assert prune_unused(starred) == starred                  # positions unknown: left alone


def _top_level_unread(src: str) -> list[str]:
    """Top-level helpers and constants (not @ct.kernel entries) that nothing else reads."""
    tree = ast.parse(src)
    out = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.decorator_list:
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        read = {n.id for other in tree.body if other is not node for n in ast.walk(other)
                if isinstance(n, ast.Name)}
        if name not in read:
            out.append(name)
    return out


def test_prune_true_baseline_is_the_seed_and_nothing_more():
    src = step_source("baseline", causal=True, even_k=True, prune=True)
    src = src[src.index('"""', 3) + 3:]            # the module docstring describes every step
    for later in ("EXP_POLY", "PAIR", "PERSISTENT", "LAZY_RESCALE", "WRITE_LSE", "FAST_MATH",
                  "SPLIT_LOOP", "REMAP", "UNCHECKED_KV", "K_LAT", "V_LAT", "num_m_blocks",
                  "exp2_fma", "exp2_split", "EXP2_POLY", "ROUND_MAGIC", "RMd"):
        assert later not in src, later
    # The docstring no longer describes the pruned num_m_blocks; the rest of it stays.
    assert "group_size = Hq // Hkv." in src
    assert len(_params(src, "fmha_kernel")) == 11


@pytest.mark.parametrize("step", FUSED)
def test_prune_true_leaves_no_unread_helper(step):
    for causal, even_k in SHAPES:
        src = step_source(step, causal=causal, even_k=even_k, prune=True)
        assert _top_level_unread(src) == [], step
        assert "fmha_kernel" in src                          # the entry point always stays


def test_pruned_diffs_show_only_their_step():
    # The polynomial exp2 enters with its step, helpers and constants included.
    d = step_diff("exp_poly", prune=True)
    added = [ln[1:] for ln in d.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    assert any(ln.startswith("def exp2_fma") for ln in added)
    assert any(ln.startswith("EXP2_POLY") for ln in added)
    # Chapter 6's diff shows no flag of a later chapter.
    fm = step_diff("fast_math", prune=True)
    for later in ("EXP_POLY", "PAIR", "PERSISTENT", "LAZY_RESCALE", "SPLIT_LOOP", "REMAP"):
        assert later not in fm, later
    assert "flush_to_zero=True" in fm


def test_prune_definitions_keeps_spacing_and_comments():
    from flashbook.source import prune_definitions
    src = ("import math\nimport os\n\nA = 1\n# about B\nB = 2\n\n\ndef helper(x):\n"
           "    return x + B\n\n\ndef used():\n    return A + math.pi\n\n\n@ct.kernel\n"
           "def k():\n    used()\n")
    want = ("import math\n\nA = 1\n\n\ndef used():\n    return A + math.pi\n\n\n@ct.kernel\n"
            "def k():\n    used()\n")
    assert prune_definitions(src) == want


def test_prune_true_drops_later_chapters_locals():
    # chapter 7's mask_start is computed only from loop_split on.
    for causal in (None, True):
        base = step_source("baseline", causal=causal, even_k=causal, prune=True)
        assert "mask_start" not in base and "chapter 7" not in base
        assert "mask_start" in step_source("loop_split", causal=causal, even_k=causal, prune=True)
    d = step_diff("loop_split", prune=True)
    assert "+    Tc, mask_start = key_tile_range(" in d


def test_dead_assignments_keep_bodies_and_stores():
    from flashbook.source import prune_definitions
    src = ("@ct.kernel\ndef k(X, F):\n    if F:\n        a = 1\n    else:\n        a = 2\n"
           "    # why b\n    b = 3\n    ct.store(X, tile=b)\n    s = ct.store(X, tile=b)\n")
    # a is unread but each branch holds only it: the whole if goes; the store stays.
    got = prune_definitions(src)
    assert "a = " not in got and "if F" not in got
    assert "b = 3" in got and got.count("ct.store") == 2 and "# why b" in got


def test_kernel_params_counts_the_listing():
    from flashbook.source import kernel_params
    src = step_source("baseline", causal=True, even_k=True, prune=True)
    assert kernel_params(src) == ["Q", "K", "V", "Out", "qk_scale", "input_pos", "num_heads",
                                  "group_size", "TILE_M", "TILE_N", "TILE_D"]
    assert len(kernel_params(step_source("baseline", causal=True, even_k=True))) > 20
    with pytest.raises(KeyError):
        kernel_params(src, "nope")
    from flashbook.source import step_params
    assert step_params("baseline", causal=True, even_k=True, prune=True) == kernel_params(src)


def test_common_helpers_list_as_the_step_calls_them():
    # The math written once (flashattn/kernels/common.py) lists with the step's constants
    # folded in: chapter 2's update has no guard, no shift and exact exp2 in the baseline.
    base = step_source("baseline", causal=True, even_k=True, prune=True,
                       functions=("online_softmax_update",))
    assert base.startswith("def online_softmax_update(qk, m_i, l_i, acc, qk_scale):")
    assert "GUARD" not in base and "P_SHIFT" not in base and "flush_to_zero=False" in base
    fast = step_source("fast_math", causal=True, even_k=True, prune=True,
                       functions=("online_softmax_update",))
    assert "flush_to_zero=True" in fast and "flush_to_zero=False" not in fast
    mask = step_source("baseline", prune=True, functions=("mask_scores",))
    assert "ct.where(mask, qk, -math.inf)" in mask and "EVEN_K" in mask
    # The call sites read the step's constants too.
    assert "k_seqlen, TILE_N, True)" in step_source("baseline", causal=True, even_k=True,
                                                     prune=True)
