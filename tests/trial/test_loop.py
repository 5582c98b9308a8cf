"""The trial's training loop, in this process."""

from __future__ import annotations

import contextlib
import threading

import psutil
import torch

from advisor import TrainingTask
from advisor.knobs import TrialConfig
from advisor.task import build_task
from advisor.trial.child.loop import Trainer

FAULTS = "tests/workloads/faults.py"


def test_closing_a_trainer_leaves_no_loader_worker_even_one_deaf_to_sigterm():
    task, _ = build_task(f"{FAULTS}:worker_stuck_after_a_batch")
    trainer = Trainer(task, TrialConfig(batch_size=16, num_workers=2), torch.device("cpu"))
    others = {child.pid for child in psutil.Process().children()}  # e.g. the trial launcher
    try:
        trainer.micro_step()  # each worker has served its one batch and hangs in the next
        workers = _children_but(others)
        assert len(workers) == 2
        trainer.close()
        alive = [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        assert alive == []
    finally:  # a failure must not leave them holding the terminal's pipes
        for worker in _children_but(others):
            with contextlib.suppress(psutil.Error):
                worker.kill()


def _children_but(pids: set[int]) -> list[psutil.Process]:
    return [child for child in psutil.Process().children() if child.pid not in pids]


class _NanAtFirstCall(torch.nn.Module):
    """A linear model whose first forward pass gives NaN, as a bad first batch would."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.calls = 0

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = self.linear(features)
        return out * float("nan") if self.calls == 1 else out


def test_a_restarted_cycle_times_its_own_micro_steps_and_keeps_the_losses_before_it():
    # A window timing a cycle's parts restarts it after the first micro-step: the next
    # micro-step starts a cycle of two, and the loss of the step that ends it still holds the
    # first micro-step's, whose NaN the window's check must see.
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(64, 4, generator=generator)
    task = TrainingTask(
        model=_NanAtFirstCall(),
        dataset=torch.utils.data.TensorDataset(features, (features[:, 0] > 0).long()),
        loss_fn=torch.nn.CrossEntropyLoss(),
        batch_size=8,
    )
    trainer = Trainer(task, TrialConfig(batch_size=8, accumulation_steps=4), torch.device("cpu"))

    assert trainer.micro_step() is False
    trainer.restart_cycle(2)

    assert trainer.micro_step() is False  # the first of its own cycle, not the end of one
    assert trainer.micro_step() is True
    assert torch.isnan(trainer.last_loss)
    trainer.close()


def test_closing_a_trainer_does_not_wait_for_a_lock_a_killed_worker_held():
    """A worker killed while checking its done event holds that event's lock for good; the
    loader's own shutdown would wait for it forever. Here another thread takes the lock and
    never gives it back, as such a worker would."""
    task, _ = build_task(f"{FAULTS}:worker_stuck_after_a_batch")
    trainer = Trainer(task, TrialConfig(batch_size=16, num_workers=2), torch.device("cpu"))
    others = {child.pid for child in psutil.Process().children()}
    try:
        trainer.micro_step()
        iterator = trainer._iterator
        assert iterator is not None
        holder = threading.Thread(target=iterator._workers_done_event._cond.acquire)
        holder.start()
        holder.join()
        closing = threading.Thread(target=trainer.close, daemon=True)
        closing.start()
        closing.join(timeout=30)
        assert not closing.is_alive(), "close() waited for the dead holder's lock"
        assert iterator._shutdown
    finally:
        for worker in _children_but(others):
            with contextlib.suppress(psutil.Error):
                worker.kill()
