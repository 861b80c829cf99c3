"""experiments/flex_bench.py's dry run on CPU (tiny shapes, the interpreter, eager torch flex,
fake timing): the GPU script's plumbing works and writes its JSON. No GPU."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import flex_bench  # noqa: E402


def test_dry_run_quick(tmp_path):
    assert flex_bench.main(["--dry-run", "--quick", "--n", "128", "--rounds", "1",
                            "--out", str(tmp_path)]) == 0
    d = json.loads((tmp_path / "flex_bench.json").read_text())
    assert [r["workload"] for r in d["rows"]] == ["causal", "sliding_window_1K", "document_8",
                                                  "softcap_50"]
    for r in d["rows"]:
        assert not r["errors"], r["errors"]
        assert {"flashattn.flex", "flashattn.flex#2", "torch.flex"} <= set(r["impls"])
        assert r["impls"]["torch.flex"]["max_diff_vs_ours"] < 5e-3
        assert r["impls"]["flashattn.flex#2"]["max_diff_vs_ours"] == 0.0
    assert "dry run" in d["meta"]["device"]
