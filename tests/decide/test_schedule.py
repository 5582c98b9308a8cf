"""The batch-size schedule (`--schedule auto`): stages that follow phi by the goodput rule, the
verdict that ships one only when it beats the fixed recommendation by more than the noise, and a
schedule race (answered in-process by a scripted runner) that an interrupt leaves with its
finished racers."""

import math
from pathlib import Path

import optuna
import pytest

from advisor.decide.race.schedule import (
    StageOption,
    decide_schedule,
    follow_noise,
    make_schedules,
    stage_options,
    tune_schedule,
)
from advisor.knobs import TrialConfig
from advisor.report.verdicts import schedule_verdict
from advisor.results import (
    BatchSchedule,
    GradientNorms,
    LrPlan,
    NoisePoint,
    NoiseProbe,
    NoiseTrack,
    RaceCurve,
    RacePoint,
    Racer,
    ScheduleStage,
    ScheduleSummary,
    TrialRecord,
    TrialResult,
)
from advisor.search.context import SearchContext
from advisor.search.records import StudyKey, read_racers
from advisor.settings import TuneSettings
from advisor.trial.child.racing import probe_due
from advisor.trial.orders import RaceOrder
from tests.scripted_runner import TASK, ScriptedRunner, scripted_context
from tests.search.interrupts import StopAfterFirstRacer

BASE = TrialConfig(batch_size=32)


def _options(rates: dict[int, float]) -> dict[int, StageOption]:
    return {b: StageOption(BASE.model_copy(update={"batch_size": b}), r) for b, r in rates.items()}


def _track(*phis: float, step: int = 10_000) -> NoiseTrack:
    return NoiseTrack(
        points=tuple(
            NoisePoint(
                seconds=i, samples=i * step, loss=1.0, value=phi, low=phi / 2, high=phi * 1.5
            )
            for i, phi in enumerate(phis)
        )
    )


def test_the_stages_follow_phi_by_goodput_and_never_shrink():
    """Goodput, samples/s / (phi + B): at phi 20 batch 32 has the most (1000/52 > 1500/84);
    at phi 400, 128 (2500/528); a later dip in phi does not take the batch back down."""
    options = _options({32: 1000.0, 64: 1500.0, 128: 2500.0, 256: 3000.0})
    starts = follow_noise(_track(20, 20, 400, 100, 400), options, 32)
    assert starts == [(0, 32), (20_000, 128)]


def test_the_first_stage_is_the_race_pick_whatever_phi_at_the_start_says():
    """phi at the initial weights gives 256 the most goodput, but the race showed your batch
    holds the first seconds: the schedule grows from it at the first later point."""
    options = _options({32: 1000.0, 64: 1500.0, 128: 2500.0, 256: 3000.0})
    assert follow_noise(_track(5000), options, 32) == [(0, 32)]
    assert follow_noise(_track(5000, 5000), options, 32) == [(0, 32), (10_000, 256)]


def test_the_stages_start_at_the_steps_their_samples_give_and_carry_both_lr_rules():
    options = _options({32: 1000.0, 128: 2500.0, 512: 4000.0})
    yours, rule = make_schedules([(0, 32), (3200, 128), (16_000, 512)], options, 32, "AdamW")
    # 3,200 samples at 32 a step: step 100; then 12,800 more at 128: step 200.
    assert [s.from_step for s in yours.stages] == [0, 100, 200]
    assert [s.batch_size for s in yours.stages] == [32, 128, 512]
    assert {s.lr_scale for s in yours.stages} == {1.0} and yours.rule == "yours"
    assert [s.lr_scale for s in rule.stages] == [1.0, 2.0, 4.0] and rule.rule == "sqrt"


def test_stage_options_keep_the_base_knobs_and_the_fastest_layout():
    def record(number: int, rate: float, **config) -> TrialRecord:
        result = TrialResult(config=TrialConfig(**config), status="ok", samples_per_s=rate)
        return TrialRecord(number=number, role="search", result=result)

    options = stage_options(
        [
            record(0, 1000.0, batch_size=32),
            record(1, 1800.0, batch_size=32, accumulation_steps=4),
            record(2, 2500.0, batch_size=128),
            record(3, 9000.0, batch_size=128, amp="bf16"),  # other knobs: not a stage
            record(4, 500.0, batch_size=16),  # smaller than the base: not a stage
        ],
        BASE,
    )
    assert {b: o.samples_per_s for b, o in options.items()} == {32: 1000.0, 128: 2500.0}


