"""Who races: what the noise scale predicts for each global batch the search measured
(`predict_batches`), which of them race (`race_finalists`), and each racer's role and learning
rate (`plan_racers`, `lr_rule`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.convergence import BatchPrediction, LrPlan, NoiseScale
from advisor.knobs import TrialConfig
from advisor.recommendation import Racer
from advisor.results import TrialRecord
from advisor.search.race.noise import optimistic_ratio, samples_ratio
from advisor.search.selection import Selection

__all__ = [
    "MAX_RACE_BATCHES",
    "RacePlan",
    "lr_rule",
    "plan_racers",
    "predict_batches",
    "race_finalists",
]

MAX_RACE_BATCHES = 2  # other global batches raced, besides the user's
LR_CAP = 8.0  # no rule scales the learning rate by more
LINEAR_WARMUP_STEPS = 20  # the linear rule's warm-up (Goyal et al. 2017)


def predict_batches(
    noise: NoiseScale | None, records: Sequence[TrialRecord], baseline: TrialConfig
) -> tuple[BatchPrediction, ...]:
    """For each global batch the search measured: its best samples/s, the samples it needs to
    reach a loss relative to the user's batch, and so the time it needs, relative to the best
    configuration at the user's batch. Without phi, the samples count as equal."""
    best = _best_by_global_batch(records)
    batch0 = baseline.global_batch_size
    if batch0 not in best:
        return ()
    rate0 = best[batch0].result.samples_per_s or 0.0
    predictions = []
    for batch, record in sorted(best.items()):
        rate = record.result.samples_per_s or 0.0
        ratio = samples_ratio(noise.value, batch0, batch) if noise and noise.value else 1.0
        predictions.append(
            BatchPrediction(
                global_batch=batch,
                samples_per_s=rate,
                samples_ratio=ratio,
                predicted_speedup=rate / rate0 / ratio,
            )
        )
    return tuple(predictions)


def race_finalists(
    predictions: Sequence[BatchPrediction],
    noise: NoiseScale | None,
    records: Sequence[TrialRecord],
    baseline: TrialConfig,
) -> tuple[tuple[BatchPrediction, ...], list[TrialRecord]]:
    """The predictions marked with the global batches that race, and the search records that
    must be re-measured for it: the best at each raced batch and at the user's.

    A batch races when its predicted time to the loss beats the user's batch at the optimistic
    end of phi's 95 % interval; the `MAX_RACE_BATCHES` best predictions race. When none is
    predicted to, the best-predicted batch with more samples/s than the user's races all the
    same: phi is measured early and grows as training goes on, so the measurement decides.
    """
    batch0 = baseline.global_batch_size
    best = _best_by_global_batch(records)
    hopeful = [
        (_optimistic_speedup(p, noise, batch0), p) for p in predictions if p.global_batch != batch0
    ]
    hopeful.sort(key=lambda h: -h[0])
    predicted = [p for speedup, p in hopeful if speedup > 1.0]
    faster = [p for _, p in hopeful if p.samples_per_s > _rate(predictions, batch0)]
    raced = {p.global_batch for p in (predicted or faster[:1])[:MAX_RACE_BATCHES]}
    marked = tuple(p.model_copy(update={"raced": p.global_batch in raced}) for p in predictions)
    finalists = [best[b] for b in sorted(raced | ({batch0} if batch0 in best else set()))]
    return marked, finalists


def _rate(predictions: Sequence[BatchPrediction], batch: int) -> float:
    return next((p.samples_per_s for p in predictions if p.global_batch == batch), 0.0)


def _optimistic_speedup(
    prediction: BatchPrediction, noise: NoiseScale | None, batch0: int
) -> float:
    if noise is None or noise.value is None:
        return prediction.predicted_speedup
    throughput = prediction.predicted_speedup * prediction.samples_ratio
    return throughput / optimistic_ratio(noise, batch0, prediction.global_batch)


def _best_by_global_batch(records: Sequence[TrialRecord]) -> dict[int, TrialRecord]:
    best: dict[int, TrialRecord] = {}
    for record in records:
        if record.role not in ("baseline", "search") or not record.eligible:
            continue
        batch = record.result.config.global_batch_size
        rate = record.result.samples_per_s or 0.0
        if batch not in best or rate > (best[batch].result.samples_per_s or 0.0):
            best[batch] = record
    return best


def lr_rule(optimizer_class: str | None, batch0: int, batch: int) -> LrPlan:
    """The optimizer family's rule for a global batch `batch` instead of `batch0`: linear with
    warm-up for SGD, square root for everything else (Adam and other adaptive methods); capped
    at `LR_CAP`."""
    ratio = batch / batch0
    if optimizer_class is not None and optimizer_class.lower().startswith("sgd"):
        scale = min(ratio, LR_CAP)
        return LrPlan(
            scale=scale, warmup_steps=LINEAR_WARMUP_STEPS if scale > 1 else 0, rule="linear"
        )
    return LrPlan(scale=min(math.sqrt(ratio), LR_CAP), rule="sqrt")


@dataclass(frozen=True)
class RacePlan:
    """A racer before it runs: which finalist, in which role, with which learning rate; one
    that `resumes` an earlier racer goes on from its saved state (`advisor.search.race.extend`)."""

    role: str
    trial: int | None
    config: TrialConfig
    lr: LrPlan
    samples_per_s: float | None
    resumes: Racer | None = None


def plan_racers(
    selection: Selection,
    predictions: Sequence[BatchPrediction],
    baseline: TrialConfig,
    optimizer_class: str | None,
) -> list[RacePlan]:
    """The baseline, the fastest re-measured configuration at the user's global batch, and at
    each raced batch the fastest re-measured one with both learning rates."""
    batch0 = baseline.global_batch_size
    rates = selection.confirmed_rates
    by_batch: dict[int, tuple[float, TrialRecord]] = {}
    for record in selection.finalists:
        rate = rates.get(record.number)
        batch = record.result.config.global_batch_size
        if rate is not None and (batch not in by_batch or rate > by_batch[batch][0]):
            by_batch[batch] = (rate, record)
    baseline_record = next((r for r in selection.finalists if r.result.config == baseline), None)
    plans = []
    if baseline_record is not None:
        plans.append(_plan("baseline", baseline_record, LrPlan(), rates))
    if batch0 in by_batch and by_batch[batch0][1] is not baseline_record:
        plans.append(_plan("your batch", by_batch[batch0][1], LrPlan(), rates))
    for prediction in predictions:
        if not prediction.raced or prediction.global_batch not in by_batch:
            continue
        record = by_batch[prediction.global_batch][1]
        rule = lr_rule(optimizer_class, batch0, prediction.global_batch)
        plans.append(_plan("candidate", record, LrPlan(), rates))
        plans.append(_plan("candidate", record, rule, rates))
    return plans


def _plan(role: str, record: TrialRecord, lr: LrPlan, rates: dict[int, float]) -> RacePlan:
    return RacePlan(role, record.number, record.result.config, lr, rates.get(record.number))
