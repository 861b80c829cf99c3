"""Compile traced mods with tileiras (no GPU needed): the generated cuTile source of each
construct the tracer emits must be accepted by the real compiler, forward and backward.

    python experiments/modtrace_compile.py [sm_90]
"""
import sys

import torch

from flashattn import flex, mods, modtrace

B, H, S = 2, 4, 256
bias = torch.randn(B, H, 4, S)
which = torch.tensor(2)
seq = torch.arange(S) >= S // 2
scale = torch.ones((), dtype=torch.int32)


def gathers(score, b, h, q, kv):
    """The tracer's gathers (three tensors: the most main's kernels take)."""
    slope = torch.exp2(-((h + 1) * 8.0 / H))                 # int scalar -> float, exp2
    s = score + (kv - q) * slope + bias[b][h][which, q]       # scalar-tensor index, chained
    s = s + bias[b, h, which, q - kv]                         # negative index: wrapped
    return torch.where(seq[q] == seq[kv], s, float("-inf"))   # bool tensor gather


def kitchen_sink(score, b, h, q, kv):
    """The other constructs of the code generator in one score function."""
    s = score + scale + torch.tan(b)                          # 0-d captured tensor, tan
    qx, kx = q / 8, kv / 8
    near = (qx - kx).abs() <= 2                               # truediv of ints, abs
    s = torch.where(~(s > 30.0) & near, s, torch.tanh(s / 30) * 30)   # ~ on a float compare
    s = torch.nn.functional.silu(s) + torch.clamp(score, -5, 5) - q // (1 + kv)
    return torch.maximum(s, score * score - 100.0) + (kv % 2 == 0)


def mask(b, h, q, kv):
    return ~(q < kv) & ~((q - kv) > 100) | (b.new_zeros(()) == 1)


def main(arch="sm_90"):
    ga = modtrace.compile_mod(gathers, mods.ScoreMod)
    sm = modtrace.compile_mod(kitchen_sink, mods.ScoreMod)
    mm = modtrace.compile_mod(mask, mods.MaskMod)
    for m in (ga, sm, mm):
        print(open(m.source_path).read())
    ok = True
    for what, rep in (("forward", flex.compile_flex(arch, score=ga, mask=mm, head_dim=64)),
                      ("forward", flex.compile_flex(arch, score=sm, head_dim=64)),
                      ("backward", flex.compile_flex_bwd(arch, score=ga, mask=mm, head_dim=64)),
                      ("backward", flex.compile_flex_bwd(arch, score=sm, head_dim=64))):
        reps = rep if isinstance(rep, (list, tuple)) else [rep]
        for r in reps:
            err = getattr(r, "error", None)
            print(what, getattr(r, "kernel", ""), "OK" if not err else f"FAILED: {err}")
            ok &= not err
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
