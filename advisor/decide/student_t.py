"""Quantiles of Student's t distribution, for the prediction interval of a few replicates
(`advisor.decide.race.estimate`): a standard library has none, and the interval needs them only
for small degrees of freedom at one coverage, so a numerical integral of the density does.
"""

from __future__ import annotations

import math
from functools import cache

__all__ = ["t_quantile"]

_SIMPSON_STEPS = 400  # even; the quantiles are exact to 4 decimals for 1 degree of freedom up


@cache
def t_quantile(probability: float, freedom: int) -> float:
    """The `probability` quantile (above 0.5) of Student's t with `freedom` degrees of
    freedom: the x at which its distribution function reaches `probability`."""
    if not 0.5 <= probability < 1 or freedom < 1:
        raise ValueError(f"t_quantile({probability}, {freedom}): needs 0.5 <= p < 1, freedom >= 1")
    low, high = 0.0, 1.0
    while _cdf(high, freedom) < probability:
        high *= 2
    for _ in range(60):  # bisection to far below the integral's own error
        middle = (low + high) / 2
        low, high = (middle, high) if _cdf(middle, freedom) < probability else (low, middle)
    return (low + high) / 2


def _cdf(x: float, freedom: int) -> float:
    """P(T <= x) for x >= 0: one half plus Simpson's rule over the density from 0 to x."""
    step = x / _SIMPSON_STEPS
    weights = (
        1 if i in (0, _SIMPSON_STEPS) else 4 if i % 2 else 2 for i in range(_SIMPSON_STEPS + 1)
    )
    total = sum(w * _density(i * step, freedom) for i, w in enumerate(weights))
    return 0.5 + total * step / 3


def _density(t: float, freedom: int) -> float:
    scale = math.lgamma((freedom + 1) / 2) - math.lgamma(freedom / 2)
    return math.exp(scale - (freedom + 1) / 2 * math.log1p(t * t / freedom)) / math.sqrt(
        freedom * math.pi
    )
