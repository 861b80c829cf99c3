"""Draw the README's figure from the recorded H200 dataset: python experiments/readme_figure.py

Also prints the numbers README.md quotes beside it (``flashbook.chapter.summary.readme_numbers``),
so that its sentences can be checked against the data (tests/test_chapter_summary.py does).
"""
from __future__ import annotations

import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "book" / "_static" / "tflops_h200.png"
# ``best`` is what flashattn.attention(..., step="best") runs: on the H200 the step warp_groups.
IMPLS = ["baseline", "autotune", "best", "sdpa_cudnn", "sdpa_flash", "flex", "naive"]
WORKLOAD = "fp16-causal-d128"


def caption(meta: dict, method: dict) -> str:
    """The regime and provenance under the figure: what was timed, on which GPU, when."""
    gpu = str(meta.get("gpu") or "").removeprefix("NVIDIA ")
    what = method.get("what", "GPU time per launch")
    rounds = method.get("rounds")
    return (f"{what}; median of {rounds} rounds. {gpu}, driver {meta.get('driver')}, "
            f"{str(meta.get('date'))[:10]}.")


def main(out: Path = OUT, *, gpu: str = "h200", results_root=None) -> Path:
    """Draw the figure from ``results.load(gpu, root=results_root)`` into ``out``."""
    import matplotlib
    matplotlib.use("Agg")
    from flashbook.chapter import plots
    from flashbook.data import results
    r = results.load(gpu, root=results_root)
    fig = plots.tflops_vs_seqlen(r.bench, impls=IMPLS, workload=WORKLOAD, meta=r.meta)
    fig.set_size_inches(8, 4.4)
    from flashbook.steps import best_step_name
    for t in fig.axes[0].get_legend().get_texts():      # say which step "best" is here
        if t.get_text() == "best":
            t.set_text(f"best ({best_step_name(r.meta.get('arch'))})")
    method = (r.bench_meta.get(WORKLOAD) or {}).get("method") or {}
    fig.text(0.01, 0.005, caption(r.meta, method), fontsize=7, color="#555555",
             ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90, bbox_inches="tight")
    print(f"wrote {out}")
    try:
        from flashbook.chapter import summary
        doc = results.load_experiment_file(*summary.PROBE)
        print("README numbers:", summary.readme_numbers(r, doc))
    except (FileNotFoundError, KeyError, ValueError) as e:     # another dataset: no README
        print(f"README numbers: not available ({e})")
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit(__doc__)
    main()
