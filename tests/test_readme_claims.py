"""README.md's FP8, backward-method, interpreter and build claims are the data's
(experiments/readme_claims.py recomputes each from results/ and experiments/data; issue 34
found five README sentences the data no longer said). CPU only, a few seconds."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from scripts import load

ROOT = Path(__file__).resolve().parents[1]


def _claims_module():
    mod = load(ROOT / "experiments" / "readme_claims.py", "readme_claims")
    return mod


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


CLAIMS = _claims_module().claims()


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_readme_says_what_the_data_say(name):
    readme = _flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert _flat(CLAIMS[name]) in readme, (
        f"README.md no longer says {CLAIMS[name]!r} ({name}); the data give it "
        f"(python experiments/readme_claims.py)")


def test_readme_fp8_example_is_the_fast_path():
    """The README's FP8 example passes V transposed (quantize_fp8(..., v_transposed=True) and
    attention(..., v_transposed=True)), the path the recorded speed-ups describe."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "quantize_fp8(v, v_transposed=True)" in readme
    assert re.search(r"flashattn\.attention\(q8, k8, v8t,[^)]*v_transposed=True\)", readme, re.S)
    assert "flashattn.attention(q8, k8, v8," not in readme


def test_backward_and_tilegym_claims_are_checked():
    """The backward's standing (fp16 re-timed, bf16 as recorded), the forward re-timed on the
    current build and TileGym's standing are among the checked claims, and the re-timed backward
    names its build: a README that drops or changes one of them fails above."""
    names = set(CLAIMS)
    assert {"backward fp16", "backward bf16", "fp16 backward re-timed", "forward re-timed",
            "tilegym forward", "tilegym backward", "tilegym decode"} <= names
    assert re.fullmatch(r"was re-timed on \d{4}-\d\d-\d\d on build [0-9a-f]{7}",
                        CLAIMS["fp16 backward re-timed"])


def test_a_wrong_number_fails():
    """The check is a substring test on the flattened README: an altered range is not found."""
    readme = _flat((ROOT / "README.md").read_text(encoding="utf-8"))
    wrong = CLAIMS["backward fp16"].replace(CLAIMS["backward fp16"][:4], "9.99", 1)
    assert wrong != CLAIMS["backward fp16"] and wrong not in readme


def test_current_build_is_false_before_the_kernels_moved():
    """"the current build" is claimed only while the timed kernels' sources match the recorded
    commit: the commit before kernels/common.py existed does not."""
    import subprocess
    mod = _claims_module()
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--",
                            "flashattn/kernels/common.py"], cwd=ROOT, capture_output=True,
                           text=True).stdout.split()
    if not added:
        pytest.skip("no git history here")
    assert not mod._current(added[-1] + "^")
