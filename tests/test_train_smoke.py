"""experiments/train_gpt.py on a CPU: the data set is deterministic, the smoke run trains with
SDPA and writes its curves, the flashattn wiring of the model traces on the meta device
(forward and backward through the autograd operator), and bad options are refused."""
import json
import math
from pathlib import Path

import pytest
import torch

from scripts import load

PATH = Path(__file__).resolve().parents[1] / "experiments" / "train_gpt.py"


@pytest.fixture(scope="module")
def tg():
    mod = load(PATH, "train_gpt")
    return mod


def test_the_data_set_is_deterministic_and_small(tg):
    a, b = tg.make_text(50_000, 7), tg.make_text(50_000, 7)
    assert a == b and len(a) == 50_000 and a != tg.make_text(50_000, 8)
    assert "+" in a and "." in a and "where is the" in a
    d = tg.CharData(20_000, 4_000)
    assert d.vocab_size < 64 and len(d.train) == 20_000 and len(d.val) == 4_000
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    x1, y1 = d.batch("train", 4, 32, g1, "cpu")
    x2, _ = d.batch("train", 4, 32, g2, "cpu")
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])


def test_smoke_run_with_sdpa_writes_its_curves(tg, tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert tg.main(["--smoke", "--attn", "sdpa", "--device", "cpu", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"meta", "runs", "comparison"}
    run = doc["runs"]["sdpa"]
    steps = tg.PRESETS["smoke"]["steps"]
    assert run["step"] == list(range(steps)) and len(run["train_loss"]) == steps
    assert all(math.isfinite(x) for x in run["train_loss"] + run["val_loss"])
    assert run["train_loss"][-1] < run["train_loss"][0]                  # it learns
    assert run["val_step"][-1] == steps and run["params"] > 0
    assert doc["meta"]["device"] == "cpu" and doc["meta"]["seed"] == 0
    assert doc["comparison"] == {}                                      # one run only
    # Same seed, same run: the curves repeat exactly on a CPU.
    again = tmp_path / "again.json"
    tg.main(["--smoke", "--attn", "sdpa", "--device", "cpu", "--out", str(again)])
    assert json.loads(again.read_text())["runs"]["sdpa"]["train_loss"] == run["train_loss"]


def test_compare_two_runs(tg):
    a = dict(train_loss=[3.0, 2.0], val_loss=[3.1, 2.1])
    b = dict(train_loss=[3.0, 2.1], val_loss=[3.1, 2.0])
    c = tg.compare(dict(flashattn=a, sdpa=b))
    assert c["max_abs_diff_train"] == pytest.approx(0.1)
    assert c["final_val"] == dict(flashattn=2.1, sdpa=2.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_model_with_flashattn_traces_on_meta(tg, dtype):
    # The flashattn model's shapes, GQA and dtypes, forward and backward, with no GPU: the
    # autograd operator's meta implementations stand in for the kernels.
    cfg = tg.PRESETS["smoke"]
    model = tg.GPT(40, cfg["block"], cfg["n_layer"], cfg["n_embd"], cfg["n_head"],
                   cfg["n_kv_head"], tg.attention_fn("flashattn")).to("meta", dtype)
    x = torch.zeros(2, cfg["block"], dtype=torch.long, device="meta")
    _, loss = model(x, x)
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())


@pytest.mark.parametrize("bad", [["--attn", "flashattn", "--device", "cpu"],
                                 ["--smoke", "--n-head", "3"], ["--smoke", "--steps", "0"],
                                 ["--attn", "xla"]])
def test_bad_options(tg, bad, capsys):
    with pytest.raises(SystemExit):
        tg.main(bad)
    assert "error" in capsys.readouterr().err
    with pytest.raises(ValueError, match="attention must be"):
        tg.attention_fn("xla")
