"""A time-to-loss search measures the user's global batch first, probes larger batches by their
goodput, and spends the rest at the batches that race (`advisor.search.staging`).

These drive the planner with a described machine (samples/s as a function of the configuration)
instead of trials: what is asserted is where the search goes, given what it measured.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from advisor.knobs import TrialConfig
from advisor.results import LrPlan, NoiseScale, TrialRecord, TrialResult
from advisor.search.ranking import Ranking
from advisor.search.space import SearchSpace
from advisor.search.staging import next_move, raced_batches, stage_budget
from advisor.settings import TuneSettings
from tests.scripted_runner import TASK, ScriptedRunner, scripted_tune
from tests.search.test_seeding import SPACE

BATCH0 = SPACE.baseline.global_batch_size  # 32


def _noise(value: float, high: float | None = None) -> NoiseScale:
    return NoiseScale(
        value=value, low=value / 2, high=high or value, small_batch=32, big_batch=256, steps=8
    )


def _search(
    rate: Callable[[TrialConfig], float],
    ranking: Ranking,
    trials: int = 20,
    space: SearchSpace = SPACE,
) -> list[TrialRecord]:
    """The trials a search of `trials` makes on a machine where `rate` gives samples/s."""
    records = [_record(0, space.baseline, rate(space.baseline), ranking)]
    while len(records) < trials:
        move = next_move(space, ranking, records, [], trials)
        if move is None:
            break
        config = space.config_from_params(move.params)
        records.append(_record(len(records), config, rate(config), ranking, move.stage))
    return records


def _record(
    number: int,
    config: TrialConfig,
    rate: float,
    ranking: Ranking,
    stage: str | None = None,
) -> TrialRecord:
    return TrialRecord(
        number=number,
        role="baseline" if number == 0 else "search",
        result=TrialResult(config=config, status="ok", samples_per_s=rate),
        samples_ratio=ranking.samples_ratio(config.global_batch_size),
        stage=stage,  # type: ignore[arg-type]
    )


def _cpu(config: TrialConfig) -> float:
    """A CPU where bf16 pays 1.5x, two loader workers 1.3x, DDP halves the rate, and a larger
    micro-batch is faster with diminishing returns (per-step overhead 4 ms, 0.1 ms a sample)."""
    per_step = 0.004 + 0.0001 * config.batch_size
    rate = config.batch_size / per_step
    rate *= 1.5 if config.amp == "bf16" else 1.0
    rate *= 1.3 if config.num_workers == 2 else 1.0
    rate /= 2.0 if config.world_size > 1 else 1.0
    return rate / (1 + 0.1 * (config.accumulation_steps - 1))


def test_the_users_batch_comes_first_and_every_knob_is_measured_there():
    records = _search(_cpu, Ranking(BATCH0, _noise(64.0)))
    first = records[: stage_budget(20).your_batch]
    assert all(r.result.config.global_batch_size == BATCH0 for r in first)
    at_batch0 = {r.result.config for r in first}
    for knob, value in (("amp", "bf16"), ("num_workers", 1), ("num_workers", 2)):
        assert any(getattr(c, knob) == value for c in at_batch0), (knob, value)
    assert any(c.world_size == 2 for c in at_batch0)  # a layout that keeps the batch
    # from the fastest so far: bf16 and two workers together
    best = max(first, key=lambda r: r.result.samples_per_s or 0.0).result.config
    assert (best.amp, best.num_workers, best.batch_size) == ("bf16", 2, 32)


def test_probes_start_from_the_best_at_your_batch_and_the_rest_goes_where_the_race_runs():
    ranking = Ranking(BATCH0, _noise(64.0))
    records = _search(_cpu, ranking)
    probes = [r for r in records if r.stage == "probe"]
    assert probes and len({r.result.config.global_batch_size for r in probes}) <= 5
    first = probes[0].result.config
    assert first.global_batch_size == 4 * BATCH0  # x4 first
    assert (first.amp, first.num_workers) == ("bf16", 2)  # the best at your batch, scaled
    raced = set(raced_batches(SPACE, ranking, records))
    assert raced
    share = sum(r.result.config.global_batch_size in raced | {BATCH0} for r in records)
    assert share / len(records) >= 0.75
    assert any(r.stage == "raced batch" for r in records)


def test_a_raced_batch_measures_the_other_precision_first():
    """bf16 pays nothing at your batch and 3x at the larger ones (a step's arithmetic grows
    with its batch), so your batch keeps fp32: the raced batches try bf16 before anything else
    and race with it."""

    def grows(config: TrialConfig) -> float:
        bf16 = config.amp == "bf16" and config.global_batch_size > BATCH0
        return _cpu(config.model_copy(update={"amp": "off"})) * (3.0 if bf16 else 1.0)

    records = _search(grows, Ranking(BATCH0, _noise(64.0)), trials=16)
    best0 = max(
        (r for r in records if r.result.config.global_batch_size == BATCH0),
        key=lambda r: r.result.samples_per_s or 0.0,
    )
    assert best0.result.config.amp == "off"
    raced = [r.result.config for r in records if r.stage == "raced batch"]
    assert raced and raced[0].amp == "bf16"
    batches = {c.global_batch_size for c in raced}
    assert all(any(c.amp == "bf16" for c in raced if c.global_batch_size == b) for b in batches)


def test_probes_take_the_precision_the_hardware_computes_fastest():
    """On the same machine, where the hardware probe timed bf16 matmuls 2.2x fp32's, the
    probes take bf16 although your batch keeps fp32. bf16's gain grows with the batch (x2 at
    128, x8 at 512): in fp32 batch 512's goodput falls below 128's and the ladder turns back
    to 128's neighbours; in bf16 it climbs past 512."""

    def grows(config: TrialConfig) -> float:
        gain = config.global_batch_size / 64 if config.global_batch_size > BATCH0 else 1.0
        return _cpu(config.model_copy(update={"amp": "off"})) * (
            gain if config.amp == "bf16" else 1.0
        )

    ranking = Ranking(BATCH0, _noise(64.0, high=256.0))
    native = replace(SPACE, probe_amp="bf16")
    probes = [r.result.config for r in _search(grows, ranking, 16, native) if r.stage == "probe"]
    assert probes and all(c.amp == "bf16" for c in probes)
    assert max(c.global_batch_size for c in probes) > 16 * BATCH0
    at_fp32 = [r.result.config for r in _search(grows, ranking, 16) if r.stage == "probe"]
    assert at_fp32 and all(c.amp == "off" for c in at_fp32)  # your batch's precision
    assert max(c.global_batch_size for c in at_fp32) == 16 * BATCH0


