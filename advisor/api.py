"""The public entry points, shared by the CLI and Python users: `tune()` and `validate()`;
`write_reports()`, `write_script()` and `export()` for a finished tune's folder."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal, cast

from pydantic import ValidationError

from advisor.decide.decision import conclude, stored_result, tune_result
from advisor.errors import BadInputError, SettingsError
from advisor.knobs import FRAMEWORKS, Framework
from advisor.progress import NullProgress, Progress
from advisor.report.codegen import render_launch_script, render_training_script
from advisor.report.exports import write_exports
from advisor.report.render import render_html, render_markdown, render_trials_csv
from advisor.results import Recommendation, StudySetup, TaskSummary, TrialResult, TuneResult
from advisor.search.checks import NumericsCheck
from advisor.search.context import SearchContext
from advisor.search.machine import resolve_device
from advisor.search.pruning import make_pruner
from advisor.search.records import fail_abandoned, pruned_of, records_of, write_outcome, write_start
from advisor.search.space import build_space
from advisor.search.storage import disk_full_is_one_line, open_study
from advisor.search.study import bind_study, make_sampler, run_search
from advisor.settings import TuneSettings, mask_url, settings_error
from advisor.task import callable_to_spec, check_spec
from advisor.trial.nodes import Rendezvous
from advisor.trial.parent.hardware import probe_isolated
from advisor.trial.parent.nodes import NodeHost, serve
from advisor.trial.parent.preflight import preflight
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

__all__ = [
    "VERSION",
    "ReportFormat",
    "export",
    "load_result",
    "make_settings",
    "read_recommendation",
    "search_and_decide",
    "serve_node",
    "tune",
    "tune_with",
    "validate",
    "write_outputs",
    "write_report_files",
    "write_reports",
    "write_script",
]

ReportFormat = Literal["all", "html", "md"]

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
    log = logs / "validate.log"
    try:
        checked = preflight(spec, Path.cwd(), device, timeout_s, log)
    except BaseException as exc:  # an interrupt too
        if str(log) not in str(exc):  # a failure keeps the log only where its message names it
            shutil.rmtree(logs, ignore_errors=True)
        raise
    shutil.rmtree(logs, ignore_errors=True)
    return checked.model_copy(update={"log_path": None})


def tune_with(settings: TuneSettings, progress: Progress) -> TuneResult:
    """`tune()` with validated settings: probe, validate the task, search, re-measure the
    finalists, and write the reports, train.py and launch.sh into `settings.out_dir`."""
    check_spec(settings.spec)
    logs_dir = settings.out_dir / "logs"
    logs_dir.mkdir(parents=True, exist_ok=True)
    with _one_tune_per_folder(settings.out_dir, settings.worker_name):
        return _tune_in(settings, progress, logs_dir)


def _tune_in(settings: TuneSettings, progress: Progress, logs_dir: Path) -> TuneResult:
    """`tune_with`, once this process holds its output folder; over several machines, with
    node 0's rendezvous store open for the whole tune."""
    rendezvous = _rendezvous(settings)
    if rendezvous is not None and rendezvous.node_rank > 0:
        raise SettingsError(
            f"node {rendezvous.node_rank} serves node 0's tune: call advisor.api.serve_node "
            "(advisor tune does)"
        )
    with NodeHost(rendezvous) if rendezvous else contextlib.nullcontext() as host:
        search, context = _prepare(settings, progress, logs_dir, host)
        return search_and_decide(search, context)


def serve_node(settings: TuneSettings, progress: Progress) -> int:
    """Serve node 0's tune from this machine (`--node-rank` 1 or more): probe, join, run this
    machine's part of each trial over several machines until node 0 is done; the number of
    trials served. Node 0 writes every output."""
    rendezvous = _rendezvous(settings)
    if rendezvous is None or rendezvous.node_rank == 0:
        raise SettingsError("serve_node is for --node-rank 1 or more of a tune with --nnodes")
    check_spec(settings.spec)
    progress.stage("probing hardware")
    hardware = probe_isolated()
    progress.stage(f"node {rendezvous.node_rank}: joining {rendezvous.endpoint}")
    logs = settings.out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return serve(rendezvous, hardware, ProcessRunner(_launch(settings)), logs, progress.stage)


