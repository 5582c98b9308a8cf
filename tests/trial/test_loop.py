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
    trainer.micro_step()  # each worker has served its one batch and hangs in the next
    workers = psutil.Process().children()
    assert len(workers) == 2
    try:
        trainer.close()
        alive = [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        assert alive == []
    finally:  # a failure must not leave them holding the terminal's pipes
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()
