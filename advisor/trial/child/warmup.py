"""A trial's warm-up: running past everything that makes early steps unrepresentative, as a
window of its own (`advisor.trial.child.window`), before the window that is timed."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Protocol

from advisor.trial.child.steps import Agreement, Clock, StepSource, WindowMonitor
from advisor.trial.child.window import Bounds, Window, run_window

__all__ = [
    "SCALER_STABLE_STEPS",
    "FirstStep",
    "LossScaler",
    "WarmUpSteps",
    "WarmUpTerms",
    "warm_up",
]

BENCHMARK_EXTRA_STEPS = 5  # cudnn.benchmark autotunes every new shape on its first calls
SCALER_STABLE_STEPS = 3  # fp16: the loss scale must have stopped backing off
SCALER_MAX_STEPS = 50
# A first step that waited for its batch this much of its time waited for the workers' first
# round (`FirstStep.data_bound`).
DATA_BOUND_FIRST_STEP = 0.5


class LossScaler(Protocol):
    """What a warm-up reads of a `torch.amp.GradScaler`: whether it scales (fp16), and its scale."""

    def is_enabled(self) -> bool:
        """Whether it scales the loss (fp16 only)."""
        ...

    def get_scale(self) -> float:
        """The current loss scale."""
        ...


class WarmUpSteps(StepSource, Protocol):
    """What a warm-up runs and reads of a `Trainer`: a window's `StepSource`, and its GradScaler."""

    @property
    def scaler(self) -> LossScaler: ...


@dataclass(frozen=True)
class FirstStep:
    """The trial's first micro-step, run alone before its warm-up: its seconds, whether it
    ended an optimizer step (it does without accumulation), and of its seconds those it waited
    for its batch; and whether its seconds predict the steps after it.

    They do not on CUDA: there the first step also loads the kernels it runs (CUDA loads a
    kernel's module at its first use) and creates the cuBLAS and cuDNN handles. On an H200,
    examples/cnn.py at batch 256 took 0.35 s for its first micro-step and 5-8 ms for each after
    it; taken as a step's length, it ended search trials' warm-ups at once and had cycles of
    16 ms (accumulation 2) timed in parts, as if too long for the window.
    """

    seconds: float
    stepped: bool
    wait_s: float = 0.0
    predicts_steps: bool = True

    @property
    def data_bound(self) -> bool:
        """Whether waiting for the loader's first batch took most of it: its workers were busy
        building their first round, with no time to queue batches beyond it."""
        return self.wait_s >= DATA_BOUND_FIRST_STEP * self.seconds


@dataclass(frozen=True)
class WarmUpTerms:
    """How long a warm-up runs: `steps` optimizer steps at least, within `budget_s` (None:
    however long, the numerics reference's); a re-run's takes `whole_steps`; a search trial's
    may end once it has lasted `settle_s`, or within its first optimizer step once that
    predicts a cycle longer than `cycle_beyond_s`."""

    steps: int
    budget_s: float | None = None
    whole_steps: bool = False
    settle_s: float | None = None
    cycle_beyond_s: float | None = None


def warm_up(
    trainer: WarmUpSteps,
    terms: WarmUpTerms,
    *,
    agree: Agreement | None = None,
    monitor: WindowMonitor | None = None,
    first: FirstStep | None = None,
    clock: Clock = time.perf_counter,
) -> Window:
    """Run past everything that makes early steps unrepresentative; return the warm-up window,
    every micro-step timed.

    At least `steps` optimizer steps and two loader worker cycles; more with cudnn.benchmark
    (autotuning); with fp16, until the GradScaler's scale has settled, since it starts at 2^16
    and skips optimizer steps while it backs off. All of it within `terms.budget_s` seconds: a
    configuration whose steps are that slow ends its warm-up early, even within a step (its
    window then times the parts of a step: `advisor.trial.child.measure`). With
    `terms.whole_steps` (a finalist's re-run) it lasts the budget and one optimizer step at the
    least, the `first` micro-step's seconds counted (with workers, only as below); under DDP,
    where the ranks end it after an optimizer step, counted apart they often cost a second whole
    cycle. With `terms.settle_s` (a search trial), it may end after one optimizer step and one
    round of the workers, once it has lasted `settle_s`: early steps' extra costs are
    milliseconds, which only short steps need several steps to outlast; or within its first
    optimizer step, once its micro-steps predict a cycle longer than `cycle_beyond_s`. Without
    loader workers, the trial's `first` micro-step counts towards all three: after a first step
    that lasted `settle_s`, without accumulation or cudnn.benchmark, the window follows at once;
    with accumulation too, where that first micro-step already predicts a cycle longer than
    `cycle_beyond_s` (the window times the cycle's parts; more warm-up micro-steps would only
    repeat them). With workers it does so only where `first` was `FirstStep.data_bound`: the
    rest of the workers' first round is then ready, as after any round. Where something else
    made it long (compilation, lazy initialisation), the batches the workers queued meanwhile
    must drain before the window, which would read them as fast steps. The monitor's stop ends
    it at once. DDP ranks pass `agree`, and end it together after an optimizer step. Time is
    read from `clock`.
    """
    extra = BENCHMARK_EXTRA_STEPS if trainer.config.cudnn_benchmark else 0
    first = _counted(trainer, first)
    budget_s = terms.budget_s
    if terms.whole_steps and budget_s is not None:
        bounds = _rerun(trainer, terms, extra, first, budget_s)
    elif terms.settle_s is None:
        bounds = Bounds(
            min_steps=terms.steps + extra,
            max_seconds=budget_s,
            stop_at_once=True,
            agree_every_micro_step=budget_s is not None,
        )
    else:
        bounds = _settling(trainer, terms, extra, first)
        if _settled_already(trainer, bounds, first, agree):
            return _settled_scaler(trainer, Window(), terms, agree, monitor, clock)
    window = run_window(trainer, bounds, agree=agree, monitor=monitor, time_micro=True, clock=clock)
    if window.stopped_early:
        return window
    return _settled_scaler(trainer, window, terms, agree, monitor, clock)


