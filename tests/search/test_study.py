"""Search budgets, samplers, infeasibility and the no-feasible-configuration exit."""

import math
from dataclasses import dataclass, field

import optuna
import pytest

import advisor
from advisor.decide.race.plan import fastest_at
from advisor.decide.reruns import failure_summary, select_winner
from advisor.knobs import TrialConfig
from advisor.memory import MemoryBudget
from advisor.noise_scale import predict_batches, race_finalists
from advisor.report.verdicts import tie_text
from advisor.results import TrialRecord, TrialResult
from advisor.search.checks import memory_problem
from advisor.search.context import SearchContext
from advisor.search.space import build_space
from advisor.search.study import run_search
from advisor.settings import TuneSettings
from advisor.trial.orders import ProgressCallback, TrialOrder, WindowOrder
from tests.conftest import CPU_PROFILE, TINY, advisor_here, survivors
from tests.scripted_runner import TASK, ScriptedRunner, scripted_context, scripted_tune

FAST = {"trial_seconds": 0.2, "warmup_steps": 1, "confirm_top": 1, "objective": "throughput"}
HOST = CPU_PROFILE.model_copy(update={"memory_bytes": 10 * 2**30})


def _ok(peak_gib: float) -> TrialResult:
    return TrialResult(
        config=TrialConfig(batch_size=8),
        status="ok",
        samples_per_s=1.0,
        peak_memory_bytes=int(peak_gib * 2**30),
    )


def test_memory_headroom_makes_a_fast_trial_ineligible():
    settings = TuneSettings(spec="a.py:f", memory_headroom=0.1)
    assert memory_problem(_ok(8.9), HOST, settings) is None
    problem = memory_problem(_ok(9.5), HOST, settings)
    assert problem == "peak host memory 9.5 GiB leaves less than 10% of 10.0 GiB free"
    budget = settings.model_copy(update={"memory_budget": MemoryBudget.model_validate("8GiB")})
    assert memory_problem(_ok(8.9), HOST, budget) == "peak host memory 8.9 GiB > budget 8.0 GiB"


def test_failure_summary_counts_reasons():
    failed = TrialResult(config=TrialConfig(batch_size=8), status="oom", reason="out of memory")
    records = [
        TrialRecord(number=0, role="baseline", result=failed),
        TrialRecord(number=1, role="search", result=failed.model_copy(update={"status": "error"})),
        TrialRecord(number=2, role="search", result=failed),
    ]
    summary = failure_summary(records)
    assert summary.startswith("all 3 trials failed: 2 oom, 1 error (trial 0: out of memory)")


@pytest.mark.slow
def test_grid_sampler_measures_ddp_beside_one_process_until_exhausted(tmp_path, marked):
    # Real trials: the point is DDP trials of two real ranks measured beside one process. One
    # re-run each (--confirm-repeats 1) is all the layouts' comparison below needs.
    result = advisor.tune(
        f"{TINY}:factory",
        trials=50,
        sampler="grid",
        knobs="classic,amp",  # searched even where the probe finds bf16 slow
        batch_sizes="32",
        accumulation_steps="1",
        early_stop=0,  # every configuration measured whole, none rejected, however slow
        confirm_repeats=1,
        confirm_max_repeats=1,
        out=tmp_path,
        **FAST,
    )
    measured = [t for t in result.trials if t.role != "duplicate"]
    # amp 2 x workers 3 x (one process, DDP with 2 ranks)
    assert len({t.result.config for t in measured}) == len(measured) == 12
    ddp = [t for t in measured if t.result.config.parallel == "ddp-2"]
    assert len(ddp) == 6 and all(t.result.status == "ok" for t in ddp)
    assert all(len(t.result.ranks) == 2 for t in ddp)
    layouts = {best.parallel: best for best in result.recommendation.parallel_best}
    assert (layouts["none"].trials, layouts["ddp-2"].trials) == (6, 6)
    # With --confirm-top 1 the best of the other layout is re-measured all the same.
    assert layouts["none"].rerun_samples_per_s and layouts["ddp-2"].rerun_samples_per_s
    ratio = layouts["ddp-2"].rerun_samples_per_s / layouts["none"].rerun_samples_per_s
    assert f"**ddp-2 vs one process: {ratio:.2f}x** (trial " in (tmp_path / "report.md").read_text()
    assert ",ddp,2," in (tmp_path / "trials.csv").read_text()
    assert survivors(marked) == []


