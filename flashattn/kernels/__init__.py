"""cuTile kernels: ``fmha`` (every FlashAttention step) and ``naive`` (standard attention)."""
