"""What the reports say about the batch-size schedule (`--schedule auto`): phi along the run, the
schedule race and its verdict; pure functions of a `ScheduleSummary`, shared by report.md and
report.html."""

from __future__ import annotations

from dataclasses import dataclass

from advisor.report.verdicts import ROLE_WORDS, schedule_rule, schedule_verdict
from advisor.results import NoisePoint, NoiseTrack, Racer, RaceSummary, ScheduleSummary

__all__ = [
    "NoiseRow",
    "ScheduleRow",
    "ScheduleView",
    "StageRow",
    "schedule_headline",
    "schedule_view",
]


@dataclass(frozen=True)
class NoiseRow:
    """phi at one point of the tracked run, formatted."""

    seconds: str
    samples: str
    loss: str
    phi: str


@dataclass(frozen=True)
class ScheduleRow:
    """One racer of the schedule race, formatted."""

    label: str
    role: str
    reaches: str
    final_loss: str
    shipped: bool


@dataclass(frozen=True)
class StageRow:
    """One stage of the shipped schedule."""

    from_step: int
    global_batch: int
    batch_size: int
    accumulation_steps: int
    lr_scale: str


@dataclass(frozen=True)
class ScheduleView:
    """The schedule's section of a report, ready to render."""

    headline: str | None  # where a schedule ships
    verdict: str
    growth: str
    noise_rows: tuple[NoiseRow, ...]
    rule: str
    rows: tuple[ScheduleRow, ...]
    stages: tuple[StageRow, ...]
    cost: str


def schedule_view(summary: ScheduleSummary, race: RaceSummary | None) -> ScheduleView:
    """The schedule's section of a report; `race` is the race before it."""
    shipped = summary.shipped_racer
    stages: tuple[StageRow, ...] = ()
    if shipped is not None and shipped.schedule is not None:
        world = shipped.config.world_size
        stages = tuple(
            StageRow(
                from_step=stage.from_step,
                global_batch=stage.batch_size * stage.accumulation_steps * world,
                batch_size=stage.batch_size,
                accumulation_steps=stage.accumulation_steps,
                lr_scale=f"{stage.lr_scale:.3g}",
            )
            for stage in shipped.schedule.stages
        )
    return ScheduleView(
        headline=schedule_headline(summary),
        verdict=schedule_verdict(summary, race),
        growth=growth_text(summary.track),
        noise_rows=tuple(
            _noise_row(point) for point in (summary.track.points if summary.track else ())
        ),
        rule=schedule_rule(summary),
        rows=tuple(
            _row(racer, index == summary.shipped) for index, racer in enumerate(summary.racers)
        ),
        stages=stages,
        cost=f"{summary.cost_s:.0f} s" if summary.cost_s else "nothing",
    )


def schedule_headline(summary: ScheduleSummary) -> str | None:
    """What a shipped schedule gains, in a sentence; None where none ships."""
    shipped = summary.shipped_racer
    if shipped is None or shipped.schedule is None:
        return None
    gain = f" {summary.speedup:.2f}x sooner than" if summary.speedup else " sooner than"
    return (
        f"a batch-size schedule ({shipped.label}) reaches your {summary.seconds:g}-s loss{gain} "
        "the fixed configuration below; train.py trains it"
    )


def growth_text(track: NoiseTrack | None) -> str:
    """Whether and how much phi grew along the run, in a sentence."""
    if track is None or len(track.measured) < 2:
        return "the noise scale was not measured along your run"
    first, last = track.measured[0], track.measured[-1]
    span = f"from {_phi(first)} at the start to {_phi(last)} after {last.seconds:.0f} s"
    if track.grew:
        return f"the noise scale grew along your run, {span}"
    return f"the noise scale did not grow beyond its noise along your run ({span})"


def _phi(point: NoisePoint) -> str:
    if point.value is None:
        return "no signal above the noise"
    interval = (
        f" [{point.low:,.0f}, {point.high:,.0f}]"
        if point.low is not None and point.high is not None
        else ""
    )
    return f"{point.value:,.0f}{interval}"


def _noise_row(point: NoisePoint) -> NoiseRow:
    return NoiseRow(
        seconds=f"{point.seconds:.1f}",
        samples=f"{point.samples:,}",
        loss=f"{point.loss:.4g}" if point.loss is not None else "–",
        phi=_phi(point),
    )


def _row(racer: Racer, shipped: bool) -> ScheduleRow:
    curve = racer.curve
    if racer.time_to_target_s is not None:
        reaches = f"{racer.time_to_target_s:.1f} s"
    elif curve is None:
        reaches = f"failed: {racer.result.reason or racer.result.status}"
    else:
        reaches = f"not within {curve.points[-1].seconds:.1f} s"
    return ScheduleRow(
        label=racer.label,
        role=ROLE_WORDS[racer.role],
        reaches=reaches,
        final_loss=f"{curve.final_loss:.4g}" if curve else "–",
        shipped=shipped,
    )
