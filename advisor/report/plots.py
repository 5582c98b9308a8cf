"""The HTML report's figures as inline SVG: matplotlib without pyplot, no files, no network."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from collections.abc import Sequence

import matplotlib
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, ScalarFormatter

from advisor.results import Racer, RaceSummary, ScheduleSummary, TrialRecord

__all__ = [
    "batch_amp_svg",
    "curves_svg",
    "history_svg",
    "importance_svg",
    "memory_svg",
    "race_svg",
    "schedule_svg",
]

SIZE = (6.4, 3.2)
NO_METADATA = {"Date": None, "Creator": None, "Type": None, "Format": None}
XMLNS = re.compile(r'\s+xmlns(:\w+)?="[^"]*"')
FAILED_COLOR = "#c0392b"


def history_svg(trials: tuple[TrialRecord, ...]) -> str | None:
    """Samples/s of every measured trial in order, failed ones at 0, and the best so far."""
    measured = [t for t in trials if t.role != "duplicate"]
    if not measured:
        return None
    figure, axes = _figure("trial", "samples/s")
    ok = [t for t in measured if t.eligible and t.result.samples_per_s]
    failed = [t for t in measured if not t.eligible]
    axes.scatter([t.number for t in ok], [t.result.samples_per_s for t in ok], label="trial")
    if failed:
        axes.scatter(
            [t.number for t in failed],
            [0] * len(failed),
            marker="x",
            color=FAILED_COLOR,
            label="failed or infeasible",
        )
    best, steps = 0.0, []
    for trial in measured:
        if trial.eligible and trial.result.samples_per_s:
            best = max(best, trial.result.samples_per_s)
        steps.append(best)
    axes.step([t.number for t in measured], steps, where="post", label="best so far")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.legend(loc="lower right", fontsize="small")
    return _svg(figure)


def batch_amp_svg(trials: tuple[TrialRecord, ...]) -> str | None:
    """The best samples/s at each batch size, one line per AMP setting."""
    best: dict[str, dict[int, float]] = defaultdict(dict)
    for trial in trials:
        rate = trial.result.samples_per_s
        if trial.role == "duplicate" or not trial.eligible or not rate:
            continue
        config = trial.result.config
        by_batch = best[config.amp]
        by_batch[config.batch_size] = max(rate, by_batch.get(config.batch_size, 0.0))
    if not best:
        return None
    figure, axes = _figure("batch size (per process)", "best samples/s")
    for amp, by_batch in sorted(best.items()):
        sizes = sorted(by_batch)
        axes.plot(sizes, [by_batch[s] for s in sizes], marker="o", label=f"amp={amp}")
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(ScalarFormatter())  # 64, not 2^6
    axes.legend(fontsize="small")
    return _svg(figure)


def memory_svg(
    trials: tuple[TrialRecord, ...], chosen: int, budget: int | None = None
) -> str | None:
    """Samples/s against peak memory; the recommended trial marked, and with `--memory-budget`
    the budget and the trials over it."""
    ran = [
        t
        for t in trials
        if t.role != "duplicate" and t.result.feasible and t.result.samples_per_s
        if t.result.peak_memory_bytes
    ]
    points = [t for t in ran if t.eligible]
    over = [t for t in ran if budget is not None and (t.result.peak_memory_bytes or 0) > budget]
    if not points and not over:
        return None
    figure, axes = _figure("peak memory (MiB)", "samples/s")

    def mib(records: list[TrialRecord]) -> list[float]:
        return [(t.result.peak_memory_bytes or 0) / 2**20 for t in records]

    def rates(records: list[TrialRecord]) -> list[float]:
        return [t.result.samples_per_s or 0.0 for t in records]

    axes.scatter(mib(points), rates(points), label="trial")
    if budget is not None:
        axes.axvline(budget / 2**20, color="grey", linestyle="--", label="memory budget")
        if over:
            axes.scatter(mib(over), rates(over), marker="x", color="red", label="over the budget")
    mine = [t for t in points if t.number == chosen]
    if mine:
        axes.scatter(
            mib(mine), rates(mine), s=160, facecolors="none", edgecolors="black",
            label=f"recommended (trial {chosen})",
        )  # fmt: skip
    axes.legend(fontsize="small")
    return _svg(figure)


def importance_svg(importances: dict[str, float]) -> str | None:
    """Optuna's parameter importances as horizontal bars."""
    if not importances:
        return None
    figure, axes = _figure("importance for samples/s (normalised to sum to 1)", "")
    names = list(importances)[::-1]
    axes.barh(names, [importances[name] for name in names])
    return _svg(figure)


def _figure(xlabel: str, ylabel: str):  # type: ignore[no-untyped-def]
    figure = Figure(figsize=SIZE, layout="constrained")
    axes = figure.subplots()
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    return figure, axes


def _svg(figure: Figure) -> str:
    """The figure as an <svg> element for HTML5: text stays text (small, searchable), and the
    XML namespace declarations go, since the HTML parser knows them (no URL in the report)."""
    buffer = io.StringIO()
    # A fixed salt makes the SVG ids, and so re-rendered reports, identical run to run.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "advisor"}):
        figure.savefig(buffer, format="svg", metadata=NO_METADATA)
    text = buffer.getvalue()
    return XMLNS.sub("", text[text.index("<svg") :])


def race_svg(race: RaceSummary | None) -> str | None:
    """Every racer's loss against training time, with the target loss."""
    if race is None:
        return None
    return curves_svg(race.racers, race.winner, race.target_loss, race.loss_kind)


def schedule_svg(summary: ScheduleSummary | None) -> str | None:
    """The schedule race's losses against training time, with the target loss."""
    if summary is None or not summary.racers:
        return None
    kind = next((r.curve.loss_kind for r in summary.racers if r.curve), "train")
    return curves_svg(summary.racers, summary.shipped, summary.target_loss, kind)


def curves_svg(
    racers: Sequence[Racer], winner: int | None, target: float | None, loss_kind: str
) -> str | None:
    """Each racer's loss against training time; the winner's line bold, the target dashed. A
    racer's later replicates share its colour, faint and out of the legend (six replicates of
    seven racers would crowd the plot out)."""
    if not any(r.curve for r in racers):
        return None
    figure, axes = _figure("training time (s)", f"{loss_kind} loss")
    colours: dict[object, str] = {}
    for index, racer in enumerate(racers):
        if racer.curve is None:
            continue
        points = racer.curve.points
        key = (racer.entrant, racer.schedule)  # a schedule race's racers share an entrant
        first = key not in colours
        label = _curve_label(racer) + (" (winner)" if index == winner else "")
        [line] = axes.plot(
            [p.seconds for p in points],
            [p.loss for p in points],
            marker="o",
            markersize=2.5 if first else 1.5,
            linewidth=2.5 if index == winner else 1.2 if first else 0.8,
            alpha=1.0 if first else 0.4,
            color=colours.get(key),
            label=label if first else None,
        )
        colours.setdefault(key, line.get_color())
    if target is not None:
        axes.axhline(target, color="#888", linestyle="--", linewidth=0.8)
    axes.set_yscale("log")
    axes.legend(loc="upper right", fontsize="x-small")
    return _svg(figure)


def _curve_label(racer: Racer) -> str:
    if racer.schedule is not None:
        batches = "→".join(str(b) for b in racer.schedule.global_batches(racer.config.world_size))
        lr = "your lr" if racer.schedule.rule == "yours" else f"{racer.schedule.rule} rule"
        return f"schedule bs {batches}, {lr}"
    label = f"bs {racer.config.global_batch_size}, {racer.lr.label}"
    return f"yours: {label}" if racer.role == "baseline" else label
