"""The `advisor` command: a thin layer that turns flags into settings and calls the API."""

from __future__ import annotations

import errno
import signal
import sys
import traceback
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, cast, get_args, get_origin

import click
from rich.console import Console
from rich.markup import escape

from advisor.api import (
    VERSION,
    ReportFormat,
    load_result,
    make_settings,
    read_recommendation,
    serve_node,
    tune_with,
    validate,
    write_report_files,
    write_reports,
    write_script,
)
from advisor.api import export as export_recommendation
from advisor.console import (
    ConsoleProgress,
    hardware_table,
    recommendation_table,
    validation_table,
)
from advisor.errors import AdvisorError, BadInputError, NodeLostError, SettingsError
from advisor.knobs import FRAMEWORKS, Framework
from advisor.report.codegen import launch_command
from advisor.report.race_view import baseline_kept, went_on_brief
from advisor.report.render import effort_summary, reproduce_command
from advisor.report.verdicts import notice_text, race_verdict, schedule_verdict
from advisor.results import TuneResult
from advisor.settings import TuneSettings, mask_url, read_settings_file, setting_help

__all__ = ["cli", "main"]

out = Console()
err = Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="advisor")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Find, by measurement, the fastest way to train your PyTorch model on this machine."""


def _settings_options(command: Any) -> Any:
    """One option per `TuneSettings` field but the spec, its type, choices and help (the
    default in brackets) read from the field: a default is written once, in the settings."""
    for name in reversed([name for name in TuneSettings.model_fields if name != "spec"]):
        option = click.option(
            f"--{name.replace('_', '-')}", type=_click_type(name), help=setting_help(name)
        )
        command = option(command)
    return command


def _click_type(name: str) -> Any:
    """The flag's type: a choice for a Literal, int or float, a path, else a string the
    settings parse (comma lists)."""
    kind = TuneSettings.model_fields[name].annotation
    if get_origin(kind) in (Union, UnionType):  # X | None: the flag's type is X's
        kind = next(arg for arg in get_args(kind) if arg is not type(None))
    if get_origin(kind) is Literal:
        return click.Choice(get_args(kind))
    if kind in (int, float):
        return kind
    return click.Path(path_type=Path) if kind is Path else str


@cli.command()
@click.argument("spec", required=False)
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Settings from a .toml or .json file (names as the flags); flags override it.",
)
@_settings_options
@click.option("--json", "as_json", is_flag=True, help="Print only the recommendation as JSON.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def tune(spec: str | None, config: Path | None, as_json: bool, quiet: bool, **flags: Any) -> None:
    """Search for the fastest training configuration of SPEC (file.py:factory)."""
    settings = _settings(spec, config, {k: v for k, v in flags.items() if v is not None})
    # A closed terminal or a scheduler's SIGTERM stops the search like Ctrl-C: trials are kept.
    # SIGINT too, explicitly: a shell starts a background job with SIGINT ignored, and Python
    # then never raises KeyboardInterrupt, so `kill -INT` would be lost on a backgrounded tune.
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, _raise_interrupt)
    progress = ConsoleProgress(err, quiet=quiet or as_json)
    if (settings.node_rank or 0) > 0:
        _serve(settings, progress)
        return
    result = _tune_keeping_trials(settings, progress)
    if as_json:
        click.echo(result.recommendation.model_dump_json(indent=2))
        return
    rec = result.recommendation
    out.print(recommendation_table(rec))
    if rec.confirmation is not None:
        colour = "green" if rec.confirmation.confirmed else "yellow"
        statement = escape(rec.confirmation.statement)
        out.print(f"[{colour}]{statement}[/]", highlight=False, soft_wrap=True)
    kept = baseline_kept(rec)
    if kept is not None:
        more = " (see report.md)" if rec.throughput_pick else ""
        out.print(f"{kept[0].lower()}: {kept[1]}{more}", highlight=False, soft_wrap=True)
    if (searched := effort_summary(result.effort)) is not None:
        out.print(f"search: {searched}", highlight=False, soft_wrap=True)
    if rec.memory_budget is not None:
        out.print(f"memory: {rec.memory_budget.statement}", highlight=False, soft_wrap=True)
    if rec.race is not None:
        out.print(f"race: {escape(race_verdict(rec.race))}", highlight=False, soft_wrap=True)
        if (went_on := went_on_brief(rec.race)) is not None:
            out.print(f"  ({escape(went_on)})", highlight=False, soft_wrap=True)
    if rec.schedule is not None:
        verdict = escape(schedule_verdict(rec.schedule, rec.race))
        trains = "; train.py trains it" if rec.schedule.schedule is not None else ""
        out.print(f"schedule: {verdict}{trains}", highlight=False, soft_wrap=True)
    for warning in rec.warnings:
        text = escape(notice_text(warning))
        out.print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)
    files = (
        "recommendation.json, trials.csv, report.md, report.html, train.py, launch.sh, logs/, "
        "exports/ (for HF Trainer, Lightning, accelerate)"
    )
    out.print(f"wrote {result.out_dir}/: {files}", markup=False, highlight=False, soft_wrap=True)
    command = launch_command(rec.config, (result.out_dir / "train.py").as_posix())
    out.print(f"train with it: {command} --epochs 1", markup=False, highlight=False, soft_wrap=True)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def probe_command(as_json: bool) -> None:
    """Show the hardware advisor tunes for."""
    from advisor.trial.child.hardware import probe  # imports torch: only this command needs it

    hardware = probe()
    if as_json:
        click.echo(hardware.model_dump_json(indent=2))
    else:
        out.print(hardware_table(hardware))


@cli.command(name="validate")
@click.argument("spec")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
def validate_command(spec: str, device: str) -> None:
    """Build SPEC's task and run two real training steps."""
    out.print(validation_table(validate(spec, device=device)))