def _counted(trainer: WarmUpSteps, first: FirstStep | None) -> FirstStep | None:
    """The first micro-step, where it counts towards the warm-up."""
    if first is not None and not first.predicts_steps:
        return None  # its one-off costs say nothing of the steps, nor settle them
    if trainer.config.num_workers and not (first is not None and first.data_bound):
        return None  # batches the workers queued meanwhile must drain in the warm-up
    return first


def _settled_already(
    trainer: WarmUpSteps, bounds: Bounds, first: FirstStep | None, agree: Agreement | None
) -> bool:
    """Whether a search trial's first micro-step settled its warm-up: every rank's, or none."""
    settled = (
        (bounds.min_steps <= 0 or _first_cycle_too_long(trainer, first, bounds.cycle_beyond_s))
        and bounds.min_seconds <= 0
        and bounds.earlier_micro >= (trainer.config.num_workers)
    )
    return agree.all_done(0, settled) if agree is not None else settled


def _rerun(
    trainer: WarmUpSteps, terms: WarmUpTerms, extra: int, first: FirstStep | None, budget_s: float
) -> Bounds:
    """A re-run's warm-up: the budget and one optimizer step at the least, in whole steps."""
    return Bounds(
        min_steps=1 + extra,
        min_seconds=_left_after(first, budget_s),
        max_steps=terms.steps + extra,
        stop_at_once=True,
        earlier_micro=_first_round_micro(first, trainer.config.num_workers),
    )


def _settling(
    trainer: WarmUpSteps, terms: WarmUpTerms, extra: int, first: FirstStep | None
) -> Bounds:
    """A search trial's warm-up: `settle_s` from the first micro-step's start, one optimizer
    step and one round of the workers at least, the first micro-step included."""
    config, settle_s = trainer.config, terms.settle_s or 0.0
    return Bounds(
        min_steps=1 + extra - int(first is not None and first.stepped),
        min_seconds=_left_after(first, settle_s),
        max_steps=max(terms.steps + extra, math.ceil(config.num_workers / trainer.cycle)),
        max_seconds=terms.budget_s,
        worker_rounds=1,
        prefetched_rounds=False,
        earlier_micro=_first_round_micro(first, config.num_workers),
        min_seconds_at_a_step=True,
        stop_at_once=True,
        agree_every_micro_step=terms.budget_s is not None,
        cycle_beyond_s=terms.cycle_beyond_s,
    )


def _left_after(first: FirstStep | None, seconds: float) -> float:
    """What is left of `seconds` once the `first` micro-step (if it counts) took its share."""
    return max(0.0, seconds - (first.seconds if first is not None else 0.0))


def _first_cycle_too_long(
    trainer: WarmUpSteps, first: FirstStep | None, cycle_beyond_s: float | None
) -> bool:
    """Whether the first micro-step, one without the optimizer step, already predicts an
    optimizer cycle longer than `cycle_beyond_s`: the window will time the cycle's parts, which
    more warm-up micro-steps would only repeat."""
    return (
        first is not None
        and not first.stepped
        and cycle_beyond_s is not None
        and not trainer.config.cudnn_benchmark  # its autotuning needs the warm-up's steps
        and trainer.cycle * first.seconds > cycle_beyond_s
    )


def _first_round_micro(first: FirstStep | None, workers: int) -> int:
    """The micro-batches of the workers' first round that the first step spans: all of them
    where it waited for that round (`FirstStep.data_bound`), its own batch otherwise."""
    if first is None:
        return 0
    return max(1, workers) if first.data_bound else 1


def _settled_scaler(
    trainer: WarmUpSteps,
    window: Window,
    terms: WarmUpTerms,
    agree: Agreement | None,
    monitor: WindowMonitor | None,
    clock: Clock,
) -> Window:
    """fp16: whole steps after `window` until the GradScaler's scale has stopped backing off,
    within what is left of `budget_s`; the steps' losses join the window's."""
    if not trainer.scaler.is_enabled():
        return window
    budget_s, whole_steps = terms.budget_s, terms.whole_steps
    started = clock() - window.elapsed_s
    scale, stable = trainer.scaler.get_scale(), 0
    for _ in range(SCALER_MAX_STEPS):
        left = None if budget_s is None else budget_s - (clock() - started)
        done = stable >= SCALER_STABLE_STEPS or (left is not None and left <= 0)
        if agree is not None:  # each rank's clock started apart: they end it together
            done = agree.all_done(window.steps, done)
        if done:
            break
        one = Bounds(max_seconds=None if whole_steps else left, worker_rounds=0, stop_at_once=True)
        settling = run_window(trainer, one, agree=agree, monitor=monitor, clock=clock)
        window.losses += settling.losses  # every step's loss, in order: the early losses
        if settling.stopped_early:
            window.stopped_early = True
            break
        previous, scale = scale, trainer.scaler.get_scale()
        stable = stable + 1 if scale == previous else 0
    return window
