"""Train a small GPT twice from one seed: attention by flashattn, then by PyTorch's SDPA (issue 11).

    python experiments/train_gpt.py --out results/h200/train/gpt.json      # both runs, ~1-2 min
    python experiments/train_gpt.py --attn flashattn --steps 100
    python experiments/train_gpt.py --smoke --attn sdpa --device cpu --out /tmp/smoke.json

The model is a GPT-2-style decoder written with PyTorch modules (pre-norm blocks, causal
self-attention with optional grouped-query heads, GELU MLP, tied embeddings). The only thing
that differs between the two runs is the attention call::

    flashattn.attention(q, k, v, causal=True)                       # --attn flashattn
    F.scaled_dot_product_attention(q, k, v, is_causal=True, ...)    # --attn sdpa

Both runs start from the same initial weights (one seed) and see the same batches in the same
order; weights are fp32, the forward runs under bf16 autocast (fp16 with a gradient scaler
when ``--dtype float16``), so q, k, v reach attention in bf16/fp16 as the kernels take them.
The loss curves then differ only by the two attentions' rounding, which compounds over the
steps: they agree to within bf16 noise, not bit for bit.

The data set is made here, deterministically (``make_text``): character-level text from a small
probabilistic grammar (sentences about animals and objects, counting, one-digit sums), so it
has structure a small model learns in a few hundred steps and needs no download. The JSON
written holds both loss curves (train loss every step, validation loss every ``--eval-every``
steps), the throughput, and the metadata (arguments, versions, GPU, seed).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTNS = ("flashattn", "sdpa")


# --- the data set ------------------------------------------------------------------------------
ANIMALS = ("cat", "dog", "bird", "fox", "horse", "mouse", "owl", "frog", "bear", "fish")
THINGS = ("ball", "box", "tree", "house", "boat", "book", "cup", "hat", "key", "lamp")
COLOURS = ("red", "blue", "green", "small", "big", "old", "new", "dark", "bright", "soft")
VERBS = ("sees", "finds", "likes", "takes", "moves", "wants", "holds", "drops")
PLACES = ("in the house", "by the tree", "on the boat", "under the lamp", "near the river")


def _sentence(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.55:
        s = f"the {rng.choice(COLOURS)} {rng.choice(ANIMALS)} {rng.choice(VERBS)} a " \
            f"{rng.choice(COLOURS)} {rng.choice(THINGS)}"
        if rng.random() < 0.4:
            s += " " + rng.choice(PLACES)
        return s + "."
    if kind < 0.75:
        a = rng.randrange(0, 10)
        b = rng.randrange(0, 10)
        return f"{a} + {b} = {a + b}."
    if kind < 0.9:
        start = rng.randrange(1, 20)
        return " ".join(str(start + i) for i in range(rng.randrange(3, 8))) + "."
    name = rng.choice(ANIMALS)
    return f"where is the {name}? the {name} is {rng.choice(PLACES)}."


def make_text(n_chars: int, seed: int) -> str:
    """``n_chars`` characters of grammar text, the same for the same seed, one sentence a line
    or several per line."""
    rng = random.Random(seed)
    out, n = [], 0
    while n < n_chars:
        line = " ".join(_sentence(rng) for _ in range(rng.randrange(1, 4))) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out)[:n_chars]


class CharData:
    """Train/validation character streams (validation from another seed) and their batches."""

    def __init__(self, n_train: int = 400_000, n_val: int = 40_000, seed: int = 1234):
        train, val = make_text(n_train, seed), make_text(n_val, seed + 1)
        self.chars = sorted(set(train) | set(val))
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.train = torch.tensor([self.stoi[c] for c in train], dtype=torch.long)
        self.val = torch.tensor([self.stoi[c] for c in val], dtype=torch.long)

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def batch(self, split: str, batch: int, block: int, gen: torch.Generator, device):
        data = self.train if split == "train" else self.val
        ix = torch.randint(len(data) - block - 1, (batch,), generator=gen)
        x = torch.stack([data[i:i + block] for i in ix.tolist()])
        y = torch.stack([data[i + 1:i + 1 + block] for i in ix.tolist()])
        return x.to(device), y.to(device)


# --- the model ---------------------------------------------------------------------------------
def attention_fn(name: str):
    """(q, k, v) -> out, causal, (B, H, T, hd) / (B, Hkv, T, hd): flashattn or SDPA."""
    if name == "flashattn":
        import flashattn
        return lambda q, k, v: flashattn.attention(q, k, v, causal=True)
    if name == "sdpa":
        def sdpa(q, k, v):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                  enable_gqa=q.shape[1] != k.shape[1])
        return sdpa
    raise ValueError(f"attention must be one of {', '.join(ATTNS)}, got {name!r}")


class SelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_kv_head: int, attn):
        super().__init__()
        if n_embd % n_head or n_head % n_kv_head:
            raise ValueError(f"n_embd ({n_embd}) must divide by n_head ({n_head}) and n_head "
                             f"by n_kv_head ({n_kv_head})")
        self.n_head, self.n_kv_head, self.hd = n_head, n_kv_head, n_embd // n_head
        self.q = nn.Linear(n_embd, n_embd, bias=False)
        self.kv = nn.Linear(n_embd, 2 * n_kv_head * self.hd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        self.attn = attn

    def forward(self, x):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_head, self.hd).transpose(1, 2)        # (B, H, T, hd)
        k, v = self.kv(x).view(B, T, 2, self.n_kv_head, self.hd).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)                          # (B, Hkv, T, hd)
        y = self.attn(q, k, v)                                               # (B, H, T, hd)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, n_kv_head, attn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = SelfAttention(n_embd, n_head, n_kv_head, attn)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block: int, n_layer: int, n_embd: int, n_head: int,
                 n_kv_head: int, attn):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, n_kv_head, attn)
                                    for _ in range(n_layer))
        self.ln = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tok.weight                                   # tied
        self.apply(self._init)
        for n, p in self.named_parameters():                                 # GPT-2's scaled init
            if n.endswith("proj.weight") or n.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.float().view(-1, logits.shape[-1]),
                                       targets.view(-1))


# --- training ----------------------------------------------------------------------------------
PRESETS = {
    # ~19M parameters, 8K tokens a step: a few hundred steps take well under a minute on an H200.
    "default": dict(n_layer=6, n_embd=512, n_head=8, n_kv_head=2, block=256, batch=32,
                    steps=400, eval_every=25, eval_batches=8, lr=1e-3, warmup=40,
                    n_train=400_000, n_val=40_000),
    # A handful of steps of a tiny model: runs on a CPU in seconds (the CI smoke test).
    "smoke": dict(n_layer=2, n_embd=64, n_head=4, n_kv_head=2, block=64, batch=8, steps=6,
                  eval_every=3, eval_batches=2, lr=3e-3, warmup=2, n_train=20_000,
                  n_val=4_000),
}


def lr_at(step: int, *, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(attn: str, cfg: dict, *, seed: int, device: str, dtype: str, compile_: bool,
          data: CharData, log=print) -> dict:
    """One run: returns its curves and throughput."""
    torch.manual_seed(seed)
    model = GPT(data.vocab_size, cfg["block"], cfg["n_layer"], cfg["n_embd"], cfg["n_head"],
                cfg["n_kv_head"], attention_fn(attn)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=(0.9, 0.95),
                            weight_decay=0.1, fused=device.startswith("cuda"))
    step_model = torch.compile(model, fullgraph=True) if compile_ else model
    amp_dtype = getattr(torch, dtype)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    scaler = torch.amp.GradScaler(dev_type, enabled=dtype == "float16")
    gen_train = torch.Generator().manual_seed(seed + 1)                     # same batches
    curves = dict(step=[], train_loss=[], lr=[], val_step=[], val_loss=[])

    def evaluate():
        model.eval()
        gen = torch.Generator().manual_seed(seed + 2)                       # same val batches
        losses = []
        with torch.no_grad(), torch.autocast(dev_type, dtype=amp_dtype):
            for _ in range(cfg["eval_batches"]):
                x, y = data.batch("val", cfg["batch"], cfg["block"], gen, device)
                losses.append(step_model(x, y)[1].item())
        model.train()
        return sum(losses) / len(losses)

    t_train, tokens = 0.0, 0
    for step in range(cfg["steps"]):
        if step % cfg["eval_every"] == 0:
            curves["val_step"].append(step)
            curves["val_loss"].append(evaluate())
        lr = lr_at(step, lr=cfg["lr"], warmup=cfg["warmup"], steps=cfg["steps"])
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = data.batch("train", cfg["batch"], cfg["block"], gen_train, device)
        if dev_type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast(dev_type, dtype=amp_dtype):
            _, loss = step_model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        loss_v = loss.item()                                                 # synchronizes
        if step >= 3:                                                        # past compilation
            t_train += time.perf_counter() - t0
            tokens += x.numel()
        if not math.isfinite(loss_v):
            raise FloatingPointError(f"{attn}: loss is {loss_v} at step {step}")
        curves["step"].append(step)
        curves["train_loss"].append(loss_v)
        curves["lr"].append(lr)
        if step % cfg["eval_every"] == 0 or step == cfg["steps"] - 1:
            log(f"{attn:>9} step {step:4d}  loss {loss_v:.4f}  lr {lr:.2e}")
    curves["val_step"].append(cfg["steps"])
    curves["val_loss"].append(evaluate())
    log(f"{attn:>9} final val loss {curves['val_loss'][-1]:.4f}")
    return dict(curves, tokens_per_s=tokens / t_train if t_train else None,
                train_s=round(t_train, 3),
                params=sum(p.numel() for p in model.parameters()))


def compare(runs: dict) -> dict:
    """How far the curves are apart: max and mean |difference| of train loss (per step) and
    of validation loss, and the final values."""
    if set(runs) != set(ATTNS):
        return {}
    a, b = runs["flashattn"], runs["sdpa"]
    d = [abs(x - y) for x, y in zip(a["train_loss"], b["train_loss"])]
    dv = [abs(x - y) for x, y in zip(a["val_loss"], b["val_loss"])]
    return dict(max_abs_diff_train=max(d), mean_abs_diff_train=sum(d) / len(d),
                max_abs_diff_val=max(dv), final_val=dict(flashattn=a["val_loss"][-1],
                                                        sdpa=b["val_loss"][-1]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--attn", default="both", choices=[*ATTNS, "both"],
                   help="attention implementation (default: both, flashattn first)")
    p.add_argument("--smoke", action="store_true",
                   help="a tiny model for a handful of steps (CPU-friendly)")
    p.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                   help="autocast dtype (attention inputs' dtype); default bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="override the preset's steps")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile(model, fullgraph=True) (flashattn traces without breaks)")
    p.add_argument("--out", help="write the JSON of curves and metadata here")
    for k in ("n_layer", "n_embd", "n_head", "n_kv_head", "block", "batch", "lr"):
        p.add_argument("--" + k.replace("_", "-"), type=float if k == "lr" else int,
                       help=f"override the preset's {k}")
    return p


def main(argv=None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    cfg = dict(PRESETS["smoke" if a.smoke else "default"])
    for k in ("steps", "n_layer", "n_embd", "n_head", "n_kv_head", "block", "batch", "lr"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    for k in ("steps", "n_layer", "n_embd", "n_head", "n_kv_head", "block", "batch"):
        if cfg[k] < 1:
            p.error(f"--{k.replace('_', '-')} must be positive, got {cfg[k]}")
    if cfg["n_embd"] % cfg["n_head"] or cfg["n_head"] % cfg["n_kv_head"]:
        p.error("n_embd must be a multiple of n_head, and n_head of n_kv_head")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    attns = list(ATTNS) if a.attn == "both" else [a.attn]
    if "flashattn" in attns and not device.startswith("cuda"):
        p.error("--attn flashattn needs a CUDA GPU (the cuTile kernels); on a CPU use "
                "--attn sdpa")
    data = CharData(cfg["n_train"], cfg["n_val"], seed=1234)
    t0 = time.perf_counter()
    runs = {}
    for attn in attns:
        runs[attn] = train(attn, cfg, seed=a.seed, device=device, dtype=a.dtype,
                           compile_=a.compile, data=data,
                           log=lambda s: print(s, file=sys.stderr, flush=True))
    meta = dict(script="experiments/train_gpt.py", argv=sys.argv[1:] if argv is None else argv,
                preset="smoke" if a.smoke else "default", config=cfg, seed=a.seed,
                device=device, dtype=a.dtype, compile=a.compile, vocab_size=data.vocab_size,
                train_chars=len(data.train), val_chars=len(data.val),
                torch=torch.__version__, python=platform.python_version(),
                gpu=torch.cuda.get_device_name() if device.startswith("cuda") else None,
                elapsed_s=round(time.perf_counter() - t0, 1),
                note="same seed, same initial weights and batches; only the attention differs")
    try:
        import flashattn
        meta["flashattn"] = flashattn.__version__
    except Exception:  # pragma: no cover
        pass
    doc = dict(meta=meta, runs=runs, comparison=compare(runs))
    text = json.dumps(doc, indent=1)
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}")
        tmp.write_text(text)
        tmp.replace(out)
        print(f"wrote {out}", file=sys.stderr)
    if doc["comparison"]:
        c = doc["comparison"]
        print(f"train loss |flashattn - sdpa|: max {c['max_abs_diff_train']:.4f}, mean "
              f"{c['mean_abs_diff_train']:.4f}; final val {c['final_val']}", file=sys.stderr)
    print(f"took {meta['elapsed_s']} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
