"""What the timing of a trial runs and reads: the step source (a `Trainer` in a trial, a
scripted trainer on a fake clock in tests), the clock, the DDP ranks' agreement, and the
parent's watch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from advisor.knobs import TrialConfig

__all__ = ["Agreement", "Clock", "StepSource", "WindowMonitor"]

Clock = Callable[[], float]


class StepSource(Protocol):
    """What a window runs and reads of a `Trainer` (`advisor.trial.child.loop`, whose docstrings
    state the contract): one micro-step at a time, the cycle of micro-steps that ends with the
    optimizer step, the loss of the last optimizer step and the seconds waited for batches."""

    @property
    def config(self) -> TrialConfig: ...

    @property
    def cycle(self) -> int: ...

    @property
    def data_wait_s(self) -> float: ...

    @property
    def last_loss(self) -> torch.Tensor: ...

    def micro_step(self) -> bool:
        """One micro-step; whether it ended with the optimizer step (`Trainer.micro_step`)."""
        ...

    def synchronize(self) -> None:
        """Wait for the device to finish the work queued so far."""
        ...


class Agreement(Protocol):
    """How DDP ranks decide together when a window ends."""

    def all_done(self, steps: int, done: bool) -> bool:
        """Whether every rank is done; each rank calls it after the same steps (or
        micro-steps: `Bounds.agree_every_micro_step`), `steps` their count so far."""
        ...

    def any_rank(self, flag: bool) -> bool:
        """Whether `flag` is set on any rank; every rank calls it once, at the same point."""
        ...


class WindowMonitor(Protocol):
    """Watches a trial as it runs; called after every micro-step, True once it should stop."""

    def __call__(self) -> bool: ...
