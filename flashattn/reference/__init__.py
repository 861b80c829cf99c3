"""References: exact attention, the online softmax, and CPU emulations of the kernels.

Everything here runs on a CPU with NumPy and PyTorch only, so the book can show each idea, and
the tests can check each kernel's tiling rules, without a GPU.

    attention(q, k, v, causal=...)           fp32/fp64 reference with flashattn.attention's contract
    softmax, online_softmax_streaming, online_softmax_blockwise, online_softmax_attention
                                             in base e, one element / one block at a time
    Program, schedule, key_tiles             which key tiles each forward program visits
"""
from ..contract import check_shapes
from .tiles import INV_LOG_2, Program, key_tiles, schedule
from .backward import (attention_backward, attention_lse, backward_delta, dkdv_schedule,
                       dq_schedule, emulate_backward)
from .exact import attention, causal_mask
from .online import (blockwise_trace, online_softmax_attention, online_softmax_blockwise,
                     online_softmax_streaming, online_softmax_trace, softmax)

__all__ = ["attention", "causal_mask", "check_shapes", "softmax", "online_softmax_trace",
           "online_softmax_streaming", "blockwise_trace", "online_softmax_blockwise",
           "online_softmax_attention", "Program", "schedule", "key_tiles", "INV_LOG_2"]
from .decode import *  # noqa: E402,F401,F403  decode attention, split-KV (decode.__all__)
from .varlen import *  # noqa: E402,F401,F403  packed variable-length attention (varlen.__all__)
