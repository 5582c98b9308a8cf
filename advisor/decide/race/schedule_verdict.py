"""The batch-size schedule's verdict (docs/method.md, "The batch-size schedule"): time every
racer to each loss the baseline's curve sets, on its own clock (a schedule's samples/s change
from stage to stage), and ship the schedule only where it beats the fixed recommendation by
`SCHEDULE_MARGIN` at every one of them."""

from __future__ import annotations

import math
from collections.abc import Sequence

from advisor.decide.race.estimate import first_crossing
from advisor.results import RaceCurve, Racer, ScheduleVerdict

__all__ = ["SCHEDULE_MARGIN", "beats", "decide_schedule", "fixed_racer", "time_to_loss"]

# A schedule must reach the loss this much sooner than the fixed recommendation to ship:
# benchmarks/machine_drift.py measured 12 % between two processes of the same configuration.
SCHEDULE_MARGIN = 0.15


def decide_schedule(
    racers: Sequence[Racer],
) -> tuple[int | None, float | None, tuple[Racer, ...], ScheduleVerdict]:
    """Time every racer to each loss the baseline's curve sets (`RaceCurve.target_losses`); the
    schedule that reached the lowest soonest ships if, at every one of them, it beat the fixed
    recommendation by more than `SCHEDULE_MARGIN`. Returns the shipped index (or None), the target
    the racers are timed to, the timed racers, and the verdict."""
    reference = next(r for r in racers if r.role == "baseline")
    assert reference.curve is not None
    targets = reference.curve.target_losses
    timed_at = [timed_to(racers, target) for target in targets]
    timed = timed_at[0]
    fixed = fixed_racer(timed)
    schedules = [i for i, r in enumerate(timed) if r.role == "schedule" and r.time_to_target_s]
    if not schedules:
        verdict = ScheduleVerdict(kind="none-reached", fixed=fixed, margin=SCHEDULE_MARGIN)
        return None, targets[0], timed, verdict
    best = min(schedules, key=lambda i: timed[i].time_to_target_s or math.inf)
    ships = all(beats(at[best], at[fixed]) for at in timed_at)
    verdict = ScheduleVerdict(
        kind="ships" if ships else "not-by-margin", best=best, fixed=fixed, margin=SCHEDULE_MARGIN
    )
    return (best if ships else None), targets[0], timed, verdict


def fixed_racer(racers: Sequence[Racer]) -> int:
    """The fixed recommendation's racer: its own, or your configuration's where it is yours."""
    fixed = next((i for i, r in enumerate(racers) if r.role == "fixed"), None)
    if fixed is not None:
        return fixed
    return next(i for i, r in enumerate(racers) if r.role == "baseline")


def time_to_loss(curve: RaceCurve, target: float) -> float | None:
    """Training time until the curve first reaches `target`, interpolated between its points;
    None if it never does."""
    return first_crossing([p.seconds for p in curve.points], [p.loss for p in curve.points], target)


def timed_to(racers: Sequence[Racer], target: float) -> tuple[Racer, ...]:
    """The racers with their training time until each first reached `target` (None: never)."""
    return tuple(
        r.model_copy(
            update={"time_to_target_s": time_to_loss(r.curve, target) if r.curve else None}
        )
        for r in racers
    )


def beats(first: Racer, second: Racer) -> bool:
    """Whether `first` reached the target more than `SCHEDULE_MARGIN` sooner than `second`."""
    if first.time_to_target_s is None:
        return False
    if second.time_to_target_s is None:
        return True
    return first.time_to_target_s < second.time_to_target_s * (1 - SCHEDULE_MARGIN)
