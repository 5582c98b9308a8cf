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
   the fastest configuration at B0 wins (`advisor.decide.race.verdict`).

Only the baseline trains the whole race time: it sets the target. Where its loss did not fall
(`RaceCurve.fell`: flat, or rising from the start), nothing can be timed to it: the other racers
are skipped, and the user's global batch is kept. Every later racer stops once
it has trained so long that it can no longer win (`_horizon`), and the best at the user's batch
also once it reaches the target, so a race costs little more than the baseline's own. Each
racer is stored in the study as it finishes, so an interrupted tune keeps it and a resumed one
does not race it again.

Every racer evaluates the same held-out slice, as large as one evaluation can afford
(`held_out_size`). Each saves its training state at its end where the race may go on
(`advisor.decide.race.extend`); a racer that goes on loads it, trains on to the longer horizon,
and evaluates `WENT_ON_EVALUATIONS` times over the added time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import optuna

from advisor.decide.race.plan import RacePlan
from advisor.decide.race.verdict import RACE_MARGIN, pick_at_batch0, time_to_loss
from advisor.progress import Stage
from advisor.results import RaceCurve, Racer, did_not_fall, reference_racer
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey, read_noise, read_racers, write_racer
from advisor.trial.orders import HELD_OUT_MAX, RACE_EVALUATIONS, TRACK_POINTS, RaceOrder

__all__ = ["held_out_size", "run_race"]

WENT_ON_EVALUATIONS = 10  # loss points over the time the race goes on for
EVAL_SHARE = 0.25  # of an evaluation interval, the most one held-out evaluation should take
HELD_OUT_MIN = 256  # samples: the slice is never cut below this
SHORTEST_RACE = 0.05  # of the race time: one of its twenty evaluation intervals


def run_race(
    study: optuna.Study,
    context: SearchContext,
    plans: Sequence[RacePlan],
    seconds: float | None = None,
    *,
    states: Path | None = None,
    key: str = StudyKey.RACERS,
) -> list[Racer]:
    """Race each plan in a fresh trial process for `seconds` of training in all (the race
    time, unless given), saving each racer's training state in `states` if given; a plan that
    `resumes` a racer goes on from its saved state. A racer the study holds under `key`
    already (same configuration, learning rate and race time) is not raced again."""
    seconds = seconds or context.settings.race_seconds
    if states is not None:
        states.mkdir(parents=True, exist_ok=True)
    stored = read_racers(study, key)
    noise = read_noise(study)
    per_sample = noise.eval_s_per_sample if noise is not None else None
    held_out = held_out_size(per_sample, context.settings.race_seconds)
    racers: list[Racer] = []
    for index, plan in enumerate(plans):
        if did_not_fall(racers):
            context.progress.stage(Stage(kind="race-skips", count=len(plans) - index))
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
        count = f"{index + 1}/{len(plans)}"
        racer = _race_one(context, plan, racers, (seconds, held_out), states, count)
        write_racer(study, racer, key)  # at once: an interrupt keeps every finished racer
        context.progress.racer_finished(racer)
        racers.append(racer)
    return racers


