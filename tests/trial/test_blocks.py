"""Activation checkpointing: which blocks a model repeats, and a trial that checkpoints them
computes what one without does, in less memory (`advisor.trial.child.blocks`)."""

from __future__ import annotations

import pytest
from torch import nn

from advisor.knobs import TrialConfig
from advisor.trial.child.blocks import checkpoint_blocks, repeated_block
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY
from tests.workloads.tiny import Tower


def test_the_repeated_block_is_the_largest_class_with_layers_that_repeats():
    assert repeated_block(Tower(depth=3, width=4)) == "ResidualBlock"
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU())
    assert repeated_block(plain) is None  # single layers repeat, no block does
    once = nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), nn.Linear(4, 2))
    assert repeated_block(once) is None


def test_a_transformers_gpt2_repeats_its_gpt2_block():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64)
    assert repeated_block(transformers.GPT2LMHeadModel(config)) == "GPT2Block"


def test_checkpointed_blocks_keep_the_models_parameter_names():
    model = Tower(depth=2, width=4)
    names = list(model.state_dict())
    assert checkpoint_blocks(model, "ResidualBlock") == 2
    assert list(model.state_dict()) == names  # a checkpoint saved from it loads into yours


def _trial(tmp_path, checkpointing: str):
    launch = TrialLaunch(
        spec=f"{TINY}:blocks", cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=120
    )
    config = TrialConfig(batch_size=128, activation_checkpointing=checkpointing)
    result = ProcessRunner(launch).run(
        WindowOrder(config=config), tmp_path / f"{checkpointing}.log"
    )
    assert result.status == "ok", result.reason
    return result


def test_checkpointing_changes_no_maths_and_takes_less_memory(tmp_path):
    """Dropout included: the recomputed forward draws the same masks, so a search trial's first
    losses (those the numerics check compares with the reference's) are the same."""
    off, on = _trial(tmp_path, "off"), _trial(tmp_path, "ResidualBlock")
    # the same to float32's rounding: under the suite's load one reading differed in its 7th
    # digit (6,186,798 against 6,186,796); another dropout mask would differ in the first
    assert len(on.early_losses) >= 2
    assert on.early_losses == pytest.approx(off.early_losses, rel=1e-6)
    # 8 blocks x 128 samples x 65,536 floats kept without it, 256 MiB (measured: 720 MiB against
    # 500 MiB); with it, one block's at a time
    assert (off.peak_memory_bytes or 0) - (on.peak_memory_bytes or 0) > 128 * 2**20, (
        off.peak_memory_bytes, on.peak_memory_bytes,
    )  # fmt: skip
