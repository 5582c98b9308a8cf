"""Configurations a search trial measures besides its own: the same one at the other
accumulation steps of the space.

Where one optimizer cycle is too long for the window, a trial times its parts, micro-steps
and optimizer steps apart (`advisor.trial.child.budget`), and the same parts give the cycle at any
accumulation (`advisor.trial.child.window.cycle_s`). A trial whose own cycle fits, but one of whose
siblings' would not, is timed in parts too. The search records each sibling it has not
measured as a trial of its own, derived from the one that ran: it costs nothing, the sampler
learns from it, and `--trials` counts a trial's siblings as one configuration (with the
default accumulation steps 1, 2, 4 and 8, each counted alone, the three siblings of each trial
timed in parts had taken half of a 12-trial search on examples/data_bound.py, whose other knobs
it then explored less). Without it, each accumulation of a configuration
whose micro-steps take a second cost a trial of its own, its first step (a loader's first
batch, DDP's set-up) paid again each time. A derived configuration that becomes a finalist is
re-measured in whole cycles like any other.
"""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from advisor.knobs import TrialConfig
from advisor.results import TrialRecord, TrialResult, TrialRole
from advisor.search.context import SearchContext
from advisor.search.ranking import Ranking
from advisor.search.records import planned_params, record_attrs
from advisor.search.space import SearchSpace

__all__ = ["add_siblings", "counted", "derived_siblings", "ran_itself", "sibling_accumulation"]


def sibling_accumulation(space: SearchSpace, config: TrialConfig) -> tuple[int, ...]:
    """The accumulation steps the space holds at `config` besides its own (none where the
    accumulation is not searched, or where `--global-batch-size` ties it to the batch)."""
    values = space.domains.get("accumulation_steps", ())
    params = space.params_of(config)
    return tuple(
        value
        for value in values
        if value != config.accumulation_steps
        and space.problem({**params, "accumulation_steps": value}) is None
    )


def derived_siblings(
    space: SearchSpace, record: TrialRecord, measured: set[TrialConfig]
) -> list[tuple[TrialConfig, TrialResult]]:
    """The configurations an eligible trial's timed parts measured and the search has not:
    each with its result, derived from the trial's."""
    if not record.eligible:
        return []
    params = space.params_of(record.result.config)
    siblings = []
    for accumulation, rate in sorted(record.result.sibling_rates.items()):
        config = space.config_from_params({**params, "accumulation_steps": accumulation})
        if config not in measured:
            siblings.append((config, _derived(record, config, rate)))
    return siblings


def _derived(record: TrialRecord, config: TrialConfig, samples_per_s: float) -> TrialResult:
    """`record`'s result as `config`'s: its rate at that accumulation, its memory and loader
    figures (the same micro-batches), none of its losses or costs (another global batch
    trains otherwise; the trial ran once)."""
    cycle_s = config.global_batch_size / samples_per_s
    return TrialResult(
        config=config,
        status="ok",
        reason=(
            f"derived from trial {record.number}'s timed micro-steps and optimizer steps "
            f"(the same configuration at accumulation {record.result.config.accumulation_steps})"
        ),
        samples_per_s=samples_per_s,
        estimated=True,
        step_time_median_s=cycle_s,
        step_time_p10_s=cycle_s,
        step_time_p90_s=cycle_s,
        data_wait_fraction=record.result.data_wait_fraction,
        peak_memory_bytes=record.result.peak_memory_bytes,
        task=record.result.task,
    )


def ran_itself(record: TrialRecord) -> bool:
    """Whether the record's trial ran, rather than being derived from another's parts."""
    return record.derived_from is None


def counted(records: list[TrialRecord], worker: str) -> int:
    """The configurations `--trials` counts of `worker`'s distinct ones: each it ran, and the
    siblings each of those derived (`advisor.search.siblings`) as one more. Counted from this
    worker's own records: another worker may have measured the same configuration at the same
    moment, and the search keeps only one record per configuration."""
    mine = [r for r in records if r.worker == worker]
    ran = {r.result.config for r in mine if ran_itself(r)}
    return len(ran) + len({r.derived_from for r in mine if not ran_itself(r)})


def add_siblings(
    study: optuna.Study,
    context: SearchContext,
    records: list[TrialRecord],
    measured: dict[TrialConfig, TrialRecord],
    done: int,
    ranking: Ranking,
) -> bool:
    """Add the configurations that this worker's trials' timed parts also measured, and
    nobody has measured or is measuring, as trials of their own (`advisor.search.siblings`):
    those of the trial whose fastest is fastest first, while `--trials` leaves room (one
    trial's siblings count as one configuration: up to three accumulation steps of one
    measurement must not crowd out the other knobs). Returns whether it added any.

    Added between trials, after the one that measured them has been stored: a failure to add
    one, or an interrupt, cannot cost that trial; a resumed search adds those it missed."""
    settings, space = context.settings, context.space
    known = set(measured) | _taken(study, space)
    groups = [
        (record, siblings)
        for record in records
        if record.worker == settings.worker_name and ran_itself(record)
        if (siblings := derived_siblings(space, record, known))
    ]
    groups.sort(key=lambda group: -max(result.samples_per_s or 0.0 for _, result in group[1]))
    added: list[TrialRecord] = []
    for source, siblings in groups[: max(0, settings.trials - done)]:
        done += 1
        label = f"trial {done}/{settings.trials}"
        # the label the progress gave it: trial K/N, K counted as --trials counts
        before = [r for r in measured.values() if r.number < source.number]
        of = f"trial {counted(before, settings.worker_name) + 1}/{settings.trials}'s timed parts"
        for config, result in siblings:
            if config in {r.result.config for r in added}:
                continue  # two trials' parts measured it: the first's estimate is kept
            if config in _taken(study, space):
                continue  # another worker started or recorded it since `known` was read
            context.progress.trial_started(f"{label} (derived from {of})", config)
            sibling = TrialRecord(
                number=len(study.get_trials(deepcopy=False)),
                role=TrialRole.SEARCH,
                result=result,
                derived_from=source.number,
                worker=settings.worker_name,
                samples_ratio=ranking.samples_ratio(config.global_batch_size),
            )
            study.add_trial(_derived_trial(space, sibling))
            added.append(sibling)
            context.progress.trial_finished(sibling, _fastest([*measured.values(), *added]))
    return bool(added)


def _taken(study: optuna.Study, space: SearchSpace) -> set[TrialConfig]:
    """The configurations some worker is measuring or has recorded, read from the study now:
    read again right before each sibling is added, the window in which another worker may
    start the same configuration is the few milliseconds of one write."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.COMPLETE))
    planned = [planned_params(trial) for trial in trials]
    return {
        space.config_from_params(p)
        for p in planned
        if set(space.domains) <= set(p) and space.problem(p) is None
    }


def _derived_trial(space: SearchSpace, record: TrialRecord) -> FrozenTrial:
    """A finished trial for the study, of a configuration another trial measured (always
    eligible: it violates no constraint)."""
    domains = space.domains
    return optuna.trial.create_trial(
        params=space.params_of(record.result.config),
        distributions={name: CategoricalDistribution(values) for name, values in domains.items()},
        value=record.goodput,
        user_attrs=record_attrs(record),
    )


def _fastest(records: list[TrialRecord]) -> float | None:
    rates = [r.result.samples_per_s for r in records if r.eligible and r.result.samples_per_s]
    return max(rates, default=None)
