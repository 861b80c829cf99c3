"""Timing on the GPU: the GPU time of a kernel started on an idle GPU.

``time_rounds`` times short batches of launches replayed from a CUDA graph, each after the GPU
idled ``idle_ms`` (an H200 under sustained load wanders in clock, so back-to-back samples vary
by several percent), in rounds with the implementations in a fresh random order, and reports the
median per launch with a bootstrap 95 % interval; ``idle_ms=0`` with ``warm_ms`` > 0 times the
sustained regime. ``host_time`` is how long a call takes to return. ``time_interleaved`` and
``time_cuda`` are the simpler first methods, kept for comparison and quick timings.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import dataclass, field

from .stats import bootstrap_ci


@dataclass
class Timing:
    median_ms: float
    min_ms: float
    max_ms: float
    q1_ms: float
    q3_ms: float
    reps: int
    samples: list = field(default_factory=list)   # ms per launch, one per round (time_rounds)
    ci_lo_ms: float | None = None                 # bootstrap 95 % interval of the median
    ci_hi_ms: float | None = None
    method: str = ""

    @property
    def spread(self) -> float:
        """Interquartile range over the median: 0.02 means the middle half is within 2 %."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms else float("nan")

    def as_dict(self) -> dict:
        d = dict(median_ms=self.median_ms, min_ms=self.min_ms, max_ms=self.max_ms,
                 q1_ms=self.q1_ms, q3_ms=self.q3_ms, reps=self.reps, spread=self.spread)
        if self.samples:
            d.update(ci_lo_ms=self.ci_lo_ms, ci_hi_ms=self.ci_hi_ms, method=self.method,
                     samples_ms=[round(x, 6) for x in self.samples])
        return d


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
    the drift fall on one of them. Interleaving spreads it over all.
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


def _summarize_rounds(samples: list[float], inner: int, method: str) -> Timing:
    t = summarize(samples)
    lo, hi = bootstrap_ci(samples)
    return Timing(t.median_ms, t.min_ms, t.max_ms, t.q1_ms, t.q3_ms, len(samples) * inner,
                  samples=list(samples), ci_lo_ms=lo, ci_hi_ms=hi, method=method)


def _capture(fn, inner: int):
    """A CUDA graph of ``inner`` calls of ``fn``, or None if ``fn`` cannot be captured."""
    import torch
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):            # warm-up on a side stream, as torch advises
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(inner):
                fn()
        torch.cuda.synchronize()
        g.replay()                            # one untimed replay: the graph is uploaded
        torch.cuda.synchronize()
        return g
    except Exception:                         # a library that refuses capture: timed eagerly
        torch.cuda.synchronize()
        return None


IDLE_MS = 25.0   # time_rounds: the GPU idles this long before each sample (same clock state)


def _graph_ms(g, inner: int, fn) -> float:
    """Milliseconds of one replay of ``g`` (or ``inner`` eager calls of ``fn``)."""
    import torch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    if g is not None:
        g.replay()
    else:
        for _ in range(inner):
            fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def time_rounds(fns: dict, *, rounds: int = 30, inner=10, graph: bool = True,
                flush: bool = True, seed: int = 0, progress=None,
                idle_ms: float = IDLE_MS, warm_ms: float = 0.0) -> dict:
    """GPU time per launch of each function, measured in alternation.

    Every round times each function once, in a fresh random order (seeded): ``inner``
    back-to-back calls (a number, or one per function) between two CUDA events, replayed from a CUDA graph when ``graph`` (so
    the host's launch work is not inside the timed region; functions that cannot be captured
    are timed as an eager batch), the L2 cache flushed before each batch. One sample per round
    is the batch time over ``inner``. Returns {name: Timing} with the per-round samples, their
    median and a bootstrap 95 % confidence interval of the median; ``Timing.method`` says
    "graph" or "batch".

    Before each sample the GPU idles for ``idle_ms`` (after the L2 flush), so every sample
    starts in the same power and clock state whatever ran before it. With ``warm_ms`` > 0
    the batch instead first runs untimed (whole replays, at least ``warm_ms`` milliseconds, at
    most 50; none for a batch of 100 ms or more): the sustained, power-limited regime.

    A function should alternate between a few input sets (``bench`` gives it three) so that
    consecutive calls do not find their inputs in L2.
    """
    import torch
    names = list(fns)
    inner = inner if isinstance(inner, dict) else {n: int(inner) for n in names}
    graphs = {n: (_capture(fns[n], inner[n]) if graph else None) for n in names}
    warm = {n: 0 for n in names}
    if warm_ms > 0:
        for n in names:
            ms = _graph_ms(graphs[n], inner[n], fns[n])
            # A batch of 100 ms or more settles into its own state within itself: no preamble.
            warm[n] = 0 if ms >= 100 else min(50, max(1, math.ceil(warm_ms / max(ms, 1e-3))))
    samples = {n: [] for n in names}
    rng = random.Random(seed)

    def run(n):
        g = graphs[n]
        if g is not None:
            g.replay()
        else:
            for _ in range(inner[n]):
                fns[n]()

    for r in range(rounds):
        order = names[:]
        rng.shuffle(order)
        for n in order:
            for _ in range(warm[n]):
                run(n)
            if flush:
                flush_l2()
            if idle_ms > 0:
                torch.cuda.synchronize()
                time.sleep(idle_ms / 1e3)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(n)
            end.record()
            end.synchronize()
            samples[n].append(start.elapsed_time(end) / inner[n])
        if progress is not None:
            progress(r + 1, rounds)
    methods = {n: "graph" if graphs[n] is not None else "batch" for n in names}
    del graphs
    return {n: _summarize_rounds(samples[n], inner[n], methods[n]) for n in names}


def host_time(fn, *, reps: int = 20) -> float:
    """Median host time in ms of one call of ``fn`` on an idle GPU: from the call until it
    returns, with the GPU drained before each call (what Python validation, configuration
    lookup and the launch cost the caller; the kernel itself runs after the call returns)."""
    import time

    import torch
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


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
