"""The gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training"), from squared gradient norms measured at two batch sizes.

A gradient estimated from B samples has E|G_B|² = |G|² + tr(Σ)/B, where G is the true gradient
and Σ the per-sample gradient covariance. Two batch sizes B_small < B_big (a micro-batch and the
batch accumulated, or all-reduced, over several) give unbiased estimates of both terms
(Appendix A.1):

    |G|²  ≈ (B_big |G_big|² - B_small |G_small|²) / (B_big - B_small)
    tr(Σ) ≈ (|G_small|² - |G_big|²) / (1/B_small - 1/B_big)

Each step's pair is noisy (the |G|² estimate can even be negative), so both are averaged over
steps before their ratio is taken, and the ratio gets a 95 % interval by the delta method.

The noise scale predicts how much a larger batch is worth per sample: reaching a given loss takes
about E_min (1 + B/B_simple) samples, so relative to the user's batch B0 a batch B needs
(B_simple + B)/(B_simple + B0) times the samples. It explains; it does not decide.

`measure_noise_scale` runs the noise trial on the user's configuration and reads phi from its
gradient norms.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from advisor.convergence import NoiseScale
from advisor.knobs import TrialConfig
from advisor.results import TrialResult
from advisor.search.context import SearchContext
from advisor.search.records import read_noise, write_noise
from advisor.trial.parent.runner import run_trial

__all__ = [
    "NOISE_ACCUMULATION",
    "NoiseScaleEstimate",
    "estimate_noise_scale",
    "measure_noise_scale",
    "optimistic_ratio",
    "samples_ratio",
]

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


def samples_ratio(noise_scale: float, baseline_batch: int, batch: int) -> float:
    """How many times the samples of batch `baseline_batch` a batch of `batch` needs to reach
    the same loss: (B_simple + B) / (B_simple + B0); its inverse is the statistical efficiency."""
    return (noise_scale + batch) / (noise_scale + baseline_batch)


def optimistic_ratio(noise: NoiseScale | None, baseline_batch: int, batch: int) -> float:
    """`samples_ratio` at the end of phi's 95 % interval that favours `batch`: the high end for
    a larger batch, the low end for a smaller one (phi grows as training goes on, so the
    interval's high end is the nearer guess for later training). 1 without a phi."""
    if noise is None or noise.value is None:
        return 1.0
    phi = noise.high if batch > baseline_batch else noise.low
    return samples_ratio(phi if phi is not None else noise.value, baseline_batch, batch)


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


NOISE_ACCUMULATION = 8  # the noise trial's big batch is this many of the user's micro-batches
NOISE_SECONDS = 3.0


def measure_noise_scale(
    study: optuna.Study, context: SearchContext, baseline: TrialConfig
) -> NoiseScale | None:
    """phi on the user's configuration, from its micro-batch and `NOISE_ACCUMULATION` of them;
    a study that measured it already keeps its figure. None if the noise trial failed."""
    config = baseline.model_copy(
        update={"accumulation_steps": max(NOISE_ACCUMULATION, baseline.accumulation_steps)}
    )
    stored = read_noise(study)
    if stored is not None and stored.config == config:
        noise = _noise_scale(stored)
        if noise is None:
            context.progress.stage(f"the noise-scale trial failed: {_failure(stored)}")
        return noise
    context.progress.trial_started("noise-scale trial", config)
    launch = context.launch.lasting(max(NOISE_SECONDS, context.settings.trial_seconds))
    result = run_trial(
        launch,
        config,
        context.logs_dir / "noise-scale.log",
        mode="noise",
        on_phase=context.progress.trial_phase,
    )
    write_noise(study, result)
    noise = _noise_scale(result)
    context.progress.noise_finished(noise, None if noise else _failure(result))
    return noise


def _failure(result: TrialResult) -> str:
    return result.reason or result.status


def _noise_scale(result: TrialResult) -> NoiseScale | None:
    """phi from a noise trial's gradient norms; None if it has too few."""
    norms = result.gradient_norms
    if norms is None or len(norms.small_sq) < 2:
        return None
    estimate = estimate_noise_scale(
        norms.small_sq, norms.big_sq, norms.small_batch, norms.big_batch
    )
    return NoiseScale(
        value=estimate.value,
        low=estimate.low,
        high=estimate.high,
        small_batch=norms.small_batch,
        big_batch=norms.big_batch,
        steps=estimate.steps,
    )