def _rendezvous(settings: TuneSettings) -> Rendezvous | None:
    if settings.nnodes == 1 or settings.rdzv_endpoint is None:
        return None
    return Rendezvous.at(
        settings.rdzv_endpoint, settings.nnodes, settings.node_rank or 0, settings.join_timeout
    )


def _launch(settings: TuneSettings) -> TrialLaunch:
    return TrialLaunch(
        spec=settings.spec,
        cwd=Path.cwd(),
        warmup_steps=settings.warmup_steps,
        trial_seconds=settings.trial_seconds,
        timeout_s=settings.trial_timeout_s,
        seed=settings.seed,
    )


def search_and_decide(search: SearchContext, context: StudySetup) -> TuneResult:
    """The study, on a probed machine and a validated task: search, re-measure the finalists,
    decide, and write the outputs. Every trial goes through `search.runner` (a test hands in a
    scripted one)."""
    settings, progress = search.settings, search.progress
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
    with disk_full_is_one_line(settings.storage_url):
        fail_abandoned(study)  # trials a dead worker left RUNNING on this host
        bind_study(study, search)
        write_start(study, settings, context)  # first: `advisor report` renders even an interrupt
        records = run_search(study, search)
        recommendation, selection = conclude(study, search, context, records)
        write_outcome(study, selection.confirmations, recommendation)
    result = tune_result(
        settings,
        recommendation,
        tuple(records_of(study)),
        selection.confirmations,
        pruned_of(study),
        settings.out_dir,
    )
    write_outputs(result)
    return result


@contextlib.contextmanager
def _one_tune_per_folder(out_dir: Path, worker: str) -> Iterator[None]:
    """Hold `out_dir` for this worker while the tune runs: a second tune of the same worker
    name (by default the host's) on the same folder is refused, so that no two write its
    study, logs and reports at once; workers with distinct `--worker` names may share it."""
    path = out_dir / f".advisor-{worker}.lock"
    with path.open("a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise SettingsError(
                f"another advisor tune ({holder}) is running on {out_dir} as worker {worker}: "
                "wait for it, give another --out, or join its study as another worker "
                "(--worker NAME)"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()}")
        lock.flush()
        yield


def _prepare(
    settings: TuneSettings, progress: Progress, logs_dir: Path, nodes: NodeHost | None = None
) -> tuple[SearchContext, StudySetup]:
    """Probe the machine (and meet the others), validate the task and build the space: what
    the search runs with, and what the study stores about it."""
    progress.stage("probing hardware")
    hardware = probe_isolated()
    if nodes is not None:
        nodes.join(hardware, progress.stage)
    device = resolve_device(settings.device, hardware)
    progress.stage(f"validating {settings.spec} on {device} (two real training steps)")
    checked = preflight(
        settings.spec, Path.cwd(), device, settings.trial_timeout_s, logs_dir / "validate.log"
    )
    task = _summary(checked)
    space = build_space(settings, hardware, task)
    runner = ProcessRunner(_launch(settings), nodes)
    numerics = NumericsCheck(runner, logs_dir)
    search = SearchContext(settings, space, hardware, runner, logs_dir, progress, numerics)
    context = StudySetup(
        advisor_version=VERSION,
        workdir=str(Path.cwd()),
        baseline_config=space.baseline,
        fixed_knobs=space.fixed,
        hardware=hardware,
        task=task,
    )
    return search, context


def write_report_files(result: TuneResult) -> None:
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
    write_report_files(result)
    if not result.recommendation.provisional:
        _write_training_script(result.recommendation, result.out_dir / "train.py")
        write_exports(result.recommendation, result.out_dir)


