"""The race in replicates, and going on for its finalists (docs/method.md, "Replicates" and
"The race goes on").

Replicates: on CPU a fixed seed makes a curve exactly repeatable, so one run per racer measures
nothing of how much the answer depends on the initial weights and the data order. Every race
runs `MIN_REPLICATES` replicates, each from a seed of its own, and more while the verdict is a
close call they could settle, up to `MAX_REPLICATES`, or a win's claim wider than `NARROW_TO`
they could narrow, up to `MAX_PRECISION_REPLICATES` (`race_in_replicates`); fewer where they
could change nothing: one where no other global batch could still win after the first
(`settled_at_once`), two where the verdict is a close call whose samples/s part, which no
replicate narrows (`advisor.decide.race.estimate.unnarrowed`), alone holds the margin. Three is
the fewest whose spread gives a usable interval (`advisor.decide.race.estimate`: Student's t
for one degree of freedom is 2.41 at 75 %, for two 1.60).

Going on: a race from initialisation judges the first seconds of training, where the gradient
noise scale is smallest, and so is the global batch that reaches a loss soonest: phi grows as
the loss falls (McCandlish et al. 2018). A verdict for a larger global batch is safe from that
bias; one that keeps the user's global batch is not. So where the race kept the user's global
batch and another global batch raced, in every replicate three racers go on from where they
stopped, to `TuneSettings.race_continue` race lengths in all: the baseline, the best at the
user's batch, and the other global batch nearest to winning. Each loads the training state it
saved (`advisor.trial.child.racer_state`), so only the added seconds cost, and each stops as
soon as it can no longer win (`advisor.decide.race.run`). The verdict is then decided again
over the longer horizon, with the same grid (extended) and the same statistics. The racers
that did not go on keep their curves. Replicate 0 goes on first, then one replicate after
another by the race's own rule (`_more`): where after the first its candidate could not win
(`settled_at_once`), the others do not go on and the race's verdict stands; a replicate the race
did not run races first.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import optuna

from advisor.decide.race.estimate import RateBook, shared_target
from advisor.decide.race.plan import RacePlan
from advisor.decide.race.run import WIN_SLACK, Heat, race_grid, race_replicate
from advisor.decide.race.verdict import (
    MARGIN,
    NARROW_TO,
    decide_race,
    may_win_later,
    narrows_to,
    needs_replicates,
    too_wide,
)
from advisor.progress import Stage
from advisor.results import Racer, RacerRole, RaceSummary
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey

# Why a race does not go on (`why_not_go_on`; `advisor.console` words each).
NotGoingOn = Literal[
    "continue-1", "no-target", "another-batch-won", "state-not-saved", "no-other-batch"
]

__all__ = [
    "MAX_PRECISION_REPLICATES",
    "MAX_REPLICATES",
    "MIN_REPLICATES",
    "RACE_STATES",
    "NotGoingOn",
    "go_on",
    "going_on",
    "later_plans",
    "race_to_loss",
    "settled_at_once",
    "why_not_go_on",
]

AT_BATCH0 = ("baseline", "your batch")
RACE_STATES = ".race-states"  # in the output folder: the racers' training states, while racing
MIN_REPLICATES = 3
MAX_REPLICATES = 4
# A win whose claim is too wide (`too_wide`) races on to this many: at six, Student's t makes
# the replicates' part of the interval 0.75 of their spread instead of 1.31 at three. Later
# replicates are cheap where your loss levels off early (a baseline stops at the target).
MAX_PRECISION_REPLICATES = 6


def race_to_loss(
    study: optuna.Study, context: SearchContext, plans: Sequence[RacePlan], rates: RateBook
) -> RaceSummary:
    """Race the plans in replicates, decide, and go on where the race kept the user's global
    batch; the racers' training states lie in the output folder's `RACE_STATES` meanwhile
    (kept on an interrupt: a resumed tune goes on from them)."""
    settings = context.settings
    states = settings.out_dir / RACE_STATES if settings.race_continue > 1 else None
    race = race_in_replicates(study, context, plans, rates, states)
    race = go_on(study, context, race, rates)
    if states is not None:
        shutil.rmtree(states, ignore_errors=True)
    return race


def race_in_replicates(
    study: optuna.Study,
    context: SearchContext,
    plans: Sequence[RacePlan],
    rates: RateBook,
    states: Path | None = None,
) -> RaceSummary:
    """Replicate 0 races every plan; later ones the entrants that can still decide, at least
    `MIN_REPLICATES` in all and more while another could change what is said (`_more`)."""
    seconds = context.settings.race_seconds
    grid = race_grid(plans, seconds)
    racers = race_replicate(study, context, plans, Heat(0, seconds, grid, states))
    race = decide_race(racers, seconds, rates)
    replicate = 1
    while _more(race, replicate, rates):
        later = _claim_plans(race, plans) if _only_narrows(race, replicate, rates) else None
        later = later or later_plans(race, plans)
        if len(later) < 2:
            break
        context.progress.stage(Stage(kind="race-replicate", count=replicate + 1))
        heat = Heat(replicate, seconds, grid, states, target=shared_target(racers))
        racers = [*racers, *race_replicate(study, context, later, heat)]
        race = decide_race(racers, seconds, rates)
        replicate += 1
    return race


def _more(race: RaceSummary, done: int, rates: RateBook) -> bool:
    """Whether to race another replicate after `done`: none where the first leaves nothing to
    decide (`settled_at_once`), or the verdict is a close call that replicates could not settle
    (`needs_replicates`: on examples/hf_gpt2.py four tunes' close calls read 0.93x-1.22x after
    three replicates, each interval holding 1.05x, 2026-12-07), from the second on; up to
    `MIN_REPLICATES`;
    else until the deciding claim counts as many (`_few_readings`), then while the verdict is
    a close call (up to `MAX_REPLICATES`), or a win's claim is wider than `NARROW_TO` and
    replicates could narrow it to that (`narrows_to`; up to `MAX_PRECISION_REPLICATES`, where
    later baselines stop at a shared target, and while those added cost less than the first
    replicate did: cheap on examples/mlp.py; on teacher.py, whose baseline trains every
    replicate's whole race, six replicates made a tune 226 s and five 287 s, and still claimed
    5.50x-11.27x)."""
    if race.target_loss is None or (done == 1 and settled_at_once(race, rates)):
        return False
    close_call = race.verdict.kind == "close-call"
    if close_call and done > 1 and not needs_replicates(race, rates):
        return False  # nor would more readings of the claim settle it
    if done < MIN_REPLICATES:
        return True
    if _few_readings(race) and done < MAX_PRECISION_REPLICATES:
        return True
    if close_call:
        return done < MAX_REPLICATES
    if not too_wide(race, NARROW_TO) or done >= MAX_PRECISION_REPLICATES:
        return False
    if not narrows_to(race, rates, NARROW_TO) or shared_target(race.racers) is None:
        return False
    return _wall(race, range(MIN_REPLICATES, done)) < _wall(race, range(1))


def _only_narrows(race: RaceSummary, done: int, rates: RateBook) -> bool:
    """Whether another replicate after `done` would only narrow a win's claim: another global
    batch won, by a claim that counts `MIN_REPLICATES` readings, and the race needs no more
    of them to decide. A replicate then races that claim's two, the winner and your
    configuration: the others' claims already lost to it, and the race does not go on after a
    win. On examples/mlp.py three other batches raced every replicate, and a win too wide
    to inform stopped at four readings, whose two replicates after the third cost more than
    the first."""
    if done < MIN_REPLICATES or _few_readings(race) or needs_replicates(race, rates):
        return False
    winner = race.racers[race.winner] if race.winner is not None else None
    return race.verdict.kind == "won" and winner is not None and winner.role == RacerRole.CANDIDATE


def _claim_plans(race: RaceSummary, plans: Sequence[RacePlan]) -> list[RacePlan]:
    """The plans of the winner's claim: the winner's and your configuration's."""
    pair = [r for r in race.racers if r.replicate == 0 and r.role == RacerRole.BASELINE]
    if race.winner is not None:
        pair.append(race.racers[race.winner])
    keep = {r.entrant for r in pair}
    return [plan for plan in plans if (plan.role, plan.config, plan.lr) in keep]


