"""What advisor stores in an Optuna study, in one place: the attribute keys, and the functions that
write advisor's records to a study and read them back.

On each trial (user attributes, `TrialKey`): its role, its `TrialResult`, why it is not eligible,
the trial it repeats, the worker that measured it and that worker's process, why a proposal was
pruned; and the constraint `feasible` (0 where it is, 1 where not). On the study (`StudyKey`):
the measurement terms it was bound to, the settings and context stored before the first trial,
and the re-runs and recommendation a finished tune leaves. `advisor report` rebuilds everything
from these alone.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

import optuna
import psutil
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, ValidationError

from advisor.errors import StorageError
from advisor.results import (
    PrunedProposal,
    Racer,
    Recommendation,
    StudySetup,
    TrialRecord,
    TrialResult,
)
from advisor.search.storage import STALE_AFTER_S
from advisor.settings import TuneSettings, mask_url

__all__ = [
    "StoredStudy",
    "StudyKey",
    "TrialKey",
    "claim",
    "enqueued",
    "fail_abandoned",
    "planned_params",
    "pruned_of",
    "read_noise",
    "read_options",
    "read_racers",
    "read_study",
    "record_attrs",
    "records_of",
    "write_noise",
    "write_option",
    "write_outcome",
    "write_racer",
    "write_record",
    "write_start",
]


class TrialKey:
    """User attributes advisor sets on a trial."""

    ROLE: Final = "role"  # baseline, search, confirm or duplicate
    RESULT: Final = "result"  # the TrialResult as JSON
    INFEASIBLE_REASON: Final = "infeasible_reason"
    DUPLICATE_OF: Final = "duplicate_of"
    DERIVED_FROM: Final = "derived_from"  # the trial whose timed parts gave its result
    WORKER: Final = "worker"  # the worker's name (--worker, else the host)
    PROCESS: Final = "advisor_process"  # host:pid:start time of the process measuring it
    PRUNED_REASON: Final = "pruned_reason"
    FEASIBLE: Final = "feasible"  # the constraint samplers read: <= 0 is feasible
    # Short copies of the result's main figures, as columns of optuna-dashboard's trial table
    # (it cuts every attribute at 1,024 characters, which the whole result passes).
    CONFIG: Final = "config"  # TrialConfig.label()
    STATUS: Final = "status"
    SAMPLES_PER_S: Final = "samples_per_s"
    # The samples its global batch needs relative to the user's (`TrialRecord.samples_ratio`);
    # set before a trial runs, for the pruner, which compares goodput.
    SAMPLES_RATIO: Final = "samples_ratio"
    STAGE: Final = "stage"  # the search stage that proposed it (advisor.search.staging)
    REASON: Final = "reason"


class StudyKey:
    """User attributes advisor sets on the study."""

    TERMS: Final = "advisor_measurement_terms"  # what its measurements depend on
    SETTINGS: Final = "advisor_settings"
    CONTEXT: Final = "advisor_context"  # baseline, fixed knobs, machine and task
    CONFIRMATIONS: Final = "confirmations"  # the re-runs of a finished tune
    RECOMMENDATION: Final = "advisor_recommendation"  # None until a tune finishes
    NOISE: Final = "advisor_noise_trial"  # the noise-scale trial's TrialResult
    RACERS: Final = "advisor_racers"  # every finished race trial, as it finished
    SCHEDULE_RACERS: Final = "advisor_schedule_racers"  # the schedule race's, likewise
    RACERS_WENT_ON: Final = "advisor_racers_went_on"  # the race's finalists that went on
    SCHEDULE_OPTIONS: Final = "advisor_schedule_options"  # its stages' throughput trials


# Optuna's system attribute of an enqueued trial: the parameters it will suggest.
_ENQUEUED_PARAMS = "fixed_params"


def write_record(trial: optuna.Trial, record: TrialRecord) -> None:
    """Store a measured (or repeated) trial's record; an ineligible one violates the constraint."""
    for key, value in record_attrs(record).items():
        trial.set_user_attr(key, value)
    trial.set_constraint(TrialKey.FEASIBLE, 0.0 if record.eligible else 1.0)