def _searched(runner: ScriptedRunner) -> list[TrialConfig]:
    """The configurations the search measured, in order (not the re-runs' whole cycles)."""
    return [o.config for o in runner.orders if isinstance(o, WindowOrder) and not o.whole_cycles]


def test_impossible_combinations_are_pruned_with_the_reason_not_run(tmp_path):
    settings = TuneSettings(
        spec=f"{TINY}:factory", trials=1, global_batch_size=64, accumulation_steps=(1, 2)
    )
    runner = ScriptedRunner()
    context = scripted_context(settings, runner, tmp_path)
    space = context.space
    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({**space.params_of(space.baseline), "batch_size": 64, "parallel": "ddp-2"})
    records = run_search(study, context)
    [pruned] = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert pruned.user_attrs["pruned_reason"] == (
        "global batch 64 is no multiple of batch 64 x 2 processes"
    )
    assert [record.role for record in records] == ["baseline"]  # nothing ran for the other
    assert _searched(runner) == [space.baseline]


OOM = "out of memory: simulated: tried to allocate 8.00 GiB"


def _oom_above_64(config: TrialConfig) -> float | TrialResult:
    """Batches above 64 run out of memory in their first step, whatever the other knobs."""
    if config.batch_size > 64:
        return TrialResult(config=config, status="oom", reason=OOM, failure_phase="first_step")
    return 1000.0 * math.sqrt(config.batch_size)


def test_batches_above_one_that_ran_out_of_memory_are_pruned_not_run(tmp_path):
    settings = TuneSettings(spec=f"{TINY}:oom_above_64", trials=2, max_world_size=1)
    runner = ScriptedRunner(rate=_oom_above_64)
    context = scripted_context(settings, runner, tmp_path)
    study = optuna.create_study(direction="maximize")
    base = context.space.params_of(context.space.baseline)
    study.enqueue_trial({**base, "batch_size": 128})
    study.enqueue_trial({**base, "batch_size": 256, "accumulation_steps": 2})
    study.enqueue_trial({**base, "batch_size": 256, "amp": "bf16"})  # another knob: no inference
    records = run_search(study, context)
    [pruned] = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert pruned.params["batch_size"] == 256 and pruned.params["accumulation_steps"] == 2
    assert pruned.user_attrs["pruned_reason"] == (
        "batch 256 needs at least the memory of batch 128, which ran out of memory in trial 0 "
        "with the same other knobs"
    )
    assert [(r.result.config.batch_size, r.result.status) for r in records] == [
        (128, "oom"),
        (256, "oom"),  # measured: bf16 autocast changes the memory a batch needs
    ]
    assert [(c.batch_size, c.amp) for c in _searched(runner)] == [(128, "off"), (256, "bf16")]


def test_timeout_stops_starting_trials(tmp_path):
    # Over before the search starts: your baseline is still measured (every speed-up is
    # against it), and no other trial starts.
    settings = TuneSettings(spec=f"{TINY}:factory", trials=20, timeout=1e-6, out=tmp_path, **FAST)
    runner = ScriptedRunner()
    result = scripted_tune(settings, runner)
    assert [t.role for t in result.trials] == ["baseline"]
    assert _searched(runner) == [result.recommendation.baseline_config]
    assert result.recommendation.config == result.recommendation.baseline_config
    report = (tmp_path / "report.md").read_text()
    assert "Your configuration was the fastest one measured" in report


@pytest.mark.slow
def test_every_trial_failing_exits_3_with_the_reasons(tmp_path):
    # Through the command's entry point: the point is its exit status and message.
    # --objective throughput: no noise-scale trial after the failed baseline.
    completed = advisor_here(
        "tune",
        f"{TINY}:nan_loss",
        "--trials",
        "2",
        "--trial-seconds",
        "0.2",
        "--objective",
        "throughput",
        "--out",
        str(tmp_path),
    )
    assert completed.returncode == 3, completed.stderr
    assert "error: all 2 trials failed: 2 diverged" in completed.stderr
    study = optuna.load_study(study_name="tiny-nan_loss", storage=f"sqlite:///{tmp_path}/study.db")
    measured = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(measured) == 2  # the failures are kept in the study
    assert all(t.constraints == {"feasible": 1.0} and t.value == 0.0 for t in measured)


