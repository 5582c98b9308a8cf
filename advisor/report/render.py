"""Render a `TuneResult` as `report.md` and `trials.csv` (pure functions of the result)."""

from __future__ import annotations

import csv
import io
import shlex
from collections import Counter, defaultdict

from advisor.knobs import KNOBS, on_one_machine, parse_parallel
from advisor.report.change import change_line
from advisor.report.codegen import launch_command
from advisor.report.race_view import race_view
from advisor.report.schedule_view import schedule_view
from advisor.report.templating import template_environment
from advisor.report.verdicts import (
    bottleneck_text,
    notice_text,
    payoff_text,
    rejection_text,
    tie_text,
)
from advisor.results import (
    LayoutBest,
    MachineLoad,
    PrunedProposal,
    Recommendation,
    SearchEffort,
    TrialRecord,
    TuneResult,
    relative_spread,
    shown_knobs,
)
from advisor.settings import TuneSettings, mask_url

__all__ = [
    "effort_summary",
    "render_html",
    "render_markdown",
    "render_trials_csv",
    "reproduce_command",
]

# Every knob's fields (`parallel` is mode and world size), so trials.csv can be filtered on either.
CSV_CONFIG_FIELDS = ("device", *(name for row in KNOBS for name in row.fields))
CSV_RESULT_FIELDS = (
    "status",
    "samples_per_s",
    "step_time_median_s",
    "step_time_p10_s",
    "step_time_p90_s",
    "data_wait_fraction",
    "peak_memory_bytes",
    "startup_s",
    "warmup_s",
    "window_s",
    "steps_measured",
    "stopped_early",
    "estimated",
    "wall_s",
    "reason",
    "log_path",
)


# The knob tables' "what" column: each knob's title and unit from the table, by knob and field.
WHAT = {
    "device": "where it trains",
    **{row.name: f"{row.title} ({row.unit})" if row.unit else row.title for row in KNOBS},
}
WHAT_FIELD = {row.fields[0]: WHAT[row.name] for row in KNOBS}


def _knob_rows(rec: Recommendation) -> list[tuple[str, str]]:
    """(knob, what it is) for each row of the recommendation table, the device first."""
    return [("device", WHAT["device"]), *((row.name, WHAT[row.name]) for row in shown_knobs(rec))]


def _md(value: object) -> str:
    """A table-cell-safe Markdown string: no pipes, no line breaks, no raw HTML (a `<` can
    open a tag; a `>` alone cannot)."""
    text = " ".join(str(value).split())
    return text.replace("|", "\\|").replace("<", "&lt;")


def _fmt(pattern: str, scale: float = 1.0):  # type: ignore[no-untyped-def]
    return lambda v: "–" if v is None else pattern.format(v * scale)


def _si(value: float | None) -> str:
    """1.73e6 -> '1.73 M', 5.7e10 -> '57.0 G': FLOP counts and rates."""
    if value is None:
        return "–"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "


_MARKDOWN_FILTERS = {
    "md": _md,
    "rate": _fmt("{:,.0f}"),
    "ms": _fmt("{:.1f}", 1e3),
    "pct": _fmt("{:.0%}"),
    "sec": _fmt("{:.1f}"),
    "mib": _fmt("{:,.0f} MiB", 1 / 2**20),
    "gib": _fmt("{:.1f} GiB", 1 / 2**30),
    "si": _si,
    "runs": lambda runs: ", ".join(f"{r:,.0f}" for r in runs) or "none",
    "ratios": lambda ratios: ", ".join(f"{r:.2f}x" for r in ratios) or "none",
    "spread": lambda runs: f"±{relative_spread(runs):.1%}" if len(runs) > 1 else "–",
    "rejection": rejection_text,
    "payoff": payoff_text,
    "tie": tie_text,
}


def _bottleneck(rec: Recommendation) -> str | None:
    return bottleneck_text(rec.bottleneck, rec.knob_effects) if rec.bottleneck else None


