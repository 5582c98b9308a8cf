"""Early stopping: Optuna's pruner stops trials projected far slower than the best, in any phase."""

import optuna
import pytest

import advisor
from advisor.knobs import TrialConfig
from advisor.search.pruning import CHECK_AFTER, SlowerThanBestPruner, stop_reason
from advisor.trial.parent.runner import STALL_S, TrialLaunch, run_trial
from tests.conftest import ROOT, TINY, survivors


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
    result = run_trial(
        _launch(30.0), config, tmp_path / "t.log", on_progress=stop_after_half_a_second
    )
    assert result.status == "ok", result.reason
    # It ended at the stop, not after the 30 s asked for (on a fake clock: tests/trial/
    # test_budget.py, test_a_search_trial_the_parent_stops_keeps_the_step_it_timed).
    assert result.stopped_early and result.reason == "enough seen"
    assert result.samples_per_s > 0 and result.steps_measured >= 3
    assert all(rate > 0 for _, rate in seen) and seen[0][0] < 0.5
    assert survivors(marked) == []


def test_a_window_nobody_stops_runs_its_length(tmp_path):
    result = run_trial(_launch(0.5), TrialConfig(batch_size=16), tmp_path / "t.log",
                       on_progress=lambda elapsed_s, rate: None)  # fmt: skip
    # (how long: tests/trial/test_budget.py, test_a_window_nobody_stops_runs_its_length)
    assert result.status == "ok" and not result.stopped_early


@pytest.mark.slow
def test_a_tune_stops_the_slow_configurations_and_says_why(tmp_path):
    result = advisor.tune(
        f"{TINY}:very_slow_with_bf16",
        trials=6,  # every configuration: amp x loader workers
        knobs="classic,amp",  # searched even where the probe finds bf16 slower than fp32
        objective="throughput",
        sampler="grid",
        batch_sizes="16",
        accumulation_steps="1",
        max_world_size=1,
        trial_seconds=1.0,
        confirm_top=1,
        out=tmp_path,
    )
    search = [t for t in result.trials if t.role in ("baseline", "search")]
    slow = [t for t in search if t.result.config.amp == "bf16"]
    fast = [t for t in search if t.result.config.amp == "off"]
    assert slow and fast
    # Every bf16 micro-step takes half a second, hundreds of times the fp32 speed: each bf16
    # trial is stopped, and says why. (When, on a fake clock: tests/trial/test_budget.py,
    # test_a_search_trial_the_parent_stops_keeps_the_step_it_timed.)
    assert all(_stopped(t.result) for t in slow)
    assert all(t.result.reason.startswith("stopped: projected ") for t in slow)
    assert any(not _stopped(t.result) for t in fast)  # the best at least runs its window
    assert result.recommendation.config.amp == "off"
    study = optuna.load_study(
        study_name="tiny-very_slow_with_bf16", storage=f"sqlite:///{tmp_path}/study.db"
    )
    assert study.trials[slow[0].number].intermediate_values  # Optuna holds the running throughput
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
    result = run_trial(launch, config, tmp_path / "t.log", on_progress=below_a_thousand)

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
    result = run_trial(launch, config, tmp_path / "t.log",
                       on_progress=lambda _, rate: "too slow" if rate < 1000 else None)  # fmt: skip

    assert result.status == "stopped" and result.reason == "too slow"
    assert result.failure_phase == "warmup"
    assert result.startup_s is not None and 0 < result.startup_s < result.wall_s < 30
    assert survivors(marked) == []


def test_a_bursty_loader_is_not_projected_slower_than_it_runs(tmp_path):
    # Two workers deliver batches in pairs: a step that waits for a pair is twice the average.
    seen: list[float] = []

    def watch(elapsed_s: float, samples_per_s: float) -> None:
        if elapsed_s >= CHECK_AFTER * WINDOW_S:  # when the pruner starts judging
            seen.append(samples_per_s)

    launch = TrialLaunch(
        spec=f"{TINY}:slow_samples", cwd=ROOT, warmup_steps=2, trial_seconds=WINDOW_S,
        timeout_s=60,
    )  # fmt: skip
    config = TrialConfig(batch_size=16, num_workers=2)
    result = run_trial(launch, config, tmp_path / "t.log", on_progress=watch)

    assert result.status == "ok", result.reason
    # No projection on the way reads half the rate the window measures: the pruner (at 0.5 of
    # the best) would stop the best configuration.
    assert seen and min(seen) > 0.7 * (result.samples_per_s or 0)


WINDOW_S = 2.0
