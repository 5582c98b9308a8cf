"""A search trial's warm-up, on a fake clock: what a first micro-step may settle."""

from __future__ import annotations

import pytest

from advisor.knobs import TrialConfig
from advisor.trial.child.warmup import FirstStep, WarmUpTerms, warm_up
from tests.trial.scripted import FakeClock, ScriptedTrainer

SETTLE_S = 0.2


@pytest.mark.parametrize("predicts_steps", [True, False], ids=["cpu", "cuda-like"])
def test_a_long_first_step_settles_the_warm_up_only_where_it_predicts_the_steps(predicts_steps):
    clock = FakeClock()
    trainer = ScriptedTrainer(TrialConfig(batch_size=16), clock, micro_s=0.002)
    trainer.micro_step()  # the first step, run apart; its seconds are made up below
    # A first step five times the time to settle in, as on CUDA, where it loads its kernels:
    # steps after it take milliseconds, as there.
    first = FirstStep(seconds=5 * SETTLE_S, stepped=True, predicts_steps=predicts_steps)

    window = warm_up(
        trainer, WarmUpTerms(steps=3, budget_s=2.0, settle_s=SETTLE_S), first=first, clock=clock
    )

    if predicts_steps:  # steps that long settle the warm-up: the window follows at once
        assert window.steps == 0 and trainer.micro_steps == 1
    else:  # its one-off costs say nothing of the steps: they warm up as in any trial
        assert window.steps == 3
