"""Issue 38 item 5: why the flex backward's dQ error with a non-linear score function
(PyTorch's test mods ``_squared``: score * score, ``_trig``: sin(cos(score)) + tan(b)) reads ~2x
the eager reference's, where other mods read 1.0-1.2x.

Part 1 runs ``flashattn.flex_attention`` (the shipped backward, interpreter) with each mod as a
ScoreMod carrying its derivative, and measures max |error| of dQ, dK, dV against a dense fp64
reference with autograd, beside two eager PyTorch references (PyTorch's flex_attention has no
backward on CPU): "eager32" = the dense math in fp32, gradients rounded to the dtype (the
tests' criterion), and "eager16" = the same math run in the inputs' dtype.

Part 2 emulates the kernel's arithmetic in torch (variant "t": dS0 = P (dP - Delta) g'(s0),
dQ += dS0.half() K) and switches one rounding at a time back to fp32/fp64:
  delta   Delta = rowsum(dO * O) from the fp16/bf16 output O (shipped), the fp32 one, or
          the stored O plus its rounding residual stored in the dtype ("hilo": a proposed fix)
  ds      dS0 cast to the dtype before the dS0 K MMA (shipped) or kept in fp32
  gs      g' evaluated on the fp32 score (shipped) or on the score rounded to the dtype
``scan`` repeats part 2 over larger shapes and seeds; ``kernel_check`` runs the shipped backward
kernels (interpreter) with Delta computed from each O.

    PYTHONPATH=. python experiments/flex_dq_error.py          # ~2 min on 2 cores
    (its output recorded: experiments/data/51-flex-dq-error/table.txt)
    PYTHONPATH=. python experiments/flex_dq_error.py --gpu --dtype fp16   # vs torch's, on a GPU
"""
import argparse
import math
import sys
import warnings

import torch

import flashattn.kernels.flex  # noqa: F401  (installs the interpreter shim before cuda.tile)
import cuda.tile as ct  # noqa: E402
from flashattn import interpret  # noqa: E402
from flashattn.flex import flex_attention  # noqa: E402
from flashattn.mods import ScoreMod, softcap  # noqa: E402


# The mods as cuTile defs (tile and derivative) and torch functions. _trig drops tan(b): a
# constant per batch, it cancels in the softmax (and is 0 at B=1).
def sq_tile(score, b, h, q_idx, kv_idx):
    return score * score


def sq_grad(score, b, h, q_idx, kv_idx):
    return score * 2.0


def trig_tile(score, b, h, q_idx, kv_idx):
    return ct.sin(ct.cos(score))


def trig_grad(score, b, h, q_idx, kv_idx):
    return -ct.cos(ct.cos(score)) * ct.sin(score)


def trig_torch(score, b, h, q_idx, kv_idx):
    return torch.sin(torch.cos(score))


def times_two(score, b, h, q_idx, kv_idx):
    return score * 2.0


def two(score, b, h, q_idx, kv_idx):
    return score * 0.0 + 2.0


MODS = {
    "identity": None,
    "times_two": ScoreMod("times_two", times_two, grad=two),
    "softcap20": softcap(20.0),
    "squared": ScoreMod("squared", sq_tile, grad=sq_grad),
    "trig": ScoreMod("trig", trig_tile, trig_torch, grad=trig_grad),
}
# torch versions of (score function, its derivative) for the emulation
TORCH = {
    "identity": (lambda s: s, lambda s: torch.ones_like(s)),
    "times_two": (lambda s: 2 * s, lambda s: torch.full_like(s, 2.0)),
    "softcap20": (lambda s: 20 * torch.tanh(s / 20), lambda s: 1 - torch.tanh(s / 20) ** 2),
    "squared": (lambda s: s * s, lambda s: 2 * s),
    "trig": (lambda s: torch.sin(torch.cos(s)), lambda s: -torch.cos(torch.cos(s)) * torch.sin(s)),
}


def inputs(seed, B, H, N, D, dtype):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, N, D, generator=g).to(dtype) for _ in range(4)]


def dense(q, k, v, fn):
    """out of the dense math in q's dtype (autograd-able)."""
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = fn(s)
    return torch.softmax(s, -1) @ v


