"""Distribution statistics with the reference's definitions.

Percentile p of n sorted values is the value at index round((n - 1) * p / 100)
(half away from zero, clamped); ``std`` is the population standard deviation;
an empty distribution gives 0.0 everywhere.

Token gaps are far too many to keep (millions per run), so they go into a
:class:`GapSketch`: exact count, min and max, batch means and variances merged,
and a logarithmic-bucket sketch (DDSketch) for percentiles with bounded
relative error, which is also how the reference summarises them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

STAT_NAMES = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")
_PERCENTILES = (("median", 50.0), ("p75", 75.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0))


def rank(n: int, p: float) -> int:
    """Index of percentile ``p`` among ``n`` sorted values (nearest rank, rounded half up)."""
    return min(math.floor((n - 1) * p / 100.0 + 0.5), n - 1)


def describe(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """mean, min, max, median, p75, p90, p95, p99 and std of ``values``."""
    n = len(values)
    if n == 0:
        return dict.fromkeys(STAT_NAMES, 0.0)
    samples = np.asarray(values, dtype=np.float64)
    ordered = np.sort(samples)
    # Sums in the given (arrival) order, two passes, as the reference's (numpy's sum
    # would add pairwise).
    mean = sum(samples.tolist()) / n
    spread = samples - mean
    spread *= spread
    var = sum(spread.tolist()) / n
    out = {"mean": mean, "min": float(ordered[0]), "max": float(ordered[-1])}
    for name, p in _PERCENTILES:
        out[name] = float(ordered[rank(n, p)])
    out["std"] = math.sqrt(var)
    return {k: out[k] for k in STAT_NAMES}


class GapSketch:
    """Streaming summary of non-negative samples: exact moments, sketched percentiles.

    Mirrors the reference (the ``ddsketchy`` DDSketch with relative accuracy
    ``alpha`` = 0.001): a positive sample goes to bucket
    ``ceil(ln(v) / ln(gamma))`` with ``gamma = 1 + 2 alpha / (1 - alpha)``,
    and a bucket reports its midpoint ``gamma^k * 2 / (1 + gamma)``; tiny
    samples and zeros count in a zero bucket that reports 0.0. Percentile
    ranks follow :func:`rank`; one sample reports itself. Mean and std merge
    each batch's (Chan et al.); min and max are exact.
    """

    __slots__ = (
        "_buckets",
        "_gamma_ln",
        "_inv_ln_gamma",
        "_m2",
        "_mid",
        "_min_indexable",
        "count",
        "max",
        "mean",
        "min",
        "zeros",
    )

    def __init__(self, alpha: float = 0.001) -> None:
        x = 2.0 * alpha / (1.0 - alpha)
        gamma = 1.0 + x
        self._inv_ln_gamma = 1.0 / math.log1p(x)
        self._gamma_ln = 1.0 / self._inv_ln_gamma
        self._mid = 2.0 / (1.0 + gamma)
        self._min_indexable = max(
            math.exp(-(2.0**31) / self._inv_ln_gamma + 1.0), 2.2250738585072014e-308 * gamma
        )
        self._buckets: dict[int, int] = {}
        self.count = 0
        self.zeros = 0
        self.mean = 0.0
        self._m2 = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add_many(self, values: np.ndarray, *, weight: int | np.ndarray = 1) -> None:
        """Record each of ``values`` ``weight`` times (or ``weight[i]`` times, given an array).

        The batch's moments merge into the running ones by Chan et al.'s
        parallel update, so the moments depend on how samples are batched:
        callers that want them reproducible batch by position (see
        :class:`servesim.metrics.collector.TokenGaps`).
        """
        if not len(values):
            return
        weights = weight if isinstance(weight, np.ndarray) else np.full(len(values), float(weight))
        # Integer weights (a window's request counts) give the same products and sums as
        # their float values: every one of them, and every sum, is a whole number below 2^53.
        n = float(weights.sum())
        total = self.count + n
        mean_b = float((values * weights).sum() / n)
        spread = values - mean_b
        spread *= spread  # (what ** 2 computes)
        spread *= weights
        m2_b = float(spread.sum())
        delta = mean_b - self.mean
        self._m2 += m2_b + delta * delta * self.count * n / total
        self.mean += delta * n / total
        self.count = int(total)
        low_value = float(values.min())
        self.min = min(self.min, low_value)
        self.max = max(self.max, float(values.max()))
        if low_value < self._min_indexable:  # (rare: zero gaps)
            indexable = values >= self._min_indexable
            self.zeros += int(weights[~indexable].sum())
            values, weights = values[indexable], weights[indexable]
        if not len(values):
            return
        logs = np.log(values)
        logs *= self._inv_ln_gamma
        np.ceil(logs, out=logs)
        keys = logs.astype(np.int64)
        # Count by bucket offset: the keys of a batch span a few thousand buckets at
        # most (a factor 1.002 each), and bincount needs no sort, unlike np.unique.
        low = int(keys.min())
        span = int(keys.max()) - low + 1
        if span > 4 * len(keys) + 4096:  # scattered over many decades: sorting is cheaper
            unique, inverse = np.unique(keys, return_inverse=True)
            counts = np.bincount(inverse, weights=weights)
        else:
            keys -= low
            counts = np.bincount(keys, weights=weights, minlength=span)
            unique = counts.nonzero()[0]
            counts = counts[unique]
            unique += low
        buckets = self._buckets
        for key, count in zip(unique.tolist(), counts.tolist(), strict=True):
            buckets[key] = buckets.get(key, 0) + round(count)

    def quantile(self, p: float) -> float:
        """Sketched value at percentile ``p``."""
        if self.count == 1:
            return self.min
        target = rank(self.count, p)
        if target < self.zeros:
            return 0.0
        seen = self.zeros
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen > target:
                return math.exp(key * self._gamma_ln) * self._mid
        raise AssertionError("rank beyond the sketch's count")

    def describe(self) -> dict[str, float]:
        """The same statistics as :func:`describe`, from the sketch."""
        n = self.count
        if n == 0:
            return dict.fromkeys(STAT_NAMES, 0.0)
        out = {"mean": self.mean, "min": self.min, "max": self.max}
        for name, p in _PERCENTILES:
            out[name] = self.quantile(p)
        out["std"] = math.sqrt(self._m2 / n)
        return {k: out[k] for k in STAT_NAMES}
