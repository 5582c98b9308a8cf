"""The gradient noise scale B_simple = tr(Σ)/|G|² (estimated in `advisor.noise_scale`) as the
search uses it: measured on the user's configuration, along a tracked race, and read as samples.

The noise scale predicts how much a larger batch is worth per sample: reaching a given loss takes
about E_min (1 + B/B_simple) samples, so relative to the user's batch B0 a batch B needs
(B_simple + B)/(B_simple + B0) times the samples. It explains; it does not decide.

`measure_noise_scale` runs the noise trial on the user's configuration and reads phi from its
gradient norms.
"""

from __future__ import annotations

import optuna

from advisor.convergence import NoisePoint, NoiseScale, NoiseTrack, RaceCurve
from advisor.knobs import TrialConfig
from advisor.noise_scale import NoiseScaleEstimate, estimate_noise_scale
from advisor.results import TrialResult
from advisor.search.context import SearchContext
from advisor.search.records import read_noise, write_noise
from advisor.trial.orders import NoiseOrder

__all__ = [
    "NOISE_ACCUMULATION",
    "NoiseScaleEstimate",
    "estimate_noise_scale",
    "measure_noise_scale",
    "noise_track",
    "optimistic_ratio",
    "samples_ratio",
]


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
    seconds = max(NOISE_SECONDS, context.settings.trial_seconds)
    result = context.runner.run(
        NoiseOrder(config=config, seconds=seconds),
        context.logs_dir / "noise-scale.log",
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


def noise_track(curve: RaceCurve) -> NoiseTrack | None:
    """phi with its interval at each point where a tracked race measured gradient norms;
    None for a race that was not tracked."""
    if not curve.noise_probes:
        return None
    points = []
    for probe in curve.noise_probes:
        norms = probe.norms
        estimate = (
            estimate_noise_scale(norms.small_sq, norms.big_sq, norms.small_batch, norms.big_batch)
            if len(norms.small_sq) >= 2
            else None
        )
        points.append(
            NoisePoint(
                seconds=probe.seconds,
                samples=probe.samples,
                loss=probe.loss,
                value=estimate.value if estimate else None,
                low=estimate.low if estimate else None,
                high=estimate.high if estimate else None,
            )
        )
    return NoiseTrack(points=tuple(points))
