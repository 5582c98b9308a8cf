"""A racer saves its training state at the end of a race, and the race that goes on from it
continues that training: the same weights, optimizer moments, warm-up position and curve."""

import pytest
import torch

from advisor.knobs import TrialConfig
from advisor.results import LrPlan
from advisor.task import build_task
from advisor.trial.child.loop import Trainer
from advisor.trial.child.racer_state import load_racer, save_racer
from advisor.trial.child.racing import held_out_split, train_racer
from advisor.trial.orders import RaceOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY
from tests.trial.scripted import GRID, steps_on

STEP_S = 1 / 64  # of training time, on a fake clock: exact in binary
WARM_UP = LrPlan(scale=2.0, warmup_steps=100, rule="linear")  # still ramping when saved


def _trainer(spec: str = f"{TINY}:factory") -> tuple[Trainer, object, object]:
    torch.manual_seed(0)
    task, _ = build_task(spec)
    task, held_out = held_out_split(task)
    return (
        Trainer(task, TrialConfig(batch_size=16), torch.device("cpu"), lr=WARM_UP),
        task,
        held_out,
    )


def test_a_racer_that_goes_on_continues_its_training_and_its_curve(tmp_path):
    first, task, held_out = _trainer()
    grid = tuple(range(128, 100_000, 128))  # one evaluation every 8 steps of 16 samples
    order = RaceOrder(config=first.config, seconds=40 * STEP_S, grid=grid)
    curve = train_racer(first, task, held_out, order, clock=steps_on(first, STEP_S))
    save_racer(first, tmp_path / "state.pt")

    going_on, task, held_out = _trainer()  # a fresh process builds the seeded model again
    load_racer(going_on, tmp_path / "state.pt", seed=0)
    for saved, loaded in zip(first.module.parameters(), going_on.module.parameters(), strict=True):
        assert torch.equal(saved, loaded)
        moments = first.optimizer.state[saved], going_on.optimizer.state[loaded]
        assert all(torch.equal(moments[0][k], moments[1][k]) for k in moments[0])
    lrs = [g["lr"] for g in first.optimizer.param_groups]
    assert [g["lr"] for g in going_on.optimizer.param_groups] == lrs  # mid warm-up, not restarted
    assert going_on.epochs_begun == first.epochs_begun

    # one evaluation every 8 steps from the 40 the first race took
    order = RaceOrder(config=going_on.config, seconds=80 * STEP_S, grid=grid, continues=curve)
    whole = train_racer(going_on, task, held_out, order, clock=steps_on(going_on, STEP_S))
    first.close()
    going_on.close()
    assert whole.points[: len(curve.points)] == curve.points
    assert [p.steps for p in whole.points[len(curve.points) :]] == [48, 56, 64, 72, 80]
    assert [p.seconds for p in whole.points[len(curve.points) :]] == [
        steps * STEP_S for steps in (48, 56, 64, 72, 80)
    ]
    # Trained on from the first race's weights, not from the initial ones.
    assert whole.points[len(curve.points)].loss < curve.points[0].loss


def _launch(seconds: float) -> TrialLaunch:
    return TrialLaunch(
        spec=f"{TINY}:factory", cwd=ROOT, warmup_steps=1, trial_seconds=seconds, timeout_s=120
    )


@pytest.mark.parametrize("layout", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_race_in_its_own_process_saves_its_state_and_goes_on_from_it(tmp_path, layout):
    """Through the trial protocol, one process or two DDP ranks (rank 0 saves, both load)."""
    config = TrialConfig(batch_size=16, **layout)
    state = tmp_path / "racer.pt"
    first = ProcessRunner(_launch(0.6)).run(
        RaceOrder(config=config, seconds=_launch(0.6).trial_seconds, state=str(state), grid=GRID),
        tmp_path / "race.log",
    )
    assert first.status == "ok", first.reason
    assert state.exists()

    whole = ProcessRunner(_launch(1.2)).run(
        RaceOrder(
            config=config,
            seconds=_launch(1.2).trial_seconds,
            state=str(state),
            grid=GRID,
            continues=first.race,
        ),
        tmp_path / "went-on.log",
    )
    assert whole.status == "ok", whole.reason
    before = first.race.points
    assert whole.race.points[: len(before)] == before
    after = whole.race.points[len(before) :]
    assert after and after[0].steps > before[-1].steps and after[-1].seconds >= 1.2
    # From the saved weights, not the initial ones: nearer where the first race ended.
    assert after[0].loss < (before[0].loss + before[-1].loss) / 2