def _racer(role: str, times: list[tuple[float, float]], schedule=None) -> Racer:
    points = tuple(RacePoint(seconds=s, samples=0, steps=0, loss=loss) for s, loss in times)
    result = TrialResult(
        config=BASE, status="ok", race=RaceCurve(loss_kind="held-out", points=points)
    )
    return Racer(
        role=role, config=BASE, lr=LrPlan(), schedule=schedule, race_seconds=60, result=result
    )


SCHEDULE = BatchSchedule(
    stages=(
        ScheduleStage(from_step=0, batch_size=32, accumulation_steps=1),
        ScheduleStage(from_step=100, batch_size=128, accumulation_steps=1),
    ),
    rule="yours",
)


@pytest.mark.parametrize(("schedule_at", "ships"), [(30.0, True), (45.0, False)])
def test_a_schedule_ships_only_if_it_beats_the_fixed_one_by_the_margin(schedule_at, ships):
    """The baseline reaches 1.0 at 60 s, the fixed recommendation at 50 s: a schedule there at
    30 s ships; at 45 s it is within the 15 % margin and does not."""
    racers = [
        _racer("baseline", [(0, 2.0), (60, 1.0)]),
        _racer("fixed", [(0, 2.0), (50, 1.0)]),
        _racer("schedule", [(0, 2.0), (schedule_at, 1.0)], SCHEDULE),
    ]
    shipped, target, timed, verdict = decide_schedule(racers)
    assert target == 1.0 and timed[1].time_to_target_s == pytest.approx(50.0)
    assert (shipped == 2) is ships, verdict
    assert verdict.kind == ("ships" if ships else "not-by-margin")
    worded = schedule_verdict(_summary(timed, shipped, target, verdict), None)
    assert ("it ships" in worded) is ships


# A regression whose noise scale grows as it converges, as tests/workloads/convergence.py's
# noise_grows: the loss is 1 (the label noise) plus |w - w*|^2, 100 from the zero weights, and at
# w phi is about d + 1 + sigma^2 d / |w - w*|^2 with d = 16 features: 17 at the start, 177 at
# |w - w*|^2 = 0.1. Samples/s at each global batch are those the search measured.
RATES = {32: 20_000.0, 64: 35_000.0, 128: 55_000.0, 256: 75_000.0, 512: 90_000.0}
START_DISTANCE = 100.0
STEP_GAIN = 0.014  # of |w - w*|^2 a step at the user's lr takes away, at B / (B + phi) = 1
PROBE_MICRO = 8  # a probe's big batch, in micro-batches


def _noise_scale(distance: float) -> float:
    return 17.0 + 16.0 / distance


class NoiseGrowsRunner(ScriptedRunner):
    """A scripted runner that trains the regression step by step: each step takes its global
    batch's share of a second at that batch's samples/s and takes `STEP_GAIN` x lr x B / (B +
    phi) of |w - w*|^2 away (a batch far above phi gains little more per step); a schedule
    changes B and the lr at its stages' steps; a tracked race probes phi at its start and at
    `TRACK_POINTS` even shares of the run, as a trial child does."""

    def __init__(self) -> None:
        super().__init__(rate=lambda config: RATES[config.global_batch_size])

    def _race(self, order: RaceOrder) -> TrialResult:
        grid = iter(order.grid)
        due = next(grid)
        seconds, samples, steps, distance = 0.0, 0, 0, START_DISTANCE
        points = [RacePoint(seconds=0.0, samples=0, steps=0, loss=1.0 + distance)]
        probes = [_probe(points[0], distance, order.config)] if order.track_noise else []
        while True:
            stage = order.schedule.stage_at(steps) if order.schedule else None
            batch = order.config.global_batch_size
            if stage is not None:
                batch = stage.batch_size * stage.accumulation_steps * order.config.world_size
            lr = order.lr.scale * (stage.lr_scale if stage else 1.0)
            seconds += batch / RATES[batch]
            samples, steps = samples + batch, steps + 1
            distance *= math.exp(-STEP_GAIN * lr * batch / (batch + _noise_scale(distance)))
            if samples < due and seconds < order.seconds:
                continue
            while due <= samples:  # the grid's next count past the samples trained on
                due = next(grid, math.inf)
            point = RacePoint(seconds=seconds, samples=samples, steps=steps, loss=1.0 + distance)
            points.append(point)
            probe_at = probe_due(len(probes), order.seconds)
            if order.track_noise and seconds >= probe_at:
                probes.append(_probe(point, distance, order.config))
            reached = order.target is not None and point.loss <= order.target
            if seconds >= order.seconds or reached or due == math.inf:
                break
        curve = RaceCurve(
            loss_kind="held-out", lr=order.lr, points=tuple(points), noise_probes=tuple(probes)
        )
        return TrialResult(config=order.config, status="ok", task=TASK, race=curve)