def test_siblings_derived_by_accumulation_leave_the_larger_batches_to_be_probed():
    """A loaded machine times the baseline in parts, so its accumulation siblings (your
    micro-batch, 2-8 steps) land on the larger batches first: they do not stand for the
    probe, which scales the micro-batch, and the probes still run."""
    ranking = Ranking(BATCH0, _noise(64.0))
    base = _record(0, SPACE.baseline, _cpu(SPACE.baseline), ranking)
    records = [base]
    for number, steps in enumerate((2, 4, 8), start=1):
        config = SPACE.baseline.model_copy(update={"accumulation_steps": steps})
        sibling = _record(number, config, _cpu(config), ranking)
        records.append(sibling.model_copy(update={"derived_from": 0}))
    while len(records) < 20 and (move := next_move(SPACE, ranking, records, [], 20)):
        config = SPACE.config_from_params(move.params)
        records.append(_record(len(records), config, _cpu(config), ranking, move.stage))
    probes = [r.result.config for r in records if r.stage == "probe"]
    assert probes and probes[0].global_batch_size == 4 * BATCH0
    assert probes[0].batch_size > SPACE.baseline.batch_size  # the micro-batch, scaled


def test_batches_whose_goodput_cannot_win_get_one_probe_at_most():
    """phi 8: a batch 4x yours needs 3.3x the samples, more than its 2x samples/s buys."""
    ranking = Ranking(BATCH0, _noise(8.0))
    records = _search(_cpu, ranking)
    per_batch = Counter(r.result.config.global_batch_size for r in records)
    raced = set(raced_batches(SPACE, ranking, records))
    for batch, count in per_batch.items():
        if batch != BATCH0 and batch not in raced:
            assert count == 1, (batch, count)
    assert per_batch[BATCH0] >= 10


def test_goodput_ranks_a_larger_batch_by_the_samples_it_needs():
    ranking = Ranking(BATCH0, _noise(32.0, high=96.0))
    assert ranking.samples_ratio(BATCH0) == 1.0
    assert ranking.samples_ratio(128) == (96.0 + 128) / (96.0 + 32)  # the optimistic end
    assert Ranking(BATCH0).samples_ratio(128) == 1.0  # no phi: samples/s ranks
    record = _record(1, SPACE.baseline.model_copy(update={"batch_size": 128}), 7000.0, ranking)
    assert record.goodput == 7000.0 / ranking.samples_ratio(128)


