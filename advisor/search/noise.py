"""The noise trial: the gradient noise scale B_simple = tr(Σ)/|G|² measured on the user's
configuration (`measure_noise_scale`), read from its gradient norms by `advisor.noise_scale`,
and kept in the study so that a resumed tune measures it once."""

from __future__ import annotations

import optuna

from advisor.knobs import TrialConfig
from advisor.noise_scale import estimate_noise_scale
from advisor.results import NoiseScale, TrialResult
from advisor.search.context import SearchContext
from advisor.search.records import read_noise, write_noise
from advisor.trial.orders import NoiseOrder

__all__ = ["NOISE_ACCUMULATION", "measure_noise_scale"]


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
