"""Timing on the GPU: CUDA events, warm-up excluded, median of many runs, L2 flushed.

Chapter 3 explains the method. Every number in the book comes through ``time_cuda``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    reps: int

    @property
    def spread(self) -> float:
        """Interquartile range over the median: 0.02 means the middle half is within 2 %."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms else float("nan")

    def as_dict(self) -> dict:
        return dict(median_ms=self.median_ms, min_ms=self.min_ms, max_ms=self.max_ms,
                    q1_ms=self.q1_ms, q3_ms=self.q3_ms, reps=self.reps, spread=self.spread)


_L2_FLUSH = {}


def flush_l2(device=None) -> None:
    """Overwrite a buffer larger than L2 (H200: 50 MB; B200: 126 MB) so no input stays cached."""
    import torch
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    if dev not in _L2_FLUSH:
        _L2_FLUSH[dev] = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    _L2_FLUSH[dev].zero_()


def summarize(times: list[float]) -> Timing:
    """Median, extremes and quartiles of a list of times in milliseconds."""
    times = sorted(times)
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return Timing(statistics.median(times), times[0], times[-1], q[0], q[2], len(times))


def event_times(fn, reps: int, *, flush: bool = True) -> list[float]:
    """``reps`` CUDA-event timings of ``fn()`` in milliseconds (no warm-up)."""
    import torch
    times = []
    for _ in range(reps):
        if flush:
            flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_interleaved(fns: dict, reps: dict, *, rounds: int = 4, flush: bool = True) -> dict:
    """Time several functions in alternation: ``rounds`` passes, each timing every function
    for a share of its reps, the order rotated every pass.

    A shared GPU drifts (clocks, temperature, neighbours): timing A's runs, then B's, lets
    the drift fall on one of them. Interleaving spreads it over all (chapter 3).
    Returns {name: Timing}.
    """
    import torch
    names = list(fns)
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)] if names else []
        for n in order:
            share = max(1, -(-reps[n] // rounds))
            fns[n]()                          # one untimed call: back to steady state
            torch.cuda.synchronize()
            times[n] += event_times(fns[n], share, flush=flush)
    return {n: summarize(t) for n, t in times.items()}


def time_cuda(fn, *, warmup: int = 3, reps: int = 20, flush: bool = True) -> Timing:
    """Median time of ``fn()`` in milliseconds, by CUDA events around each call.

    ``warmup`` calls first (JIT compilation and module load stay out of the numbers); with
    ``flush`` the L2 cache is overwritten before every timed call (outside the events).
    """
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return summarize(event_times(fn, reps, flush=flush))


def attention_flops(B: int, Hq: int, Nq: int, Nk: int, D: int, causal: bool,
                    input_pos: int = 0) -> float:
    """Useful FLOPs of the forward pass: two matmuls of 2*Nq*Nk*D each per (batch, head).

    Causal counts only the visible (query, key) pairs: for Nq == Nk (input_pos 0) that is
    the usual halving, 4*B*H*N*N*D / 2; in general the exact number of visible pairs.
    """
    if not causal:
        pairs = Nq * Nk
    else:
        # Row i sees min(Nk, input_pos + i + 1) keys.
        r = min(Nq, max(0, Nk - input_pos))             # rows i < r see input_pos + i + 1 keys
        pairs = r * (input_pos + 1) + r * (r - 1) // 2 + (Nq - r) * Nk
        if Nq == Nk and input_pos == 0:
            pairs = Nq * Nk / 2                         # the convention of FA papers and the seed
    return 4.0 * B * Hq * pairs * D


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
