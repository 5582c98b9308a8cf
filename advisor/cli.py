"""The `advisor` command: a thin layer that turns flags into settings and calls the API."""

from __future__ import annotations

import signal
import sys
import traceback
from pathlib import Path
from typing import Any, cast

import click
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from advisor.api import (
    VERSION,
    make_settings,
    stored_result,
    tune_with,
    validate,
    write_outputs,
    write_reports,
)
from advisor.console import (
    ConsoleProgress,
    hardware_table,
    recommendation_table,
    validation_table,
)
from advisor.errors import AdvisorError, BadInputError, SettingsError
from advisor.knobs import BASE_GROUP, KNOB_GROUPS
from advisor.report.codegen import launch_command, render_launch_script, render_training_script
from advisor.report.exports import FRAMEWORKS, Framework, write_exports
from advisor.report.race import baseline_kept
from advisor.report.render import render_html, render_markdown, reproduce_command
from advisor.results import Recommendation
from advisor.search.storage import mask_url
from advisor.settings import TuneSettings, read_settings_file

__all__ = ["cli", "main"]

out = Console()
err = Console(stderr=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(VERSION, prog_name="advisor")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """Find, by measurement, the fastest way to train your PyTorch model on this machine."""


@cli.command()
@click.argument("spec", required=False)
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Settings from a .toml or .json file (names as the flags); flags override it.",
)
@click.option(
    "--trials",
    type=int,
    help="Distinct configurations to measure [20]; a trial timed in parts also measures its "
    "other accumulation steps, counted together as one.",
)
@click.option("--timeout", type=float, help="Search budget in seconds (re-measurements follow).")
@click.option(
    "--trial-seconds",
    type=float,
    help="Timed window of each trial [2]; a search trial's ends sooner once its rate is precise.",
)
@click.option("--trial-timeout", type=float, help="Hard limit per trial in seconds.")
@click.option("--warmup-steps", type=int, help="Optimizer steps before timing [3].")
@click.option("--global-batch-size", type=int, help="Keep batch x accumulation at this value.")
@click.option("--batch-sizes", help="Micro-batch sizes to try, e.g. 16,32,64.")
@click.option("--accumulation-steps", help="Accumulation steps to try [1,2,4,8].")
@click.option(
    "--max-world-size", type=int, help="Most DDP processes to try [GPUs, or cores]; 1: none."
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), help="[auto]")
@click.option("--storage", help="Optuna storage URL [sqlite:///OUT/study.db].")
@click.option("--study-name", help="Study name [from the spec].")
@click.option("--out", type=click.Path(path_type=Path), help="Output folder [reports/STUDY].")
@click.option(
    "--worker", help="This worker's name in a shared study [host name]; --trials counts its own."
)
@click.option("--seed", type=int, help="Sampler seed [0].")
@click.option("--sampler", type=click.Choice(["tpe", "random", "grid"]), help="[tpe]")
@click.option(
    "--knobs",
    help=f"Knobs to search: {BASE_GROUP}, all, or a comma list of groups "
    f"({', '.join(g for g in KNOB_GROUPS if g != BASE_GROUP)}) and knob names [{BASE_GROUP}].",
)
@click.option(
    "--early-stop",
    type=float,
    help="Stop a search trial early below this fraction of the best so far; 0: never, and no "
    "knob value is rejected either [0.5].",
)
@click.option(
    "--objective",
    type=click.Choice(["time-to-loss", "throughput"]),
    help="What wins: the soonest to your loss in a race from the same weights, or the highest "
    "samples/s [time-to-loss].",
)
@click.option(
    "--race-seconds",
    type=float,
    help="Training time of each racer; 0: no race, your global batch is kept [15].",
)
@click.option("--confirm-top", type=int, help="Finalists re-measured with the baseline [3].")
@click.option("--confirm-repeats", type=int, help="Re-runs per finalist [2].")
@click.option("--memory-headroom", type=float, help="Memory fraction to keep free [0.1].")
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
    try:
        result = tune_with(settings, progress)
    except KeyboardInterrupt:
        click.echo(
            f"\ninterrupted: finished trials are saved in {mask_url(settings.storage_url)} "
            f"(study {settings.resolved_study_name}); run the same command to resume",
            err=True,
        )
        _write_provisional_reports(settings)
        sys.exit(130)
    if as_json:
        click.echo(result.recommendation.model_dump_json(indent=2))
        return
    rec = result.recommendation
    out.print(recommendation_table(rec))
    kept = baseline_kept(rec)
    if kept is not None:
        more = " (see report.md)" if rec.throughput_pick else ""
        out.print(f"{kept[0].lower()}: {kept[1]}{more}", highlight=False, soft_wrap=True)
    if rec.race is not None:
        out.print(f"race: {escape(rec.race.verdict)}", highlight=False, soft_wrap=True)
    for warning in rec.warnings:
        out.print(f"[yellow]note:[/] {escape(warning)}", highlight=False, soft_wrap=True)
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
    from advisor.trial.probe import probe  # imports torch: only this command needs it

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
    rec = _confirmed_recommendation(recommendation, "codegen")
    output.write_text(render_training_script(rec, output.parent))
    launcher = output.parent / "launch.sh"
    launcher.write_text(render_launch_script(rec))
    launcher.chmod(0o755)
    command = launch_command(rec.config, output.as_posix())
    out.print(
        f"wrote {output} and {launcher}; train with: {command} --epochs 1",
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
    rec = _confirmed_recommendation(folder / "recommendation.json", "export")
    frameworks = FRAMEWORKS if target == "all" else (cast(Framework, target),)
    for path in write_exports(rec, folder, frameworks):
        out.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)


