"""The public entry points: `tune()` and `validate()`; the CLI calls exactly these."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

import advisor
from advisor.codegen import render_launch_script, render_training_script
from advisor.config import TuneSettings, settings_error
from advisor.effects import best_by_layout, diagnose, knob_effects
from advisor.errors import StorageError
from advisor.hardware import probe_isolated
from advisor.preflight import preflight
from advisor.progress import NullProgress, Progress
from advisor.report import render_html, render_markdown, render_trials_csv
from advisor.results import (
    HardwareProfile,
    Recommendation,
    TaskSummary,
    TrialRecord,
    TrialResult,
    TuneResult,
)
from advisor.search import SearchContext, bind_study, make_sampler, records_of, run_search
from advisor.selection import Selection, select_winner
from advisor.space import SearchSpace, build_space, resolve_device
from advisor.storage import (
    CONFIRMATIONS_ATTR,
    RECOMMENDATION_ATTR,
    SETTINGS_ATTR,
    load_study,
    mask_url,
    open_study,
)
from advisor.task import callable_to_spec, check_spec
from advisor.trial.runner import TrialLaunch

__all__ = [
    "make_settings",
    "stored_result",
    "tune",
    "tune_with",
    "validate",
    "write_outputs",
    "write_reports",
]


def make_settings(factory_or_spec: str | Callable[[], Any], **settings: Any) -> TuneSettings:
    """Validate settings at the boundary; every problem is named in one `SettingsError`."""
    spec = (
        factory_or_spec if isinstance(factory_or_spec, str) else callable_to_spec(factory_or_spec)
    )
    try:
        return TuneSettings(spec=spec, **settings)
    except ValidationError as exc:
        raise settings_error(exc) from None


def tune(
    factory_or_spec: str | Callable[[], Any], *, progress: Progress | None = None, **settings: Any
) -> TuneResult:
    """Search for the fastest training configuration of a factory's model on this machine.

    `settings` are the fields of `TuneSettings` (trials, timeout, batch_sizes, storage, ...).
    """
    return tune_with(make_settings(factory_or_spec, **settings), progress or NullProgress())


def validate(spec: str, *, device: str = "auto", timeout_s: float = 300.0) -> TrialResult:
    """Build the task and run two real training steps in a child process."""
    settings = make_settings(spec, device=device, trial_timeout=timeout_s)
    check_spec(spec)
    hardware = probe_isolated()
    log_path = Path(_scratch_logs()) / "validate.log"
    return preflight(
        spec, Path.cwd(), resolve_device(settings.device, hardware), timeout_s, log_path
    )


def tune_with(settings: TuneSettings, progress: Progress) -> TuneResult:
    check_spec(settings.spec)
    out_dir = settings.out_dir
    logs_dir = out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    progress.stage("probing hardware")
    hardware = probe_isolated()
    device = resolve_device(settings.device, hardware)
    progress.stage(f"validating {settings.spec} on {device} (two real training steps)")
    checked = preflight(
        settings.spec, Path.cwd(), device, settings.trial_timeout_s, logs_dir / "validate.log"
    )
    space = build_space(settings, hardware, _summary(checked))
    progress.stage(
        f"searching {space.size} configurations with {settings.sampler}; storage "
        f"{mask_url(settings.storage_url)}, study {settings.resolved_study_name}"
    )
    study = open_study(
        settings.storage_url, settings.resolved_study_name, make_sampler(settings, space)
    )
    launch = TrialLaunch(
        spec=settings.spec,
        cwd=Path.cwd(),
        warmup_steps=settings.warmup_steps,
        trial_seconds=settings.trial_seconds,
        timeout_s=settings.trial_timeout_s,
        seed=settings.seed,
    )
    context = SearchContext(settings, space, hardware, launch, logs_dir, progress)
    bind_study(study, context)
    records = run_search(study, context)
    progress.stage("re-measuring the finalists and the baseline")
    selection = select_winner(records, context)
    study.set_user_attr(
        CONFIRMATIONS_ATTR, [r.model_dump(mode="json") for r in selection.confirmations]
    )
    trials = records_of(study)
    effects = knob_effects(trials)
    recommendation = _recommend(settings, space, hardware, checked, selection).model_copy(
        update={
            "parallel_best": best_by_layout(trials, selection.confirmations),
            "knob_effects": effects,
            "bottleneck": diagnose(selection.winner, effects),
        }
    )
    # Stored with the trials, so that `advisor report` can render everything from the study.
    study.set_user_attr(RECOMMENDATION_ATTR, recommendation.model_dump(mode="json"))
    stored_settings = settings.model_copy(
        update={"storage": mask_url(settings.storage) if settings.storage else None}
    )
    study.set_user_attr(SETTINGS_ATTR, stored_settings.model_dump(mode="json"))
    result = TuneResult(
        settings=settings,
        recommendation=recommendation,
        trials=tuple(trials),
        confirmations=selection.confirmations,
        out_dir=out_dir,
    )
    write_outputs(result)
    return result


def _recommend(
    settings: TuneSettings,
    space: SearchSpace,
    hardware: HardwareProfile,
    checked: TrialResult,
    selection: Selection,
) -> Recommendation:
    winner = selection.winner.result
    baseline = space.baseline
    base_value = selection.baseline_samples_per_s
    warnings = []
    if winner.config.global_batch_size != baseline.global_batch_size:
        ratio = winner.config.global_batch_size / baseline.global_batch_size
        warnings.append(
            f"the global batch changes from {baseline.global_batch_size} to "
            f"{winner.config.global_batch_size} ({ratio:g}x): the optimisation changes with it; "
            f"scale the learning rate by {ratio:g} (linear-scaling rule) or re-run with "
            f"--global-batch-size {baseline.global_batch_size} to keep it"
        )
    if base_value is None:
        warnings.append("the baseline configuration failed: no speed-up can be stated")
    return Recommendation(
        advisor_version=advisor.__version__,
        spec=settings.spec,
        workdir=str(Path.cwd()),
        config=winner.config,
        samples_per_s=selection.samples_per_s,
        peak_memory_bytes=winner.peak_memory_bytes,
        baseline_config=baseline,
        baseline_samples_per_s=base_value,
        speedup=selection.samples_per_s / base_value if base_value else None,
        chosen_from_trial=selection.winner.number,
        confirm_runs=selection.winner_runs,
        baseline_runs=selection.baseline_runs,
        global_batch_changed=winner.config.global_batch_size != baseline.global_batch_size,
        warnings=tuple(warnings),
        fixed_knobs=space.fixed,
        hardware=hardware,
        task=_summary(checked),
        storage=mask_url(settings.storage_url),
        study_name=settings.resolved_study_name,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def write_reports(result: TuneResult) -> None:
    """recommendation.json, trials.csv, report.md and report.html into the output folder."""
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "recommendation.json").write_text(result.recommendation.model_dump_json(indent=2))
    (out / "trials.csv").write_text(render_trials_csv(result))
    (out / "report.md").write_text(render_markdown(result))
    (out / "report.html").write_text(render_html(result))


def write_outputs(result: TuneResult) -> None:
    """Every file of the output folder: the reports, train.py and launch.sh."""
    out = result.out_dir
    write_reports(result)
    (out / "train.py").write_text(render_training_script(result.recommendation, out))
    launcher = out / "launch.sh"
    launcher.write_text(render_launch_script(result.recommendation))
    launcher.chmod(0o755)


def stored_result(url: str, study_name: str | None, out_dir: Path | None) -> TuneResult:
    """A finished tune's result, rebuilt from its study alone (for `advisor report`).

    `out_dir` defaults to reports/<study name>.
    """
    study = load_study(url, study_name)
    attrs = study.user_attrs
    trials = tuple(records_of(study))
    if RECOMMENDATION_ATTR not in attrs:
        raise StorageError(
            f"study {study.study_name!r} has no recommendation yet ({len(trials)} trials "
            "stored: the tune did not finish, or an older advisor ran it): run its advisor tune "
            "command again to finish it"
        )
    try:
        return TuneResult(
            settings=TuneSettings.model_validate(attrs[SETTINGS_ATTR]),
            recommendation=Recommendation.model_validate(attrs[RECOMMENDATION_ATTR]),
            trials=trials,
            confirmations=tuple(
                TrialRecord.model_validate(c) for c in attrs.get(CONFIRMATIONS_ATTR, [])
            ),
            out_dir=out_dir or Path("reports") / study.study_name,
        )
    except (KeyError, ValidationError) as exc:
        raise StorageError(
            f"study {study.study_name!r} was not written by this advisor version "
            f"({str(exc).splitlines()[0]}): re-run the tune with a new --study-name"
        ) from exc


def _summary(checked: TrialResult) -> TaskSummary:
    if checked.task is None:  # a successful validation always carries it
        raise RuntimeError("the validation trial returned no task summary")
    return checked.task


def _scratch_logs() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="advisor-validate-")
