"""Block sparsity that pays, seen through the interpreter's trace: a flex program loads exactly
the key tiles its query block's BlockMask lists (partial and full), never a skipped one, and far
fewer than the dense count for sliding-window, document and prefix-LM masks. No GPU."""
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from flashattn import interpret, mods
from flashattn.flex import flex_attention

warnings.filterwarnings("ignore", message=".*flex_attention.*")

N, BLOCK = 256, 32
IDS = torch.arange(N, dtype=torch.int32) * 4 // N              # 4 documents of 64


@pytest.mark.parametrize("name,mask,at_most", [
    ("sliding_window", mods.sliding_window(40), 0.35),
    ("document", mods.document(IDS, causal=True), 0.3),
    ("prefix_lm", mods.prefix_lm(64), 0.75),
])
@pytest.mark.parametrize("tiles", [(32, 32), (16, 16)], ids=["tile=block", "tile<block"])
def test_tiles_loaded_are_the_listed_blocks(name, mask, at_most, tiles):
    tm, tn = tiles
    q, k, v = (torch.randn(1, 2, N, 16).half() for _ in range(3))
    bm = create_block_mask(mask, None, None, N, N, device="cpu", BLOCK_SIZE=BLOCK)
    with interpret.enabled(), interpret.trace() as tr:
        flex_attention(q, k, v, block_mask=bm, kernel_options={"BLOCK_M": tm, "BLOCK_N": tn})
    qpb, tpb = BLOCK // tm, BLOCK // tn
    listed = bm.kv_num_blocks[0, 0] + bm.full_kv_num_blocks[0, 0]       # per query block
    loads = tr.loads("K")
    for (x, y, _), n in loads.items():
        assert n == int(listed[x // qpb]) * tpb, (name, x, y, n)
    # Which tiles: exactly those of the listed blocks, in the partial-then-full order.
    for x in range(N // tm):
        qb = x // qpb
        blocks = (bm.kv_indices[0, 0, qb, :bm.kv_num_blocks[0, 0, qb]].tolist() +
                  bm.full_kv_indices[0, 0, qb, :bm.full_kv_num_blocks[0, 0, qb]].tolist())
        want = [b * tpb + t for b in blocks for t in range(tpb)]
        got = [i[3] for i in tr.tiles("load", "K", (x, 0, 0))]
        assert got == want, (name, x)
    dense = 2 * (N // tm) * (N // tn)
    total = sum(loads.values())
    assert total <= at_most * dense, (name, total, dense)
    assert sum(tr.loads("V").values()) == total        # no BLASST: every loaded K tile is used
