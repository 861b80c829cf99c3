"""Statistics of recorded timings: bootstrap confidence intervals (pure Python, CPU only).

The benchmark keeps one sample per round for every implementation, all implementations timed
in the same rounds, so these can be recomputed from the recorded data at any time.
"""
from __future__ import annotations

import random
import statistics


def bootstrap_ci(samples, stat=statistics.median, *, level: float = 0.95, n: int = 2000,
                 seed: int = 0) -> tuple[float, float]:
    """A percentile-bootstrap confidence interval of ``stat`` over ``samples``."""
    xs = [x for x in samples if x is not None]
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    rng = random.Random(seed)
    est = sorted(stat(rng.choices(xs, k=len(xs))) for _ in range(n))
    return est[int((1 - level) / 2 * n)], est[min(n - 1, int((1 + level) / 2 * n))]


def ratio_ci(ref_samples, samples, *, level: float = 0.95, n: int = 2000,
             seed: int = 0) -> tuple[float, float, float]:
    """Speed of an implementation relative to a reference timed in the same rounds: the
    median over rounds of ref/impl (pairing by round cancels drift that hit both in that
    round), with a bootstrap interval over rounds. Returns (ratio, lo, hi)."""
    rs = [a / b for a, b in zip(ref_samples, samples) if a and b]
    if not rs:
        return (float("nan"),) * 3
    lo, hi = bootstrap_ci(rs, level=level, n=n, seed=seed)
    return statistics.median(rs), lo, hi


def gap(a_samples, b_samples) -> tuple[float, float, float]:
    """Relative difference of two implementations timed in the same rounds (a control:
    the same kernel twice): |ratio - 1| with the interval of ``ratio_ci``."""
    r, lo, hi = ratio_ci(a_samples, b_samples)
    return abs(r - 1), lo - 1, hi - 1
