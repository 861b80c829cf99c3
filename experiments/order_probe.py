"""Where the interpreter and the GPU disagree on a ragged, permuted load (issue 25's targeted
check ``order=(0,2,1) with a ragged tile``): the same kernel on variants of the shapes, each
element compared, the differing positions printed.

    python experiments/order_probe.py          # on a GPU
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import interpret_kernels as K          # noqa: E402
from flashattn import interpret        # noqa: E402


def both(kernel, grid, x, yshape):
    import cuda.tile as ct
    out = {}
    for dev in ("cpu", "cuda"):
        y = torch.full(yshape, -7.0, dtype=x.dtype, device=dev)
        args = (x.to(dev), y)
        if dev == "cpu":
            interpret.launch(grid, kernel, args)
        else:
            ct.launch(torch.cuda.current_stream(), grid, kernel, args)
            torch.cuda.synchronize()
        out[dev] = y.cpu().float()
    return out["cpu"], out["cuda"]


g = torch.Generator().manual_seed(0)
for xs, ys in (((3, 5, 6), (3, 8, 8)), ((4, 5, 6), (4, 8, 8)), ((4, 8, 8), (4, 8, 8)),
               ((3, 8, 8), (3, 8, 8)), ((4, 6, 5), (4, 8, 8))):
    x = (torch.randn(*xs, generator=g) + 10).half()         # no zeros in the data
    a, b = both(K.order_kernel, (2, 2), x, ys)
    bad = (a != b).nonzero().tolist()
    print(f"X {xs} -> Y {ys}: {len(bad)} of {a.numel()} differ")
    for i in bad[:12]:
        print(f"   at {tuple(i)}: interpreter {a[tuple(i)].item():.3f}  GPU {b[tuple(i)].item():.3f}")