def _probe(point: RacePoint, distance: float, config: TrialConfig) -> NoiseProbe:
    """Squared gradient norms at one micro-batch and at `PROBE_MICRO` of them: |G|^2 = 1 and
    tr(Sigma) = phi, give or take a tenth from one group to the next."""
    small, big, phi = config.batch_size, config.batch_size * PROBE_MICRO, _noise_scale(distance)
    wobble = [0.1 * (-1) ** i for i in range(16)]
    norms = GradientNorms(
        small_batch=small,
        big_batch=big,
        small_sq=tuple(1.0 + phi * (1 + w) / small for w in wobble),
        big_sq=tuple(1.0 + phi * (1 + w) / big for w in wobble),
    )
    return NoiseProbe(seconds=point.seconds, samples=point.samples, loss=point.loss, norms=norms)


def _context(tmp_path: Path, progress: StopAfterFirstRacer) -> SearchContext:
    settings = TuneSettings(
        spec="train.py:task", schedule="auto", schedule_seconds=2.0, max_world_size=1, out=tmp_path
    )
    return scripted_context(settings, NoiseGrowsRunner(), tmp_path, progress=progress)


def _search_records() -> list[TrialRecord]:
    """Throughput the search measured on the regression (`RATES`)."""
    return [
        TrialRecord(
            number=i,
            role="search",
            result=TrialResult(config=TrialConfig(batch_size=b), status="ok", samples_per_s=rate),
        )
        for i, (b, rate) in enumerate(RATES.items())
    ]


def test_an_interrupted_schedule_race_keeps_its_finished_racers(tmp_path):
    """A schedule race on a regression whose phi grows: stopped after the tracked baseline, the
    study keeps it; resumed, only the schedule's two racers run."""
    storage = f"sqlite:///{tmp_path}/study.db"
    study = optuna.create_study(storage=storage, study_name="schedule")
    args = (BASE, (BASE, LrPlan()), _search_records(), "SGD")
    with pytest.raises(KeyboardInterrupt):
        tune_schedule(study, _context(tmp_path, StopAfterFirstRacer()), *args)
    study = optuna.load_study(storage=storage, study_name="schedule")
    [kept] = read_racers(study, StudyKey.SCHEDULE_RACERS)
    assert kept.role == "baseline" and kept.curve is not None and kept.curve.noise_probes

    resumed = StopAfterFirstRacer()
    resumed.started.append("(already stopped once)")
    context = _context(tmp_path, resumed)
    summary = tune_schedule(study, context, *args)
    assert summary.track is not None and summary.track.grew, summary.verdict
    # The fixed recommendation is your configuration: your run is its run.
    assert [r.role for r in summary.racers] == ["baseline", "schedule", "schedule"]
    assert len(resumed.started) == 1 + 2  # the two schedule racers
    assert [o.schedule for o in context.runner.orders] == [r.schedule for r in summary.racers[1:]]
    assert summary.racers[0].curve == kept.curve
    assert len(read_racers(study, StudyKey.SCHEDULE_RACERS)) == 3
    schedules = [r.schedule for r in summary.racers[1:]]
    assert schedules[0].rule == "yours" and schedules[1].rule == "linear"
    assert all(len(s.stages) >= 2 for s in schedules)


def test_a_schedule_stopped_before_your_loss_does_not_ship_and_says_what_it_had_to_beat():
    racers = [
        _racer("baseline", [(0, 2.0), (30, 1.0)]),
        _racer("fixed", [(0, 2.0), (8.8, 1.0)]),
        _racer("schedule", [(0, 2.0), (7.5, 1.2)], SCHEDULE),  # stopped at 0.85 x 8.8 s
    ]
    shipped, target, timed, verdict = decide_schedule(racers)
    assert shipped is None and verdict.kind == "none-reached"
    worded = schedule_verdict(_summary(timed, shipped, target, verdict), None)
    assert "more than 15% sooner than the fixed recommendation" in worded
    assert "which took 8.8 s: none ships" in worded


def _summary(racers, shipped, target, verdict) -> ScheduleSummary:
    """A schedule's tune that decided `verdict` on `racers`, as the reports see it."""
    return ScheduleSummary(
        seconds=60, track=None, racers=racers, target_loss=target, shipped=shipped,
        verdict=verdict,
    )  # fmt: skip
