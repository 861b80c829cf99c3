"""The backward pass (chapter 11): what autograd saves, the five products, the recorded
backward benchmarks, the tile sweep (E14), the Nsight Compute profiles of the three backward
kernels beside cuDNN's, the training run and the GPU suite's error ratios.

    from flashbook.chapter import backward as bw
    bw.saved_bytes(fn, q, k, v)                 # bytes autograd keeps for the backward of fn
    bw.bench_frame()                            # the four recorded workloads, one DataFrame
    bw.ratio_table(df, "bwd")                   # ours over cuDNN / FA2, [95 %] by round
    bw.kernel_profile(r)                        # one row per kernel, named for the chapter
    bw.kernel_card(prof, ["bwd_dkdv", "cudnn_bwd"])
    bw.train_figure(bw.train_run())

CPU only: everything reads the recorded data (``results/h200/``, ``experiments/data/``), and
the saved-bytes count runs PyTorch on the CPU and flashattn's operator on the ``meta`` device.

A module per part of the chapter: ``names`` (implementations, workloads, runs, kernels),
``memory`` (what autograd keeps, the products), ``bench`` (listings, recorded benchmarks,
the tile sweep), ``tiles`` (the tiles each program visits), ``profiles`` (Nsight Compute),
``training`` (the training run, the GPU suite).
"""
from __future__ import annotations

from .bench import (atomic_frame, bench_doc, bench_frame, fmt_ci, listing, lse_cost, ratio_range,
                    ratio_table, sweep_frame, sweep_table, tflops_figure)
from .memory import (fit_n2_n, flashattn_saved_formula, flops_ratio, math_attention,
                     products_table, qkv, saved_by_n, saved_bytes, saved_tensors)
from .names import (ATOMIC, ATOMIC_RUN, COLORS, GPU, IMPLS, KERNELS, LABELS, LIBS, OURS,
                    PASS_NAMES, SUITE_RUN, SWEEP_RUN, WORKLOADS)
from .profiles import durations, kernel_card, kernel_name, kernel_profile, work_table
from .tiles import visit_kinds, visits_figure
from .training import (error_ratio_figure, suite_error_ratios, train_diff, train_figure,
                       train_run, worst_ratios)

__all__ = ["listing", "saved_tensors", "saved_bytes", "qkv", "math_attention", "saved_by_n",
           "fit_n2_n", "flashattn_saved_formula", "products_table", "bench_doc", "bench_frame",
           "ratio_table", "ratio_range", "lse_cost", "tflops_figure", "sweep_frame", "sweep_table",
           "atomic_frame", "visit_kinds", "visits_figure", "kernel_name", "kernel_profile",
           "durations", "work_table", "kernel_card", "train_run", "train_diff", "train_figure",
           "suite_error_ratios", "worst_ratios", "error_ratio_figure", "flops_ratio", "fmt_ci",
           "GPU", "OURS", "ATOMIC", "LIBS", "IMPLS", "LABELS", "COLORS", "PASS_NAMES", "WORKLOADS",
           "SWEEP_RUN", "ATOMIC_RUN", "SUITE_RUN", "KERNELS"]