def ref_grads(q, k, v, do, fn, dt):
    ls = [t.detach().to(dt).requires_grad_() for t in (q, k, v)]
    dense(*ls, fn).backward(do.to(dt))
    return [t.grad for t in ls]


def ours(q, k, v, do, mod):
    ls = [t.clone().requires_grad_() for t in (q, k, v)]
    with interpret.enabled():
        out = flex_attention(*ls, score_mod=mod)
        out.backward(do)
    return [t.grad for t in ls], out.detach()


def emulate(q, k, v, do, out, name, delta="o16", ds="half", gs="fp32"):
    """The shipped kernels' arithmetic (fp32 tiles, fp16/bf16 MMA operands), one switch at a
    time: see the module docstring. Returns dq, dk, dv in the dtype."""
    dt = q.dtype
    f, g = TORCH[name]
    scale = 1 / math.sqrt(q.shape[-1])
    s0 = (q.float() @ k.float().transpose(-1, -2)) * scale       # fp16 products exact in fp32
    s = f(s0)
    lse = torch.logsumexp(s, -1, keepdim=True)                     # the forward's (fp32)
    p = torch.exp(s - lse)
    o32 = p @ v.float()                                            # the output before rounding
    if delta == "o16":
        o = out.float()                                            # the stored output
    elif delta == "hilo":
        o = out.float() + (o32 - out.float()).to(dt).float()       # + its rounding residual
    else:
        o = o32
    dlt = (do.float() * o).sum(-1, keepdim=True)
    dp = do.float() @ v.float().transpose(-1, -2)
    garg = s0 if gs == "fp32" else s0.to(dt).float()
    ds0 = p * (dp - dlt) * g(garg)
    dsm = ds0.to(dt).float() if ds == "half" else ds0
    dq = (dsm @ k.float()) * scale
    dk = (ds0.to(dt).float().transpose(-1, -2) @ q.float()) * scale
    dv = p.to(dt).float().transpose(-1, -2) @ do.float()
    return [x.to(dt) for x in (dq, dk, dv)]


def amplification(name, B=1, H=2, N=128, D=64, dt=torch.float16, seed=0):
    """What multiplies Delta's error in dQ: dQ_i gets scale * dDelta_i * sum_j P_ij g'_ij K_j.
    Returns (max_i |dDelta_i|, median and max over rows of max_d |sum_j P g' K|)."""
    q, k, v, do = inputs(seed, B, H, N, D, dt)
    f, g = TORCH[name]
    s0 = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D)
    p = torch.softmax(f(s0), -1)
    o32 = p @ v.float()
    dd = (do.float() * (o32.to(dt).float() - o32)).sum(-1).abs()
    c = ((p * g(s0)) @ k.float()).abs().amax(-1)
    return dd.max().item(), c.median().item(), c.max().item()


def err(a, r):
    return (a.double() - r).abs().max().item()


def table(shapes, dtypes, seeds):
    rows = []
    for name, mod in MODS.items():
        f = TORCH[name][0]
        for (B, H, N, D) in shapes:
            for dt in dtypes:
                acc = {}
                for seed in seeds:
                    q, k, v, do = inputs(seed, B, H, N, D, dt)
                    r64 = ref_grads(q, k, v, do, f, torch.float64)
                    cands = {"eager32": [x.to(dt) for x in ref_grads(q, k, v, do, f,
                                                                     torch.float32)],
                             "eager16": ref_grads(q, k, v, do, f, dt)}
                    got, out = ours(q, k, v, do, mod)
                    cands["ours"] = got
                    cands["emu"] = emulate(q, k, v, do, out, name)
                    cands["emu ds32"] = emulate(q, k, v, do, out, name, ds="fp32")
                    cands["emu o32"] = emulate(q, k, v, do, out, name, delta="o32")
                    cands["emu o32 ds32"] = emulate(q, k, v, do, out, name, delta="o32",
                                                    ds="fp32")
                    cands["emu hilo"] = emulate(q, k, v, do, out, name, delta="hilo")
                    cands["emu hilo ds32"] = emulate(q, k, v, do, out, name, delta="hilo",
                                                     ds="fp32")
                    cands["emu g'(s16)"] = emulate(q, k, v, do, out, name, gs="half")
                    for c, gr in cands.items():
                        e = acc.setdefault(c, [0.0, 0.0, 0.0])
                        for i in range(3):
                            e[i] = max(e[i], err(gr[i], r64[i]))
                rows.append((name, f"{B}x{H}x{N}x{D}", str(dt).split(".")[-1], acc))
    return rows


