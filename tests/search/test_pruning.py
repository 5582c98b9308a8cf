"""Early stopping: Optuna's pruner stops trials projected far slower than the best, in any phase."""

from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from advisor.knobs import TrialConfig
from advisor.results import TrialResult
from advisor.search.pruning import CHECK_AFTER, SlowerThanBestPruner, stop_reason
from advisor.settings import TuneSettings
from advisor.trial.child.agreement import ParentWatch
from advisor.trial.orders import ProgressCallback, TrialOrder, WindowOrder
from advisor.trial.parent.runner import POLL_S, ProcessRunner, TrialLaunch
from advisor.trial.parent.watch import STALL_S, ProgressReader
from advisor.trial.protocol import Channel, TrialRequest
from tests.conftest import ROOT, TINY, survivors
from tests.scripted_runner import ScriptedRunner, scripted_tune
from tests.trial.scripted import FakeClock, Loader


def _study_with_best(value: float) -> optuna.Study:
    study = optuna.create_study(direction="maximize", pruner=SlowerThanBestPruner(0.5, 300))
    study.add_trial(optuna.trial.create_trial(value=value))
    return study


def test_a_trial_below_the_fraction_of_the_best_is_pruned_only_after_the_first_step():
    trial = _study_with_best(100.0).ask()
    trial.report(40.0, step=100)
    assert not trial.should_prune()  # too early to judge
    trial.report(40.0, step=300)
    assert trial.should_prune()


def test_a_trial_near_the_best_or_in_a_study_without_one_runs_on():
    near = _study_with_best(100.0).ask()
    near.report(60.0, step=400)
    first = optuna.create_study(direction="maximize", pruner=SlowerThanBestPruner(0.5, 300)).ask()
    first.report(1.0, step=400)
    assert not near.should_prune() and not first.should_prune()


def _launch(trial_seconds: float) -> TrialLaunch:
    return TrialLaunch(
        spec=f"{TINY}:factory", cwd=ROOT, warmup_steps=2, trial_seconds=trial_seconds, timeout_s=60
    )


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_the_parent_ends_a_window_early_and_keeps_what_it_measured(tmp_path, marked, knobs):
    seen: list[tuple[float, float]] = []

    def stop_after_half_a_second(elapsed_s: float, samples_per_s: float) -> str | None:
        seen.append((elapsed_s, samples_per_s))
        return "enough seen" if elapsed_s >= 0.5 else None

    config = TrialConfig(batch_size=16, **knobs)
    result = ProcessRunner(_launch(30.0)).run(
        WindowOrder(config=config), tmp_path / "t.log", on_progress=stop_after_half_a_second
    )
    assert result.status == "ok", result.reason
    # It ended at the stop, not after the 30 s asked for (on a fake clock: tests/trial/
    # test_budget.py, test_a_search_trial_the_parent_stops_keeps_the_step_it_timed).
    assert result.stopped_early and result.reason == "enough seen"
    assert result.samples_per_s > 0 and result.steps_measured >= 3
    assert seen and all(rate > 0 for _, rate in seen)
    assert survivors(marked) == []


def test_a_window_nobody_stops_runs_its_length(tmp_path):
    order = WindowOrder(config=TrialConfig(batch_size=16))
    result = ProcessRunner(_launch(0.5)).run(order, tmp_path / "t.log", on_progress=lambda *_: None)
    # (how long: tests/trial/test_budget.py, test_a_window_nobody_stops_runs_its_length)
    assert result.status == "ok" and not result.stopped_early


@dataclass
class _Watched(ScriptedRunner):
    """Reports a search trial's projected samples/s every POLL_S of its warm-up and window, as
    the parent does (`ProgressReader`), and stops it where the report's answer says so: in its
    warm-up, `stopped` with its projection; in its window, a shorter window measured."""

    trial_seconds: float = 1.0

    def answered(
        self, order: TrialOrder, result: TrialResult, on_progress: ProgressCallback | None
    ) -> TrialResult:
        rate = result.samples_per_s
        if on_progress is None or rate is None:
            return result
        for tick in range(1, round(2 * self.trial_seconds / POLL_S) + 1):
            elapsed_s = tick * POLL_S
            reason = on_progress(elapsed_s, rate)
            if reason is None:
                continue
            if elapsed_s <= self.trial_seconds:  # warm-up
                return TrialResult(
                    config=order.config, status="stopped", reason=reason, samples_per_s=rate,
                    failure_phase="warmup", startup_s=0.1,
                )  # fmt: skip
            return result.model_copy(update={"stopped_early": True, "reason": reason})
        return result


