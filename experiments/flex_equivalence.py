"""The flex forward and backward through the interpreter for every shipped mod, with fixed seeds:
save the outputs, LSEs and gradients, or compare them bit for bit with a saved run (issue 35's
"behaviour unchanged" for refactors of the flex kernels).

    PYTHONPATH=. python experiments/flex_equivalence.py save /tmp/flex_before.pt
    PYTHONPATH=. python experiments/flex_equivalence.py compare /tmp/flex_before.pt

Cases: causal, sliding window, chunked, prefix-LM (int and tensor), document, softcap, ALiBi,
relative bias, sinks, no mod, the dense path (no block mask) and a mask composed with
``and_masks`` where the library has it; causal and not; a GQA and an MQA shape whose lengths
are not multiples of the block; fp16 and bf16 for a subset.
"""
import sys
import warnings
import zlib

import torch
from torch.nn.attention.flex_attention import create_block_mask

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests")
from flashattn import interpret, mods                       # noqa: E402
from flashattn.flex import flex_attention                  # noqa: E402
from test_flex import _case                                # noqa: E402

warnings.filterwarnings("ignore", message=".*flex_attention.*")

NAMES = ["none", "window", "chunked", "prefix_lm", "document", "softcap", "alibi",
         "relative_bias", "sink"]
SHAPES = [(37, 37, 4, 2), (20, 45, 2, 1)]


def run_case(name, causal, shape, dtype, dense=False):
    Nq, Nk, Hq, Hkv = shape
    g = torch.Generator().manual_seed(zlib.crc32(repr((name, causal, shape, dtype, dense)).encode()))
    q, k, v, do = (torch.randn(2, h, n, 32, generator=g).to(dtype)
                   for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk), (Hq, Nq)))
    score, mask = _case(name, Hq, Nq, Nk, causal)
    sinks = torch.linspace(-1.0, 2.0, Hq) if name == "sink" else None
    bm = None
    if mask is not None and not dense:
        bm = create_block_mask(mask, 2 if mask.name == "prefix_lm(tensor)" else None, None, Nq,
                               Nk, device="cpu", BLOCK_SIZE=(16, 32))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if sinks is not None:
        leaves.append(sinks.clone().requires_grad_())
    with interpret.enabled():
        out, lse = flex_attention(*leaves[:3], score_mod=score, block_mask=bm, enable_gqa=True,
                                  sinks=leaves[3] if sinks is not None else None,
                                  return_lse=True,
                                  kernel_options=None if bm is not None else
                                  {"BLOCK_M": 16, "BLOCK_N": 32})
        out.backward(do)
    res = {"out": out.detach(), "lse": lse.detach()}
    for n, t in zip(("dq", "dk", "dv", "dsinks"), leaves):
        res[n] = t.grad
    return res


def cases():
    for name in NAMES:
        for causal in (True, False):
            for shape in SHAPES:
                yield (name, causal, shape, torch.float16, False)
    for name in ("softcap", "document", "relative_bias"):
        yield (name, True, SHAPES[0], torch.bfloat16, False)
    for name in ("none", "softcap", "alibi"):
        yield (name, False, SHAPES[1], torch.float16, True)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    got = {}
    for c in cases():
        key = f"{c[0]}|{'causal' if c[1] else 'full'}|{c[2]}|{c[3]}|{'dense' if c[4] else 'bm'}"
        got[key] = run_case(*c)
    if mode == "save":
        torch.save(got, path)
        print(f"saved {len(got)} cases to {path}")
        return
    before = torch.load(path)
    n_same = n_diff = 0
    for key, res in got.items():
        for n, t in res.items():
            b = before[key][n]
            if t is None and b is None:
                continue
            if torch.equal(t, b):
                n_same += 1
            else:
                n_diff += 1
                d = (t.float() - b.float()).abs()
                d = d[torch.isfinite(d)]
                print(f"DIFF {key} {n}: max |after - before| = "
                      f"{d.max().item() if d.numel() else 'nan'}; "
                      f"{(t != b).sum().item()} of {t.numel()} elements")
    print(f"{n_same} tensors bit-equal, {n_diff} differ ({len(got)} cases)")


if __name__ == "__main__":
    main()
