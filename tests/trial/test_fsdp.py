"""FSDP2 trials over gloo: two ranks shard the model's repeated blocks and compute what DDP
computes (`advisor.trial.child.loop.wrap_model`, `advisor.trial.child.blocks.shard_blocks`)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from advisor.knobs import TrialConfig
from advisor.trial.child.loop import Trainer
from advisor.trial.orders import ReferenceOrder, WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY, survivors
from tests.workloads.tiny import blocks

FSDP = {"parallel_mode": "fsdp", "world_size": 2}
DDP = {"parallel_mode": "ddp", "world_size": 2}


def _run(tmp_path, mode: str = "trial", **knobs):
    launch = TrialLaunch(
        spec=f"{TINY}:blocks", cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=120
    )
    config = TrialConfig(batch_size=16, **knobs)
    result = ProcessRunner(launch).run(
        _order(mode, config), tmp_path / f"{config.label()}-{mode}.log"
    )
    assert result.status == "ok", result.reason
    return result


def test_fsdp_computes_the_losses_ddp_computes(tmp_path):
    """Rank 0's first losses, dropout included: the gathered blocks compute what DDP's copies
    do, with accumulation (FSDP holds the micro-steps' gradients unsharded until the last
    reduces them) and whether or not it reshards after the forward pass."""
    ddp = _run(tmp_path, "reference", accumulation_steps=2, **DDP)
    for reshard in (True, False):
        fsdp = _run(
            tmp_path, "reference", accumulation_steps=2, reshard_after_forward=reshard, **FSDP
        )
        assert fsdp.early_losses == pytest.approx(ddp.early_losses, rel=1e-5)


def test_an_fsdp_trial_with_checkpointing_and_bf16_is_measured_over_both_ranks(tmp_path, marked):
    result = _run(tmp_path, activation_checkpointing="ResidualBlock", amp="bf16", **FSDP)
    assert result.config.parallel == "fsdp-2"
    assert [rank.rank for rank in result.ranks] == [0, 1]
    assert result.samples_measured == result.steps_measured * 2 * 16
    assert result.peak_memory_bytes == sum(rank.peak_memory_bytes for rank in result.ranks)
    assert survivors(marked) == []


@pytest.mark.parametrize("checkpointing", ["off", "ResidualBlock"])
def test_fsdp_makes_each_block_a_unit_and_the_optimizer_steps_the_shards(checkpointing):
    """In a group of one: every repeated block is an FSDP unit of its own (its checkpoint
    wrapper, where checkpointed) and the root one more; the parameters are sharded DTensors,
    and a step changes them."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        task = blocks()
        config = TrialConfig(
            batch_size=8,
            parallel_mode="fsdp",
            world_size=1,
            activation_checkpointing=checkpointing,
        )
        trainer = Trainer(task, config, torch.device("cpu"))
        units = [m for m in trainer.module.modules() if isinstance(m, FSDPModule)]
        assert len(units) == 8 + 1  # the eight ResidualBlocks and the root
        wrapped = sum(isinstance(unit, CheckpointWrapper) for unit in units)
        assert wrapped == (8 if checkpointing != "off" else 0)
        assert all(isinstance(p, DTensor) for p in trainer.module.parameters())
        before = trainer.module.head.weight.full_tensor().clone()
        trainer.step()
        assert not torch.equal(trainer.module.head.weight.full_tensor(), before)
        trainer.close()
    finally:
        dist.destroy_process_group()


def _order(mode: str, config: TrialConfig) -> WindowOrder | ReferenceOrder:
    """A search trial's order, or with `mode` "reference" the numerics reference's."""
    return ReferenceOrder(config=config) if mode == "reference" else WindowOrder(config=config)
