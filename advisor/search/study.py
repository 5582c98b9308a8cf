"""The Optuna search: the baseline first, then sampled configurations, each an isolated trial.

Proposals advisor queues come before the sampler's (`advisor.search.proposals`): under the
time-to-loss objective the noise scale is measured right after the baseline, every trial is
ranked by goodput (`advisor.search.ranking`), and the stages of `advisor.search.staging` propose
first; a proposal with a value every trial has ruled out (`advisor.search.dominance`), or a
sampled one at a global batch that cannot win the race, is pruned without running.

A failed or infeasible trial is told to the study as COMPLETE with a violated constraint and a
penalty value, so the sampler learns to avoid the region (FAIL trials are ignored by samplers).
`--trials N` counts distinct configurations measured in the study, over all runs of the command:
a re-run resumes and never measures a finished configuration again.
"""

from __future__ import annotations

import time
from typing import Any

import optuna
from optuna.trial import TrialState

from advisor.errors import SettingsError
from advisor.knobs import KNOBS, TrialConfig
from advisor.progress import Stage
from advisor.results import TrialRecord, TrialRole
from advisor.search.checks import known_out_of_memory, memory_problem
from advisor.search.context import SearchContext
from advisor.search.dominance import rejected_in_search
from advisor.search.memory import memory_gate
from advisor.search.proposals import enqueue_baseline, enqueue_next, staged
from advisor.search.pruning import best_value, stop_reason
from advisor.search.ranking import Ranking, measure_ranking, ranks_by_goodput
from advisor.search.records import (
    StudyKey,
    TrialKey,
    claim,
    enqueued,
    planned_params,
    records_of,
    write_record,
)
from advisor.search.seeding import seed_count
from advisor.search.siblings import add_siblings, counted, ran_itself, sibling_accumulation
from advisor.search.space import SearchSpace
from advisor.search.staging import allowed_batches
from advisor.search.storage import optimize_one
from advisor.settings import TuneSettings
from advisor.trial.orders import ProgressCallback, WindowOrder

__all__ = ["bind_study", "make_sampler", "run_search"]

MAX_UNMEASURED_IN_A_ROW = 200
# The search stops once the first trials of a run, the baseline's among them, this many, all
# raised the same exception: the error is the user's code's or data's (a corrupt record, say),
# not a configuration's, and every further trial would only fail with it again.
SAME_ERROR_TRIALS = 3
PENALTY = 0.0


def make_sampler(settings: TuneSettings, space: SearchSpace) -> optuna.samplers.BaseSampler:
    """The `--sampler`: TPE (its start-up trials a third of the budget, 3 to 10), random or grid."""
    if settings.sampler == "random":
        return optuna.samplers.RandomSampler(seed=settings.seed)
    if settings.sampler == "grid":
        return optuna.samplers.GridSampler(space.domains, seed=settings.seed)
    return optuna.samplers.TPESampler(seed=settings.seed, n_startup_trials=seed_count(settings))


def bind_study(study: optuna.Study, context: SearchContext) -> None:
    """Record what the study's measurements depend on; refuse to resume it under other terms.

    Throughput measured with another space, window or machine is not comparable, and Optuna
    cannot resume a categorical parameter whose choices changed.
    """
    terms = _measurement_terms(context)
    recorded = study.user_attrs.get(StudyKey.TERMS)
    if recorded is None:
        study.set_user_attr(StudyKey.TERMS, terms)
        return
    terms["fixed"] = _newer_defaults_left_out(terms["fixed"], recorded.get("fixed", {}))
    changed = sorted(
        key for key in terms.keys() | recorded.keys() if terms.get(key) != recorded.get(key)
    )
    if "machine" in changed or "gpus" in changed:
        raise SettingsError(
            f"study {study.study_name!r} was measured on other hardware "
            f"({_machine_text(recorded)}; this worker: {_machine_text(terms)}): throughput "
            "from different machines is not comparable; join it from a machine like those, "
            "or start a new study with --study-name NAME"
        )
    if changed:
        raise SettingsError(
            f"study {study.study_name!r} was measured under other settings "
            f"({', '.join(changed)} differ): re-run with its original flags, or start a new "
            "study with --study-name NAME or --out DIR"
        )


