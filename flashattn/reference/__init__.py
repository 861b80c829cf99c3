"""References: exact attention, the online softmax, and a CPU emulation of the kernel.

Everything here runs on a CPU with NumPy and PyTorch only, so the book can show each idea, and
the tests can check each step's tiling rules, without a GPU.

    attention(q, k, v, causal=...)           fp32/fp64 reference with flashattn.attention's contract
    softmax, online_softmax_streaming, online_softmax_blockwise, online_softmax_attention
                                             in base e, one element / one block at a time
    schedule, work_per_program, tile_counts  which key tiles each program visits
    emulate(step, q, k, v, ...)              the fused kernel of one step, tile by tile, in NumPy
"""
from ..contract import check_shapes
from .emulate import (INV_LOG_2, LAZY_THRESHOLD, Program, default_config, emulate, schedule,
                      tile_counts, work_per_program)
from .backward import (attention_backward, attention_lse, backward_delta, dkdv_schedule,
                       dq_schedule, emulate_backward)
from .exact import attention, causal_mask
from .online import (blockwise_trace, online_softmax_attention, online_softmax_blockwise,
                     online_softmax_streaming, online_softmax_trace, softmax)

__all__ = ["attention", "causal_mask", "check_shapes", "softmax", "online_softmax_trace",
           "online_softmax_streaming", "blockwise_trace", "online_softmax_blockwise",
           "online_softmax_attention", "Program", "schedule", "work_per_program", "tile_counts",
           "default_config", "emulate", "INV_LOG_2", "LAZY_THRESHOLD"]
from .decode import *  # noqa: E402,F401,F403  decode attention, split-KV (decode.__all__)
from .varlen import *  # noqa: E402,F401,F403  packed variable-length attention (varlen.__all__)