def show(rows):
    cols = ["ours", "eager32", "eager16", "emu", "emu ds32", "emu o32", "emu o32 ds32",
            "emu hilo", "emu hilo ds32", "emu g'(s16)"]
    print("max |error| vs fp64 of dQ (dK, dV below); ratio = / eager32")
    print("| mod | shape | dtype | " + " | ".join(cols) + " |")
    print("|---|---|---|" + "---|" * len(cols))
    for name, shape, dt, acc in rows:
        base = acc["eager32"][0]
        cells = [f"{acc[c][0]:.2e} ({acc[c][0] / base:.2f}x)" for c in cols]
        print(f"| {name} | {shape} | {dt} | " + " | ".join(cells) + " |")
    print("\ndK, dV: ours / eager32 / emu o32 / emu hilo")
    for name, shape, dt, acc in rows:
        dk = " / ".join(f"{acc[c][1]:.2e}" for c in ("ours", "eager32", "emu o32", "emu hilo"))
        dv = " / ".join(f"{acc[c][2]:.2e}" for c in ("ours", "eager32", "emu o32", "emu hilo"))
        print(f"{name:10s} {shape:12s} {dt:9s} dK {dk}   dV {dv}")


def show_amplification():
    print("\nAmplification of Delta's error (1x2x128x64 fp16, seed 0): max |dDelta|, "
          "median / max over rows of max_d |sum_j P g' K|")
    for name in MODS:
        d, med, mx = amplification(name)
        print(f"{name:10s} {d:.2e}  {med:.2f} / {mx:.2f}")


def scan(dt=torch.float16, seeds=range(3)):
    """The emulation alone (it reproduces the interpreter's errors exactly, part 1) over larger
    shapes: per shape, the range over seeds of dQ's error / eager32's."""
    print(f"\nEmulation, dQ error / eager32's, {str(dt).split('.')[-1]}, seeds "
          f"{list(seeds)}: min-max")
    for name in ("identity", "trig", "squared"):
        f = TORCH[name][0]
        for (B, H, N, D) in [(2, 2, 64, 32), (1, 2, 128, 64), (2, 4, 512, 64),
                             (1, 2, 1024, 128)]:
            r = {}
            for seed in seeds:
                q, k, v, do = inputs(seed, B, H, N, D, dt)
                r64 = ref_grads(q, k, v, do, f, torch.float64)[0]
                e32 = err(ref_grads(q, k, v, do, f, torch.float32)[0].to(dt), r64)
                s = f((q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D))
                out = (torch.softmax(s, -1) @ v.float()).to(dt)
                for c, kw in {"shipped": {}, "ds32": dict(ds="fp32"),
                              "o32": dict(delta="o32"),
                              "o32+ds32": dict(delta="o32", ds="fp32")}.items():
                    r.setdefault(c, []).append(err(emulate(q, k, v, do, out, name, **kw)[0],
                                                   r64) / e32)
            print(f"{name:9s} {B}x{H}x{N}x{D:<4d} " +
                  "  ".join(f"{c} {min(x):.2f}-{max(x):.2f}" for c, x in r.items()))