@cli.command()
@click.argument("recommendation", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=Path("train.py"))
def codegen(recommendation: Path, output: Path) -> None:
    """Write the training script for a recommendation.json."""
    script, launcher = write_script(recommendation, output)
    command = launch_command(read_recommendation(recommendation).config, script.as_posix())
    out.print(
        f"wrote {script} and {launcher}; train with: {command} --epochs 1",
        markup=False,
        highlight=False,
    )


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--to",
    "target",
    type=click.Choice(["all", *FRAMEWORKS]),
    default="all",
    help="hf: TrainingArguments keywords (JSON); lightning: a Trainer snippet; accelerate: its "
    "config file; all: the three [default].",
)
def export(folder: Path, target: str) -> None:
    """Write FOLDER's recommendation for HF Trainer, Lightning or accelerate to FOLDER/exports/."""
    for path in export_recommendation(folder, cast(Framework, target)):
        out.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


@cli.command()
@click.argument("folder", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--storage", help="Optuna storage URL, instead of FOLDER/study.db.")
@click.option("--study-name", help="The study to report [the only one in the storage].")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), help="Output folder [FOLDER].")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["all", "html", "md", "json"]),
    default="all",
    help="all: every output file [default]; html or md: that report only; json: print the "
    "stored result.",
)
def report(
    folder: Path | None,
    storage: str | None,
    study_name: str | None,
    out_dir: Path | None,
    fmt: str,
) -> None:
    """Re-render a finished tune's reports from its stored study alone."""
    if fmt == "json":
        result = load_result(folder, storage=storage, study_name=study_name, out_dir=out_dir)
        click.echo(result.model_dump_json(indent=2))
        return
    result = write_reports(
        folder, storage=storage, study_name=study_name, out_dir=out_dir, fmt=cast(ReportFormat, fmt)
    )
    if fmt == "all":
        files = "recommendation.json, trials.csv, report.md, report.html"
        if not result.recommendation.provisional:
            files += ", train.py, launch.sh, exports/"
        wrote = f"{result.out_dir}/: {files}"
    else:
        wrote = str(result.out_dir / f"report.{fmt}")
    out.print(f"wrote {wrote}", markup=False, highlight=False, soft_wrap=True)
    if result.recommendation.provisional:
        out.print(
            "[yellow]note:[/] the tune did not finish: these reports are provisional (single "
            f"search windows, no training script); resume it with: "
            f"{escape(reproduce_command(result.settings))}",
            highlight=False,
            soft_wrap=True,
        )


cli.add_command(probe_command, name="probe")


def _tune_keeping_trials(settings: TuneSettings, progress: ConsoleProgress) -> TuneResult:
    """The tune; stopped by Ctrl-C or a machine gone, it says where the finished trials are,
    writes provisional reports and exits."""
    try:
        return tune_with(settings, progress)
    except NodeLostError as exc:
        click.echo(
            f"error: {exc}; finished trials are saved in {mask_url(settings.storage_url)}: run "
            "the same commands on every machine to resume",
            err=True,
        )
        _write_provisional_reports(settings)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo(
            f"\ninterrupted: finished trials are saved in {mask_url(settings.storage_url)} "
            f"(study {settings.resolved_study_name}); run the same command to resume",
            err=True,
        )
        _write_provisional_reports(settings)
        sys.exit(130)


def _serve(settings: TuneSettings, progress: ConsoleProgress) -> None:
    """Another machine of a tune over several: serve node 0 until it is done."""
    try:
        served = serve_node(settings, progress)
    except KeyboardInterrupt:
        click.echo("\ninterrupted: node 0 goes on without this machine's layouts", err=True)
        sys.exit(130)
    click.echo(f"node {settings.node_rank}: served {served} trials; node 0 wrote the outputs")


def _settings(spec: str | None, config: Path | None, flags: dict[str, Any]) -> TuneSettings:
    """The settings file's values, overridden by the flags given, validated together."""
    values = {**(read_settings_file(config) if config else {}), **flags}
    spec = spec or values.pop("spec", None)
    values.pop("spec", None)
    if not spec:
        raise BadInputError("pass SPEC (e.g. mymodel.py:factory), or set spec in the --config file")
    try:
        return make_settings(str(spec), **values)
    except SettingsError as exc:
        raise SettingsError(f"{config}: {exc}" if config else str(exc)) from None


def _write_provisional_reports(settings: TuneSettings) -> None:
    """After an interrupt, the reports of the trials so far; silent when there are none."""
    try:
        result = load_result(
            storage=settings.storage_url,
            study_name=settings.resolved_study_name,
            out_dir=settings.out_dir,
        )
        write_report_files(result)
    except (AdvisorError, KeyboardInterrupt):
        return
    click.echo(
        f"provisional reports of the trials so far (not re-measured): {result.out_dir}/report.md, "
        "report.html",
        err=True,
    )


DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # no space, quota, file size limit


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    """Entry point: one line per error, the documented exit codes, tracebacks only with --debug."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        cli.main(args=args, prog_name="advisor", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "advisor"
        click.echo(f"error: {exc.format_message()} (see '{command} --help')", err=True)
        sys.exit(2)
    except AdvisorError as exc:
        if debug:
            traceback.print_exc()
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # an output folder that cannot be written, a full disk, ...
        if debug:
            traceback.print_exc()
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in DISK_FULL:
            click.echo(
                f"error: the disk is full{where}: the finished trials are kept; free some space "
                "and run the same command to resume",
                err=True,
            )
            sys.exit(1)
        click.echo(f"error: {exc.strerror or exc}{where}: check the path and permissions", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, click.Abort):
        click.echo("interrupted", err=True)
        sys.exit(130)