def _race_one(
    context: SearchContext,
    plan: RacePlan,
    racers: Sequence[Racer],
    lengths: tuple[float, int],
    states: Path | None,
    count: str,
) -> Racer:
    """Train one racer in a fresh trial process, as long as it can still win; `lengths` are
    the race's training time and its held-out slice's samples at most."""
    seconds, held_out = lengths
    target = _target(racers)
    horizon = _horizon(plan, racers, target, seconds)
    name = f"race-{plan.trial}-{count.split('/')[0]}"
    resumes = plan.resumes.curve if plan.resumes is not None else None
    if plan.resumes is not None and not _may_go_on(resumes, horizon, target):
        return plan.resumes.model_copy(update={"state": None, "race_seconds": seconds})
    went_on = resumes is not None
    state = plan.resumes.state if plan.resumes else (states / f"{name}.pt" if states else None)
    context.progress.trial_started(f"race {count}, {plan.lr.label}", plan.config)
    order = RaceOrder(
        config=plan.config,
        seconds=horizon,  # in all: one that goes on starts at its last point
        lr=plan.lr,
        # A candidate's two learning rates train equally long: the one that ends lower ships.
        # Only one of them goes on.
        target=target if plan.role == "your batch" or went_on else None,
        state=str(state) if state else None,
        continues=resumes,
        evaluations=_evaluations(plan.resumes, horizon, seconds),
        held_out=held_out,
    )
    log_path = context.logs_dir / f"{name}{'-went-on' if went_on else ''}.log"
    result = context.runner.run(order, log_path, on_phase=context.progress.trial_phase)
    saved = state is not None and not went_on and Path(state).exists()
    return Racer(
        role=plan.role,
        trial=plan.trial,
        config=plan.config,
        lr=plan.lr,
        race_seconds=seconds,
        samples_per_s=plan.samples_per_s,
        result=result,
        state=str(state) if saved else None,
    )


def held_out_size(eval_s_per_sample: float | None, race_seconds: float) -> int:
    """Samples of the race's held-out slice at most: as many as one evaluation takes in
    `EVAL_SHARE` of an evaluation interval (the noise trial timed one), between `HELD_OUT_MIN`
    and `HELD_OUT_MAX`; `HELD_OUT_MAX` where it was not timed. Every racer of the race, and
    each that goes on, evaluates the same slice. On examples/hf_gpt2.py an evaluation of 1,024
    samples took 0.46 s, about as long as the training between two of them."""
    if not eval_s_per_sample:
        return HELD_OUT_MAX
    affordable = EVAL_SHARE * race_seconds / RACE_EVALUATIONS / eval_s_per_sample
    return int(min(HELD_OUT_MAX, max(HELD_OUT_MIN, affordable)))


def _evaluations(resumes: Racer | None, horizon: float, seconds: float) -> int:
    """Loss points over a racer's `horizon`: the race's; for one that goes on, as many as
    space `WENT_ON_EVALUATIONS` over the time the race went on for."""
    if resumes is None:
        return RACE_EVALUATIONS
    interval = (seconds - resumes.race_seconds) / WENT_ON_EVALUATIONS
    return max(TRACK_POINTS, round(horizon / interval))


def _may_go_on(curve: RaceCurve | None, horizon: float, target: float | None) -> bool:
    """Whether a racer going on from `curve` can still win: it has not reached the target
    already, and has not trained as long as it may."""
    if curve is None or not curve.points:
        return False
    reached = target is not None and time_to_loss(curve, target) is not None
    return not reached and curve.points[-1].seconds < horizon


def _target(racers: Sequence[Racer]) -> float | None:
    """The loss to reach, once the racer that sets it has run: the baseline's lowest (or, if
    the baseline failed, the best at the user's batch's), the lowest of the targets
    `decide_race` times racers to: reached last, it bounds how long a racer can still win."""
    reference = reference_racer(racers)
    return reference.curve.best_loss if reference is not None and reference.curve else None


def _horizon(
    plan: RacePlan, racers: Sequence[Racer], target: float | None, seconds: float
) -> float:
    """How long a racer trains: the whole race until the target is set; after, only as long
    as it can still win. The best at the user's batch loses to the baseline once it is past the
    baseline's time by the margin; another batch must beat the pick at the user's batch by it,
    or, a larger one going on, be level with it (`levels`)."""
    if target is None:
        return seconds
    role = plan.role
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
        pick = timed[pick_at_batch0(timed)] if at_batch0 else None
        rival = pick.time_to_target_s if pick is not None else None
        level = (
            plan.resumes is not None
            and pick is not None
            and plan.config.global_batch_size > pick.config.global_batch_size
        )
        limit = rival * (1 if level else 1 - RACE_MARGIN) if rival is not None else seconds
    return max(min(seconds, limit), SHORTEST_RACE * seconds)