def _confirmed_recommendation(path: Path, command: str) -> Recommendation:
    """The recommendation.json at `path`, confirmed by re-runs; else a one-line error."""
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
            f"re-measured): resume the tune with its command, then run {command} on the new file"
        )
    return rec


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
    if storage is None:
        if folder is None:
            raise BadInputError(
                "pass the folder advisor tune wrote (e.g. reports/mlp-factory), "
                "or --storage URL --study-name NAME"
            )
        database = folder / "study.db"
        if not database.is_file():
            raise BadInputError(
                f"{database} does not exist: pass the folder advisor tune wrote, "
                "or --storage URL --study-name NAME"
            )
        storage = f"sqlite:///{database.resolve()}"
    result = stored_result(storage, study_name, out_dir or folder)
    if fmt == "json":
        click.echo(result.model_dump_json(indent=2))
        return
    if fmt == "all":
        write_outputs(result)
        files = "recommendation.json, trials.csv, report.md, report.html"
        if not result.recommendation.provisional:
            files += ", train.py, launch.sh, exports/"
        out.print(
            f"wrote {result.out_dir}/: {files}", markup=False, highlight=False, soft_wrap=True
        )
    else:
        result.out_dir.mkdir(parents=True, exist_ok=True)
        path = result.out_dir / f"report.{fmt}"
        path.write_text(render_html(result) if fmt == "html" else render_markdown(result))
        out.print(f"wrote {path}", markup=False, highlight=False, soft_wrap=True)
    if result.recommendation.provisional:
        out.print(
            "[yellow]note:[/] the tune did not finish: these reports are provisional (single "
            f"search windows, no training script); resume it with: "
            f"{escape(reproduce_command(result.settings))}",
            highlight=False,
            soft_wrap=True,
        )


cli.add_command(probe_command, name="probe")


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
        result = stored_result(settings.storage_url, settings.resolved_study_name, settings.out_dir)
        write_reports(result)
    except (AdvisorError, KeyboardInterrupt):
        return
    click.echo(
        f"provisional reports of the trials so far (not re-measured): {result.out_dir}/report.md, "
        "report.html",
        err=True,
    )


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
        click.echo(f"error: {exc.strerror or exc}{where}: check the path and permissions", err=True)
        sys.exit(2)
    except (KeyboardInterrupt, click.Abort):
        click.echo("interrupted", err=True)
        sys.exit(130)