def test_a_kept_global_batch_is_searched_to_the_end_of_its_moves():
    """Nothing larger can race: every move from the fastest at your batch is measured, then
    the planner asks for nothing more."""
    ranking = Ranking(BATCH0)
    kept = replace(SPACE, global_batch_size=BATCH0)
    records = [_record(0, kept.baseline, _cpu(kept.baseline), ranking)]
    while (move := next_move(kept, ranking, records, [], trials=50)) is not None:
        config = kept.config_from_params(move.params)
        assert config.global_batch_size == BATCH0 and move.stage == "your batch"
        records.append(_record(len(records), config, _cpu(config), ranking, move.stage))
    assert 5 <= len(records) < 50


def test_a_knob_is_walked_along_its_values_until_two_in_a_row_ran_slower():
    """Six loader-worker counts, as on a 16-core GPU host, every one slower than none: two are
    measured, not five."""
    space = replace(SPACE, domains={**SPACE.domains, "num_workers": (0, 1, 2, 4, 8, 16)})
    ranking = Ranking(BATCH0)

    def slower_with_workers(config: TrialConfig) -> float:
        return 1000.0 / (1 + 0.2 * (config.num_workers > 0))

    records = [_record(0, space.baseline, 1000.0, ranking)]
    while (move := next_move(space, ranking, records, [], trials=40)) is not None:
        config = space.config_from_params(move.params)
        records.append(_record(len(records), config, slower_with_workers(config), ranking))
    workers = {r.result.config.num_workers for r in records if r.result.config.amp == "off"}
    assert {1, 2} <= workers and not workers & {4, 8, 16}


# --- whole tunes, scripted ------------------------------------------------------------------
# A whole tune (search, re-runs, noise scale, race, outputs) in-process, each trial answered
# from a script of the workload of tests/workloads/convergence.py it stands for: what is
# asserted is where the search goes and what the race decides, given what was measured.
WHOLE = {"trials": 8, "trial_seconds": 1.0, "race_seconds": 2.5, "max_world_size": 1}
YOURS = TASK.user_batch_size  # 32, the scripted task's own batch


def _loading(config: TrialConfig) -> float:
    """input_bound: a sample takes 1 ms to load, whatever the batch or the arithmetic; without
    workers the main process loads, else each worker loads in parallel."""
    return 1000.0 * max(1, config.num_workers)


def _loss_per_step(config: TrialConfig, lr: LrPlan, samples: int) -> float:
    """input_bound: clean labels and an lr tuned for your batch, which is past the critical
    batch: a larger batch needs as many steps, hence proportionally more samples."""
    steps_worth = samples * min(1.0, YOURS / config.global_batch_size)
    return 0.01 + 2.0 * math.exp(-steps_worth / 5000)


def test_an_input_bound_workload_gets_loader_workers_at_its_own_batch(tmp_path):
    """Only loader workers help (samples/s is set by loading, whatever the batch): the search
    measures them at the user's batch, and the recommendation keeps that batch."""
    runner = ScriptedRunner(
        rate=_loading,
        wait=lambda config: 0.5 if config.num_workers else 0.9,  # waiting for data throughout
        loss=_loss_per_step,
        phi=9.0,  # d + 1 for its 8 features, no label noise
    )
    settings = TuneSettings(spec="tests/workloads/tiny.py:factory", out=tmp_path, **WHOLE)

    result = scripted_tune(settings, runner)

    rec, effort = result.recommendation, result.effort
    configs = [t.result.config for t in result.trials]
    at_yours = [c for c in configs if c.global_batch_size == YOURS]
    assert {c.num_workers for c in at_yours} >= {0, 1, 2}
    assert rec.config.global_batch_size == YOURS and rec.config.num_workers > 0, rec.race
    assert effort is not None and effort.share is not None and effort.share >= 0.75
    assert effort.best_at_yours_speedup is not None and effort.best_at_yours_speedup > 1.3


def test_a_larger_batch_that_clearly_wins_is_still_found_and_raced(tmp_path):
    """Steps cost the same whatever the batch and the labels are noisy: larger batches are
    probed, and one of them wins the race."""
    runner = ScriptedRunner(
        rate=lambda config: config.batch_size / 0.02,  # every micro-step 20 ms, whatever its size
        # (the default loss: falls alike per sample at every batch, below the critical one)
        phi=81.0,  # d + 1 + sigma^2 d for 8 features and label noise sigma 3
    )
    settings = TuneSettings(spec="tests/workloads/tiny.py:factory", out=tmp_path, **WHOLE)

    result = scripted_tune(settings, runner)

    rec = result.recommendation
    assert rec.noise_scale is not None and rec.noise_scale.value
    stages = [t.stage for t in result.trials if t.role == "search"]
    assert "probe" in stages
    assert rec.race is not None and rec.race.verdict.kind == "won", rec
    assert rec.config.global_batch_size > YOURS, rec.race.verdict
    assert result.effort is not None and result.effort.share >= 0.75


