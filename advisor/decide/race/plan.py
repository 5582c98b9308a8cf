"""Who races and how: each racer's role and learning rate (`plan_racers`, `lr_rule`), for the
global batches the noise scale's prediction sends to the race (`advisor.noise_scale`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.decide.claims import COVERAGE
from advisor.decide.paired_ratio import paired_ratio
from advisor.decide.reruns import Selection, knob_changes, rerun_pairs
from advisor.knobs import TrialConfig
from advisor.results import BatchPrediction, LrPlan, Racer, RacerRole, TrialRecord

__all__ = ["CLEARLY_FASTER", "RacePlan", "fastest_at", "lr_rule", "plan_racers"]

LR_CAP = 8.0  # no rule scales the learning rate by more
LINEAR_WARMUP_STEPS = 20  # the linear rule's warm-up (Goyal et al. 2017)
# A configuration with more changes races for its global batch only where it re-ran this much
# faster than one with fewer, at the low end of their paired interval: the race's margin.
CLEARLY_FASTER = 0.05


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
    each raced batch the fastest re-measured one with both learning rates (`fastest_at`)."""
    batch0 = baseline.global_batch_size
    rates = selection.confirmed_rates
    by_batch = {
        batch: (rates[record.number], record)
        for batch, record in fastest_at(selection, baseline).items()
    }
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


def fastest_at(selection: Selection, baseline: TrialConfig) -> dict[int, TrialRecord]:
    """For each global batch, the fastest re-measured finalist at it: the one with the fewest
    changes from `baseline`, unless another is faster than it by `CLEARLY_FASTER` at the low end
    of their paired re-runs' interval. Two within each other's noise (bf16 and fp32 with the same
    loader, on a loader-bound model) give the same racer whichever re-ran a little faster."""
    rates = selection.confirmed_rates
    at: dict[int, list[TrialRecord]] = {}
    for record in selection.finalists:
        if record.number in rates:
            at.setdefault(record.result.config.global_batch_size, []).append(record)
    chosen = {}
    for batch, records in at.items():
        ordered = sorted(
            records, key=lambda r: (knob_changes(r.result.config, baseline), -rates[r.number])
        )
        current = ordered[0]
        for other in ordered[1:]:
            if _clearly_faster(selection, other, current):
                current = other
        chosen[batch] = current
    return chosen


def _clearly_faster(selection: Selection, record: TrialRecord, than: TrialRecord) -> bool:
    """Whether `record` re-ran faster than `than` by `CLEARLY_FASTER` at the low end of their
    paired rounds' interval (their medians' ratio where no round re-ran both)."""
    pairs = rerun_pairs(selection.confirmations, record.number, than.number)
    if pairs:
        low = paired_ratio([mine / theirs for mine, theirs, _ in pairs], COVERAGE).low
    else:
        rates = selection.confirmed_rates
        low = rates[record.number] / rates[than.number] if rates.get(than.number) else 1.0
    return low >= 1 + CLEARLY_FASTER


def _plan(role: RacerRole, record: TrialRecord, lr: LrPlan, rates: dict[int, float]) -> RacePlan:
    return RacePlan(role, record.number, record.result.config, lr, rates.get(record.number))
