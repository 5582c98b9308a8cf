"""The trial's training loop, in this process."""

from __future__ import annotations

import contextlib

import psutil
import torch

from advisor.knobs import TrialConfig
from advisor.task import build_task
from advisor.trial.loop import Trainer

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
