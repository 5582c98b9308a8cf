"""The convergence race that decides a time-to-loss recommendation (docs/method.md, "The race
and its verdict").

Samples/s ranks configurations cheaply but does not decide: a changed global batch changes the
optimisation. So, after the throughput search:

1. a noise trial measures the gradient noise scale phi on the user's configuration, and phi,
   with each global batch's best samples/s, predicts which global batches could reach the
   user's loss sooner (`predict_batches`); the best of them join the finalists;
2. the racers train in replicates (`race_replicate`): within one, every racer starts from the
   replicate's seeded weights and data order, each in a fresh trial process, and is evaluated
   at the race's shared sample counts (`advisor.decide.race.grid`). Replicate 0 races the
   user's baseline, the fastest configuration at the user's global batch B0, and the fastest at
   each predicted batch twice: with the user's learning rate and with the optimizer family's
   scaling rule (`plan_racers`); later replicates race each entrant that can still decide the
   verdict (`later_plans`). The best at B0 that differs from the baseline only in how batches
   arrive (loader workers, pinning) computes the baseline's steps: it is read from the
   baseline's curve at its own samples/s, not trained again (`_twin_of`);
3. the verdict times every racer to its replicate's target in samples, and turns samples into
   time with the paired re-runs' samples/s (`advisor.decide.race.verdict`).

In each replicate the baseline trains first: where its settled curve ends is the replicate's
target. Where its loss did not fall (`RaceCurve.fell`), nothing can be timed to it: the other
racers are skipped, and the user's global batch is kept. Every later racer stops once two
evaluations in a row reach the target (`advisor.results.stop_index`: one chance dip does not),
or once it has trained on so many samples that it can no longer win (`_most_samples`); the
verdict reads every curve as if it had stopped there. Where the first replicate's baseline
levelled off (`advisor.decide.race.estimate.shared_target`), later replicates share its target
and their baseline stops there too: on examples/mlp.py, whose loss levels off after a tenth of
the race, a tune took 72 s instead of 112 s. Each racer is stored in the study as it finishes,
so an interrupted tune keeps it and a resumed one does not race it again.

Every racer evaluates the same held-out slice, as large as its evaluations can afford
(`held_out_size`). Each saves its training state at its end where the race may go on
(`advisor.decide.race.extend`); a racer that goes on loads it and trains on to the longer
horizon over the longer grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna

from advisor.decide.race.estimate import samples_to_loss, target_in
from advisor.decide.race.grid import sample_grid
from advisor.decide.race.plan import RacePlan, steps_of
from advisor.progress import Stage
from advisor.results import Racer, RacerRole, TrialResult, did_not_fall, reference_racer
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey, read_noise, read_racers, write_racer
from advisor.trial.orders import HELD_OUT_MAX, RaceOrder

__all__ = ["CLOCK_SLACK", "WIN_SLACK", "Heat", "held_out_size", "race_grid", "race_replicate"]

EVAL_SHARE = 0.25  # of the race time, the most its held-out evaluations should take
EVALUATIONS_EXPECTED = 40  # the baseline's evaluations over the race time, about (the grid's)
HELD_OUT_MIN = 256  # samples: the slice is never cut below this
SHORTEST_RACE = 0.05  # of the race time: the least a racer trains
WIN_SLACK = 1.25  # a racer trains on past the samples at which it would merely tie by this
CLOCK_SLACK = 1.5  # your configuration's clock may run this much longer than the race (`_bounds`)


@dataclass(frozen=True)
class Heat:
    """One replicate of a race: its racers' `seconds` of training at most, the shared `grid`,
    where each saves its training state (`states`, None: nowhere), and the race's shared
    `target` (`shared_target`; None: the heat's baseline trains the whole race to set its own)."""

    replicate: int
    seconds: float
    grid: tuple[int, ...]
    states: Path | None = None
    key: str = StudyKey.RACERS
    target: float | None = None


def race_grid(
    plans: Sequence[RacePlan], seconds: float, horizon: float | None = None
) -> tuple[int, ...]:
    """The race's sample grid: from a share of what the baseline trains on in `seconds` to as
    far as the fastest racer can in `horizon` (the race going on: the same grid, longer)."""
    fastest = max((plan.samples_per_s or 0.0 for plan in plans), default=0.0)
    baseline = next((plan for plan in plans if plan.role == RacerRole.BASELINE), None)
    yours = (baseline.samples_per_s if baseline is not None else None) or fastest
    smallest = min((plan.config.global_batch_size for plan in plans), default=1)
    return sample_grid(smallest, yours * seconds, fastest * (horizon or seconds))


def race_replicate(
    study: optuna.Study, context: SearchContext, plans: Sequence[RacePlan], heat: Heat
) -> list[Racer]:
    """Race each plan of one replicate in a fresh trial process, saving each racer's training
    state in `heat.states` if given; a plan that `resumes` a racer goes on from its saved
    state. A racer the study holds under `heat.key` already (same configuration, learning rate,
    race time and replicate) is not raced again."""
    if heat.states is not None:
        heat.states.mkdir(parents=True, exist_ok=True)
    stored = read_racers(study, heat.key)
    noise = read_noise(study)
    per_sample = noise.eval_s_per_sample if noise is not None else None
    held_out = held_out_size(per_sample, context.settings.race_seconds)
    racers: list[Racer] = []
    for index, plan in enumerate(plans):
        if did_not_fall(racers):
            context.progress.stage(Stage(kind="race-skips", count=len(plans) - index))
            break
        same = (plan.config, plan.lr, heat.seconds, heat.replicate)
        earlier = next(
            (r for r in stored if (r.config, r.lr, r.race_seconds, r.replicate) == same), None
        )
        if earlier is not None:
            racers.append(earlier.model_copy(update={"role": plan.role, "trial": plan.trial}))
            continue
        count = f"{index + 1}/{len(plans)}"
        twin = _twin_of(plan, racers)
        if twin is not None:
            label = f"race {count}{_replicate_label(heat)}, your steps: read from your curve"
            context.progress.trial_started(label, plan.config)
            racer = _as_twin(plan, twin, heat)
        else:
            racer = _race_one(context, plan, racers, heat, (held_out, count))
        write_racer(study, racer, heat.key)  # at once: an interrupt keeps every finished racer
        context.progress.racer_finished(racer)
        racers.append(racer)
    return racers


def _race_one(
    context: SearchContext,
    plan: RacePlan,
    racers: Sequence[Racer],
    heat: Heat,
    where: tuple[int, str],
) -> Racer:
    """Train one racer in a fresh trial process, as long as it can still win; `where` is the
    held-out slice's samples at most and the racer's place in the heat."""
    held_out, count = where
    target = _target(racers, heat)
    name = f"race-{plan.trial}-{count.split('/')[0]}-r{heat.replicate}"
    resumes = plan.resumes
    went_on = resumes is not None
    state = resumes.state if resumes else (heat.states / f"{name}.pt" if heat.states else None)
    label = f"race {count}{_replicate_label(heat)}, {plan.lr.label}"
    context.progress.trial_started(label, plan.config)
    seconds, most = _bounds(plan, racers, target, heat.seconds)
    order = RaceOrder(
        config=plan.config,
        seconds=seconds,  # in all: one that goes on starts at its last point
        lr=plan.lr,
        target=target,
        grid=heat.grid,
        max_samples=most,
        replicate=heat.replicate,
        state=str(state) if state else None,
        continues=resumes.curve if resumes is not None else None,
        held_out=held_out,
    )
    log_path = context.logs_dir / f"{name}{'-went-on' if went_on else ''}.log"
    result = context.runner.run(order, log_path, on_phase=context.progress.trial_phase)
    saved = state is not None and not went_on and Path(state).exists()
    return _racer(plan, heat, result, str(state) if saved else None)


def _target(racers: Sequence[Racer], heat: Heat) -> float | None:
    """The loss the heat's racers are timed to, and stop at (`stop_index`): the race's shared
    one, else where the heat's baseline, which trains the whole race, ends (`target_in`); None
    until it is set."""
    reference = reference_racer(racers)
    curve = reference.curve if reference is not None else None
    if curve is None:
        return heat.target
    return target_in(curve, heat.target)


def _racer(plan: RacePlan, heat: Heat, result: TrialResult, state: str | None) -> Racer:
    return Racer(
        role=plan.role,
        trial=plan.trial,
        config=plan.config,
        lr=plan.lr,
        race_seconds=heat.seconds,
        replicate=heat.replicate,
        samples_per_s=plan.samples_per_s,
        result=result,
        state=state,
    )


def _twin_of(plan: RacePlan, racers: Sequence[Racer]) -> Racer | None:
    """The heat's baseline racer where `plan` is the best at the user's batch and computes its
    steps (it differs only in how batches arrive, `steps_of`) with its learning
    rate: it reaches every loss after the same samples, so it is not trained again."""
    if plan.role != RacerRole.YOUR_BATCH:
        return None
    return next(
        (
            r
            for r in racers
            if r.role == RacerRole.BASELINE
            and r.curve is not None
            and r.lr == plan.lr
            and steps_of(r.config) == steps_of(plan.config)
        ),
        None,
    )


def _as_twin(plan: RacePlan, twin: Racer, heat: Heat) -> Racer:
    """`plan`'s racer read from its twin's: the same samples and losses, each evaluation's
    training time at `plan`'s own samples/s (the re-runs measured it; only the reports show the
    seconds)."""
    curve = twin.curve
    assert curve is not None  # `_twin_of` chose a twin with a curve
    scale = (
        twin.samples_per_s / plan.samples_per_s
        if twin.samples_per_s and plan.samples_per_s
        else 1.0
    )
    points = tuple(p.model_copy(update={"seconds": p.seconds * scale}) for p in curve.points)
    race = curve.model_copy(update={"points": points})
    result = twin.result.model_copy(update={"config": plan.config, "race": race})
    return _racer(plan, heat, result, twin.state).model_copy(update={"steps_of_baseline": True})


def _replicate_label(heat: Heat) -> str:
    return f" (replicate {heat.replicate + 1})" if heat.replicate else ""


def held_out_size(eval_s_per_sample: float | None, race_seconds: float) -> int:
    """Samples of the race's held-out slice at most: as many as `EVALUATIONS_EXPECTED`
    evaluations take in `EVAL_SHARE` of the race time (the noise trial timed one), between
    `HELD_OUT_MIN` and `HELD_OUT_MAX`; `HELD_OUT_MAX` where it was not timed. Every racer of the
    race, and each that goes on, evaluates the same slice. On examples/hf_gpt2.py an evaluation
    of 1,024 samples took 0.46 s."""
    if not eval_s_per_sample:
        return HELD_OUT_MAX
    affordable = EVAL_SHARE * race_seconds / EVALUATIONS_EXPECTED / eval_s_per_sample
    return int(min(HELD_OUT_MAX, max(HELD_OUT_MIN, affordable)))


def _bounds(
    plan: RacePlan, racers: Sequence[Racer], target: float | None, seconds: float
) -> tuple[float, int | None]:
    """A racer's training time at most, and its samples at most. Your configuration trains the
    samples its re-runs' samples/s does in `seconds`, whatever its clock reads this time, so
    that its curve ends, and sets the target, at the same stage in every replicate (on
    examples/teacher.py one run at two thirds of its usual speed set a target that batch 128
    reached after a sixth of the samples yours took); its clock may run `CLOCK_SLACK` times
    as long. Every other racer trains `seconds`, up to `_most_samples`."""
    if plan.role == RacerRole.BASELINE and plan.samples_per_s:
        return seconds * CLOCK_SLACK, int(seconds * plan.samples_per_s)
    return seconds, _most_samples(plan, racers, target, seconds)


def _most_samples(
    plan: RacePlan, racers: Sequence[Racer], target: float | None, seconds: float
) -> int | None:
    """Samples past which a racer can no longer win: where, at its samples/s, it would take
    `WIN_SLACK` times as long as the soonest racer at the user's batch took to the target, or
    `WIN_SLACK` times the samples the same configuration took with another learning rate (it
    would ship that one, and race on only within `WIN_SLACK` of it: on examples/teacher.py the
    linear rule's 4x and 8x trained the whole race after your lr had reached the target at a
    fifth of it); each curve read as stopped (`samples_to_loss`); never fewer than
    `SHORTEST_RACE` of the race time's worth. None until the target is set."""
    rate = plan.samples_per_s
    if target is None or not rate or plan.role == RacerRole.BASELINE:
        return None
    times, siblings = [], []
    for racer in racers:
        samples = samples_to_loss(racer.curve, target) if racer.curve is not None else None
        if samples is None:
            continue
        if racer.role in (RacerRole.BASELINE, RacerRole.YOUR_BATCH) and racer.samples_per_s:
            times.append(samples / racer.samples_per_s)
        if racer.role == plan.role and racer.config == plan.config:
            siblings.append(samples / rate)
    if not times:
        return None
    most = min([min(times), *siblings]) * WIN_SLACK
    return int(max(most, SHORTEST_RACE * seconds) * rate)
