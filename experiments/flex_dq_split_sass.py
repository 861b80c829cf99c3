"""Issue 38 item 5: what splitting dS0 into hi + lo 16-bit parts before the dQ MMA would cost
(one more MMA per key tile; registers, spills) in the shipped "t" dQ kernel, for sm_90, with
the score function ``_squared`` (and none). A copy of kernels/flex_bwd.py with the one line
changed is written to a temporary file (the library is not touched) and compiled with tileiras
beside the shipped kernel; each kernel in its own process and cache directory (a second
kernel compiled in the same process fails in cuTile's front end).

    PYTHONPATH=. python experiments/flex_dq_split_sass.py [--head-dim 128]
"""
import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = "        return ct.mma(ds.astype(q.dtype), k, dq)                     # dQ += dS0 K\n"
SPLIT = ("        hi = ds.astype(q.dtype)\n"
         "        lo = (ds - hi.astype(ct.float32)).astype(q.dtype)\n"
         "        return ct.mma(lo, k, ct.mma(hi, k, dq))\n")


def split_module(tmp):
    src = (ROOT / "flashattn" / "kernels" / "flex_bwd.py").read_text()
    if src.count(LINE) != 1:
        sys.exit("the dQ MMA line of kernels/flex_bwd.py changed; update LINE")
    src = src.replace(LINE, SPLIT).replace("from .common", "from flashattn.kernels.common")
    src = src.replace("from .flex", "from flashattn.kernels.flex")
    path = Path(tmp) / "flex_bwd_split.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("flex_bwd_split", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--variant", choices=("shipped", "split"))
    ap.add_argument("--score", choices=("none", "squared"))
    a = ap.parse_args()
    if a.variant is None:
        print(f"sm_90 flex dQ kernel (variant t, no mask), D={a.head_dim}")
        print("| dQ kernel | score | config | registers | stack (spill) bytes | MMA ops | "
              "SASS lines | error |\n|---|---|---|---|---|---|---|---|")
        for v in ("shipped", "split"):
            for sc in ("none", "squared"):
                subprocess.run([sys.executable, __file__, "--head-dim", str(a.head_dim),
                                "--variant", v, "--score", sc], check=True)
        return
    tmp = tempfile.mkdtemp(prefix="x2_split_")
    from flashattn import flex
    from flashattn.mods import ScoreMod
    sys.path.insert(0, str(ROOT / "experiments"))
    from flex_dq_error import sq_grad, sq_tile
    sq = ScoreMod("squared", sq_tile, grad=sq_grad)
    orig = flex.flex_bwd_kernels
    rows = []
    for variant in (a.variant,):
        os.environ["FLASHATTN_CACHE"] = str(Path(tmp) / variant.replace(" ", "_"))
        if variant != "shipped":
            mod = split_module(tmp)
            flex._BWD_KERNELS.clear()

            def patched(score=None, mask=None, kind="mn", _m=mod):
                grad = score.grad if score is not None else None
                make = {"mn": _m.make_flex_bwd_kernels, "t": _m.make_flex_bwd_kernels_t}[kind]
                return make(score.tile if score else None, grad, mask.tile if mask else None,
                            len(score.tensors) if score else 0, len(mask.tensors) if mask else 0)
            flex.flex_bwd_kernels = patched
        for name, score in ((a.score, {"none": None, "squared": sq}[a.score]),):
            dq, _ = flex.compile_flex_bwd("sm_90", score=score, block_size=None,
                                          head_dim=a.head_dim)
            rows.append((variant, name, dq))
    flex.flex_bwd_kernels = orig
    for variant, name, r in rows:
        print(f"| {variant} | {name} | {r.config} | {r.registers} | {r.stack_bytes} | "
              f"{r.mma_ops} | {r.sass_lines} | {r.error[:60]} |")


if __name__ == "__main__":
    main()