def render_markdown(result: TuneResult) -> str:
    """report.md: the recommendation, the evidence for it and every trial."""
    rec = result.recommendation
    baseline = next((t for t in result.trials if t.role == "baseline"), None)
    return (
        template_environment(**_MARKDOWN_FILTERS)
        .get_template("report.md.j2")
        .render(
            rec=rec,
            change=change_line(rec),
            notes=[notice_text(notice) for notice in rec.warnings],
            bottleneck=_bottleneck(rec),
            view=race_view(rec),
            schedule=schedule_view(rec.schedule, rec.race) if rec.schedule else None,
            knobs=_knob_rows(rec),
            what=WHAT_FIELD,
            baseline_memory=baseline.result.peak_memory_bytes if baseline else None,
            launch=launch_command(rec.config, (result.out_dir / "train.py").as_posix()),
            parallel=_parallel_rows(rec.parallel_best),
            trials=result.trials,
            confirmations=result.confirmations,
            counts=_counts(result.trials),
            pruned=_pruned_rows(result.pruned),
            rejected=result.rejected,
            effort=result.effort,
            hw=rec.hardware,
            settings=result.settings,
            measured=_measured(result.trials),
            reproduce=reproduce_command(result.settings),
            rerender=shlex.join(["advisor", "report", result.out_dir.as_posix()]),
        )
    )


def render_html(result: TuneResult) -> str:
    """One self-contained HTML file: inline CSS and SVG plots, no script, no URL."""
    # matplotlib takes 0.4 s to import: imported here, the commands that draw nothing
    # (validate, probe, a bad input's one-line error) start without it.
    from advisor.report.plots import (
        batch_amp_svg,
        history_svg,
        importance_svg,
        memory_svg,
        race_svg,
        schedule_svg,
    )

    rec, trials = result.recommendation, result.trials
    budget = rec.memory_budget.limit.bytes if rec.memory_budget else None
    figures = (
        ("Optimisation history: samples/s by trial, best so far", history_svg(trials)),
        ("Best throughput by batch size, per AMP setting", batch_amp_svg(trials)),
        (
            "Throughput against peak memory",
            memory_svg(trials, rec.chosen_from_trial, budget),
        ),
        (
            "Parameter importance (Optuna, PED-ANOVA)",
            importance_svg(result.importances),
        ),
    )
    filters = {name: f for name, f in _MARKDOWN_FILTERS.items() if name != "md"}
    environment = template_environment(autoescape=True, duration=_duration, **filters)
    return environment.get_template("report.html.j2").render(
        rec=rec,
        change=change_line(rec),
        notes=[notice_text(notice) for notice in rec.warnings],
        bottleneck=_bottleneck(rec),
        view=race_view(rec),
        race_plot=race_svg(rec.race),
        schedule=schedule_view(rec.schedule, rec.race) if rec.schedule else None,
        schedule_plot=schedule_svg(rec.schedule),
        knobs=_knob_rows(rec),
        what=WHAT_FIELD,
        parallel=_parallel_rows(rec.parallel_best),
        plots=[(title, svg) for title, svg in figures if svg],
        trials=trials,
        counts=_counts(trials),
        pruned=_pruned_rows(result.pruned),
        rejected=result.rejected,
        effort=result.effort,
        hw=rec.hardware,
        settings=result.settings,
        measured=_measured(trials),
        trial_seconds=sum(t.result.wall_s or 0.0 for t in (*trials, *result.confirmations)),
        launch=launch_command(rec.config, (result.out_dir / "train.py").as_posix()),
        reproduce=reproduce_command(result.settings),
        rerender=shlex.join(["advisor", "report", result.out_dir.as_posix()]),
    )


def effort_summary(effort: SearchEffort | None) -> str | None:
    """One line on where the search went, e.g. `20 trials ran, 90% at your global batch 32 or
    one that raced (128, 256); the best at 32: 1.21x your samples/s (trial 4)`."""
    if effort is None or not effort.ran or effort.share is None:
        return None
    yours = next((b.global_batch for b in effort.batches if b.yours), None)
    raced = [str(b.global_batch) for b in effort.batches if b.raced]
    where = f"your global batch {yours}" if yours is not None else "your global batch"
    text = f"{effort.ran} trials ran, {effort.share:.0%} at {where}"
    text += f" or one that raced ({', '.join(raced)})" if raced else ""
    if effort.best_is_yours:
        text += f"; nothing at {yours} beat your configuration"
    elif effort.best_at_yours is not None and effort.best_at_yours_speedup:
        text += (
            f"; the best at {yours}: {effort.best_at_yours_speedup:.2f}x your samples/s "
            f"(trial {effort.best_at_yours})"
        )
    return text