def _very_slow_with_bf16(config: TrialConfig) -> float:
    """bf16 micro-steps take half a second (32 samples/s at batch 16); fp32 runs hundreds of
    times faster."""
    return config.batch_size / 0.5 if config.amp == "bf16" else 1000.0 * config.batch_size


def test_a_tune_stops_the_slow_configurations_and_says_why(tmp_path):
    settings = TuneSettings(
        spec=f"{TINY}:very_slow_with_bf16",
        trials=6,  # every configuration: amp x loader workers
        knobs="classic,amp",  # searched even where bf16 would be dropped as slow
        objective="throughput",
        sampler="grid",
        batch_sizes="16",
        accumulation_steps="1",
        max_world_size=1,
        trial_seconds=1.0,
        confirm_top=1,
        out=tmp_path,
    )
    runner = _Watched(rate=_very_slow_with_bf16, trial_seconds=settings.trial_seconds)
    result = scripted_tune(settings, runner)
    search = [t for t in result.trials if t.role in ("baseline", "search")]
    slow = [t for t in search if t.result.config.amp == "bf16"]
    fast = [t for t in search if t.result.config.amp == "off"]
    assert slow and fast
    # bf16 runs hundreds of times below fp32: each bf16 trial is stopped, and says why. (When,
    # on a fake clock: tests/trial/test_budget.py,
    # test_a_search_trial_the_parent_stops_keeps_the_step_it_timed.)
    assert all(_stopped(t.result) for t in slow)
    assert all(t.result.reason.startswith("stopped: projected ") for t in slow)
    assert any(not _stopped(t.result) for t in fast)  # the best at least runs its window
    assert result.recommendation.config.amp == "off"
    study = optuna.load_study(
        study_name="tiny-very_slow_with_bf16", storage=f"sqlite:///{tmp_path}/study.db"
    )
    reported = study.trials[slow[0].number].intermediate_values  # the running throughput
    assert reported and set(reported.values()) == {32.0}  # the projection the parent read
    report = (tmp_path / "report.md").read_text()
    assert "x slower than the best" in report
    assert all(t.result.reason in report for t in slow)


def _stopped(result) -> bool:
    """Stopped in its window (a shorter one, measured) or before it."""
    return result.stopped_early or result.status == "stopped"


def test_a_slow_configuration_is_stopped_during_its_warm_up_with_the_reason(tmp_path, marked):
    seen: list[float] = []

    def below_a_thousand(elapsed_s: float, samples_per_s: float) -> str | None:
        seen.append(samples_per_s)
        return stop_reason(samples_per_s, 1000.0) if samples_per_s < 1000 else None

    config = TrialConfig(batch_size=16, amp="bf16")
    launch = TrialLaunch(
        spec=f"{TINY}:very_slow_with_bf16", cwd=ROOT, warmup_steps=3, trial_seconds=2.0,
        timeout_s=60,
    )  # fmt: skip
    result = ProcessRunner(launch).run(
        WindowOrder(config=config), tmp_path / "t.log", on_progress=below_a_thousand
    )

    assert result.status == "stopped" and result.failure_phase == "warmup"
    assert result.reason == stop_reason(result.samples_per_s, 1000.0)
    # At most one micro-batch in the silence that stopped it: an upper bound of its rate.
    assert result.samples_per_s <= 16 / STALL_S
    assert result.window_s is None  # it never reached its window
    assert seen and survivors(marked) == []


def test_a_trial_deaf_to_the_stop_is_killed_and_keeps_its_start_up(tmp_path, marked):
    """Its third micro-step hangs: the parent's projection falls while it is silent, the stop
    goes unheard, and the parent kills it; the result it makes says when the warm-up began."""
    config = TrialConfig(batch_size=16)
    launch = TrialLaunch(spec=f"{TINY}:hang", cwd=ROOT, warmup_steps=3, trial_seconds=2.0,
                         timeout_s=60)  # fmt: skip
    result = ProcessRunner(launch).run(
        WindowOrder(config=config),
        tmp_path / "t.log",
        on_progress=lambda _, rate: "too slow" if rate < 1000 else None,
    )

    assert result.status == "stopped" and result.reason == "too slow"
    assert result.failure_phase == "warmup"
    assert result.startup_s is not None and 0 < result.startup_s < result.wall_s < 30
    assert survivors(marked) == []


