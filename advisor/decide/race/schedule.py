"""The batch-size schedule (`--schedule auto`; docs/method.md, "The batch-size schedule").

The race judges global batches over its first seconds from the initial weights, where the
critical batch is smallest; the gradient noise scale phi grows as the loss falls (McCandlish et
al. 2018), so later in a run a larger batch is worth more per sample. After the race:

1. the baseline trains for `schedule_seconds` from the seeded weights, with phi measured at its
   start and along the run (a tracked race); its lowest loss is the target;
2. where phi grew beyond its noise, a schedule follows it (`follow_noise`): it starts with the
   base configuration (the race's pick at the user's batch, which the race showed holds the
   first seconds); at each later measured point, the global batch with the most goodput,
   samples/s / (phi + B) (AdaptDL's rule, with the noise scale's statistical efficiency),
   among the batches measured with the base configuration's knobs, where it is larger than
   the stage before; a stage starts where its batch first wins, after as many samples as the
   baseline had trained there;
3. the fixed recommendation and the schedule, once with the user's learning rate and once with
   the optimizer family's rule at each stage, race to the target from the same weights. The
   schedule ships only if it reaches the target sooner by more than `SCHEDULE_MARGIN` at every
   loss the verdict checks (`RaceCurve.target_losses`); otherwise the report says it did not.
   Each racer is evaluated at the same sample counts (`advisor.decide.race.grid`). The
   schedule's racers train at samples/s that change from stage to stage, so, unlike the race's
   verdict, this one reads time from their own clock, in one replicate, with the margin that
   covers that clock's noise.

Each racer is stored as it finishes, so an interrupted tune keeps it and a resumed one does not
race it again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna

from advisor.decide.race.grid import sample_grid
from advisor.decide.race.plan import lr_rule
from advisor.decide.race.schedule_verdict import (
    SCHEDULE_MARGIN,
    decide_schedule,
    fixed_racer,
    time_to_loss,
)
from advisor.knobs import TrialConfig
from advisor.noise_scale import noise_track
from advisor.progress import Stage
from advisor.results import (
    BatchSchedule,
    LrPlan,
    LrRule,
    NoiseTrack,
    Racer,
    RacerRole,
    ScheduleStage,
    ScheduleSummary,
    ScheduleVerdict,
    TrialRecord,
    TrialResult,
)
from advisor.search.context import SearchContext
from advisor.search.records import (
    StudyKey,
    read_options,
    read_racers,
    write_option,
    write_racer,
)
from advisor.trial.orders import TRACK_POINTS, RaceOrder, WindowOrder

__all__ = [
    "GROWTH",
    "StageOption",
    "decide_schedule",
    "fixed_racer",
    "follow_noise",
    "make_schedules",
    "schedule_bound",
    "stage_options",
    "tune_schedule",
]

GROWTH = (2, 4, 8, 16)  # global batches a schedule may grow to, times the base's
_LAYOUT = frozenset({"batch_size", "accumulation_steps"})


def schedule_bound(seconds: float) -> float:
    """About the most a schedule's tune takes with a horizon of `seconds`: your run with its
    probes, a throughput trial per missing batch, the fixed recommendation and two schedules
    (each stopped at your loss or once it can no longer win), and their start-ups."""
    probes = (1 + TRACK_POINTS) * max(0.05 * seconds, 1.0)
    return 4 * seconds + probes + len(GROWTH) * 10.0 + 4 * 10.0


@dataclass(frozen=True)
class StageOption:
    """A global batch a stage can train at: its fastest measured layout with the base knobs."""

    config: TrialConfig
    samples_per_s: float


def stage_options(records: Sequence[TrialRecord], base: TrialConfig) -> dict[int, StageOption]:
    """For each global batch from the base's up, the fastest eligible search trial whose knobs,
    all but micro-batch and accumulation, are the base's: a stage changes only those."""
    knobs = base.model_dump(exclude=set(_LAYOUT))
    options: dict[int, StageOption] = {}
    for record in records:
        config, rate = record.result.config, record.result.samples_per_s
        if record.role not in ("baseline", "search") or not record.eligible or not rate:
            continue
        batch = config.global_batch_size
        if batch < base.global_batch_size or config.model_dump(exclude=set(_LAYOUT)) != knobs:
            continue
        if batch not in options or rate > options[batch].samples_per_s:
            options[batch] = StageOption(config, rate)
    return options


def follow_noise(
    track: NoiseTrack, options: Mapping[int, StageOption], first: int
) -> list[tuple[int, int]]:
    """(samples, global batch) where each stage starts: the first at 0 samples with batch
    `first` (the race measured the first seconds: its pick there holds them), then at each
    later measured point of the track the option with the most goodput at that phi, where it
    is larger than the stage before; one entry per change of batch."""
    stages = [(0, first)]
    for point in track.measured:
        if point.samples == 0 or not options:
            continue
        phi = point.value or 0.0
        best = max(options, key=lambda b: options[b].samples_per_s / (phi + b))
        if best > stages[-1][1]:
            stages.append((point.samples, best))
    return stages