def record_attrs(record: TrialRecord) -> dict[str, Any]:
    """The user attributes that store a trial's record (`write_record`)."""
    result = record.result
    attrs: dict[str, Any] = {
        TrialKey.ROLE: record.role,
        TrialKey.RESULT: result.model_dump(mode="json"),
        # the result's main figures, short, for the dashboard
        TrialKey.CONFIG: result.config.label(),
        TrialKey.STATUS: result.status,
    }
    if result.samples_per_s is not None:
        attrs[TrialKey.SAMPLES_PER_S] = round(result.samples_per_s, 1)
    if result.reason:
        attrs[TrialKey.REASON] = result.reason[:1000]
    if record.infeasible_reason:
        attrs[TrialKey.INFEASIBLE_REASON] = record.infeasible_reason
    if record.duplicate_of is not None:
        attrs[TrialKey.DUPLICATE_OF] = record.duplicate_of
    if record.derived_from is not None:
        attrs[TrialKey.DERIVED_FROM] = record.derived_from
    if record.worker is not None:
        attrs[TrialKey.WORKER] = record.worker
    if record.stage is not None:
        attrs[TrialKey.STAGE] = record.stage
    if record.samples_ratio != 1.0:
        attrs[TrialKey.SAMPLES_RATIO] = record.samples_ratio
    return attrs


def records_of(study: optuna.Study) -> list[TrialRecord]:
    """Every finished trial of the study that carries a result, in trial order."""
    records = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if TrialKey.RESULT not in trial.user_attrs:
            continue
        try:
            records.append(_record_of(trial))
        except ValueError as exc:
            raise StorageError(
                f"trial {trial.number} of study {study.study_name!r} was not written by this "
                f"advisor version ({str(exc).splitlines()[0]}): use a new --study-name"
            ) from exc
    return records


def _record_of(trial: FrozenTrial) -> TrialRecord:
    attrs = trial.user_attrs
    return TrialRecord(
        number=trial.number,
        role=attrs.get(TrialKey.ROLE, "search"),
        result=TrialResult.model_validate(attrs[TrialKey.RESULT]),
        infeasible_reason=attrs.get(TrialKey.INFEASIBLE_REASON),
        duplicate_of=attrs.get(TrialKey.DUPLICATE_OF),
        derived_from=attrs.get(TrialKey.DERIVED_FROM),
        worker=attrs.get(TrialKey.WORKER),
        samples_ratio=attrs.get(TrialKey.SAMPLES_RATIO, 1.0),
        stage=attrs.get(TrialKey.STAGE),
    )


def pruned_of(study: optuna.Study) -> tuple[PrunedProposal, ...]:
    """Every proposal advisor pruned without running it, with the reason."""
    return tuple(
        PrunedProposal(
            number=trial.number,
            params=trial.params,
            reason=trial.user_attrs.get(TrialKey.PRUNED_REASON, "pruned"),
        )
        for trial in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
    )


def enqueued(trial: optuna.Trial) -> bool:
    """Whether a running trial was queued with its parameters (by advisor or by its caller)
    rather than proposed by the sampler."""
    return bool(trial.study._storage.get_trial_system_attrs(trial._trial_id).get(_ENQUEUED_PARAMS))


def planned_params(trial: FrozenTrial) -> dict[str, Any]:
    """The parameters a trial measures: an enqueued trial carries them before it suggests them."""
    return trial.system_attrs.get(_ENQUEUED_PARAMS) or trial.params


def write_start(study: optuna.Study, settings: TuneSettings, context: StudySetup) -> None:
    """Store what the reports need besides the trials, before the first trial runs."""
    stored = settings.model_copy(
        update={"storage": mask_url(settings.storage) if settings.storage else None}
    )
    study.set_user_attr(StudyKey.SETTINGS, stored.model_dump(mode="json"))
    study.set_user_attr(StudyKey.CONTEXT, context.model_dump(mode="json"))
    # A resumed study's earlier recommendation no longer covers all its trials.
    study.set_user_attr(StudyKey.RECOMMENDATION, None)
    study.set_user_attr(StudyKey.CONFIRMATIONS, [])


def write_outcome(
    study: optuna.Study, confirmations: tuple[TrialRecord, ...], recommendation: Recommendation
) -> None:
    """Store what a finished tune concluded: the re-runs and the recommendation."""
    study.set_user_attr(
        StudyKey.CONFIRMATIONS, [record.model_dump(mode="json") for record in confirmations]
    )
    study.set_user_attr(StudyKey.RECOMMENDATION, recommendation.model_dump(mode="json"))


def write_noise(study: optuna.Study, result: TrialResult) -> None:
    """Store the noise-scale trial, so that a resumed tune need not run it again."""
    study.set_user_attr(StudyKey.NOISE, result.model_dump(mode="json"))


def read_noise(study: optuna.Study) -> TrialResult | None:
    """The stored noise-scale trial; None if there is none or another version wrote it."""
    try:
        return _optional(TrialResult, study.user_attrs.get(StudyKey.NOISE))
    except ValidationError:
        return None


def write_option(study: optuna.Study, result: TrialResult) -> None:
    """Add a schedule stage's throughput trial to the study's (read, append, write)."""
    stored = list(study.user_attrs.get(StudyKey.SCHEDULE_OPTIONS, []))
    study.set_user_attr(StudyKey.SCHEDULE_OPTIONS, [*stored, result.model_dump(mode="json")])


