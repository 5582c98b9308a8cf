"""The first trials start at the user's configuration and move out one measured step at a time;
values every trial has ruled out are no longer proposed."""

from __future__ import annotations

import optuna

from advisor.knobs import TrialConfig
from advisor.progress import NullProgress
from advisor.results import TrialRecord, TrialResult
from advisor.search.context import SearchContext
from advisor.search.dominance import rejected_in_search, rejected_values
from advisor.search.seeding import next_seed
from advisor.search.space import build_space
from advisor.search.study import make_sampler, run_search
from advisor.settings import TuneSettings
from advisor.trial.orders import WindowOrder
from tests.conftest import CPU_PROFILE, TINY
from tests.scripted_runner import ScriptedRunner
from tests.search.test_space import TASK

SPACE = build_space(TuneSettings(spec="a.py:f", knobs="classic,amp"), CPU_PROFILE, TASK)


def _record(number: int, config: TrialConfig, rate: float, status: str = "ok") -> TrialRecord:
    role = "baseline" if number == 0 else "search"
    result = TrialResult(config=config, status=status, samples_per_s=rate)  # type: ignore[arg-type]
    return TrialRecord(number=number, role=role, result=result)


def _moves(params: dict, base: TrialConfig) -> dict:
    config = SPACE.config_from_params(params)
    return {
        name: getattr(config, name)
        for name in SPACE.domains
        if getattr(config, name) != getattr(base, name)
    }


def test_seeds_move_one_knob_one_step_from_the_fastest_so_far():
    baseline = SPACE.baseline  # batch 32, one process, fp32, no workers
    records = [_record(0, baseline, 1000.0)]

    first = next_seed(SPACE, records, [], turn=0)  # your global batch kept: no race needed
    assert _moves(first, baseline) == {"num_workers": 1}
    assert SPACE.config_from_params(first).global_batch_size == baseline.global_batch_size

    records.append(_record(1, SPACE.config_from_params(first), 3000.0))
    second = next_seed(SPACE, records, [], turn=1)
    faster = records[1].result.config  # from the new fastest, the next knob's turn
    assert _moves(second, faster) == {"batch_size": 128}  # two notches up

    records.append(_record(2, SPACE.config_from_params(second), 500.0))
    third = next_seed(SPACE, records, [], turn=2)
    assert _moves(third, faster) == {"parallel": "ddp-2"}


def test_seeds_skip_rejected_values_and_measured_configurations():
    baseline = SPACE.baseline
    bf16 = baseline.model_copy(update={"amp": "bf16"})
    records = [
        _record(0, baseline, 1000.0),
        _record(1, bf16, 40.0, status="stopped"),
        _record(2, bf16.model_copy(update={"batch_size": 64}), 60.0),
    ]
    rejected = rejected_values(records, SPACE.domains)
    assert [(r.knob, r.value) for r in rejected] == [("amp", "bf16")]

    for turn in range(8):
        seed = next_seed(SPACE, records, rejected, turn)
        assert seed is not None and seed["amp"] == "off"
        assert SPACE.config_from_params(seed) not in {r.result.config for r in records}


def test_early_stop_0_measures_every_proposal_and_rejects_no_value():
    records = [
        _record(0, SPACE.baseline, 1000.0),
        *(_record(n, SPACE.baseline.model_copy(update={"amp": "bf16", "batch_size": b}), 40.0)
          for n, b in ((1, 32), (2, 64))),
    ]  # fmt: skip
    assert [r.value for r in rejected_in_search(records, ["amp"], early_stop=0.5)] == ["bf16"]
    assert rejected_in_search(records, ["amp"], early_stop=0.0) == []


def test_a_value_is_rejected_only_on_enough_evidence_near_the_best():
    best = TrialConfig(batch_size=512)
    small_bf16 = [TrialConfig(batch_size=8, amp="bf16"), TrialConfig(batch_size=16, amp="bf16")]
    one = [_record(0, best, 10_000.0), _record(1, small_bf16[0], 100.0)]
    assert rejected_values(one, ["amp"]) == []  # one trial is not enough

    # Slow only at small batches: bf16 may still win at the best's batch (docs/method.md).
    small = [_record(0, best, 10_000.0)]
    small += [_record(i + 1, config, 100.0) for i, config in enumerate(small_bf16)]
    assert rejected_values(small, ["amp"]) == []
    # Batch sizes are their own evidence: batch 8 ran far below the best in both its trials.
    eight = [*small, _record(9, TrialConfig(batch_size=8, accumulation_steps=2), 900.0)]
    assert [r.value for r in rejected_values(eight, ["batch_size"])] == [8]

    near = [*small, _record(3, TrialConfig(batch_size=256, amp="bf16"), 2_400.0)]
    [rejected] = rejected_values(near, ["amp"])
    assert (rejected.value, rejected.trials, rejected.best_trial) == ("bf16", (1, 2, 3), 0)
    assert rejected.reason == (
        "amp=bf16 rejected: its 3 trials (1, 2, 3) ran at most 0.24x the best (trial 0)"
    )

    close = [*near, _record(4, TrialConfig(batch_size=512, amp="bf16"), 2_600.0)]
    assert rejected_values(close, ["amp"]) == []  # one came within 4x of the best