def test_under_a_budget_your_batch_over_it_is_retried_with_checkpointing_and_split():
    """Your batch 32 peaks over the budget; checkpointing brings it under, and so does micro-batch
    16 with two accumulation steps. Both are measured first, and no micro-batch of 32 or more
    without checkpointing is proposed again."""
    from advisor.search.space import build_space
    from advisor.settings import TuneSettings
    from tests.conftest import CPU_PROFILE
    from tests.search.test_space import TASK

    settings = TuneSettings(spec="a.py:f", knobs="classic,amp", memory_budget="1GiB")
    space = build_space(settings, CPU_PROFILE, TASK.model_copy(update={"repeated_block": "Block"}))
    assert space.domains["activation_checkpointing"] == ("off", "Block")
    ranking = Ranking(BATCH0, _noise(64.0))

    def ran(number: int, config: TrialConfig) -> TrialRecord:
        per_sample = 6 if config.activation_checkpointing != "off" else 30
        peak = (400 + per_sample * config.batch_size * config.world_size) * 2**20
        record = _record(number, config, _cpu(config), ranking)
        over = "peak host memory > budget 1.0 GiB" if peak > 2**30 else None
        return record.model_copy(update={"infeasible_reason": over})

    records = [ran(0, space.baseline)]
    for _ in range(5):
        move = next_move(space, ranking, records, [], trials=20)
        assert move is not None
        records.append(ran(len(records), space.config_from_params(move.params)))
    first, second = (r.result.config for r in records[1:3])
    assert (first.batch_size, first.activation_checkpointing) == (32, "Block")
    assert (second.batch_size, second.accumulation_steps, second.world_size) == (16, 2, 1)
    unchecked = [
        r.result.config for r in records[1:] if r.result.config.activation_checkpointing == "off"
    ]
    assert all(config.batch_size < 32 for config in unchecked)


def test_on_cuda_without_a_budget_the_memory_knobs_wait_until_memory_binds():
    """Two GPUs, no --memory-budget: checkpointing and FSDP are in the space but no move uses
    them while everything fits; once your configuration runs out of memory, the first move is
    its checkpointed retry, and a DDP layout that runs out too is retried checkpointed and
    sharded next."""
    from advisor.results import GpuInfo
    from advisor.search.memory import MEMORY_GATE, memory_gate
    from advisor.search.space import build_space
    from advisor.settings import TuneSettings
    from tests.conftest import CPU_PROFILE
    from tests.search.test_space import TASK

    gpu = GpuInfo(name="G", memory_bytes=2**34, capability="8.0", bf16=True)
    two_gpus = CPU_PROFILE.model_copy(update={"cuda_version": "12.8", "gpus": (gpu, gpu)})
    task = TASK.model_copy(update={"repeated_block": "Block"})
    space = build_space(TuneSettings(spec="a.py:f", knobs="classic,amp"), two_gpus, task)
    assert space.memory_gated and space.domains["activation_checkpointing"] == ("off", "Block")
    assert {"fsdp-2", "fsdp-2-grad-op"} <= set(space.domains["parallel"])
    ranking = Ranking(BATCH0, _noise(64.0))

    def plan(baseline_status: str, ddp_status: str) -> list[TrialConfig]:
        baseline = _record(0, space.baseline, 1000.0, ranking)
        records = [baseline.model_copy(update={"result": baseline.result.model_copy(
            update={"status": baseline_status})})]  # fmt: skip
        for _ in range(10):
            move = next_move(space, ranking, records, [], trials=20)
            if move is None:
                break
            config = space.config_from_params(move.params)
            status = ddp_status if config.parallel == "ddp-2" else "ok"
            result = TrialResult(config=config, status=status, samples_per_s=900.0)
            records.append(_record(len(records), config, 900.0, ranking).model_copy(
                update={"result": result}))  # fmt: skip
        return [r.result.config for r in records[1:]]

    fitting = plan("ok", "ok")
    assert fitting and not any(
        c.activation_checkpointing != "off" or c.parallel_mode == "fsdp" for c in fitting
    )
    checkpointed = space.baseline.model_copy(update={"activation_checkpointing": "Block"})
    assert memory_gate(True, checkpointed, []) == MEMORY_GATE
    bound = plan("oom", "oom")
    assert bound[0] == checkpointed
    ddp = next(i for i, c in enumerate(bound) if c.parallel == "ddp-2")
    retries = bound[ddp + 1 : ddp + 3]  # checkpointed, then sharded
    assert bound[ddp].model_copy(update={"activation_checkpointing": "Block"}) in retries
    assert bound[ddp].model_copy(update={"parallel_mode": "fsdp"}) in retries
