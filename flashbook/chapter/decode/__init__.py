"""flashbook.chapter.decode: the data, tables and figures of chapter 12 (decoding) and of its
experiment record (``book/appendix/decoding_experiments``).

Everything here reads the recorded decode measurements of one GPU (``results/<gpu>/decode/``
and the Nsight Compute profile ``results/<gpu>/profiles/decode/``) or computes from the launch
rules of ``flashattn.kernels`` (no GPU):

    d = decode.load()                       # DecodeData: frames of the four parts, meta, profile
    decode.intensity(G=4, Nq=1)             # FLOP per byte of K/V read: G * Nq
    decode.split_table(d)                   # what decode_num_splits picks for the measured shapes
    decode.results_table(d), decode.targets(d)
    decode.split_sweep(), decode.combine_sweep()   # the split-count and combine sweeps
    decode.kernel_times(d, "decode-b1"), decode.varlen_profile(d)
    decode.bandwidth_figure(d), decode.roofline_figure(d)

Columns of the decode rows (``flashbook.data.schema``, DECODE_FIELDS): ``median_ms`` (GPU time
per call, idle start), ``gbps`` (bytes of K/V the step must read / time), ``frac_peak`` (over
the datasheet's HBM peak, ``meta["hbm_peak_tbps"]``), ``ratio_best_torch`` (the fastest
PyTorch row's time over this row's: >= 1 is as fast as every PyTorch path).

The package, a module per concern: ``data`` (loading), ``arith`` (launch arithmetic, no GPU),
``tables`` (the recorded rows), ``experiments`` (the experiment runs and profiles),
``figures`` and ``demo`` (listings, the CPU merge, the live step).
"""
from __future__ import annotations

from ...hardware import PEAK_TFLOPS
from .arith import _fmt_n, gqa_bytes, intensity, path_table, ridge, split_plan, split_table
from .data import FINAL_RUN, OURS, SWEEP_RUN, TORCH, DecodeData, load
from .demo import kernel_listing, live_step, merge_demo
from .experiments import (COMBINE_LABELS, COMBINE_RUN, MERGES, MULTIROW_RUN, PROFILE_ROWS,
                          PROFILE_STEPS, QTILES_RUN, combine_kinds, combine_run_comparison,
                          combine_sweep, combine_sweep_table, kernel_times, profile_frame,
                          split_sweep, split_sweep_table, varlen_profile, varlen_qtiles,
                          varlen_qtiles_cfg, varlen_tile_sweep)
from .figures import COLORS, LABELS, bandwidth_figure, crossover_figure, roofline_figure
from .tables import (crossover_table, host_table, paging_cost, results_table, target_summary,
                     targets, varlen_backward_times, varlen_table)

__all__ = ["DecodeData", "load", "intensity", "ridge", "gqa_bytes", "split_plan", "split_table",
           "results_table", "targets", "target_summary", "crossover_table", "path_table",
           "host_table", "varlen_table", "paging_cost", "profile_frame", "bandwidth_figure",
           "roofline_figure", "crossover_figure", "kernel_listing", "merge_demo", "live_step",
           "split_sweep", "split_sweep_table", "combine_sweep", "combine_sweep_table",
           "combine_run_comparison", "combine_kinds", "varlen_qtiles", "varlen_qtiles_cfg",
           "varlen_backward_times", "kernel_times", "FINAL_RUN", "varlen_profile",
           "varlen_tile_sweep", "SWEEP_RUN", "OURS", "TORCH", "LABELS", "COLORS", "PEAK_TFLOPS",
           "COMBINE_LABELS", "COMBINE_RUN", "MERGES", "MULTIROW_RUN", "PROFILE_ROWS",
           "PROFILE_STEPS", "QTILES_RUN", "_fmt_n"]