def make_schedules(
    starts: Sequence[tuple[int, int]],
    options: Mapping[int, StageOption],
    batch0: int,
    optimizer_class: str | None,
) -> tuple[BatchSchedule, BatchSchedule]:
    """The stages at their optimizer steps (the samples before a stage's start, at the earlier
    stages' batches), twice: with the user's learning rate throughout, and with the optimizer
    family's rule at each stage's batch (`lr_rule`)."""
    steps, previous = [0], starts[0]
    for start in starts[1:]:
        steps.append(steps[-1] + math.ceil((start[0] - previous[0]) / previous[1]))
        previous = start
    schedules = []
    for rule in ("yours", "rule"):
        stages = []
        rules: list[LrRule] = []
        for step, (_, batch) in zip(steps, starts, strict=True):
            plan = lr_rule(optimizer_class, batch0, batch) if rule == "rule" else LrPlan()
            rules.append(plan.rule)
            config = options[batch].config
            stages.append(
                ScheduleStage(
                    from_step=step,
                    batch_size=config.batch_size,
                    accumulation_steps=config.accumulation_steps,
                    lr_scale=plan.scale,
                )
            )
        named: LrRule = next((r for r in rules if r != "yours"), "yours")
        schedules.append(BatchSchedule(stages=tuple(stages), rule=named))
    return schedules[0], schedules[1]


def tune_schedule(
    study: optuna.Study,
    context: SearchContext,
    base: TrialConfig,
    fixed: tuple[TrialConfig, LrPlan],
    records: Sequence[TrialRecord],
    optimizer_class: str | None,
) -> ScheduleSummary:
    """Track phi along the baseline's long run, follow it with a schedule from `base` (the best
    configuration at the user's batch), and race that against the `fixed` recommendation."""
    started = time.perf_counter()
    seconds = context.settings.schedule_seconds
    baseline = context.space.baseline
    race = _ScheduleRace(study, context, seconds, _schedule_grid(records, base, seconds))
    if baseline.world_size > 1:
        processes = ScheduleVerdict(kind="processes", processes=baseline.world_size)
        return race.summary(None, processes)
    context.progress.stage(Stage(kind="schedule-tracks", seconds=seconds))
    reference = race.run(RacerRole.BASELINE, baseline, LrPlan(), track=True)
    track = noise_track(reference.curve) if reference.curve is not None else None
    why = _why_no_schedule(reference, track)
    if why is not None or track is None:
        return race.summary(track, why, started)
    options = race.measure_options(base, stage_options(records, base))
    known = options.get(base.global_batch_size)  # the first stage is the base, as raced
    options[base.global_batch_size] = StageOption(base, known.samples_per_s if known else 0.0)
    starts = follow_noise(track, options, base.global_batch_size)
    if len(starts) < 2:
        kept = ScheduleVerdict(kind="one-stage", batch=starts[0][1])
        return race.summary(track, kept, started)
    schedules = make_schedules(starts, options, baseline.global_batch_size, optimizer_class)
    _race_schedules(race, reference, base, fixed, schedules)
    return race.summary(track, None, started)


def _race_schedules(
    race: _ScheduleRace,
    reference: Racer,
    base: TrialConfig,
    fixed: tuple[TrialConfig, LrPlan],
    schedules: Sequence[BatchSchedule],
) -> None:
    """The fixed recommendation, then each schedule, to the reference's lowest loss; a
    schedule stops once it can no longer beat the fixed one by the margin."""
    assert reference.curve is not None
    target, seconds = reference.curve.best_loss, reference.race_seconds
    label = schedules[0].label(base.world_size)
    race.context.progress.stage(
        Stage(kind="schedule-races", label=label, seconds=seconds, loss=target)
    )
    # Where the fixed recommendation is your configuration, your run is its run too.
    same = fixed == (reference.config, LrPlan())
    kept = reference if same else race.run(RacerRole.FIXED, *fixed, target=target)
    rival = time_to_loss(kept.curve, target) if kept.curve else None
    limit = max(min(seconds, rival * (1 - SCHEDULE_MARGIN)), 0.05 * seconds) if rival else seconds
    for schedule in schedules:
        race.run(RacerRole.SCHEDULE, base, LrPlan(), target=target, schedule=schedule, limit=limit)


def _why_no_schedule(reference: Racer, track: NoiseTrack | None) -> ScheduleVerdict | None:
    if reference.curve is None:
        why = reference.result.reason or reference.result.status
        return ScheduleVerdict(kind="long-run-failed", reason=why)
    if not reference.curve.fell:
        return ScheduleVerdict(kind="did-not-fall")
    if track is None or len(track.measured) < 2:
        return ScheduleVerdict(kind="phi-unmeasured")
    if not track.grew:
        return ScheduleVerdict(kind="phi-flat")
    return None