def settled_at_once(race: RaceSummary, rates: RateBook) -> bool:
    """Whether no later replicate can change the verdict or its claim: at your batch only your
    configuration raced, or a pick that computes your steps (its samples ratio is 1 in every
    replicate), and no other global batch could still win (`may_win_later`; one that did not
    reach the target cannot: a claim needs every replicate to reach it). On
    examples/data_bound.py two more replicates cost 50 s of a 253-s tune and changed nothing.
    Where the race then goes on, `go_on` races the replicates it needs."""
    first = [r for r in race.racers if r.replicate == 0]
    if any(r.role == RacerRole.YOUR_BATCH and not r.steps_of_baseline for r in first):
        return False
    return not may_win_later(race, rates)


def _few_readings(race: RaceSummary) -> bool:
    """Whether the claim that decides (a win's, or a close call's best) rests on fewer than
    `MIN_REPLICATES` replicates, having reached your loss in each: a candidate's counts those
    after the first, which chose it. Two readings' spread is a chance: on examples/mlp.py one
    tune's two claimed 6.01x-8.56x, and four others' five 3.23x-5.07x to 4.73x-8.08x."""
    verdict = race.verdict
    claim = verdict.best_claim if verdict.kind in ("won", "close-call") else None
    if claim is None or claim.reached != claim.replicates:
        return False  # one that missed your loss has no low end: more readings cannot make it win
    return claim.replicates < MIN_REPLICATES