def test_reports_render_failed_trials_with_their_reasons(tmp_path):
    settings = TuneSettings(
        spec=f"{TINY}:oom_above_64",
        trials=50,
        sampler="grid",
        knobs="classic,amp",  # searched even where bf16 would be dropped as slow
        batch_sizes="32,128",
        accumulation_steps="1",
        max_world_size=1,
        early_stop=0,  # no value rejected: all twelve are measured
        out=tmp_path,
        **FAST,
    )
    result = scripted_tune(settings, ScriptedRunner(rate=_oom_above_64))
    failed = [t for t in result.trials if t.result.status == "oom"]
    assert len(failed) == 6  # batch 128 x amp 2 x workers 3
    html = (tmp_path / "report.html").read_text()
    assert html.count('<tr class="failed">') == 6
    assert OOM in html
    assert "failed or infeasible" in html  # the history plot marks them
    assert "6 oom" in (tmp_path / "report.md").read_text()


@dataclass
class _Reruns(ScriptedRunner):
    """Each run of a configuration measures the next of its `runs` (samples/s, the last one
    again once they are spent), as a machine's speed wanders from run to run."""

    runs: dict[TrialConfig, tuple[float, ...]] = field(default_factory=dict)

    def answered(
        self, order: TrialOrder, result: TrialResult, on_progress: ProgressCallback | None
    ) -> TrialResult:
        runs = self.runs[order.config]
        done = sum(other.config == order.config for other in self.orders) - 1
        return result.model_copy(update={"samples_per_s": runs[min(done, len(runs) - 1)]})


BASELINE, BF16 = TrialConfig(batch_size=32), TrialConfig(batch_size=32, amp="bf16")


def test_a_tie_within_noise_is_re_run_then_goes_to_the_config_with_fewer_changes(tmp_path):
    # bf16 leads every time, by about 1 %: within the noise floor (3 %), a tie.
    runner = _Reruns(
        runs={BASELINE: (3000.0, 3030.0, 2990.0, 3010.0), BF16: (3060.0, 3030.0, 3050.0, 3040.0)}
    )
    context = _selection_context(runner, 2, tmp_path)
    records = [  # as the search left them: bf16 looked faster in its single window
        TrialRecord(number=0, role="baseline", result=_measured(BASELINE, 3000.0)),
        TrialRecord(number=1, role="search", result=_measured(BF16, 3300.0)),
    ]
    selection = select_winner(records, context)
    assert selection.winner.number == 0  # the same speed, one knob fewer
    reruns = [c for c in selection.confirmations if c.number in (0, 1)]
    assert len(reruns) == 8  # 2 re-runs each, then 2 more each for the tie
    assert len(runner.orders) == 8 and all(o.whole_cycles for o in runner.orders)
    tie = selection.close_call
    assert tie is not None and (tie.fast, tie.slow, tie.kept, tie.runs) == (1, 0, 0, 4)
    assert "stayed within measurement noise after 4 re-runs each" in tie_text(tie)
    assert "advisor recommends trial 0, which changes fewer knobs" in tie_text(tie)


def test_a_finalist_clearly_behind_after_its_first_re_run_is_not_re_run_again(tmp_path):
    # a lucky search window made bf16 a finalist; it runs at a quarter of the speed
    runner = _Reruns(runs={BASELINE: (1600.0,), BF16: (400.0,)})
    context = _selection_context(runner, 3, tmp_path)
    records = [
        TrialRecord(number=0, role="baseline", result=_measured(BASELINE, 1600.0)),
        TrialRecord(number=1, role="search", result=_measured(BF16, 1700.0)),
    ]
    selection = select_winner(records, context)
    runs = {n: [c for c in selection.confirmations if c.number == n] for n in (0, 1)}
    assert (len(runs[0]), len(runs[1])) == (3, 1)
    assert selection.winner.number == 0 and selection.close_call is None


def test_under_a_race_a_finalist_at_your_batch_clearly_behind_is_not_re_run_again(tmp_path):
    """The race needs every round of its entrants and of the best at your batch, but not of a
    finalist there that is clearly slower than the best (a slow layout kept for the report)."""
    runner = _Reruns(runs={BASELINE: (1600.0,), BF16: (400.0,)})
    context = _selection_context(runner, 3, tmp_path)
    records = [
        TrialRecord(number=0, role="baseline", result=_measured(BASELINE, 1600.0)),
        TrialRecord(number=1, role="search", result=_measured(BF16, 1700.0)),
    ]
    selection = select_winner(records, context, [records[0]], racing=True)
    runs = {n: [c for c in selection.confirmations if c.number == n] for n in (0, 1)}
    assert (len(runs[0]), len(runs[1])) == (3, 1)
    assert selection.confirmed_rates[0] > 2 * selection.confirmed_rates[1]


