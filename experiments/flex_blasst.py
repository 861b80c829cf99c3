"""BLASST's accuracy against its threshold, on CPU through the interpreter (issue 23).

With ``blasst_threshold=T`` (log2 units) the flex kernel drops a key tile whose row maxima all
fall more than T below the running maxima, after S = QK^T: no exponentials, no V load, no P.V.
A dropped tile's weights are each below 2^-T of the row's current maximum weight, so the error
it leaves is at most TILE_N * 2^-T of that row's mass per dropped tile (times max |v|).

Measured here: the fraction of key tiles dropped (1 - V tiles / K tiles loaded, from the
interpreter's trace) and the error against exact attention (fp64), as functions of T, on
* random: q, k, v ~ N(0, 1) (flat attention: logits within a few units),
* local: each query aligned with its own key (logit ~12 natural units above the rest), as
  local/retrieval heads;
* sink: the first 16 keys carry a logit ~20 for every query, as attention sinks.

    PYTHONPATH=. python experiments/flex_blasst.py [--n 512]

Writes experiments/data/40-blasst/blasst.{md,json}. CPU only: the speed it buys is a GPU
question (a skipped tile still pays its K load and QK^T).
"""
import argparse
import json
import math
import warnings
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask
from torch.nn.attention.flex_attention import flex_attention as torch_flex

from flashattn import interpret, mods
from flashattn.flex import flex_attention

OUT = Path(__file__).resolve().parent / "data" / "40-blasst"
THRESHOLDS = [None, 20.0, 16.0, 12.0, 8.0, 6.0, 4.0, 2.0, 1.0]


def inputs(kind, n, d=64, h=2, seed=0):
    """q, k, v (1, h, n, d) fp16 on the CPU of one kind: random (flat attention), local (each
    query aligned with its own key: a logit ~12 natural units above the rest), sink (the first
    16 keys carry a logit ~20 for every query); the GPU benchmark's inputs at this size."""
    from flashbook.measure.bench_flex import blasst_inputs
    return blasst_inputs(kind, 1, h, n, d, dtype=torch.float16, device="cpu", seed=seed)


def run(kind, n, causal, tile):
    q, k, v = inputs(kind, n)
    bm = create_block_mask(mods.causal(), None, None, n, n, device="cpu", BLOCK_SIZE=tile) \
        if causal else None
    ref = torch_flex(q.double(), k.double(), v.double(), block_mask=bm)
    logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    rows = []
    for t in THRESHOLDS:
        with interpret.enabled(), interpret.trace() as tr:
            out = flex_attention(q, k, v, block_mask=bm, blasst_threshold=t,
                                 kernel_options={"BLOCK_M": tile, "BLOCK_N": tile})
        kl = sum(tr.loads("K").values())
        vl = sum(tr.loads("V").values())
        err = (out.double() - ref).abs()
        rows.append(dict(T=t, k_tiles=kl, v_tiles=vl, skipped=1 - vl / kl,
                         max_err=err.max().item(), mean_err=err.mean().item()))
    return dict(kind=kind, causal=causal, n=n, tile=tile,
                logit_spread=(logits.amax(-1) - logits.mean(-1)).mean().item(), rows=rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--tile", type=int, default=32)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    res = [run(kind, a.n, causal, a.tile) for kind in ("random", "local", "sink")
           for causal in (False, True)]
    lines = [f"N = {a.n}, H = 2, D = 64, fp16, tiles {a.tile}x{a.tile}; error: max |out - "
             "exact fp64|; skipped: fraction of loaded K tiles with no exp/V load/P.V", ""]
    head = "| input | causal | (row max - row mean) logit | " + " | ".join(
        "off" if t is None else f"T={t:g}" for t in THRESHOLDS) + " |"
    lines += [head, "|" + "---|" * (3 + len(THRESHOLDS))]
    for r in res:
        cells = [f"{x['skipped']:.1%} / {x['max_err']:.1e}" for x in r["rows"]]
        lines.append(f"| {r['kind']} | {r['causal']} | {r['logit_spread']:.1f} | " +
                     " | ".join(cells) + " |")
    lines += ["", "cells: skipped tiles / max error"]
    table = "\n".join(lines)
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "blasst.md").write_text(table + "\n")
    (a.out / "blasst.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
