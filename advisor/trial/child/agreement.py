"""How the ranks of a trial and its parent agree while it runs: the parent watching a trial's
progress and asking it to stop (`ParentWatch`), and DDP ranks ending a warm-up or a window
together (`EveryStep`, `RankAgreement`), each after the same steps, so that no rank waits in a
collective call the others never make.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.distributed as dist

from advisor.knobs import TrialConfig
from advisor.trial.child.steps import Clock
from advisor.trial.protocol import PROGRESS_INTERVAL_S, Channel

__all__ = ["EveryStep", "ParentWatch", "RankAgreement"]


class ParentWatch:
    """Tells the parent how far the trial got, and stops it when the parent asks.

    From the warm-up on, every `INTERVAL_S` rank 0 appends "elapsed_s samples" (all ranks'
    samples, estimated from its own) to the progress file, and every rank looks for the stop
    file. DDP ranks then stop at their next agreement check. Time is read from `clock`.
    """

    INTERVAL_S = PROGRESS_INTERVAL_S

    def __init__(
        self,
        channel: Channel,
        config: TrialConfig,
        rank: int,
        *,
        clock: Clock = time.perf_counter,
    ) -> None:
        self._progress = Path(channel.progress_path) if channel.progress_path and not rank else None
        self._stop = Path(channel.stop_path) if channel.stop_path else None
        self._samples_per_micro_batch = config.batch_size * config.world_size
        self._clock = clock
        self._started = clock()
        self._micro_batches = 0
        self._next_s = self.INTERVAL_S
        self._stopping = False

    def __call__(self) -> bool:
        self._micro_batches += 1
        elapsed_s = self._clock() - self._started
        if self._stopping or elapsed_s < self._next_s:
            return self._stopping
        self._next_s = elapsed_s + self.INTERVAL_S
        if self._progress is not None:
            samples = self._micro_batches * self._samples_per_micro_batch
            with self._progress.open("a") as progress:
                progress.write(f"{elapsed_s:.4f} {samples}\n")
        self._stopping = self._stop is not None and self._stop.exists()
        return self._stopping


class EveryStep:
    """DDP ranks end a warm-up together: an all-reduce after every optimizer step."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def all_done(self, steps: int, done: bool) -> bool:
        flag = torch.tensor([int(done)], device=self._device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def any_rank(self, flag: bool) -> bool:
        return _any_rank(self._device, flag)


class RankAgreement:
    """DDP ranks end their windows together, once every rank has run its minimum.

    Each check is an all-reduce, so ranks check rarely, all after the same steps: each check
    comes where the time still missing says, at the pace measured so far (the earliest any rank
    proposes), but never more than as many steps later as were run before it: the first steps'
    pace can mislead (batches the loader's workers queued during the warm-up read as fast
    steps; such a pace had put a 2-s window's first check a minute away), and this bounds the
    overrun to the steps already run. A window the parent may end early is checked about
    every `check_every_s` (an all-reduce of two integers: tens of microseconds over gloo), so
    that the ranks stop soon after the parent asks. Its steps are whatever the window counts
    where the ranks decide: optimizer steps, or an estimate's micro-steps. Time is read from
    `clock`.
    """

    def __init__(
        self,
        device: torch.device,
        seconds: float,
        check_every_s: float | None,
        *,
        clock: Clock = time.perf_counter,
    ) -> None:
        self._device = device
        self._seconds = seconds
        self._check_every_s = check_every_s
        self._next_check = 1
        self._clock = clock
        self._started = clock()

    def all_done(self, steps: int, done: bool) -> bool:
        if steps < self._next_check:
            return False
        elapsed = self._clock() - self._started
        missing_s = max(0.0, self._seconds - elapsed)
        gap = min(steps, max(1, math.ceil(missing_s * steps / elapsed)))
        if self._check_every_s:  # steps per check_every_s, at the pace measured so far
            gap = min(gap, max(1, math.ceil(self._check_every_s * steps / elapsed)))
        proposal = steps + gap if not done else steps
        flags = torch.tensor([int(done), proposal], device=self._device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        self._next_check = max(int(flags[1].item()), steps + 1)
        return bool(flags[0].item())

    def any_rank(self, flag: bool) -> bool:
        return _any_rank(self._device, flag)


def _any_rank(device: torch.device, flag: bool) -> bool:
    """Whether `flag` is set on any rank; every rank calls it once, at the same point."""
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
