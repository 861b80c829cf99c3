"""Draw the README's figure from the recorded H200 dataset: python experiments/readme_figure.py"""
import matplotlib

matplotlib.use("Agg")
from flashattn import plots, results  # noqa: E402

r = results.load("h200")
impls = ["baseline", "autotune", "arch_tuned", "sdpa_cudnn", "sdpa_flash", "flex", "naive"]
fig = plots.tflops_vs_seqlen(r.bench, impls=impls, workload="fp16-causal-d128", meta=r.meta)
fig.set_size_inches(8, 4.2)
fig.savefig("book/_static/tflops_h200.png", dpi=90, bbox_inches="tight")
print("wrote book/_static/tflops_h200.png")