def load_result(
    folder: Path | str | None = None,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: Path | str | None = None,
) -> TuneResult:
    """A tune's result rebuilt from its stored study alone: the folder `advisor tune` wrote
    (its study.db), or any Optuna storage URL. A tune that did not finish gets a provisional
    recommendation from its search trials. `out_dir` defaults to the folder."""
    if storage is None:
        if folder is None:
            raise BadInputError(
                "pass the folder advisor tune wrote (e.g. reports/mlp-factory), "
                "or --storage URL --study-name NAME"
            )
        database = Path(folder) / "study.db"
        if not database.is_file():
            raise BadInputError(
                f"{database} does not exist: pass the folder advisor tune wrote, "
                "or --storage URL --study-name NAME"
            )
        storage = f"sqlite:///{database.resolve()}"
    out = out_dir if out_dir is not None else folder
    return stored_result(storage, study_name, Path(out) if out is not None else None)


def write_reports(
    folder: Path | str | None = None,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    out_dir: Path | str | None = None,
    fmt: ReportFormat = "all",
) -> TuneResult:
    """Re-render a tune's reports from its stored study (see `load_result`): every output file
    ("all": for a provisional result the reports only), or report.html or report.md alone."""
    if fmt not in ("all", "html", "md"):
        raise BadInputError(f"cannot write the reports as {fmt!r}: choose all, html or md")
    result = load_result(folder, storage=storage, study_name=study_name, out_dir=out_dir)
    if fmt == "all":
        write_outputs(result)
    else:
        result.out_dir.mkdir(parents=True, exist_ok=True)
        path = result.out_dir / f"report.{fmt}"
        path.write_text(render_html(result) if fmt == "html" else render_markdown(result))
    return result


def read_recommendation(path: Path | str, purpose: str = "this") -> Recommendation:
    """The recommendation.json at `path` (or in that folder), confirmed by re-runs; a one-line
    `BadInputError` otherwise. `purpose` names what needs it, for the message."""
    path = Path(path)
    if path.is_dir():
        path = path / "recommendation.json"
    if not path.is_file():
        raise BadInputError(
            f"{path} does not exist: pass the folder (or file) `advisor tune` wrote, "
            "e.g. reports/mlp-factory"
        )
    try:
        rec = Recommendation.model_validate_json(path.read_text())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = f"{where}: {first['msg']}" if where else first["msg"]
        raise BadInputError(
            f"{path} is not a recommendation.json advisor can read ({problem}): "
            "pass the file `advisor tune` wrote"
        ) from exc
    if rec.provisional:
        raise BadInputError(
            f"{path} is provisional (its tune was interrupted before the finalists were "
            f"re-measured): resume the tune with its command, then run {purpose} on the new file"
        )
    return rec


def write_script(recommendation: Path | str, output: Path | str = "train.py") -> list[Path]:
    """train.py for a recommendation.json (or the folder holding it), and launch.sh beside it;
    the paths written."""
    rec = read_recommendation(recommendation, "codegen")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    return _write_training_script(rec, Path(output))


def export(folder: Path | str, to: Framework | Literal["all"] = "all") -> list[Path]:
    """A folder's recommendation for HF Trainer ("hf"), Lightning or accelerate, or all three,
    written to FOLDER/exports/; the paths written."""
    if to not in ("all", *FRAMEWORKS):
        raise BadInputError(f"cannot export to {to!r}: choose all, {', '.join(FRAMEWORKS)}")
    rec = read_recommendation(Path(folder) / "recommendation.json", "export")
    frameworks = FRAMEWORKS if to == "all" else (cast(Framework, to),)
    return list(write_exports(rec, Path(folder), frameworks))


def _write_training_script(rec: Recommendation, script: Path) -> list[Path]:
    """train.py at `script` and an executable launch.sh beside it."""
    script.write_text(render_training_script(rec, script.parent))
    launcher = script.parent / "launch.sh"
    launcher.write_text(render_launch_script(rec))
    launcher.chmod(0o755)
    return [script, launcher]


def _summary(checked: TrialResult) -> TaskSummary:
    if checked.task is None:  # a successful validation always carries it
        raise RuntimeError("the validation trial returned no task summary")
    return checked.task


def _scratch_logs() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="advisor-validate-")
