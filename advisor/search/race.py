"""The convergence race that decides a time-to-loss recommendation (DESIGN.md §5).

Samples/s ranks configurations cheaply but does not decide: a changed global batch changes the
optimisation. So, after the throughput search:

1. a noise trial measures the gradient noise scale phi on the user's configuration, and phi,
   with each global batch's best samples/s, predicts which global batches could reach the
   user's loss sooner (`predict_batches`); the best of them join the finalists;
2. the racers train from the same seeded weights for the same training time, each in a fresh
   trial process: the user's baseline, the fastest configuration at the user's global batch B0,
   and the fastest at each predicted batch, twice: with the user's learning rate and with the
   optimizer family's scaling rule (`plan_racers`, `run_race`);
3. the winner reaches the baseline's lowest loss in the race (its end-of-race loss, unless it
   rose again) soonest, by more than the noise, and also that loss plus twice the noise of the
   baseline's evaluations (`RaceCurve.target_losses`); otherwise
   the fastest configuration at B0 wins (`advisor.search.race_verdict`).

Only the baseline trains the whole race time: it sets the target. Where its loss did not fall
(`RaceCurve.fell`: flat, or rising from the start), nothing can be timed to it: the other racers
are skipped, and the user's global batch is kept. Every later racer stops once
it has trained so long that it can no longer win (`_horizon`), and the best at the user's batch
also once it reaches the target, so a race costs little more than the baseline's own. Each
racer is stored in the study as it finishes, so an interrupted tune keeps it and a resumed one
does not race it again.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from advisor.convergence import BatchPrediction, LrPlan, NoiseScale
from advisor.knobs import TrialConfig
from advisor.results import Racer, RaceSummary, TrialRecord, TrialResult
from advisor.search.context import SearchContext
from advisor.search.race_verdict import (
    RACE_MARGIN,
    did_not_fall,
    pick_at_batch0,
    reference_racer,
    time_to_loss,
)
from advisor.search.records import read_noise, read_racers, write_noise, write_racer
from advisor.search.selection import Selection
from advisor.trial.noise_scale import estimate_noise_scale, samples_ratio
from advisor.trial.runner import run_trial

__all__ = [
    "RacePlan",
    "lr_rule",
    "measure_noise_scale",
    "plan_racers",
    "predict_batches",
    "race_choice",
    "race_finalists",
    "rerun_rates",
    "run_race",
]

NOISE_ACCUMULATION = 8  # the noise trial's big batch is this many of the user's micro-batches
NOISE_SECONDS = 3.0
MAX_RACE_BATCHES = 2  # other global batches raced, besides the user's
LR_CAP = 8.0  # no rule scales the learning rate by more
LINEAR_WARMUP_STEPS = 20  # the linear rule's warm-up (Goyal et al. 2017)
SHORTEST_RACE = 0.05  # of the race time: one of its twenty evaluation intervals


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
    phi = noise.high if prediction.global_batch > batch0 else noise.low
    ratio = samples_ratio(phi if phi is not None else noise.value, batch0, prediction.global_batch)
    return throughput / ratio


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
    """A racer before it runs: which finalist, in which role, with which learning rate."""

    role: str
    trial: int
    config: TrialConfig
    lr: LrPlan
    samples_per_s: float | None


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


def run_race(study: optuna.Study, context: SearchContext, plans: Sequence[RacePlan]) -> list[Racer]:
    """Race each plan in a fresh trial process; a racer the study holds already (same
    configuration, learning rate and race time) is not raced again."""
    seconds = context.settings.race_seconds
    stored = read_racers(study)
    racers: list[Racer] = []
    for index, plan in enumerate(plans):
        if did_not_fall(racers):
            context.progress.stage(
                "your loss did not fall in the race: it cannot compare global batches, so the "
                f"other {len(plans) - index} racers are skipped"
            )
            break
        earlier = next(
            (
                r
                for r in stored
                if (r.config, r.lr, r.race_seconds) == (plan.config, plan.lr, seconds)
            ),
            None,
        )
        if earlier is not None:
            racers.append(earlier.model_copy(update={"role": plan.role, "trial": plan.trial}))
            continue
        context.progress.trial_started(
            f"race {index + 1}/{len(plans)}, {plan.lr.label}", plan.config
        )
        target = _target(racers)
        result = run_trial(
            context.launch.lasting(_horizon(plan.role, racers, target, seconds)),
            plan.config,
            context.logs_dir / f"race-{plan.trial}-{index + 1}.log",
            mode="race",
            lr=plan.lr,
            # A candidate's two learning rates train equally long: the one that ends lower ships.
            race_target=target if plan.role == "your batch" else None,
            on_phase=context.progress.trial_phase,
        )
        racer = Racer(
            role=plan.role,  # type: ignore[arg-type]
            trial=plan.trial,
            config=plan.config,
            lr=plan.lr,
            race_seconds=seconds,
            samples_per_s=plan.samples_per_s,
            result=result,
        )
        write_racer(study, racer)  # at once: an interrupt keeps every finished racer
        context.progress.racer_finished(racer)
        racers.append(racer)
    return racers


def _target(racers: Sequence[Racer]) -> float | None:
    """The loss to reach, once the racer that sets it has run: the baseline's lowest (or, if
    the baseline failed, the best at the user's batch's), the lowest of the targets
    `decide_race` times racers to: reached last, it bounds how long a racer can still win."""
    reference = reference_racer(racers)
    return reference.curve.best_loss if reference is not None and reference.curve else None


def _horizon(role: str, racers: Sequence[Racer], target: float | None, seconds: float) -> float:
    """How long a racer trains: the whole race until the target is set; after, only as long
    as it can still win. The best at the user's batch loses to the baseline once it is past the
    baseline's time by the margin; another batch must beat the pick at the user's batch by it."""
    if target is None:
        return seconds
    timed = [
        r.model_copy(update={"time_to_target_s": time_to_loss(r.curve, target)})
        for r in racers
        if r.curve is not None
    ]
    at_batch0 = [r for r in timed if r.role in ("baseline", "your batch")]
    if role == "your batch":
        rival = next((r.time_to_target_s for r in at_batch0 if r.role == "baseline"), None)
        limit = rival / (1 - RACE_MARGIN) if rival is not None else seconds
    else:
        rival = timed[pick_at_batch0(timed)].time_to_target_s if at_batch0 else None
        limit = rival * (1 - RACE_MARGIN) if rival is not None else seconds
    return max(min(seconds, limit), SHORTEST_RACE * seconds)


def race_choice(
    selection: Selection, race: RaceSummary | None, baseline: TrialConfig
) -> tuple[TrialRecord, LrPlan]:
    """The configuration and learning rate a time-to-loss tune recommends: the race's winner;
    without a race, the fastest re-measured configuration at the user's global batch."""
    by_number = {record.number: record for record in selection.finalists}
    if race is not None and race.winner is not None:
        racer = race.racers[race.winner]
        if racer.trial in by_number:
            return by_number[racer.trial], racer.lr
    batch0 = baseline.global_batch_size
    if selection.winner.result.config.global_batch_size == batch0:
        return selection.winner, LrPlan()  # the re-runs' winner, a tie broken as they broke it
    at_batch0 = [r for r in selection.finalists if r.result.config.global_batch_size == batch0]
    if not at_batch0:  # the baseline failed and nothing else ran at its batch
        return selection.winner, LrPlan()
    rates = selection.confirmed_rates
    return max(at_batch0, key=lambda r: rates.get(r.number, 0.0)), LrPlan()


def rerun_rates(selection: Selection, number: int) -> tuple[float, ...]:
    """Samples/s of every re-run of search trial `number`."""
    return tuple(
        c.result.samples_per_s
        for c in selection.confirmations
        if c.number == number and c.result.samples_per_s is not None
    )