def reproduce_command(settings: TuneSettings) -> str:
    """The `advisor tune` command line for these settings (defaults left out; a storage
    password masked)."""
    parts = ["advisor", "tune", settings.spec]
    for name, value in settings.model_dump(mode="json", exclude_defaults=True).items():
        if name == "spec":
            continue
        shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if name == "storage":  # the password stays out: the user types it in again
            shown = mask_url(shown)
        parts += [f"--{name.replace('_', '-')}", shown]
    return shlex.join(parts)


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def _parallel_rows(layouts: tuple[LayoutBest, ...]) -> list[dict[str, object]]:
    """Each layout's best trial and its ratio to the best single-process trial, on re-runs
    where both were re-measured, else on their search windows; a layout over N machines also
    against N times its one-machine counterpart (linear scaling)."""
    single = next((b for b in layouts if b.parallel == "none" and b.samples_per_s), None)
    by_layout = {best.parallel: best for best in layouts}
    rows: list[dict[str, object]] = []
    for best in layouts:
        ratio, basis = _ratio(best, single)
        rows.append(
            {"best": best, "ratio": ratio, "basis": basis, "linear": _linear(best, by_layout)}
        )
    return rows


def _ratio(best: LayoutBest, other: LayoutBest | None) -> tuple[float | None, str | None]:
    if other and other.rerun_samples_per_s and best.rerun_samples_per_s:
        return best.rerun_samples_per_s / other.rerun_samples_per_s, "re-runs"
    if other and other.samples_per_s and best.samples_per_s:
        return best.samples_per_s / other.samples_per_s, "search windows"
    return None, None


def _linear(best: LayoutBest, by_layout: dict[str, LayoutBest]) -> dict[str, object] | None:
    """Over N machines: the share of N x its one-machine counterpart's samples/s it reached."""
    nodes = parse_parallel(best.parallel).nodes
    if nodes == 1:
        return None
    alone = on_one_machine(best.parallel)
    ratio, basis = _ratio(best, by_layout.get(alone))
    if ratio is None:
        return None
    return {
        "nodes": nodes,
        "alone": alone,
        "efficiency": ratio / nodes,
        "basis": basis,
    }


def _pruned_rows(pruned: tuple[PrunedProposal, ...]) -> list[tuple[str, str]]:
    """(reason, the proposal numbers) for the proposals not run, grouped by reason."""
    by_reason: dict[str, list[int]] = defaultdict(list)
    for proposal in pruned:
        by_reason[proposal.reason].append(proposal.number)
    return [(reason, ", ".join(map(str, numbers))) for reason, numbers in by_reason.items()]


def _measured(trials: tuple[TrialRecord, ...]) -> int:
    return sum(t.role != "duplicate" for t in trials)


def _counts(trials: tuple[TrialRecord, ...]) -> str:
    measured = [t for t in trials if t.role != "duplicate"]
    by_status = Counter("infeasible" if t.infeasible_reason else t.result.status for t in measured)
    parts = ", ".join(f"{n} {status}" for status, n in by_status.most_common())
    duplicates = len(trials) - len(measured)
    proposals = "proposal was" if duplicates == 1 else "proposals were"
    repeated = (
        f"; {duplicates} repeated {proposals} answered from earlier trials" if duplicates else ""
    )
    noun = "configuration" if len(measured) == 1 else "configurations"
    return f"{len(measured)} {noun} measured: {parts}{repeated}."


def render_trials_csv(result: TuneResult) -> str:
    """trials.csv: one row per trial and re-run, every knob and measurement a column."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(
        [
            "number",
            "role",
            "stage",
            *CSV_CONFIG_FIELDS,
            *CSV_RESULT_FIELDS,
            "samples_ratio",
            "goodput",
            "infeasible_reason",
            "round",
            "outside_cores",
            "steal_share",
        ]
    )
    for record in (*result.trials, *result.confirmations):
        config = record.result.config
        writer.writerow(
            [
                record.number,
                record.role,
                record.stage or "",
                *(getattr(config, name) for name in CSV_CONFIG_FIELDS),
                *(getattr(record.result, name) for name in CSV_RESULT_FIELDS),
                record.samples_ratio,
                record.goodput,
                record.infeasible_reason or "",
                record.round or "",
                *_load_cells(record.result.load),
            ]
        )
    return buffer.getvalue()


def _load_cells(load: MachineLoad | None) -> tuple[str, str]:
    """trials.csv's load columns: the cores other programs used, the share stolen."""
    if load is None:
        return "", ""
    return f"{load.outside_cores:.2f}", f"{load.steal_share:.3f}"
