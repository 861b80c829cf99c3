"""Draw the README's figure from the recorded H200 dataset: python experiments/readme_figure.py"""
from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "book" / "_static" / "tflops_h200.png"
IMPLS = ["baseline", "autotune", "arch_tuned", "sdpa_cudnn", "sdpa_flash", "flex", "naive"]


def main(out: Path = OUT, *, gpu: str = "h200", results_root=None) -> Path:
    """Draw the figure from ``results.load(gpu, root=results_root)`` into ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    from flashattn.chapter import plots
    from flashattn.data import results
    r = results.load(gpu, root=results_root)
    fig = plots.tflops_vs_seqlen(r.bench, impls=IMPLS, workload="fp16-causal-d128", meta=r.meta)
    fig.set_size_inches(8, 4.2)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    print(f"wrote {out}")
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    main()
