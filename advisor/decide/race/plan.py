"""Who races and how: each racer's role and learning rate (`plan_racers`, `lr_rule`), for the
global batches the noise scale's prediction sends to the race (`advisor.noise_scale`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from advisor.decide.claims import COVERAGE
from advisor.decide.paired_ratio import paired_ratio
from advisor.decide.reruns import Selection, knob_changes, rerun_pairs
from advisor.knobs import TrialConfig
from advisor.results import BatchPrediction, LrPlan, Racer, RacerRole, TrialRecord

__all__ = [
    "CLEARLY_FASTER",
    "FEED_FIELDS",
    "RacePlan",
    "fastest_at",
    "lr_rule",
    "plan_racers",
    "steps_of",
]

LR_CAP = 8.0  # no rule scales the learning rate by more
LINEAR_WARMUP_STEPS = 20  # the linear rule's warm-up (Goyal et al. 2017)
# A configuration with more changes races for its global batch only where it re-ran this much
# faster than one with fewer, at the low end of their paired interval: the race's margin.
CLEARLY_FASTER = 0.05
# The knobs that only change how batches arrive, not what a step computes (`steps_of`).
FEED_FIELDS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")


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
    for record in _at_batch0(selection, baseline, by_batch.get(batch0, (0.0, None))[1]):
        if record is not baseline_record:
            plans.append(_plan(RacerRole.YOUR_BATCH, record, LrPlan(), rates))
    for prediction in predictions:
        if not prediction.raced or prediction.global_batch not in by_batch:
            continue
        record = by_batch[prediction.global_batch][1]
        rule = lr_rule(optimizer_class, batch0, prediction.global_batch)
        plans.append(_plan(RacerRole.CANDIDATE, record, LrPlan(), rates))
        plans.append(_plan(RacerRole.CANDIDATE, record, rule, rates))
    return plans


def _at_batch0(
    selection: Selection, baseline: TrialConfig, fastest: TrialRecord | None
) -> list[TrialRecord]:
    """What races at your global batch: its fastest (`fastest_at`) and, where that one changes
    what a step computes (precision, layout), also the fastest that computes your steps (loader
    knobs alone), read from your curve at no cost. The first must then beat the second, not
    only yours: on examples/data_bound.py bf16 with 2 loader workers raced alone at your batch,
    and where its interval was a close call against yours, yours stood though fp32 with the same
    workers re-ran 1.3x-1.8x your samples/s in every other tune."""
    if fastest is None or steps_of(fastest.result.config) == steps_of(baseline):
        return [fastest] if fastest is not None else []
    twins = replace(
        selection,
        finalists=tuple(
            r
            for r in selection.finalists
            if r.result.config != baseline and steps_of(r.result.config) == steps_of(baseline)
        ),
    )
    twin = fastest_at(twins, baseline).get(baseline.global_batch_size)
    return [twin, fastest] if twin is not None else [fastest]


def steps_of(config: TrialConfig) -> TrialConfig:
    """`config` without the knobs that only change how batches arrive (`FEED_FIELDS`): two
    with the same steps compute the same steps on the same samples."""
    fields = TrialConfig.model_fields
    return config.model_copy(update={name: fields[name].default for name in FEED_FIELDS})


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
