"""A fake clock and a trainer whose micro-steps take scripted seconds on it: the timing code of a
trial (`advisor.trial.child.warmup`, `window`, `budget`, `early_end`) driven without a real clock,
as httpx's tests drive its client through `MockTransport`."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from advisor.decide.race.grid import sample_grid
from advisor.knobs import TrialConfig
from advisor.trial.child.budget import (
    WindowTerms,
    estimated_cycle_s,
    timed_window,
    too_long_for_window,
    warm_up_trial,
)
from advisor.trial.child.measure import first_micro_step
from advisor.trial.child.steps import WindowMonitor
from advisor.trial.child.warmup import FirstStep
from advisor.trial.child.window import Window
from advisor.trial.protocol import EARLY_STEPS

# Seconds by micro-step (or optimizer step): one figure for all, a list (its last figure for
# every one after it), or a function of the 0-based index.
Seconds = float | Sequence[float] | Callable[[int], float]


def at(seconds: Seconds, index: int) -> float:
    """The scripted seconds of the `index`-th micro-step (or step)."""
    if callable(seconds):
        return seconds(index)
    if isinstance(seconds, (int, float)):
        return float(seconds)
    return seconds[min(index, len(seconds) - 1)]


class FakeClock:
    """Seconds that pass only when told: `clock()` reads them, `advance` moves them on."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass."""
        assert seconds >= 0, seconds
        self.now += seconds


def steps_on(trainer: object, step_s: float) -> FakeClock:
    """A fake clock on which each of `trainer`'s optimizer steps (a real `Trainer`'s) takes
    `step_s`."""
    clock = FakeClock()
    step = trainer.step  # type: ignore[attr-defined]

    def timed_step(on_backward=None):  # type: ignore[no-untyped-def]
        clock.advance(step_s)
        return step(on_backward)

    trainer.step = timed_step  # type: ignore[attr-defined]
    return clock


class Loader:
    """A DataLoader's workers on a `FakeClock`, as `ScriptedTrainer(wait_s=...)`: `workers`
    processes, each building every `workers`-th batch in `batch_s`, at most `prefetch` of its
    batches built ahead of the one the training process takes. Batches then arrive in rounds:
    one micro-step waits for a round, the next ones find their batches ready."""

    def __init__(self, clock: FakeClock, workers: int, batch_s: float, prefetch: int = 2) -> None:
        self._clock = clock
        self._workers = workers
        self._batch_s = batch_s
        self._prefetch = prefetch
        self._started = clock()
        self._ready: list[float] = []  # by batch
        self._taken: list[float] = []

    def __call__(self, index: int) -> float:
        """How long the `index`-th micro-step waits for its batch (taken in order)."""
        assert index == len(self._taken), "batches are taken in order"
        ahead = index - self._workers * self._prefetch  # the batch that frees its slot
        previous = index - self._workers  # the batch its worker built before it
        start = max(
            self._ready[previous] if previous >= 0 else self._started,
            self._taken[ahead] if ahead >= 0 else self._started,
        )
        self._ready.append(start + self._batch_s)
        now = self._clock()
        self._taken.append(max(now, self._ready[index]))
        return self._taken[index] - now


class ScriptedTrainer:
    """A `Trainer` (`advisor.trial.child.loop`) whose micro-steps take scripted seconds on a
    `FakeClock`, and keep its contract: a cycle of `cycle` micro-steps (the configuration's
    accumulation steps) ends with the optimizer step, after which `last_loss` holds the mean
    loss of the micro-batches in its gradients; `restart_cycle` starts cycles of another length
    with the next micro-step, the micro-batches accumulated so far staying in the next step.

    Each micro-step first waits `wait_s` for its batch (added to `data_wait_s`, as the loader's
    wait is), then computes for `micro_s`, and `optimizer_s` more where it ends a cycle (indexed
    by optimizer step).
    """

    def __init__(
        self,
        config: TrialConfig,
        clock: FakeClock,
        *,
        micro_s: Seconds = 0.1,
        optimizer_s: Seconds = 0.0,
        wait_s: Seconds = 0.0,
        loss: Seconds = 1.0,
    ) -> None:
        self.config = config
        self.clock = clock
        self.device = torch.device("cpu")
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)
        self.cycle = config.accumulation_steps
        self.data_wait_s = 0.0
        self.last_loss = torch.zeros(())
        self.micro_steps = 0  # run so far
        self.steps = 0  # optimizer steps so far
        self._script = (micro_s, optimizer_s, wait_s, loss)
        self._micro_done = 0  # of the current cycle
        self._cycle_losses: list[float] = []  # of the micro-batches in the gradients

    def micro_step(self) -> bool:
        """One micro-batch: its wait, its compute, and after the cycle's last the optimizer
        step; returns whether it stepped."""
        micro_s, optimizer_s, wait_s, loss = self._script
        index = self.micro_steps
        final = self._micro_done + 1 >= self.cycle
        waited = at(wait_s, index)
        self.data_wait_s += waited
        self.clock.advance(waited + at(micro_s, index))
        if final:
            self.clock.advance(at(optimizer_s, self.steps))
        self._cycle_losses.append(at(loss, index))
        self.micro_steps += 1
        self._micro_done += 1
        if not final:
            return False
        self.last_loss = torch.tensor(math.fsum(self._cycle_losses) / len(self._cycle_losses))
        self._cycle_losses = []
        self._micro_done = 0
        self.steps += 1
        return True

    def restart_cycle(self, cycle: int) -> None:
        """From now on, cycles of `cycle` micro-batches, the next micro-step the first of one."""
        self.cycle = cycle
        self._micro_done = 0

    def synchronize(self) -> None:
        """Nothing is queued: its micro-steps' seconds are on the clock already."""


