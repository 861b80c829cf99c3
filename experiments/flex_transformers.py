"""flashattn inside Hugging Face transformers models (issue 23, item 7): tiny models built from
config classes with random weights (nothing downloaded), run with attn_implementation="cutile"
(flashattn.integrations.transformers) against the same weights with "eager".

The FlashAttention criterion on the logits: the reference is the eager model in float64; PyTorch's
own error is the eager model in the run's dtype (fp16/bf16); flashattn's max logit error must be
<= 2 x PyTorch's + a floor. CPU: the kernels run in flashattn's interpreter.

    python experiments/flex_transformers.py      # writes data/40-flex/transformers.{md,json}
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch

SEQ = 53                  # not a multiple of any tile
WINDOW = 16               # sliding windows smaller than the sequence, so they bite
MODELS = ("llama", "mistral", "gemma2", "gpt_oss")
QK_GAIN = 10.0            # the query/key projections scaled up from their random init


def tiny_config(kind: str):
    """A 2-layer model: hidden 64, 4 heads of 16, 2 key/value heads, vocab 128."""
    import transformers as tf
    common = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=128,
                  max_position_embeddings=256)
    if kind == "llama":
        return tf.LlamaConfig(**common)
    if kind == "mistral":
        return tf.MistralConfig(**common, sliding_window=WINDOW)
    if kind == "gemma2":
        # Softcap 2 on logits of this size bites (the default 50 would be a no-op); layer 0
        # sliding, layer 1 full; query_pre_attn_scalar = head_dim (scaling 1/4).
        return tf.Gemma2Config(**common, sliding_window=WINDOW, attn_logit_softcapping=2.0,
                               query_pre_attn_scalar=16,
                               layer_types=["sliding_attention", "full_attention"])
    if kind == "gpt_oss":
        return tf.GptOssConfig(**common, sliding_window=WINDOW, num_local_experts=4,
                               num_experts_per_tok=2,
                               layer_types=["sliding_attention", "full_attention"])
    raise KeyError(kind)


def tiny_model(kind: str, seed: int = 0):
    """The model in float32, eager attention, random weights (seeded; gpt-oss's sinks too)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    extra = dict(experts_implementation="eager") if kind == "gpt_oss" else {}   # fp64 experts
    m = AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="eager",
                                         **extra).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("sinks"):        # initialised empty/zero: make them matter
                p.copy_(torch.linspace(-1.0, 2.0, p.numel()))
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(QK_GAIN)                 # scores of a few units: softcap and masks bite
    return m


def inputs(batch: int = 2, seq: int = SEQ, padded: bool = False, seed: int = 1):
    """(input_ids, attention_mask or None); padded: the second row left-padded by 11."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (batch, seq), generator=g)
    if not padded:
        return ids, None
    am = torch.ones(batch, seq, dtype=torch.long)
    am[1, :11] = 0
    return ids, am


def compare(kind: str, dtype=torch.float16, *, padded: bool = False, name: str = "cutile",
            device: str = "cpu"):
    """Max |logit - fp64 eager| for flashattn and for eager in ``dtype``, over the unpadded
    positions; and how many times flashattn's flex_attention ran. ``device="cuda"``: the
    kernels on the GPU (the references too), else the interpreter on CPU."""
    import contextlib
    from flashattn import flex, interpret
    from flashattn.integrations import transformers as fa_hf
    fa_hf.register(name)
    base = tiny_model(kind).to(device)
    ids, am = inputs(padded=padded)
    ids = ids.to(device)
    am = am.to(device) if am is not None else None
    with torch.no_grad():
        # Eager in float64 turns a fully padded row into NaN (and spreads it through the next
        # layer's keys): with padding the float64 reference is SDPA.
        ref_model = copy.deepcopy(base).double()
        if padded:
            ref_model.set_attn_implementation("sdpa")
        ref = ref_model(ids, attention_mask=am).logits
        pt = copy.deepcopy(base).to(dtype)(ids, attention_mask=am).logits
        ours_model = copy.deepcopy(base).to(dtype)
        ours_model.set_attn_implementation(name)
        calls = []
        real = flex.flex_attention

        def counted(*a, **k):
            calls.append(1)
            return real(*a, **k)
        flex.flex_attention = counted
        try:
            with (interpret.enabled() if device == "cpu" else contextlib.nullcontext()):
                ours = ours_model(ids, attention_mask=am).logits
        finally:
            flex.flex_attention = real
    keep = (am.bool() if am is not None else torch.ones(ids.shape, dtype=torch.bool,
                                                         device=device))
    err = (ours.double() - ref)[keep].abs().max().item()
    err_pt = (pt.double() - ref)[keep].abs().max().item()
    return dict(model=kind, dtype=str(dtype).removeprefix("torch."), padded=padded,
                seq=ids.shape[1], err=err, err_pt=err_pt, flex_calls=len(calls),
                logit_max=ref.abs().max().item())


FLOOR = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def main(argv=None):
    out = Path(__file__).parent / "data" / "40-flex"
    rows = []
    for kind in MODELS:
        for dtype in (torch.float16, torch.bfloat16):
            rows.append(compare(kind, dtype))
    rows.append(compare("llama", torch.float16, padded=True))
    rows.append(compare("mistral", torch.bfloat16, padded=True))
    import transformers
    lines = ["# flashattn in transformers models (CPU, interpreter)", "",
             f"transformers {transformers.__version__}, torch {torch.__version__}. Tiny models "
             f"from config classes, random weights (seed 0; query and key projections x "
             f"{QK_GAIN:g}, so scores reach a few units), 2 layers, hidden 64, 4 query heads "
             f"of 16, 2 key/value heads, vocab 128, batch 2 x {SEQ} tokens; sliding window "
             f"{WINDOW} (Mistral; Gemma 2 and gpt-oss layer 0), Gemma 2 softcap 2.0, gpt-oss "
             "sinks linspace(-1, 2). Logits of attn_implementation=\"cutile\" (flashattn) and "
             "of \"eager\" in the same dtype against eager in float64 (SDPA in float64 when padded: "
             "eager's float64 mask turns padded rows into NaN); padded: row 2 left-padded "
             "by 11 (unpadded positions compared). Made by `experiments/flex_transformers.py`.",
             "", "| model | dtype | padded | max logit err flashattn | max logit err eager "
             "(same dtype) | criterion 2 x eager + floor | flex calls | max abs logit |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bound = 2 * r["err_pt"] + FLOOR[getattr(torch, r["dtype"])]
        r["bound"] = bound
        lines.append(f"| {r['model']} | {r['dtype']} | {'yes' if r['padded'] else 'no'} | "
                     f"{r['err']:.3g} | {r['err_pt']:.3g} | {bound:.3g} "
                     f"({'pass' if r['err'] <= bound else 'FAIL'}) | {r['flex_calls']} | "
                     f"{r['logit_max']:.3g} |")
    lines += ["", "gpt-oss in bfloat16: both errors are large and equal in kind because the "
              "mixture-of-experts router picks different experts for some tokens once the "
              "hidden states are rounded to bfloat16 (a discontinuity, in eager too); in float16 "
              "the routing agrees and the errors are those of the attention.",
              "", "Each feature bites (tests/test_transformers.py::test_each_feature_bites): "
              "with the integration dropping Mistral's sliding window, Gemma 2's softcap or "
              "gpt-oss's sinks, the flashattn error exceeds 5 x the criterion's bound."]
    out.mkdir(parents=True, exist_ok=True)
    (out / "transformers.md").write_text("\n".join(lines) + "\n")
    (out / "transformers.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