@pytest.mark.parametrize("batch_s", [0.48, 0.15])  # rounds beyond, and within, STALL_S
def test_a_bursty_loader_is_not_projected_slower_than_it_runs(tmp_path, batch_s):
    """Two workers deliver batches in rounds (`Loader`): a micro-step that waits for a round
    takes all of its time, the next one none. No projection the pruner judges may read half the
    rate the window measures, or the pruner (at 0.5 of the best) would stop the best."""
    config = TrialConfig(batch_size=16, num_workers=2)
    clock = FakeClock()
    loader = Loader(clock, workers=2, batch_s=batch_s)
    clock.advance(loader(0) + COMPUTE_S)  # the first micro-step, before the warm-up
    trial = _Trial(tmp_path, config, clock)
    for micro in range(1, 60):
        trial.micro_step(loader(micro) + COMPUTE_S)
    rate = 59 * 16 / trial.elapsed_s
    judged = [projected for at_s, projected in trial.seen if at_s >= CHECK_AFTER * WINDOW_S]
    assert len(judged) > 10 and min(judged) > 0.7 * rate


def test_a_silent_trial_is_projected_as_if_its_round_ended_now(tmp_path):
    """A child quiet for longer than STALL_S is inside a micro-step at least that long: its rate
    so far is bounded by counting the round it waits in as finished now, and falls while it is
    silent, so that a hung trial is stopped rather than judged on its past."""
    trial = _Trial(tmp_path, TrialConfig(batch_size=16), FakeClock())
    for _ in range(10):  # 160 samples in 1 s, one line each 0.1 s
        trial.micro_step(0.1)
    trial.micro_step(3.0)  # then silence

    stalled = [(at_s, rate) for at_s, rate in trial.seen if at_s > 1.0]  # past its last line
    rates = [rate for _, rate in stalled]
    assert len(stalled) > 10 and rates == sorted(rates, reverse=True)
    # The later half of its progress (80 samples since 0.5 s) and one more micro-batch, now.
    for at_s, rate in stalled:
        assert rate == pytest.approx((160 + 16 - 80) / (at_s - 0.5), rel=1e-3)


COMPUTE_S = 0.005  # of a micro-step, besides its wait for a batch


class _Trial:
    """A search trial's progress on a fake clock: the child reports it as a trial does
    (`ParentWatch`), the parent reads it every POLL_S as `ProcessRunner` does
    (`ProgressReader`), and the projections it hands the pruner are collected in `seen`
    (seconds, samples/s)."""

    def __init__(self, tmp_path: Path, config: TrialConfig, clock: FakeClock) -> None:
        channel = Channel(
            launched_at=0.0, result_path=str(tmp_path / "result.json"),
            phase_path=str(tmp_path / "phase"), progress_path=str(tmp_path / "progress"),
            stop_path=str(tmp_path / "stop"),
        )  # fmt: skip
        request = TrialRequest(
            order=WindowOrder(config=config, precise_window=True), spec=f"{TINY}:factory",
            cwd=str(ROOT), trial_seconds=WINDOW_S, channel=channel,
        )  # fmt: skip
        self.seen: list[tuple[float, float]] = []
        self._clock = clock
        self._parent = ProgressReader(
            request, None, lambda at_s, rate: self.seen.append((at_s, rate)), clock=clock
        )
        (tmp_path / "phase").write_text("warmup\n")
        self._parent.read()
        self._started = clock()
        self._child = ParentWatch(channel, config, rank=0, clock=clock)
        self._next_poll = clock() + POLL_S

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._started

    def micro_step(self, seconds: float) -> None:
        """A micro-step of `seconds`, the parent polling meanwhile; then the child's report."""
        end = self._clock() + seconds
        while self._next_poll <= end:
            self._clock.advance(self._next_poll - self._clock())
            self._parent.read()
            self._next_poll += POLL_S
        self._clock.advance(end - self._clock())
        self._child()


WINDOW_S = 2.0
