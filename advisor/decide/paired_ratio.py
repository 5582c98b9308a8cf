"""The typical ratio of paired runs, and an interval around it.

Each pair (the recommendation and the baseline, run one after the other) gives one ratio of
their samples/s. On logs of the ratios, the Hodges-Lehmann estimate (the median of the pairwise
means, "Walsh averages") is the typical ratio, and the Wilcoxon signed-rank test gives the
interval around it (Hollander & Wolfe, Nonparametric Statistical Methods, ch. 3):
distribution-free for noise symmetric on the log scale, unmoved by one wild pair as a mean
would be, and finer-grained than the order statistics of the ratios themselves. On the
project's VM, quiet, examples/data_bound.py's pairs fell into two clusters (about 1.6x and
2.4x over 10 rounds); the order statistics' interval spanned both for any number of rounds
advisor can afford, while this one narrows as rounds are added.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from functools import cache

__all__ = ["PairedRatio", "paired_ratio"]


class PairedRatio:
    """The typical ratio and its interval at `coverage`, from `ratios` (all positive)."""

    def __init__(self, ratios: Sequence[float], coverage: float) -> None:
        logs = [math.log(ratio) for ratio in ratios]
        walsh = sorted((a + b) / 2 for i, a in enumerate(logs) for b in logs[i:])
        drop = _signed_rank_quantile(len(logs), (1 - coverage) / 2)
        self.typical = math.exp(statistics.median(walsh))
        self.low = math.exp(walsh[drop])
        self.high = math.exp(walsh[-1 - drop])


def paired_ratio(ratios: Sequence[float], coverage: float) -> PairedRatio:
    """The typical ratio of `ratios` and its interval at `coverage`."""
    return PairedRatio(ratios, coverage)


def _signed_rank_quantile(n: int, tail: float) -> int:
    """How many Walsh averages to drop from each end: the largest d with P(W <= d) <= `tail`
    under the null, W the signed-rank statistic of n pairs, so that the interval keeps
    coverage 1 - 2 P(W <= d), at least 1 - 2 `tail` (none dropped where n is too small)."""
    counts = _signed_rank_counts(n)
    total, below, fits = 2**n, 0, 0
    while fits < len(counts) and (below + counts[fits]) / total <= tail:
        below += counts[fits]
        fits += 1
    return max(fits - 1, 0)


@cache
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2^n sign patterns of ranks 1..n give each rank sum 0..n(n+1)/2."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for total, count in enumerate(counts):
            grown[total + rank] += count
        counts = grown
    return tuple(counts)
