"""Tiles a flex program loads under a BlockMask against the dense count (issue 23), on CPU.

The interpreter's trace (``flashattn.interpret.trace``) records every K and V tile each program
loads; a block the BlockMask does not list must cost no load. Prints a markdown table and writes
it with the raw counts to experiments/data/40-flex/tiles.{md,json}.

    PYTHONPATH=. python experiments/flex_tiles.py [--n 512] [--block 32]
"""
import argparse
import json
import warnings
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask

from flashattn import interpret, mods
from flashattn.flex import flex_attention

OUT = Path(__file__).resolve().parent / "data" / "40-flex"


def masks(n):
    ids = torch.arange(n, dtype=torch.int32) * 4 // n          # 4 equal documents
    return {
        "causal": mods.causal(),
        "sliding_window(64)": mods.sliding_window(64),
        "sliding_window(32, 32)": mods.sliding_window(32, 32),
        "document (4 docs)": mods.document(ids),
        "document causal (4 docs)": mods.document(ids, causal=True),
        "prefix_lm(128)": mods.prefix_lm(128),
    }


def count(mask, n, block, d=16):
    """(K tiles, V tiles, partial blocks, full blocks, dense tiles) of one head."""
    q, k, v = (torch.randn(1, 1, n, d).half() for _ in range(3))
    bm = create_block_mask(mask, None, None, n, n, device="cpu", BLOCK_SIZE=block)
    with interpret.enabled(), interpret.trace() as tr:
        flex_attention(q, k, v, block_mask=bm)
    kl = sum(tr.loads("K").values())
    vl = sum(tr.loads("V").values())
    part = int(bm.kv_num_blocks.sum())
    full = int(bm.full_kv_num_blocks.sum()) if bm.full_kv_num_blocks is not None else 0
    nt = -(-n // block)
    return dict(k_tiles=kl, v_tiles=vl, partial=part, full=full, dense=nt * nt,
                per_program=dict(sorted((str(p[0]), c) for p, c in tr.loads("K").items())))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    rows = {name: count(m, a.n, a.block) for name, m in masks(a.n).items()}
    lines = [f"N = {a.n}, BlockMask {a.block}x{a.block}, kernel tiles {a.block}x{a.block}, one "
             "head: key tiles loaded by all programs (interpreter trace)", "",
             "| mask | K tiles loaded | V tiles | partial (mask evaluated) | full (no mask) | "
             "dense | fraction of dense |", "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['k_tiles']} | {r['v_tiles']} | {r['partial']} | "
                     f"{r['full']} | {r['dense']} | {r['k_tiles'] / r['dense']:.3f} |")
    table = "\n".join(lines)
    print(table)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "tiles.md").write_text(table + "\n")
    (a.out / "tiles.json").write_text(json.dumps(dict(n=a.n, block=a.block, rows=rows),
                                                 indent=1) + "\n")


if __name__ == "__main__":
    main()