def _very_slow_with_bf16(config: TrialConfig) -> float:
    """fp32 at thousands of samples/s; bf16 micro-steps of half a second (32 samples/s at
    batch 16): hundreds of times slower."""
    return config.batch_size / 0.5 if config.amp == "bf16" else 1000.0 * config.batch_size


def _windows(runner: ScriptedRunner) -> list[TrialConfig]:
    """The configurations whose training steps `runner` timed, in order."""
    return [order.config for order in runner.orders if isinstance(order, WindowOrder)]


def test_the_search_prunes_a_proposal_with_a_rejected_value_without_running_it(tmp_path):
    settings = TuneSettings(
        spec=f"{TINY}:very_slow_with_bf16", trials=4, knobs="classic,amp", max_world_size=1,
        batch_sizes=(16, 32), accumulation_steps=(1,), trial_seconds=0.5, sampler="random",
    )  # fmt: skip
    task = TASK.model_copy(update={"user_batch_size": 16, "dataset_size": 256})
    space = build_space(settings, CPU_PROFILE, task)
    study = optuna.create_study(direction="maximize")
    base = space.params_of(space.baseline)
    study.enqueue_trial(base, user_attrs={"role": "baseline"})  # fp32: hundreds of times faster
    for params in (
        {**base, "amp": "bf16"},
        {**base, "amp": "bf16", "batch_size": 32},
        {**base, "amp": "bf16", "num_workers": 1},  # ruled out by the two before
    ):
        study.enqueue_trial(params)
    runner = ScriptedRunner(rate=_very_slow_with_bf16)
    context = SearchContext(settings, space, CPU_PROFILE, runner, tmp_path, NullProgress())

    records = run_search(study, context)

    ran = [r.result.config.amp for r in records if r.role != "duplicate"]
    assert ran.count("bf16") == 2 and ran[0] == "off"  # the third bf16 proposal never ran
    assert [config.amp for config in _windows(runner)] == ran
    pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert pruned and pruned[0].params["amp"] == "bf16"
    assert pruned[0].user_attrs["pruned_reason"].startswith("amp=bf16 rejected: its 2 trials")


def test_a_grid_ends_once_every_configuration_is_measured_or_ruled_out(tmp_path):
    """An exhausted GridSampler proposes visited points again: a grid with a rejected value must
    not spend its budget on repeats of what it has already settled."""
    settings = TuneSettings(
        spec=f"{TINY}:very_slow_with_bf16", trials=50, knobs="classic,amp", max_world_size=1,
        batch_sizes=(16,), accumulation_steps=(1,), trial_seconds=0.5, sampler="grid",
    )  # fmt: skip
    task = TASK.model_copy(update={"user_batch_size": 16, "dataset_size": 256})
    space = build_space(settings, CPU_PROFILE, task)
    study = optuna.create_study(direction="maximize", sampler=make_sampler(settings, space))
    runner = ScriptedRunner(rate=_very_slow_with_bf16)
    context = SearchContext(settings, space, CPU_PROFILE, runner, tmp_path, NullProgress())

    records = run_search(study, context)

    measured = {r.result.config for r in records if r.role != "duplicate"}
    pruned = study.get_trials(states=(optuna.trial.TrialState.PRUNED,))
    assert pruned and all(t.params["amp"] == "bf16" for t in pruned)  # 2 bf16 trials ruled it out
    ran = _windows(runner)
    assert len(ran) == len(set(ran)) and set(ran) == measured  # each once, the pruned never
    assert len(measured) + len(pruned) == space.size
    assert len(study.trials) <= space.size + 1  # the enqueued baseline, then each point once


def test_a_seed_another_worker_is_measuring_is_not_proposed_again():
    baseline = SPACE.baseline
    records = [_record(0, baseline, 1000.0)]
    first = next_seed(SPACE, records, [], turn=0)

    other = next_seed(SPACE, records, [], turn=0, busy=[first, {"batch_size": 8}])

    assert other is not None and other != first  # a half-drawn proposal is ignored
