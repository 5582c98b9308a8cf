"""Real DDP trials over gloo: ranks launched, measured, combined, failed and killed as a group."""

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from advisor.knobs import TrialConfig
from advisor.task import TrainingTask
from advisor.trial.child.loop import Trainer, wrap_model
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY, survivors
from tests.workloads.tiny import factory

DDP = {"parallel_mode": "ddp", "world_size": 2}


def _run(name, tmp_path, *, timeout_s=120.0, **knobs):
    launch = TrialLaunch(
        spec=f"{TINY}:{name}", cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=timeout_s
    )
    config = TrialConfig(batch_size=16, **{**DDP, **knobs})
    phases: list[str] = []
    result = ProcessRunner(launch).run(
        WindowOrder(config=config), tmp_path / "trial.log", on_phase=phases.append
    )
    return result, phases


def test_two_rank_trial_counts_the_samples_of_both_over_the_slowest_window(tmp_path, marked):
    result, phases = _run("factory", tmp_path, accumulation_steps=2, num_workers=1)
    assert result.status == "ok", result.reason
    assert phases == ["first_step", "warmup", "measure"]
    assert [rank.rank for rank in result.ranks] == [0, 1]
    slowest = max(rank.window_s for rank in result.ranks)
    assert result.window_s == slowest
    # Both ranks ran the same agreed number of steps, each over its own shard.
    per_rank = result.steps_measured * 2 * 16
    assert result.samples_measured == 2 * per_rank
    assert result.samples_per_s == result.samples_measured / slowest
    assert result.peak_memory_bytes == sum(rank.peak_memory_bytes for rank in result.ranks)
    assert result.config.parallel == "ddp-2"
    assert survivors(marked) == []


def test_a_rank_that_raises_fails_the_trial_with_its_reason(tmp_path, marked):
    result, _ = _run("rank1_raises", tmp_path)
    assert result.status == "error"
    assert result.reason == "rank 1: RuntimeError: simulated failure in rank 1's forward"
    assert result.wall_s < 60  # the launcher stopped rank 0, which was waiting for rank 1
    assert survivors(marked) == []


def test_a_rank_killed_by_sigkill_is_named_and_not_blamed_on_its_peer(tmp_path, marked):
    result, _ = _run("rank1_sigkill", tmp_path)
    assert result.status == "oom"
    assert result.reason.startswith("rank 1 was killed by SIGKILL")
    assert survivors(marked) == []


@pytest.mark.slow
def test_a_hung_rank_times_out_and_every_rank_is_killed(tmp_path, marked, monkeypatch):
    """Killed with its group, the trial leaves no scratch folder behind, the ranks' included."""
    temporary = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))  # short: sockets are made there
    monkeypatch.setenv("TMPDIR", str(temporary))  # the trial launcher's, and so its children's
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # this process's
    try:
        result, phases = _run("rank1_hangs", tmp_path, timeout_s=12)
        left = [path.name for path in temporary.iterdir() if path.name.startswith("advisor-")]
    finally:
        shutil.rmtree(temporary)
    assert result.status == "timeout"
    assert result.failure_phase == "warmup" and "warmup" in phases
    assert survivors(marked) == []
    assert left == []


def test_ddp_reduces_gradients_only_on_the_last_micro_step(monkeypatch):
    """Counts DDP's gradient all-reduces through a communication hook, in a 1-process group."""
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        reductions = {1: 0, 4: 0}
        for accumulation in reductions:
            model, dataset, loss_fn = factory()
            task = TrainingTask(model=model, dataset=dataset, loss_fn=loss_fn)
            config = TrialConfig(batch_size=16, accumulation_steps=accumulation, **DDP)
            trainer = Trainer(task, config, torch.device("cpu"))

            def count(state, bucket, accumulation=accumulation):
                reductions[accumulation] += 1
                future = torch.futures.Future()
                future.set_result(bucket.buffer())
                return future

            trainer.model.register_comm_hook(None, count)
            for _ in range(3):
                trainer.step()
            trainer.close()
        assert reductions[1] > 0
        assert reductions[4] == reductions[1]  # 12 micro-steps, but only 3 reductions
    finally:
        dist.destroy_process_group()


def test_data_parallel_wraps_the_model_and_trains_on_cpu():
    """On CPU DataParallel just calls the module; the wrapping and training path still run."""
    model = nn.Linear(8, 2)
    data_parallel = TrialConfig.model_construct(batch_size=4, parallel_mode="dp")  # CUDA's
    wrapped = wrap_model(model, data_parallel, torch.device("cpu"))
    assert isinstance(wrapped, nn.DataParallel) and wrapped.module is model
    features = torch.randn(4, 8)
    assert torch.equal(wrapped(features), model(features))
    wrapped(features).sum().backward()
    assert model.weight.grad is not None
    assert wrap_model(model, TrialConfig(batch_size=4), torch.device("cpu")) is model