def read_options(study: optuna.Study) -> list[TrialResult]:
    """The schedule stages' throughput trials the study holds that this version can read."""
    results = []
    for stored in study.user_attrs.get(StudyKey.SCHEDULE_OPTIONS, []):
        try:
            results.append(TrialResult.model_validate(stored))
        except ValidationError:
            continue
    return results


def write_racer(study: optuna.Study, racer: Racer, key: str = StudyKey.RACERS) -> None:
    """Add a finished race trial to the study's racers, or with `key`
    `StudyKey.SCHEDULE_RACERS` the schedule race's (read, append, write: one worker races)."""
    stored = list(study.user_attrs.get(key, []))
    study.set_user_attr(key, [*stored, racer.model_dump(mode="json")])


def read_racers(study: optuna.Study, key: str = StudyKey.RACERS) -> list[Racer]:
    """Every race trial the study holds under `key` that this version can read, in the order
    raced."""
    racers = []
    for stored in study.user_attrs.get(key, []):
        try:
            racers.append(Racer.model_validate(stored))
        except ValidationError:
            continue
    return racers


@dataclass(frozen=True)
class StoredStudy:
    """Everything advisor stored in a study, validated."""

    name: str
    settings: TuneSettings
    recommendation: Recommendation | None  # None until a tune finished
    context: StudySetup | None  # read only where there is no recommendation
    confirmations: tuple[TrialRecord, ...]
    trials: list[TrialRecord]
    pruned: tuple[PrunedProposal, ...]


def read_study(study: optuna.Study) -> StoredStudy:
    """What advisor stored in `study`; a `StorageError` if another version (or tool) wrote it."""
    attrs = study.user_attrs
    trials = records_of(study)
    if StudyKey.SETTINGS not in attrs or not (
        attrs.get(StudyKey.CONTEXT) or attrs.get(StudyKey.RECOMMENDATION)
    ):
        raise StorageError(
            f"study {study.study_name!r} was not written by this advisor version "
            f"({len(trials)} trials stored, no settings): re-run the tune with a new --study-name"
        )
    try:
        recommendation = _optional(Recommendation, attrs.get(StudyKey.RECOMMENDATION))
        return StoredStudy(
            name=study.study_name,
            settings=TuneSettings.model_validate(attrs[StudyKey.SETTINGS]),
            recommendation=recommendation,
            context=None if recommendation else _optional(StudySetup, attrs[StudyKey.CONTEXT]),
            confirmations=tuple(
                TrialRecord.model_validate(c) for c in attrs.get(StudyKey.CONFIRMATIONS, [])
            ),
            trials=trials,
            pruned=pruned_of(study),
        )
    except ValidationError as exc:
        raise StorageError(
            f"study {study.study_name!r} was not written by this advisor version "
            f"({str(exc).splitlines()[0]}): re-run the tune with a new --study-name"
        ) from exc


Model = TypeVar("Model", bound=BaseModel)


def _optional(model: type[Model], stored: Any) -> Model | None:
    return model.model_validate(stored) if stored else None


def claim(trial: optuna.Trial) -> None:
    """Mark a trial as this process's, so that a later worker can tell when it died."""
    trial.set_user_attr(TrialKey.PROCESS, _this_process())


def _this_process() -> str:
    process = psutil.Process()
    return f"{socket.gethostname()}:{process.pid}:{process.create_time():.0f}"


def fail_abandoned(study: optuna.Study, unclaimed_after_s: float = STALE_AFTER_S) -> None:
    """Fail RUNNING trials whose worker is gone: a process on this host that no longer runs, or
    a worker that never claimed its trial within `unclaimed_after_s` of asking for it.

    RDB storages fail a dead worker's trial by heartbeat, and a journal file has none; neither
    sees a worker killed between asking for a trial and claiming it (no heartbeat, no owner),
    whose trial would otherwise stay RUNNING forever. A live worker claims its trial within
    milliseconds. Claimed trials of other hosts are left alone: whether their worker lives
    cannot be seen from here.
    """
    host = socket.gethostname()
    now = datetime.now()  # Optuna stores a trial's start as this host's naive local time
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = str(trial.user_attrs.get(TrialKey.PROCESS, ""))
        owner_host, _, rest = owner.partition(":")
        if not owner:
            started = trial.datetime_start
            dead = started is not None and (now - started).total_seconds() > unclaimed_after_s
        elif owner_host == host and rest:
            pid, _, created = rest.partition(":")
            dead = not _alive(int(pid), created)
        else:
            dead = False
        if dead:  # Optuna offers no public call for this
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)


def _alive(pid: int, started: str) -> bool:
    try:
        return f"{psutil.Process(pid).create_time():.0f}" == started
    except psutil.Error:
        return False
