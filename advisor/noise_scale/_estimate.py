"""The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"), estimated from squared gradient norms measured at two batch sizes.

A gradient estimated from B samples has E|G_B|² = |G|² + tr(Σ)/B, where G is the true gradient
and Σ the per-sample gradient covariance. Two batch sizes B_small < B_big (a micro-batch and the
batch accumulated, or all-reduced, over several) give unbiased estimates of both terms
(Appendix A.1):

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

Each step's pair is noisy (the |G|² estimate can even be negative), so both are averaged over
steps before their ratio is taken, and the ratio gets a 95 % interval by the delta method.
Pure arithmetic: the trial child uses it to know when a probe is precise, the search to read
noise trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["NoiseScaleEstimate", "estimate_noise_scale"]

Z_95 = 1.96


@dataclass(frozen=True)
class NoiseScaleEstimate:
    """B_simple with its 95 % interval; `value` is None where an averaged estimate was not
    positive: |G|² (the signal did not rise above the noise) or tr(Σ) (no noise measured)."""

    value: float | None
    low: float | None
    high: float | None
    gradient_sq: float  # the averaged |G|² estimate
    trace_sigma: float  # the averaged tr(Σ) estimate
    steps: int
    small_batch: int
    big_batch: int


def estimate_noise_scale(
    small_sq_norms: Sequence[float],
    big_sq_norms: Sequence[float],
    small_batch: int,
    big_batch: int,
) -> NoiseScaleEstimate:
    """B_simple from per-step squared gradient norms at `small_batch` and `big_batch` samples."""
    if big_batch <= small_batch:
        raise ValueError(f"big_batch ({big_batch}) must exceed small_batch ({small_batch})")
    if len(small_sq_norms) != len(big_sq_norms) or len(small_sq_norms) < 2:
        raise ValueError("need the same number (at least 2) of small- and big-batch norms")
    gradients = [
        (big_batch * big - small_batch * small) / (big_batch - small_batch)
        for small, big in zip(small_sq_norms, big_sq_norms, strict=True)
    ]
    traces = [
        (small - big) / (1 / small_batch - 1 / big_batch)
        for small, big in zip(small_sq_norms, big_sq_norms, strict=True)
    ]
    gradient, trace = statistics.fmean(gradients), statistics.fmean(traces)
    value = trace / gradient if gradient > 0 and trace > 0 else None
    low = high = None
    if value is not None:
        half = Z_95 * _ratio_stderr(traces, gradients, value)
        low, high = max(0.0, value - half), value + half
    return NoiseScaleEstimate(
        value=value,
        low=low,
        high=high,
        gradient_sq=gradient,
        trace_sigma=trace,
        steps=len(gradients),
        small_batch=small_batch,
        big_batch=big_batch,
    )


def _ratio_stderr(
    numerators: Sequence[float], denominators: Sequence[float], ratio: float
) -> float:
    """Standard error of mean(numerators) / mean(denominators), by the delta method:
    Var(N/D) ~ (Var N - 2 R Cov(N, D) + R^2 Var D) / D^2, with N and D the means."""
    count = len(numerators)
    var_num = statistics.variance(numerators) / count
    var_den = statistics.variance(denominators) / count
    cov = statistics.covariance(numerators, denominators) / count
    variance = (var_num - 2 * ratio * cov + ratio**2 * var_den) / statistics.fmean(
        denominators
    ) ** 2
    return math.sqrt(max(0.0, variance))
