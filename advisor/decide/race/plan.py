"""Who races and how: each racer's role and learning rate (`plan_racers`, `lr_rule`), for the
global batches the noise scale's prediction sends to the race (`advisor.noise_scale`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.decide.reruns import Selection
from advisor.knobs import TrialConfig
from advisor.results import BatchPrediction, LrPlan, Racer, RacerRole, TrialRecord

__all__ = ["RacePlan", "lr_rule", "plan_racers"]

LR_CAP = 8.0  # no rule scales the learning rate by more
LINEAR_WARMUP_STEPS = 20  # the linear rule's warm-up (Goyal et al. 2017)


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
    that `resumes` an earlier racer goes on from its saved state (`advisor.decide.race.extend`)."""

    role: RacerRole
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
        plans.append(_plan(RacerRole.BASELINE, baseline_record, LrPlan(), rates))
    if batch0 in by_batch and by_batch[batch0][1] is not baseline_record:
        plans.append(_plan(RacerRole.YOUR_BATCH, by_batch[batch0][1], LrPlan(), rates))
    for prediction in predictions:
        if not prediction.raced or prediction.global_batch not in by_batch:
            continue
        record = by_batch[prediction.global_batch][1]
        rule = lr_rule(optimizer_class, batch0, prediction.global_batch)
        plans.append(_plan(RacerRole.CANDIDATE, record, LrPlan(), rates))
        plans.append(_plan(RacerRole.CANDIDATE, record, rule, rates))
    return plans


def _plan(role: RacerRole, record: TrialRecord, lr: LrPlan, rates: dict[int, float]) -> RacePlan:
    return RacePlan(role, record.number, record.result.config, lr, rates.get(record.number))
