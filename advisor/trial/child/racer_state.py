"""A racer's training state, saved at the end of a race and loaded by the race that continues
it (docs/method.md, "The race goes on").

The state is what the next optimizer step depends on: the model's weights and buffers, the
optimizer's state, the GradScaler's scale, the learning-rate warm-up's position, and how many
epochs of the loader's shuffle were begun. The continued racer begins a fresh epoch, whose
shuffle is seeded by its number, rather than the rest of the interrupted one: the order of the
samples is random either way. An FSDP racer's weights are sharded over its ranks, and it is not
saved.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from advisor.trial.child.loop import Trainer

__all__ = ["can_save", "load_racer", "save_racer"]


def can_save(trainer: Trainer) -> bool:
    """Whether the racer's state fits one file: not under FSDP, whose weights are sharded."""
    return trainer.config.parallel_mode != "fsdp"


def save_racer(trainer: Trainer, path: Path) -> None:
    """Write the state to `path` (rank 0 of a DDP racer: every rank holds the same), whole or
    not at all."""
    if not can_save(trainer) or (dist.is_initialized() and dist.get_rank() != 0):
        return
    state = {
        "model": trainer.module.state_dict(),
        "optimizer": trainer.optimizer.state_dict(),
        "scaler": trainer.scaler.state_dict(),
        "scheduler": trainer.scheduler.state_dict() if trainer.scheduler else None,
        "epochs": trainer.epochs_begun,
    }
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)


def load_racer(trainer: Trainer, path: Path, seed: int) -> None:
    """Continue from the state at `path`; the sampling generators reseeded from `seed` and the
    epochs begun, so that no rank repeats the first race's order."""
    state = torch.load(path, map_location=trainer.device, weights_only=True)
    trainer.module.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scaler.load_state_dict(state["scaler"])
    if trainer.scheduler is not None and state["scheduler"] is not None:
        trainer.scheduler.load_state_dict(state["scheduler"])
    epochs = int(state["epochs"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(seed + epochs + 1000 * (rank + 1))
    trainer.epochs_begun = epochs