def _newer_defaults_left_out(fixed: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """The fixed knobs without those a study recorded before they existed, at their default now:
    a knob added to advisor since changes nothing the study measured."""
    defaults = {row.fields[0]: row.default for row in KNOBS}
    return {
        name: value
        for name, value in fixed.items()
        if name in recorded or name not in defaults or value != defaults[name]
    }


def _machine_text(terms: dict[str, Any]) -> str:
    machine = terms.get("machine", {})
    gpus = terms.get("gpus") or []
    memory_gib = (machine.get("memory_bytes") or 0) / 2**30
    text = (
        f"{machine.get('cpu_model')}, {machine.get('cores')} cores, {memory_gib:.0f} GiB, "
        f"torch {machine.get('torch_version')}"
    )
    text += f", {machine['allocator']} malloc" if machine.get("allocator") else ""
    return text + (f", {len(gpus)} x {gpus[0]}" if gpus else "")


def _measurement_terms(context: SearchContext) -> dict[str, Any]:
    space, settings, hardware = context.space, context.settings, context.hardware
    machine = hardware.model_dump(include={"cpu_model", "cores", "memory_bytes", "torch_version"})
    if hardware.allocator != "glibc":  # only then: studies recorded before it was read resume
        machine["allocator"] = hardware.allocator  # it changes speed, and on CPU the peaks
    return {
        "spec": settings.spec,
        "device": space.device,
        "domains": {name: list(values) for name, values in space.domains.items()},
        "fixed": dict(space.fixed_values),
        "global_batch_size": space.global_batch_size,
        "trial_seconds": settings.trial_seconds,
        "warmup_steps": settings.warmup_steps,
        "machine": machine,
        "gpus": [gpu.name for gpu in hardware.gpus],
    }


def run_search(study: optuna.Study, context: SearchContext) -> list[TrialRecord]:
    """Measure configurations until this worker has measured `--trials` distinct ones, every
    configuration is measured, or a budget runs out."""
    settings, space = context.settings, context.space
    first_number = len(study.get_trials(deepcopy=False))  # this run's trials come after
    enqueue_baseline(study, space)
    deadline = time.monotonic() + settings.timeout if settings.timeout else None
    objective = _Objective(context)
    objective.deadline = deadline
    while True:
        records = records_of(study)
        # One record per configuration, one that ran rather than one derived from another's
        # parts where (another worker measuring it meanwhile) there are both.
        unique = sorted((r for r in records if r.role != "duplicate"), key=ran_itself)
        measured = {r.result.config: r for r in unique}
        done = counted(unique, settings.worker_name)
        if add_siblings(study, context, records, measured, done, objective.ranking):
            continue  # read back with the others
        if done >= settings.trials or len(measured) >= space.size:
            return records
        if len(measured.keys() | _ruled_out(study, space)) >= space.size:
            context.progress.stage("every configuration is measured or ruled out")
            return records
        # Your baseline is measured however short the budget: every speed-up is against it.
        if deadline is not None and measured and time.monotonic() > deadline:
            context.progress.stage(f"--timeout {settings.timeout:g} s reached")
            return records
        if (error := _same_error(records, first_number)) is not None:
            failed = Stage(kind="same-error", count=SAME_ERROR_TRIALS - 1, label=error)
            context.progress.stage(failed)
            return records
        if objective.unmeasured_in_a_row >= MAX_UNMEASURED_IN_A_ROW:
            context.progress.stage(
                "the sampler keeps proposing measured or impossible configurations"
            )
            return records
        if measured and not objective.ranked and ranks_by_goodput(context):
            objective.ranking, objective.ranked = measure_ranking(study, context), True
            continue  # the next trials are ranked by it
        objective.measured, objective.done = measured, done
        if context.numerics is not None:  # measured twins, also those of an earlier run
            for record in measured.values():
                context.numerics.remember(record.result)
        enqueue_next(study, context, objective.ranking, list(measured.values()), done)
        # One trial per optimize() call: GridSampler stops the study when exhausted, which Optuna
        # allows only inside optimize(); an interrupt marks the running trial FAIL.
        optimize_one(study, objective, settings.storage_url)


def _same_error(records: list[TrialRecord], first_number: int) -> str | None:
    """The exception class every trial of this run raised, once SAME_ERROR_TRIALS have, the
    baseline among them (a resumed study's baseline was measured before: never then)."""
    ran = [r for r in records if r.number >= first_number and r.role in ("baseline", "search")]
    if len(ran) < SAME_ERROR_TRIALS or not any(r.role == "baseline" for r in ran):
        return None
    kinds = {r.result.error_type if r.result.status == "error" else None for r in ran}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _ruled_out(study: optuna.Study, space: SearchSpace) -> set[TrialConfig]:
    """Configurations pruned without running: a rejected value, a batch known to run out of
    memory, or one another worker is measuring. Once these and the measured ones cover the
    space, a sampler can only propose repeats (an exhausted GridSampler draws visited points)."""
    return {
        space.config_from_params(trial.params)
        for trial in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
        if trial.params.keys() >= space.domains.keys() and space.problem(trial.params) is None
    }


class _Objective:
    """Measure the sampled configuration, or answer a repeat from the trial that measured it.

    A proposal that cannot or need not run (see `_why_not_run`) is pruned with the reason,
    without running anything; samplers treat it as the worst outcome.
    """

    def __init__(self, context: SearchContext) -> None:
        self.context = context
        self.measured: dict[TrialConfig, TrialRecord] = {}
        self.done = 0  # configurations this worker measured
        self.unmeasured_in_a_row = 0
        self.deadline: float | None = None
        self.ranking = Ranking(context.space.baseline.global_batch_size)
        self.ranked = False  # whether the noise scale was measured for the ranking

    def __call__(self, trial: optuna.Trial) -> float:
        settings, space = self.context.settings, self.context.space
        trial.set_user_attr(TrialKey.WORKER, settings.worker_name)
        claim(trial)
        params = space.suggest(trial)
        config = None if space.problem(params) else space.config_from_params(params)
        earlier = _measured_now(trial.study, config, self.measured) if config else None
        if earlier is not None:
            self.unmeasured_in_a_row += 1
            repeat = {"number": trial.number, "role": "duplicate", "duplicate_of": earlier.number}
            return _record(trial, earlier.model_copy(update=repeat))
        problem = self._why_not_run(trial, params, config)
        if problem is not None or config is None:
            self.unmeasured_in_a_row += 1
            trial.set_user_attr(TrialKey.PRUNED_REASON, problem)
            raise optuna.TrialPruned(problem)
        self.unmeasured_in_a_row = 0
        role = TrialRole(trial.user_attrs.get(TrialKey.ROLE, TrialRole.SEARCH))
        label = f"trial {self.done + 1}/{settings.trials}"
        if TrialKey.STAGE in trial.user_attrs:
            label += f", {trial.user_attrs[TrialKey.STAGE]}"
        if self.deadline is not None:
            label += f" ({max(0.0, self.deadline - time.monotonic()):.0f} s of --timeout left)"
        ratio = self.ranking.samples_ratio(config.global_batch_size)
        trial.set_user_attr(TrialKey.SAMPLES_RATIO, ratio)  # for the pruner, which ranks goodput
        record = _measure(trial, config, role, label, self.context).model_copy(
            update={"samples_ratio": ratio, "stage": trial.user_attrs.get(TrialKey.STAGE)}
        )
        value = _record(trial, record)
        self.context.progress.trial_finished(record, _best([*self.measured.values(), record]))
        return value

    def _why_not_run(
        self, trial: optuna.Trial, params: dict[str, Any], config: TrialConfig | None
    ) -> str | None:
        """No configuration at all; being measured by another worker now; or larger than a
        batch that ran out of memory."""
        if config is None:
            return self.context.space.problem(params)
        for other in trial.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            # An enqueued trial carries its values before it suggests them.
            if other.number != trial.number and planned_params(other) == params:
                who = other.user_attrs.get(TrialKey.WORKER, "another worker")
                return f"being measured in trial {other.number} by {who}"
        if trial.user_attrs.get(TrialKey.ROLE) == "baseline":
            return None
        settings, domains = self.context.settings, self.context.space.domains
        for rejected in rejected_in_search(self.measured.values(), domains, settings.early_stop):
            if params.get(rejected.knob) == rejected.value:
                return rejected.reason
        if staged(settings) and not enqueued(trial):  # the sampler's
            problem = self._cannot_win(config)
            if problem is not None:
                return problem
        held_back = memory_gate(self.context.space.memory_gated, config, self.measured.values())
        return held_back or known_out_of_memory(config, self.measured.values())

    def _cannot_win(self, config: TrialConfig) -> str | None:
        """Why a sampled configuration's global batch cannot win the race: neither the user's
        nor one that races by what is measured so far."""
        records = list(self.measured.values())
        allowed = allowed_batches(self.context.space, self.ranking, records)
        batch = config.global_batch_size
        if batch in allowed:
            return None
        return (
            f"global batch {batch} cannot reach your loss sooner by what is measured (the race "
            f"runs {', '.join(map(str, sorted(allowed)))})"
        )


def _measured_now(
    study: optuna.Study, config: TrialConfig, measured: dict[TrialConfig, TrialRecord]
) -> TrialRecord | None:
    """The record that measured `config`, read again from the study: since `measured` was
    read, another worker may have measured it, or derived it from a trial's timed parts."""
    if config in measured:
        return measured[config]
    fresh = [r for r in records_of(study) if r.role != "duplicate" and r.result.config == config]
    return min(fresh, key=lambda r: r.number, default=None)


def _measure(
    trial: optuna.Trial, config: TrialConfig, role: TrialRole, label: str, context: SearchContext
) -> TrialRecord:
    context.progress.trial_started(f"{label} ({role})" if role != "search" else label, config)
    log_path = context.logs_dir / f"trial-{trial.number}.log"
    searched = role != "baseline"
    order = WindowOrder(
        config=config,
        precise_window=True,
        # clearly below the best, a longer window would only narrow the gap's interval
        beat_samples_per_s=_to_beat(trial) if searched else None,
        sibling_accumulation=sibling_accumulation(context.space, config) if searched else (),
    )
    result = context.runner.run(
        order,
        log_path,
        on_phase=context.progress.trial_phase,
        # The baseline is never stopped: it is the first best, and the reference for every
        # speed-up (which its whole-window re-runs measure).
        on_progress=_pruning(trial) if searched else None,
    )
    problem = memory_problem(result, context.hardware, context.settings)
    if problem is None and context.numerics is not None:
        problem = context.numerics.problem(result, context.progress.trial_phase)
    return TrialRecord(
        number=trial.number,
        role=role,
        result=result,
        infeasible_reason=problem,
    )


def _to_beat(trial: optuna.Trial) -> float | None:
    """The samples/s this trial must exceed to be the best: the best goodput so far, at its
    global batch's samples ratio."""
    best = best_value(trial.study)
    return best * trial.user_attrs.get(TrialKey.SAMPLES_RATIO, 1.0) if best else None


def _pruning(trial: optuna.Trial) -> ProgressCallback:
    """Report the trial's projected throughput to Optuna; stop it when the study's pruner says
    so, with the reason."""

    def report(elapsed_s: float, samples_per_s: float) -> str | None:
        trial.report(samples_per_s, step=round(elapsed_s * 1000))
        if not trial.should_prune():
            return None
        return stop_reason(samples_per_s, _to_beat(trial))

    return report


def _record(trial: optuna.Trial, record: TrialRecord) -> float:
    """Store the record on the trial; the objective is its goodput (samples/s where the search
    ranks by samples/s), or a penalty if ineligible."""
    write_record(trial, record)
    return record.goodput if record.eligible and record.goodput else PENALTY


def _best(records: list[TrialRecord]) -> float | None:
    values = [r.goodput for r in records if r.eligible and r.goodput]
    return max(values) if values else None
