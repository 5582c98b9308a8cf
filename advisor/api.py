"""The public entry points: `tune()` and `validate()`; the CLI calls exactly these."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import optuna
from pydantic import ValidationError

from advisor.convergence import BatchPrediction, NoiseScale
from advisor.progress import NullProgress, Progress
from advisor.report.codegen import render_launch_script, render_training_script
from advisor.report.exports import write_exports
from advisor.report.outcome import confirmed_recommendation, stored_result
from advisor.report.render import render_html, render_markdown, render_trials_csv
from advisor.results import (
    Recommendation,
    StudyContext,
    TaskSummary,
    TrialRecord,
    TrialResult,
    TuneResult,
)
from advisor.search.checks import NumericsCheck, preflight
from advisor.search.context import SearchContext
from advisor.search.pruning import make_pruner
from advisor.search.race import (
    measure_noise_scale,
    plan_racers,
    predict_batches,
    race_finalists,
    run_race,
)
from advisor.search.race_verdict import decide_race
from advisor.search.records import (
    fail_abandoned,
    pruned_of,
    records_of,
    write_outcome,
    write_start,
)
from advisor.search.selection import Selection, select_winner
from advisor.search.space import build_space, resolve_device
from advisor.search.storage import mask_url, open_study
from advisor.search.study import bind_study, make_sampler, run_search
from advisor.settings import TuneSettings, settings_error
from advisor.task import callable_to_spec, check_spec
from advisor.trial.probe_runner import probe_isolated
from advisor.trial.runner import TrialLaunch

__all__ = [
    "VERSION",
    "make_settings",
    "stored_result",
    "tune",
    "tune_with",
    "validate",
    "write_outputs",
    "write_reports",
]

try:
    VERSION = version("advisor")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.0.0+unknown"


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
    logs = Path(_scratch_logs())
    device = resolve_device(settings.device, hardware)
    # a failure keeps the log, for what its message leaves out
    checked = preflight(spec, Path.cwd(), device, timeout_s, logs / "validate.log")
    shutil.rmtree(logs, ignore_errors=True)
    return checked.model_copy(update={"log_path": None})


def tune_with(settings: TuneSettings, progress: Progress) -> TuneResult:
    """`tune()` with validated settings: probe, validate the task, search, re-measure the
    finalists, and write the reports, train.py and launch.sh into `settings.out_dir`."""
    check_spec(settings.spec)
    logs_dir = settings.out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    search, context = _prepare(settings, progress, logs_dir)
    progress.stage(
        f"searching {search.space.size} configurations with {settings.sampler}; storage "
        f"{mask_url(settings.storage_url)}, study {settings.resolved_study_name}"
    )
    study = open_study(
        settings.storage_url,
        settings.resolved_study_name,
        make_sampler(settings, search.space),
        make_pruner(settings.early_stop, settings.trial_seconds),
    )
    fail_abandoned(study)  # trials a dead worker left RUNNING on this host
    bind_study(study, search)
    write_start(study, settings, context)  # first: `advisor report` renders even an interrupt
    records = run_search(study, search)
    recommendation, selection = _conclude(study, search, context, records)
    write_outcome(study, selection.confirmations, recommendation)
    result = TuneResult(
        settings=settings,
        recommendation=recommendation,
        trials=tuple(records_of(study)),
        confirmations=selection.confirmations,
        pruned=pruned_of(study),
        out_dir=settings.out_dir,
    )
    write_outputs(result)
    return result


def _conclude(
    study: optuna.Study, search: SearchContext, context: StudyContext, records: list[TrialRecord]
) -> tuple[Recommendation, Selection]:
    """Re-measure the finalists and, for the time-to-loss objective, race them: the
    recommendation, and the re-runs it rests on."""
    settings, progress = search.settings, search.progress
    racing = settings.objective == "time-to-loss" and settings.race_seconds > 0
    racing = racing and any(record.eligible for record in records)  # else nothing can win
    noise, predictions, extra = _race_entrants(study, search, records) if racing else (None, (), [])
    progress.stage("re-measuring the finalists and the baseline")
    selection = select_winner(records, search, extra, racing=racing)
    race = None
    if racing:
        plans = plan_racers(
            selection, predictions, search.space.baseline, context.task.optimizer_class
        )
        progress.stage(
            f"racing {len(plans)} configurations for {settings.race_seconds:g} s of training "
            "each, from the same initial weights, to your loss"
        )
        race = decide_race(run_race(study, search, plans), settings.race_seconds)
    recommendation = confirmed_recommendation(
        settings, context, selection, records_of(study), race=race, noise=noise
    )
    return recommendation, selection


def _race_entrants(
    study: optuna.Study, search: SearchContext, records: list[TrialRecord]
) -> tuple[NoiseScale | None, tuple[BatchPrediction, ...], list[TrialRecord]]:
    """The noise scale, what it predicts per global batch, and the search trials the race
    needs re-measured with the other finalists."""
    baseline = search.space.baseline
    search.progress.stage("measuring the gradient noise scale of your configuration")
    noise = measure_noise_scale(study, search, baseline)
    predictions, extra = race_finalists(
        predict_batches(noise, records, baseline), noise, records, baseline
    )
    if noise is not None:
        noise = noise.model_copy(update={"predictions": predictions})
    return noise, predictions, extra


def _prepare(
    settings: TuneSettings, progress: Progress, logs_dir: Path
) -> tuple[SearchContext, StudyContext]:
    """Probe the machine, validate the task and build the space: what the search runs with,
    and what the study stores about it."""
    progress.stage("probing hardware")
    hardware = probe_isolated()
    device = resolve_device(settings.device, hardware)
    progress.stage(f"validating {settings.spec} on {device} (two real training steps)")
    checked = preflight(
        settings.spec, Path.cwd(), device, settings.trial_timeout_s, logs_dir / "validate.log"
    )
    task = _summary(checked)
    space = build_space(settings, hardware, task)
    launch = TrialLaunch(
        spec=settings.spec,
        cwd=Path.cwd(),
        warmup_steps=settings.warmup_steps,
        trial_seconds=settings.trial_seconds,
        timeout_s=settings.trial_timeout_s,
        seed=settings.seed,
    )
    numerics = NumericsCheck(launch, logs_dir)
    search = SearchContext(settings, space, hardware, launch, logs_dir, progress, numerics)
    context = StudyContext(
        advisor_version=VERSION,
        workdir=str(Path.cwd()),
        baseline_config=space.baseline,
        fixed_knobs=space.fixed,
        hardware=hardware,
        task=task,
    )
    return search, context


def write_reports(result: TuneResult) -> None:
    """recommendation.json, trials.csv, report.md and report.html into the output folder."""
    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "recommendation.json").write_text(result.recommendation.model_dump_json(indent=2))
    (out / "trials.csv").write_text(render_trials_csv(result))
    (out / "report.md").write_text(render_markdown(result))
    (out / "report.html").write_text(render_html(result))


def write_outputs(result: TuneResult) -> None:
    """Every file of the output folder: the reports, then, for a confirmed recommendation,
    train.py, launch.sh and the exports for HF Trainer, Lightning and accelerate."""
    out = result.out_dir
    write_reports(result)
    if result.recommendation.provisional:
        return
    (out / "train.py").write_text(render_training_script(result.recommendation, out))
    launcher = out / "launch.sh"
    launcher.write_text(render_launch_script(result.recommendation))
    launcher.chmod(0o755)
    write_exports(result.recommendation, out)


def _summary(checked: TrialResult) -> TaskSummary:
    if checked.task is None:  # a successful validation always carries it
        raise RuntimeError("the validation trial returned no task summary")
    return checked.task


def _scratch_logs() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="advisor-validate-")
