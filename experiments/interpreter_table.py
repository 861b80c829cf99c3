"""Issue 20's note tables, on a CPU: every kernel x the cases run x the worst error against the
fp64 reference (and against PyTorch's own same-precision error), and each planted bug with
what caught it.

    python experiments/interpreter_table.py
"""
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "experiments"))

import flashattn                                    # noqa: E402
from flashattn import interpret, reference          # noqa: E402


def main():
    import gpu_agreement as A
    fam = {}
    for name, (make, run, ref, floor) in A.cases().items():
        g = torch.Generator().manual_seed(A._seed(name))
        x = make(g)
        refs = ref(x)
        outs, _ = A._side(run, x, "cpu")
        kernel = ("forward naive (3 kernels)" if "naive" in name else
                  "forward fmha: " + name.split()[1] if name.startswith("forward") else
                  " ".join(name.split()[:2]))
        for o, (r, pt) in zip(outs, refs):
            e, ept = A._err(o, r), A._err(pt, r)
            f = fam.setdefault(kernel, [0, 0.0, 0.0])
            f[0] += 1
            f[1] = max(f[1], e)
            f[2] = max(f[2], e / max(ept, 1e-12))
    # the grid of awkward shapes for "best"
    for N in (1, 17, 113, 200):
        for D in (16, 80, 128, 256):
            for Hq, Hkv in ((4, 4), (4, 2), (4, 1)):
                g = torch.Generator().manual_seed(N * 1000 + D * 10 + Hkv)
                q = torch.randn(1, Hq, N, D, generator=g).half()
                k = torch.randn(1, Hkv, N, D, generator=g).half()
                v = torch.randn(1, Hkv, N, D, generator=g).half()
                with interpret.enabled():
                    o = flashattn.attention(q, k, v, causal=True)
                r = reference.attention(q.double(), k.double(), v.double(), causal=True)
                pt = reference.attention(q.float(), k.float(), v.float(), causal=True).half()
                e, ept = A._err(o, r), A._err(pt, r)
                f = fam.setdefault("best (decode path for Nq <= 4) N 1-200 x D 16-256 x MHA/GQA/MQA",
                                   [0, 0.0, 0.0])
                f[0] += 1
                f[1] = max(f[1], e)
                f[2] = max(f[2], e / max(ept, 1e-12))
    print("| kernel | outputs checked | worst max error vs fp64 | worst error / PyTorch's own |")
    print("|---|---|---|---|")
    for k, (n, e, r) in fam.items():
        print(f"| {k} | {n} | {e:.1e} | {r:.2f} |")

    import test_interpret as TI
    print("\n| planted bug | caught by |\n|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, old, new, step, case in TI.MUTATIONS:
            kernel = TI._mutant(Path(d), name, old, new)
            try:
                q, k, v, out = TI._run_forward(kernel, step, **case)
            except interpret.InterpreterError as e:
                print(f"| {name} | InterpreterError: {str(e).split(': ', 1)[1][:110]} |")
                continue
            r = reference.attention(q.double(), k.double(), v.double(), causal=case["causal"],
                                    input_pos=case.get("input_pos", 0))
            nan = torch.isnan(out).sum().item()
            print(f"| {name} | the criterion: {nan} NaN outputs, max error "
                  f"{(out.double() - r).abs().nan_to_num(0).max().item():.2g} |")


if __name__ == "__main__":
    main()
