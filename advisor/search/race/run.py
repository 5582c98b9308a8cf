"""The convergence race that decides a time-to-loss recommendation (docs/method.md, "The race
and its verdict").

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
   the fastest configuration at B0 wins (`advisor.search.race.verdict`).

Only the baseline trains the whole race time: it sets the target. Where its loss did not fall
(`RaceCurve.fell`: flat, or rising from the start), nothing can be timed to it: the other racers
are skipped, and the user's global batch is kept. Every later racer stops once
it has trained so long that it can no longer win (`_horizon`), and the best at the user's batch
also once it reaches the target, so a race costs little more than the baseline's own. Each
racer is stored in the study as it finishes, so an interrupted tune keeps it and a resumed one
does not race it again.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna

from advisor.recommendation import Racer, did_not_fall, reference_racer
from advisor.search.context import SearchContext
from advisor.search.race.plan import RacePlan
from advisor.search.race.verdict import RACE_MARGIN, pick_at_batch0, time_to_loss
from advisor.search.records import read_racers, write_racer
from advisor.trial.parent.runner import run_trial

__all__ = ["run_race"]

SHORTEST_RACE = 0.05  # of the race time: one of its twenty evaluation intervals


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