def _wall(race: RaceSummary, replicates: range) -> float:
    """The wall time the racers of `replicates` took (a result without one counts nothing)."""
    return sum(r.result.wall_s or 0.0 for r in race.racers if r.replicate in replicates)


def later_plans(race: RaceSummary, plans: Sequence[RacePlan]) -> list[RacePlan]:
    """The plans a later replicate races: those of replicate 0's entrants that can still stand
    or win (a claim needs its racer to reach the target in every replicate), or that the race
    may go on from while what stands is at your batch (`go_on`):

    - your baseline, always;
    - the best at your batch where it reached the target, or the race may go on;
    - of each other global batch, the learning rates that reached the target within
      `WIN_SLACK` of the samples its soonest one took (the verdict chooses between them; one
      that needed more would lose to it alike: on examples/teacher.py such a racer trained the
      whole race of every replicate);
    - where the race may go on, the candidate that would (`_nearest_candidate`): of batches
      that reached the target in no replicate, no other can win at this race's end or after
      it. On examples/data_bound.py batches 256 and 512, which reached nothing, raced two more
      replicates each: 36 s of a 244-s tune."""
    first = [r for r in race.racers if r.replicate == 0 and r.curve is not None]
    may_go_on = not _another_batch_leads(race)
    keep = {
        r.entrant
        for r in first
        if r.role == RacerRole.BASELINE
        or (r.role == RacerRole.YOUR_BATCH and (r.samples_to_target is not None or may_go_on))
    }
    by_batch: dict[object, list[Racer]] = {}
    for racer in first:
        if racer.role == RacerRole.CANDIDATE:
            by_batch.setdefault(racer.config, []).append(racer)
    for racers in by_batch.values():
        reached = [r for r in racers if r.samples_to_target is not None]
        soonest = min((r.samples_to_target or 0.0 for r in reached), default=0.0)
        keep |= {r.entrant for r in reached if (r.samples_to_target or 0.0) <= WIN_SLACK * soonest}
    nearest = _nearest_candidate(first) if may_go_on else None
    keep |= {nearest.entrant} if nearest is not None else set()
    return [plan for plan in plans if (plan.role, plan.config, plan.lr) in keep]


def _another_batch_leads(race: RaceSummary) -> bool:
    """Whether the race so far reads another global batch sooner to your loss than what stands
    at your batch by the margin, at its estimate (one replicate gives no interval yet), having
    reached it in every replicate: the race would then not go on."""
    verdict = race.verdict
    if verdict.best is None or race.racers[verdict.best].role != RacerRole.CANDIDATE:
        return False  # a close call at your batch names its pick as the best
    if verdict.best_claim is None or verdict.best_claim.reached != verdict.best_claim.replicates:
        return False
    stand = verdict.kept_claim.speedup if verdict.kept_claim is not None else 1.0
    return verdict.best_claim.speedup >= (1 + MARGIN) * stand


def why_not_go_on(race: RaceSummary, factor: float) -> NotGoingOn | None:
    """Why the race does not go on (`advisor.console` words it); None where it does."""
    if factor <= 1:
        return "continue-1"
    if race.target_loss is None or race.winner is None:
        return "no-target"
    if race.racers[race.winner].role not in AT_BATCH0:
        return "another-batch-won"
    if not any(r.role == "baseline" and _saved(r) for r in race.racers):
        return "state-not-saved"
    if _nearest_candidate(race.racers) is None:
        return "no-other-batch"
    return None


def going_on(race: RaceSummary, replicate: int = 0) -> tuple[Racer, ...]:
    """The racers of a replicate that go on: the baseline, the best at the user's batch, and
    the candidate nearest to winning (replicate 0's); each with its saved state."""
    racers = [r for r in race.racers if r.replicate == replicate]
    at_batch0 = [r for r in racers if r.role in AT_BATCH0 and _saved(r)]
    nearest = _nearest_candidate([r for r in race.racers if r.replicate == 0])
    candidate = next(
        (r for r in racers if nearest is not None and r.entrant == nearest.entrant and _saved(r)),
        None,
    )
    return (*at_batch0, *([candidate] if candidate else []))


