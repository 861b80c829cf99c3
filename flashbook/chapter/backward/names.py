"""The names the chapter gives the backward's implementations, workloads, runs and kernels;
labels and colours from the registry (``flashbook.impls``)."""
from __future__ import annotations

from ...impls import color_of, label_of

GPU = "h200"
OURS = "fmha_bwd"                       # our backward: three kernels, deterministic
ATOMIC = "fmha_bwd_atomic"              # the opt-in variant: dQ by atomic adds
LIBS = ("sdpa_cudnn", "sdpa_flash", "sdpa_efficient")
IMPLS = (OURS, *LIBS)
LABELS = {n: label_of(n, "backward") for n in (OURS, ATOMIC, *LIBS)}   # the registry's
COLORS = {n: color_of(n) for n in (OURS, ATOMIC, *LIBS)}
PASS_NAMES = {"bwd": "backward alone", "fwd_bwd": "forward + backward", "fwd": "forward"}
WORKLOADS = {(dtype, causal): f"{dtype}-{'causal' if causal else 'full'}-d128-bwd"
             for dtype in ("fp16", "bf16") for causal in (True, False)}
SWEEP_RUN = "20-bwd-sweep"
ATOMIC_RUN = "21-bwd-atomic"
SUITE_RUN = "22-gpu-suite"

# The kernels of each profiled backward, by the names this chapter gives them.
KERNELS = {
    "bwd_preprocess_kernel": "bwd_preprocess",
    "bwd_dkdv_kernel": "bwd_dkdv",
    "bwd_dq_kernel": "bwd_dq",
    "bwd_dkdv_dq_atomic_kernel": "bwd_dkdv_dq_atomic",
    "cudnn::compute_dot_do_o_specialized": "cudnn_delta",
    "cudnn::convert_dq_to_16bits": "cudnn_convert_dq",
    "pytorch_flash::flash_bwd_dot_do_o_kernel": "fa2_delta",
    "pytorch_flash::flash_bwd_convert_dq_kernel": "fa2_convert_dq",
}
_KERNEL_PREFIX = {"cudnn_generated_fort_native_sdpa_sm90_flash_bprop": "cudnn_bwd",
                  "pytorch_flash::flash_bwd_dq_dk_dv_loop": "fa2_bwd"}
