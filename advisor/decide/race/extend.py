"""The race goes on for its finalists (docs/method.md, "The race goes on").

A race from initialisation judges the first seconds of training, where the gradient noise scale
is smallest, and so is the global batch that reaches a loss soonest: phi grows as the loss falls
(McCandlish et al. 2018). A verdict for a larger global batch is safe from that bias; one that
keeps the user's global batch is not, and neither is one between two configurations at it whose
numerics differ (amp) and whose losses part only later. So where the race kept the user's
global batch and another global batch raced, three racers go on from where they stopped, to
`TuneSettings.race_continue` race lengths in all: the baseline, the best at the user's batch,
and the other global batch that came nearest to winning. Each loads the training state it saved
(`advisor.trial.child.racer_state`), so only the added seconds cost, and each stops as soon as
it can no longer win (`advisor.decide.race.run`). The verdict is then decided again
(`decide_race`) at the baseline's lowest loss over the longer horizon, with the same margin and
noise band, but for a tie: a larger global batch level with the pick at the user's batch wins
(`levels`: the horizon is still shorter than the user's run, and a larger batch gains as
training goes on). The racers that did not go on keep their curves, and win only where they
reached that loss within them.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import optuna

from advisor.decide.race.plan import RacePlan
from advisor.decide.race.run import run_race
from advisor.decide.race.verdict import decide_race
from advisor.progress import Stage
from advisor.results import Racer, RaceSummary
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey

__all__ = ["RACE_STATES", "go_on", "going_on", "race_to_loss", "why_not_go_on"]

AT_BATCH0 = ("baseline", "your batch")
RACE_STATES = ".race-states"  # in the output folder: the racers' training states, while racing


def race_to_loss(
    study: optuna.Study, context: SearchContext, plans: Sequence[RacePlan]
) -> RaceSummary:
    """Race the plans, decide, and go on where the race kept the user's global batch; the
    racers' training states lie in the output folder's `RACE_STATES` meanwhile (kept on an
    interrupt: a resumed tune goes on from them)."""
    settings = context.settings
    states = settings.out_dir / RACE_STATES if settings.race_continue > 1 else None
    race = decide_race(run_race(study, context, plans, states=states), settings.race_seconds)
    race = go_on(study, context, race)
    if states is not None:
        shutil.rmtree(states, ignore_errors=True)
    return race


def why_not_go_on(race: RaceSummary, factor: float) -> str | None:
    """Why the race does not go on; None where it does."""
    if factor <= 1:
        return "--race-continue 1 keeps the race to its length"
    if race.target_loss is None or race.winner is None:
        return "the race set no target"
    if race.racers[race.winner].role not in AT_BATCH0:
        return "another global batch won already, which a longer race favours more"
    if not any(r.role == "baseline" and _saved(r) for r in race.racers):
        return "your configuration's training state was not saved"
    if _nearest_candidate(race.racers) is None:
        return "no other global batch raced"
    return None


def going_on(race: RaceSummary) -> tuple[Racer, ...]:
    """The racers that go on: the baseline, the best at the user's batch, and the candidate
    nearest to winning; each with its saved state."""
    at_batch0 = [r for r in race.racers if r.role in AT_BATCH0 and _saved(r)]
    candidate = _nearest_candidate(race.racers)
    return (*at_batch0, *([candidate] if candidate else []))


def go_on(study: optuna.Study, context: SearchContext, race: RaceSummary) -> RaceSummary:
    """The race after its finalists went on to `race_continue` race lengths (see the module's
    doc); the race as it was where it does not go on."""
    factor = context.settings.race_continue
    why = why_not_go_on(race, factor)
    if why is not None:
        if race.winner is not None and race.racers[race.winner].role in AT_BATCH0:
            context.progress.stage(f"the race kept your global batch and does not go on: {why}")
        return race
    racers = going_on(race)
    horizon = factor * race.seconds
    context.progress.stage(Stage(kind="race-goes-on", count=len(racers), seconds=horizon))
    plans = [RacePlan(r.role, r.trial, r.config, r.lr, r.samples_per_s, resumes=r) for r in racers]
    went_on = run_race(study, context, plans, horizon, key=StudyKey.RACERS_WENT_ON)
    merged = [_after(racer, went_on) for racer in race.racers]
    decided = decide_race(merged, horizon, went_on=True)
    return decided.model_copy(update={"went_on_from": race.seconds, "first_race": race})


def _nearest_candidate(racers: Sequence[Racer]) -> Racer | None:
    """Of the other global batches' racers with a saved state: the soonest to the race's
    target, else the lowest at the end of its race."""
    candidates = [r for r in racers if r.role == "candidate" and _saved(r)]
    timed = [r for r in candidates if r.time_to_target_s is not None]
    if timed:
        return min(timed, key=lambda r: r.time_to_target_s or 0.0)
    return min(candidates, key=lambda r: r.curve.final_loss if r.curve else 0.0, default=None)


def _saved(racer: Racer) -> bool:
    """Whether the racer raced and its state is still on disk (a tune resumed after an
    interrupt finds it there)."""
    return racer.curve is not None and racer.state is not None and Path(racer.state).exists()


def _after(racer: Racer, went_on: Sequence[Racer]) -> Racer:
    """The racer as it went on, if it did; else as it raced."""
    key = (racer.role, racer.config, racer.lr)
    return next((r for r in went_on if (r.role, r.config, r.lr) == key), racer)