def terms(config: TrialConfig, trial_seconds: float, **fields: object) -> WindowTerms:
    """What a window order's warm-up and window keep to, as `WindowTerms.of` makes them of a
    request: the warm-up takes `EARLY_STEPS` optimizer steps at least."""
    steps = max(int(fields.pop("warmup_steps", EARLY_STEPS)), EARLY_STEPS)  # type: ignore[call-overload]
    return WindowTerms(config=config, trial_seconds=trial_seconds, warmup_steps=steps, **fields)  # type: ignore[arg-type]


@dataclass
class Timing:
    """What a trial's timing saw: its first micro-step, its warm-up and its window (None where
    the warm-up was stopped), and whether the window timed a cycle's parts."""

    first: FirstStep
    warmup: Window
    estimate: bool
    window: Window | None

    def cycle_s(self, accumulation: int) -> float | None:
        """A cycle of `accumulation` micro-steps, as the trial's samples/s says
        (`advisor.trial.child.measure`): estimated from the parts a window timed
        (`estimated_cycle_s`), or from its micro-steps over its seconds."""
        window = self.window
        if window is None:
            return None
        if self.estimate:
            return estimated_cycle_s(window, accumulation)
        return accumulation * window.elapsed_s / window.micro_batches


def time_trial(
    trainer: ScriptedTrainer, request: WindowTerms, watch: WindowMonitor | None = None
) -> Timing:
    """A trial's timing, in the order `advisor.trial.child.measure` runs it: the first
    micro-step alone, the warm-up, whether a cycle is too long for the window, the window."""
    clock = trainer.clock
    first, _ = first_micro_step(trainer, clock=clock)
    warmup = warm_up_trial(trainer, request, watch, first, clock=clock)
    if warmup.stopped_early:
        return Timing(first, warmup, estimate=False, window=None)
    estimate = too_long_for_window(warmup, request, first)
    window = timed_window(trainer, request, warmup, first, watch, estimate, clock=clock)
    return Timing(first, warmup, estimate, window)


def scripted_trial(
    config: TrialConfig,
    trial_seconds: float,
    *,
    micro_s: Seconds = 0.1,
    optimizer_s: Seconds = 0.0,
    batch_s: float | None = None,
    watch: WindowMonitor | None = None,
    **fields: object,
) -> Timing:
    """`time_trial` of a `ScriptedTrainer` on a fresh `FakeClock`, its batches built by
    `config.num_workers` loader workers in `batch_s` each (`Loader`; ready at once without),
    under DDP in a `one_rank_group`. `fields` are the window's terms (`WindowTerms`)."""
    clock = FakeClock()
    wait_s: Seconds = 0.0
    if batch_s is not None:
        wait_s = Loader(clock, config.num_workers, batch_s, config.prefetch_factor)
    trainer = ScriptedTrainer(
        config, clock, micro_s=micro_s, optimizer_s=optimizer_s, wait_s=wait_s
    )
    ranks = one_rank_group() if config.world_size > 1 else contextlib.nullcontext()
    with ranks:
        return time_trial(trainer, terms(config, trial_seconds, **fields), watch)


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A process group of this process alone, over gloo: the all-reduces by which DDP ranks
    agree (`advisor.trial.child.agreement`) then answer as ranks that all saw the same steps."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


# A race's sample grid for the trial tests: whole batches of 16, to 20 million samples.
GRID = sample_grid(16, 16 * 32, 5_000_000)
