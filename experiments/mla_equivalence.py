"""The MLA decode (split and combine kernels) through the cuTile interpreter, bit for bit,
before and after a refactor of its kernels or of the split-KV helpers they share.

    python experiments/mla_equivalence.py save  /tmp/mla_before.pt
    python experiments/mla_equivalence.py check /tmp/mla_before.pt

Fixed-seed cases: bf16 and fp16 latent caches, pages out of order, one split and several,
causal speculative tokens, an empty sequence, fewer keys than new tokens, and an FP8 cache.
Outputs and LSEs are compared as bit patterns (NaN and inf included).
"""
import sys

import torch

import flashattn
from flashattn.mla import flash_mla_with_kvcache, get_mla_metadata

D_LAT, D_ROPE = 512, 64
CASES = {  # name: (B, Sq, Hq, lens, page, causal, dtype, splits)
    "bf16 one split": (2, 1, 16, (70, 129), 64, False, torch.bfloat16, 1),
    "bf16 causal 3 splits": (3, 2, 16, (1, 0, 200), 64, True, torch.bfloat16, 3),
    "fp16 causal 2 splits": (2, 4, 16, (3, 190), 64, True, torch.float16, 2),
    "bf16 fewer keys than tokens": (1, 3, 8, (2,), 16, True, torch.bfloat16, None),
    "fp8 cache 2 splits": (2, 2, 16, (97, 40), 64, True, torch.float8_e4m3fn, 2),
}


def _case(name, B, Sq, Hq, lens, page, causal, dtype, splits):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    lens = torch.tensor(lens, dtype=torch.int32)
    n_pages = [max(1, -(-int(n) // page)) for n in lens]
    perm = torch.randperm(sum(n_pages) + 1, generator=gen).to(torch.int32)
    table = torch.full((B, max(n_pages)), int(perm[-1]), dtype=torch.int32)
    i = 0
    for b, n in enumerate(n_pages):
        table[b, :n] = perm[i:i + n]
        i += n
    kv = torch.randn(len(perm), page, 1, D_LAT + D_ROPE, generator=gen)
    fp8 = dtype == torch.float8_e4m3fn
    kv = (kv * 4).to(dtype)
    q = torch.randn(B, Sq, Hq, D_LAT + D_ROPE, generator=gen).to(torch.bfloat16 if fp8 else dtype)
    descale = torch.tensor([0.03]) if fp8 else None
    with flashattn.interpret.enabled():
        meta, ns = get_mla_metadata(lens, Sq * Hq, 1)
        if splits is not None:
            meta = meta.clone()
            meta[0, 0] = splits
        return flash_mla_with_kvcache(q, kv, table, lens, D_LAT, meta, ns, causal=causal,
                                      descale=descale)


def run_all():
    return {name: _case(name, *c) for name, c in CASES.items()}


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def check(path):
    saved, now = torch.load(path), run_all()
    same = 0
    for name in CASES:
        eq = all(torch.equal(_bits(a), _bits(b)) for a, b in zip(saved[name], now[name]))
        same += eq
        print(f"{'bit-equal' if eq else 'DIFFERS  '}  {name}")
    print(f"{same}/{len(CASES)} cases bit-equal")
    return same == len(CASES)


if __name__ == "__main__":
    if sys.argv[1] == "save":
        torch.save(run_all(), sys.argv[2])
    else:
        sys.exit(0 if check(sys.argv[2]) else 1)