class _ScheduleRace:
    """The schedule race's racers, run in fresh trial processes or read back from the study."""

    def __init__(
        self, study: optuna.Study, context: SearchContext, seconds: float, grid: tuple[int, ...]
    ) -> None:
        self._study = study
        self.context = context
        self._seconds = seconds
        self._grid = grid
        self._stored = read_racers(study, StudyKey.SCHEDULE_RACERS)
        self.racers: list[Racer] = []

    def run(
        self,
        role: RacerRole,
        config: TrialConfig,
        lr: LrPlan,
        *,
        track: bool = False,
        target: float | None = None,
        schedule: BatchSchedule | None = None,
        limit: float | None = None,
    ) -> Racer:
        key = (role, config, lr, schedule, self._seconds)
        earlier = next(
            (
                r
                for r in self._stored
                if (r.role, r.config, r.lr, r.schedule, r.race_seconds) == key
            ),
            None,
        )
        if earlier is None:
            earlier = self._race(role, config, lr, track, target, schedule, limit)
        return self.add(earlier)

    def measure_options(
        self, base: TrialConfig, options: dict[int, StageOption]
    ) -> dict[int, StageOption]:
        """`options` with the base's micro-batch times each of `GROWTH` where the search did not
        measure that global batch: a throughput trial each (stored), up to the first that
        fails (memory, or a dataset too small for it)."""
        stored = read_options(self._study)
        options = dict(options)
        for factor in GROWTH:
            batch = base.global_batch_size * factor
            if batch in options:
                continue
            config = base.model_copy(update={"batch_size": base.batch_size * factor})
            result = next((r for r in stored if r.config == config), None)
            if result is None:
                result = self._measure(config, batch)
            if not result.feasible or not result.samples_per_s:
                break
            options[batch] = StageOption(config, result.samples_per_s)
        return options

    def _measure(self, config: TrialConfig, batch: int) -> TrialResult:
        context = self.context
        context.progress.trial_started(f"schedule stage, global batch {batch}", config)
        result = context.runner.run(
            WindowOrder(config=config),
            context.logs_dir / f"schedule-stage-{batch}.log",
            on_phase=context.progress.trial_phase,
        )
        write_option(self._study, result)
        rate = f"{result.samples_per_s:,.0f} samples/s" if result.samples_per_s else None
        context.progress.stage(f"global batch {batch}: {rate or result.reason or result.status}")
        return result

    def add(self, racer: Racer) -> Racer:
        self.racers.append(racer)
        return racer

    def _race(
        self,
        role: RacerRole,
        config: TrialConfig,
        lr: LrPlan,
        track: bool,
        target: float | None,
        schedule: BatchSchedule | None,
        limit: float | None,
    ) -> Racer:
        context = self.context
        index = len(self.racers) + 1
        what = f"{role}: {schedule.label(config.world_size)}" if schedule else role
        context.progress.trial_started(f"schedule race {index}, {what}", config)
        order = RaceOrder(
            config=config,
            seconds=limit or self._seconds,
            lr=lr,
            target=target,
            in_a_row=1,  # its lowest loss: the verdict reads each crossing from the raw curve
            schedule=schedule,
            track_noise=track,
            grid=self._grid,
        )
        result = context.runner.run(
            order,
            context.logs_dir / f"schedule-race-{index}.log",
            on_phase=context.progress.trial_phase,
        )
        racer = Racer(
            role=role,
            config=config,
            lr=lr,
            schedule=schedule,
            race_seconds=self._seconds,
            result=result,
        )
        write_racer(self._study, racer, StudyKey.SCHEDULE_RACERS)  # an interrupt keeps it
        context.progress.racer_finished(racer)
        return racer

    def summary(
        self, track: NoiseTrack | None, why: ScheduleVerdict | None, started: float | None = None
    ) -> ScheduleSummary:
        """What the schedule's tune found: `why` none was raced, or the race's verdict."""
        cost = time.perf_counter() - started if started is not None else 0.0
        shipped, target, racers, verdict = (
            (None, None, tuple(self.racers), why)
            if why is not None
            else decide_schedule(self.racers)
        )
        return ScheduleSummary(
            seconds=self._seconds,
            track=track,
            racers=racers,
            target_loss=target,
            shipped=shipped,
            verdict=verdict,
            cost_s=cost,
        )


def _schedule_grid(
    records: Sequence[TrialRecord], base: TrialConfig, seconds: float
) -> tuple[int, ...]:
    """The schedule race's sample grid: from a share of what your configuration trains on in
    `seconds` to as far as the fastest search trial could."""
    rates = [r.result.samples_per_s or 0.0 for r in records if r.eligible]
    yours = next((r.result.samples_per_s for r in records if r.role == "baseline"), None)
    fastest = max(rates, default=0.0)
    return sample_grid(base.global_batch_size, (yours or fastest) * seconds, fastest * seconds)