def go_on(
    study: optuna.Study, context: SearchContext, race: RaceSummary, rates: RateBook
) -> RaceSummary:
    """The race after its finalists went on to `race_continue` race lengths, one replicate
    after another while another could change what is said (`_more`, as for the race; see the
    module's doc); the race as it was where it does not go on, or where what went on in the
    first replicate cannot win."""
    factor = context.settings.race_continue
    why = why_not_go_on(race, factor)
    if why is not None:
        if race.winner is not None and race.racers[race.winner].role in AT_BATCH0:
            context.progress.stage(Stage(kind="race-stays", label=why))
        return race
    horizon = factor * race.seconds
    first = [r for r in race.racers if r.replicate == 0]
    plans = [RacePlan(r.role, r.trial, r.config, r.lr, r.samples_per_s) for r in first]
    grid = race_grid(plans, race.seconds, horizon)  # the race's grid, longer
    context.progress.stage(Stage(kind="race-goes-on", count=len(going_on(race)), seconds=horizon))
    key = StudyKey.RACERS_WENT_ON
    went_on = _went_on_in(study, context, race, Heat(0, horizon, grid, key=key))
    decided, done = _gone_on(race, went_on, horizon, rates), 1
    while _more(decided, done, rates):
        race = _with_replicate(study, context, race, rates, done)
        target = shared_target(went_on)  # replicate 0's, gone on
        heat = Heat(done, horizon, grid, key=key, target=target)
        went_on += _went_on_in(study, context, race, heat)
        decided, done = _gone_on(race, went_on, horizon, rates), done + 1
    if done == 1:
        context.progress.stage(
            Stage(kind="race-went-on-alone", seconds=race.seconds, until_s=horizon)
        )
        return race
    return decided.model_copy(update={"went_on_from": race.seconds, "first_race": race})


def _gone_on(
    race: RaceSummary, went_on: Sequence[Racer], horizon: float, rates: RateBook
) -> RaceSummary:
    """The race decided at the longer horizon over the replicates that went on; in each, a racer
    that did not go on keeps its curve."""
    replicates = {r.replicate for r in went_on}
    merged = [_after(r, went_on) for r in race.racers if r.replicate in replicates]
    return decide_race(merged, horizon, rates)


def _went_on_in(
    study: optuna.Study, context: SearchContext, race: RaceSummary, heat: Heat
) -> list[Racer]:
    """The racers of the heat's replicate that go on (`going_on`), each from its saved state."""
    racers = going_on(race, heat.replicate)
    plans = [RacePlan(r.role, r.trial, r.config, r.lr, r.samples_per_s, resumes=r) for r in racers]
    return race_replicate(study, context, plans, heat)


def _with_replicate(
    study: optuna.Study, context: SearchContext, race: RaceSummary, rates: RateBook, replicate: int
) -> RaceSummary:
    """The race with `replicate` raced, where it stopped before it (`settled_at_once`) and going
    on needs it: the racers that go on race it first, as replicate 0 did, saving their states."""
    if race.replicates > replicate:
        return race
    first = [r for r in race.racers if r.replicate == 0]
    plans = [RacePlan(r.role, r.trial, r.config, r.lr, r.samples_per_s) for r in first]
    going = {r.entrant for r in going_on(race)}
    later = [plan for plan, racer in zip(plans, first, strict=True) if racer.entrant in going]
    context.progress.stage(Stage(kind="race-replicate", count=replicate + 1))
    states = context.settings.out_dir / RACE_STATES
    grid = race_grid(plans, race.seconds)  # the race's own
    heat = Heat(replicate, race.seconds, grid, states, target=shared_target(race.racers))
    racers = [*race.racers, *race_replicate(study, context, later, heat)]
    return decide_race(racers, race.seconds, rates)


def _nearest_candidate(racers: Sequence[Racer]) -> Racer | None:
    """Of the other global batches' racers with a saved state: the soonest to the race's
    target (by its samples at its samples/s), else the lowest at the end of its race."""
    candidates = [r for r in racers if r.role == "candidate" and _saved(r)]
    timed = [r for r in candidates if r.samples_to_target is not None and r.samples_per_s]
    if timed:
        return min(timed, key=lambda r: (r.samples_to_target or 0.0) / (r.samples_per_s or 1.0))
    return min(candidates, key=lambda r: r.curve.final_loss if r.curve else 0.0, default=None)


def _saved(racer: Racer) -> bool:
    """Whether the racer raced and its state is still on disk (a tune resumed after an
    interrupt finds it there)."""
    return racer.curve is not None and racer.state is not None and Path(racer.state).exists()


def _after(racer: Racer, went_on: Sequence[Racer]) -> Racer:
    """The racer as it went on, if it did; else as it raced."""
    key = (racer.entrant, racer.replicate)
    return next((r for r in went_on if (r.entrant, r.replicate) == key), racer)