def kernel_check(name="squared", seed=0, shape=(1, 2, 128, 64)):
    """The shipped backward kernels (interpreter) given the O that Delta is computed from: the
    16-bit O (as shipped), the fp32 O, the 16-bit O plus its 16-bit rounding residual (fix a).
    O and LSE from fp32 math, so the three differ only in Delta."""
    from flashattn import flex
    f = TORCH[name][0]
    B, H, N, D = shape
    print(f"\nShipped kernels, Delta from three O's: {name} {B}x{H}x{N}x{D} seed {seed}, "
          "max |error| vs fp64 (/ eager32's)")
    for dt in (torch.float16, torch.bfloat16):
        q, k, v, do = inputs(seed, B, H, N, D, dt)
        r64 = ref_grads(q, k, v, do, f, torch.float64)
        e32 = [x.to(dt) for x in ref_grads(q, k, v, do, f, torch.float32)]
        s = f((q.float() @ k.float().transpose(-1, -2)) / math.sqrt(D))
        lse = torch.logsumexp(s, -1)
        o32 = torch.softmax(s, -1) @ v.float()
        hi = o32.to(dt).float()
        for label, out in (("O 16-bit", o32.to(dt)), ("O fp32", o32),
                           ("O hi+lo", hi + (o32 - hi).to(dt).float())):
            with interpret.enabled():
                g = flex._backward(q, k, v, out, do, lse, None, score=MODS[name], mask=None,
                                   tensors=None, block_size=None, scale=1 / math.sqrt(D),
                                   blasst=None, ko=None, block_mask=None)
            print(f"{str(dt).split('.')[-1]:9s} {label:9s} " + "  ".join(
                f"{w} {err(a, r):.2e} ({err(a, r) / err(p, r):.2f}x)"
                for w, a, r, p in zip(("dQ", "dK", "dV"), g[:3], r64, e32)))


DEVICE = "cuda"
GPU_SHAPE = (4, 8, 2048, 64)      # PyTorch's test_flex_attention: B, H, S, D


def gpu(dtypes, mods=("squared", "trig")):
    """Ours (the shipped kernels) vs PyTorch's compiled flex backward on the GPU, both against
    the fp64 dense reference: B=4, H=8, N=2048, D=64 (PyTorch's test shape), fp16 and bf16."""
    from torch.nn.attention.flex_attention import flex_attention as tflex

    def sq_t(score, b, h, m, n):
        return score * score

    def trig_t(score, b, h, m, n):
        return torch.sin(torch.cos(score)) + torch.tan(b)
    cf = torch.compile(tflex)
    B, H, N, D = GPU_SHAPE
    print("| mod | dtype | ours dQ | torch flex dQ | ratio | ours dK | torch dK | ours dV | "
          "torch dV |\n|---|---|---|---|---|---|---|---|---|")
    for name, tmod in ((m, {"squared": sq_t, "trig": trig_t}[m]) for m in mods):
        for dt in dtypes:
            q, k, v, do = (x.to(DEVICE) for x in inputs(0, B, H, N, D, dt))
            f = TORCH[name][0]
            r64 = ref_grads(q, k, v, do, f, torch.float64)
            ls = [t.clone().requires_grad_() for t in (q, k, v)]
            flex_attention(*ls, score_mod=MODS[name]).backward(do)
            mine = [t.grad for t in ls]
            ls = [t.clone().requires_grad_() for t in (q, k, v)]
            cf(*ls, score_mod=tmod).backward(do)
            theirs = [t.grad for t in ls]
            e = [err(a, r) for a, r in zip(mine, r64)]
            t = [err(a, r) for a, r in zip(theirs, r64)]
            print(f"| {name} | {str(dt).split('.')[-1]} | {e[0]:.2e} | {t[0]:.2e} | "
                  f"{e[0] / t[0]:.2f} | {e[1]:.2e} | {t[1]:.2e} | {e[2]:.2e} | {t[2]:.2e} |")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--quick", action="store_true", help="one shape, fp16, one seed")
    ap.add_argument("--dtype", choices=("fp16", "bf16", "both"), default="both")
    ap.add_argument("--mod", choices=("squared", "trig", "both"), default="both",
                    help="--gpu: which of PyTorch's test mods")
    a = ap.parse_args()
    dts = {"fp16": [torch.float16], "bf16": [torch.bfloat16],
           "both": [torch.float16, torch.bfloat16]}[a.dtype]
    if a.gpu:
        gpu(dts, ("squared", "trig") if a.mod == "both" else (a.mod,))
        sys.exit()
    if a.quick:
        show(table([(1, 2, 128, 64)], [torch.float16], [0]))
        sys.exit()
    show(table([(1, 2, 128, 64), (1, 2, 256, 64)], dts, [0, 1]))
    show_amplification()
    scan()
    kernel_check()
