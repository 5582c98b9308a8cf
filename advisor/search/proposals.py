"""What the search measures next: the queue of proposals advisor makes before the sampler's.

The baseline first; under the time-to-loss objective with TPE, the stages of
`advisor.search.staging` (the user's global batch, probes, the batches that race); otherwise the
seeded first steps (`advisor.search.seeding`) and, in the last trials, the best configuration
with one newer knob changed. One proposal is queued at a time, and none while one waits.
"""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from advisor.knobs import BASE_GROUP, KNOBS
from advisor.results import TrialRecord
from advisor.search.context import SearchContext
from advisor.search.dominance import rejected_in_search
from advisor.search.ranking import Ranking
from advisor.search.records import TrialKey, planned_params
from advisor.search.seeding import next_seed, seed_count
from advisor.search.space import SearchSpace
from advisor.search.staging import next_move
from advisor.settings import TuneSettings

__all__ = ["enqueue_baseline", "enqueue_next", "staged"]


def staged(settings: TuneSettings) -> bool:
    """Whether the search proposes by stages (`advisor.search.staging`): the time-to-loss
    objective with TPE, the default; another sampler or objective proposes as it would."""
    return settings.objective == "time-to-loss" and settings.sampler == "tpe"


def enqueue_next(
    study: optuna.Study,
    context: SearchContext,
    ranking: Ranking,
    measured: list[TrialRecord],
    done: int,
) -> None:
    """Queue the next proposal the stages make, or the next seed and the newer knobs' pairs."""
    settings = context.settings
    if staged(settings):
        _enqueue_move(study, context, ranking, measured)
        return
    ran = [r for r in measured if r.derived_from is None]
    if settings.sampler == "tpe" and len(ran) < seed_count(settings):
        _enqueue_seed(study, context, measured, turn=max(0, len(ran) - 1))
    _enqueue_neighbours(study, context, measured, settings.trials - done)


def _enqueue_move(
    study: optuna.Study, context: SearchContext, ranking: Ranking, measured: list[TrialRecord]
) -> None:
    """Queue the next configuration the search's stages ask for; none once none is left, and
    the sampler proposes (among the batches that may still win)."""
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return
    space, settings = context.space, context.settings
    rejected = rejected_in_search(measured, space.domains, settings.early_stop)
    # Another worker's running trials count as measured; so do the stages' earlier proposals
    # that were pruned: a move is proposed once (two workers once looped on a pruned one).
    states = (TrialState.RUNNING, TrialState.PRUNED)
    busy = [
        space.config_from_params(p)
        for trial in study.get_trials(deepcopy=False, states=states)
        if (trial.state == TrialState.RUNNING or TrialKey.STAGE in trial.user_attrs)
        and set(space.domains) <= set(p := planned_params(trial))
        and space.problem(p) is None
    ]
    move = next_move(space, ranking, measured, rejected, settings.trials, busy)
    if move is not None:
        study.enqueue_trial(
            move.params, user_attrs={TrialKey.ROLE: "search", TrialKey.STAGE: move.stage}
        )


def _enqueue_neighbours(
    study: optuna.Study, context: SearchContext, measured: list[TrialRecord], left: int
) -> None:
    """Spend the last trials (at most half of `--trials`) on the best configuration with one
    newer knob changed.

    The sampler rarely proposes two configurations that differ in compile (or channels_last,
    prefetching, the optimizer implementation) alone; these pairs measure each such knob's
    effect on the configuration that matters, and the report states it.
    """
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return
    best = max(
        (r for r in measured if r.eligible), key=lambda r: r.result.samples_per_s or 0, default=None
    )
    if best is None:
        return
    space = context.space
    params = space.params_of(best.result.config)
    known = {r.result.config for r in measured}
    neighbours = [
        {**params, row.name: value}
        for row in KNOBS
        if row.group != BASE_GROUP and row.name in space.domains
        for value in space.domains[row.name]
        if value != params[row.name]
    ]
    fresh = [
        p
        for p in neighbours
        if space.problem(p) is None and space.config_from_params(p) not in known
    ]
    room = min(len(fresh), context.settings.trials // 2)  # the sampler keeps the other half
    if 0 < left <= room:
        for neighbour in fresh[:left]:
            study.enqueue_trial(neighbour, user_attrs={TrialKey.ROLE: "search"})


def _enqueue_seed(
    study: optuna.Study, context: SearchContext, measured: list[TrialRecord], turn: int
) -> None:
    """Queue the next first trial: one step out from the fastest configuration so far, the
    knobs taking turns (`turn`: the trials run so far, less the baseline)."""
    if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return
    space = context.space
    rejected = rejected_in_search(measured, space.domains, context.settings.early_stop)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    busy = [planned_params(trial) for trial in running]  # other workers' trials
    params = next_seed(space, measured, rejected, turn=turn, busy=busy)
    if params is not None:
        study.enqueue_trial(params, user_attrs={TrialKey.ROLE: "search"})


def enqueue_baseline(study: optuna.Study, space: SearchSpace) -> None:
    """Queue the user's configuration first, unless the study has it, waits for it, or another
    worker is measuring it now (a second worker starting then ran it again: a clean-clone CI
    run on PostgreSQL caught the two workers measuring it twice)."""
    params = space.params_of(space.baseline)
    states = (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
    for trial in study.get_trials(deepcopy=False, states=states):
        if planned_params(trial) == params:
            return
    study.enqueue_trial(params, user_attrs={TrialKey.ROLE: "baseline"})
