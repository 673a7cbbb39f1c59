"""Ratios of two contenders timed in the same interleaved rounds: :func:`paired_ratio`, and the
distribution-free interval around a median it uses (:func:`median_interval`)."""

from __future__ import annotations

import statistics
from typing import Optional

#: confidence of the interval around a paired ratio
RATIO_CONFIDENCE = 0.95


def median_interval(values: list[float], confidence: float = RATIO_CONFIDENCE) -> tuple[float, float]:
    """A distribution-free interval for the median of ``values``: the order statistics
    ``x_(k)`` and ``x_(n+1-k)`` with the largest ``k`` for which the binomial(n, 1/2) chance of
    the median falling outside is at most ``1 - confidence``. With too few values for that
    confidence the interval is the whole range."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        raise ValueError("median_interval needs at least one value")
    # tail: the number of outcomes of n fair coins with at most k - 1 heads (the chance that the
    # median lies below x_(k), times 2**n), in integers: exact for any n (in floats, the
    # binomial terms overflow from n = 1032)
    num, den = float(1 - confidence).as_integer_ratio()  # the chance allowed outside, exactly
    k, tail, term, total = 0, 0, 1, 1 << n  # term: comb(n, k)
    while True:
        tail_next = tail + term
        if 2 * tail_next * den > num * total or k + 1 > (n + 1) // 2:
            break
        tail, term, k = tail_next, term * (n - k) // (k + 1), k + 1
    k = max(k, 1)
    return xs[k - 1], xs[n - k]


def paired_ratio(samples: Optional[list], reference: Optional[list]) -> Optional[tuple[float, float, float]]:
    """The ratio of two contenders timed in the same interleaved rounds, round by round:
    ``(median, low, high)`` of ``samples[r] / reference[r]`` with :func:`median_interval`.
    Clock and power drift between rounds hit both samples of a round alike and cancel here,
    which the ratio of the two medians does not do. None without paired samples."""
    if not samples or not reference or len(samples) != len(reference):
        return None
    ratios = [a / b for a, b in zip(samples, reference) if b]
    if len(ratios) != len(samples):
        return None
    low, high = median_interval(ratios)
    return statistics.median(ratios), low, high