def test_the_precision_at_your_batch_is_chosen_on_re_runs_not_a_search_window(tmp_path):
    """bf16 with loader workers looked a little slower than fp32 in its search window, below the
    one finalist asked for; it re-runs as the best of its precision at your batch, and wins."""
    workers = TrialConfig(batch_size=32, num_workers=2)
    bf16 = workers.model_copy(update={"amp": "bf16"})
    runner = _Reruns(
        runs={BASELINE: (1000.0,), workers: (3000.0, 3020.0, 2980.0), bf16: (3700.0, 3650.0)}
    )
    context = _selection_context(runner, 2, tmp_path, top=1)
    records = [
        TrialRecord(number=0, role="baseline", result=_measured(BASELINE, 1000.0)),
        TrialRecord(number=1, role="search", result=_measured(workers, 3000.0)),
        TrialRecord(number=2, role="search", result=_measured(bf16, 2900.0)),
    ]
    selection = select_winner(records, context)
    assert {r.number for r in selection.finalists} == {0, 1, 2}
    assert selection.winner.number == 2


def test_the_precision_a_batch_races_in_is_chosen_on_re_runs_not_a_search_window(tmp_path):
    """As on examples/mlp.py in one tune: batch 512 in bf16 (the precision whose matmuls ran
    fastest here) read half its usual samples/s in its one search window, below fp32 there.
    Both re-run; bf16 is clearly faster and races, fp32 (clearly behind at its batch after one
    re-run) is not re-run again. At 1024, where bf16 read faster, fp32 is not re-run. The race
    decides, so the two within noise at the top (512 and 1024 in bf16) get no tie-break."""
    big, big_bf16 = TrialConfig(batch_size=512), TrialConfig(batch_size=512, amp="bf16")
    bigger, bigger_bf16 = TrialConfig(batch_size=1024), TrialConfig(batch_size=1024, amp="bf16")
    runner = _Reruns(
        runs={BASELINE: (1000.0,), big: (7000.0,), big_bf16: (10000.0,), bigger_bf16: (10100.0,)}
    )
    context = _selection_context(runner, 3, tmp_path, top=1)
    records = [
        TrialRecord(number=0, role="baseline", result=_measured(BASELINE, 1000.0)),
        TrialRecord(number=1, role="search", result=_measured(big, 7400.0)),
        TrialRecord(number=2, role="search", result=_measured(big_bf16, 5700.0)),
        TrialRecord(number=3, role="search", result=_measured(bigger_bf16, 10000.0)),
        TrialRecord(number=4, role="search", result=_measured(bigger, 7600.0)),
    ]
    predictions, extra = race_finalists(
        predict_batches(None, records, BASELINE), None, records, BASELINE, probe_amp="bf16"
    )
    assert {p.global_batch for p in predictions if p.raced} == {512, 1024}
    assert {r.number for r in extra} == {0, 1, 2, 3}  # bf16 at 512 too; not fp32 at 1024
    selection = select_winner(records, context, extra, racing=True)
    runs = {n: sum(c.number == n for c in selection.confirmations) for n in range(5)}
    assert runs == {0: 3, 1: 1, 2: 3, 3: 3, 4: 0}
    assert fastest_at(selection, BASELINE)[512].number == 2
    assert selection.close_call is None


def _selection_context(
    runner: ScriptedRunner, repeats: int, tmp_path, top: int = 2
) -> SearchContext:
    """What selection needs to re-run `top` finalists, their re-runs answered by `runner`."""
    settings = TuneSettings(
        spec=f"{TINY}:factory", trials=2, confirm_top=top, confirm_repeats=repeats,
        max_world_size=1,
    )  # fmt: skip
    return scripted_context(settings, runner, tmp_path)


def _measured(config: TrialConfig, rate: float) -> TrialResult:
    return TrialResult(config=config, status="ok", samples_per_s=rate, peak_memory_bytes=2**20)


def test_a_second_worker_does_not_queue_the_baseline_another_is_measuring():
    """The first worker took the queued baseline and measures it; a second starting now must
    not queue it again (it would run twice: the baseline skips the duplicate check)."""
    from optuna.trial import TrialState

    from advisor.search.proposals import enqueue_baseline

    space = build_space(TuneSettings(spec=f"{TINY}:factory"), CPU_PROFILE, TASK)
    study = optuna.create_study(direction="maximize")
    enqueue_baseline(study, space)
    taken = study.ask()  # the first worker's: RUNNING
    assert taken.number == 0 and study.trials[0].state == TrialState.RUNNING
    enqueue_baseline(study, space)
    assert not study.get_trials(states=(TrialState.WAITING,))
