"""Timing a window of a trial's micro-steps and optimizer steps (its warm-up is one too:
`advisor.trial.child.warmup`).

A window runs a `Trainer` (`advisor.trial.child.loop`), bounded in seconds as well as steps. Under
DDP the ranks decide together when it ends (`Agreement`), so that a long optimizer cycle can
be cut in its middle on every rank alike; a search trial's parent may stop it after any
micro-step (`WindowMonitor`). A search trial's window may also end before its time once the
rate it measures is precise (`Bounds.precise_after_s`, `advisor.trial.child.early_end`), or clearly
below the best trial's (`Bounds.beat_step_s`).

A window reads the time through a `Clock` (`time.perf_counter` in a trial) and runs the
micro-steps of a `StepSource` (a `Trainer` in a trial): its tests drive it with a fake clock and
scripted step times.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from advisor.trial.child.early_end import EarlyEnd, mean_and_error
from advisor.trial.child.loop import DivergedError
from advisor.trial.child.steps import Agreement, Clock, StepSource, WindowMonitor

__all__ = [
    "Bounds",
    "Window",
    "cycle_s",
    "run_window",
]


# Seconds from an arbitrary start: `time.perf_counter` in a trial, a fake clock in tests.
class Timed(NamedTuple):
    """A timed micro-step: its seconds, and of them those it waited for its batch."""

    seconds: float
    wait_s: float

    @property
    def compute_s(self) -> float:
        return self.seconds - self.wait_s


@dataclass
class Window:
    """Micro-steps run back to back, timed between device synchronisations."""

    steps: int = 0  # optimizer steps completed
    micro_batches: int = 0
    elapsed_s: float = 0.0
    data_wait_s: float = 0.0
    stopped_early: bool = False  # the monitor ended it
    below_best: bool = False  # it ended once clearly slower than `Bounds.beat_step_s`
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    # With `time_micro`: each micro-step's seconds, and whether it ended with the optimizer step.
    micro_times_s: list[tuple[float, bool]] = field(default_factory=list)
    # With `time_micro`: of each micro-step's seconds, those it waited for its batch.
    micro_waits_s: list[float] = field(default_factory=list)
    loader_workers: int = 0  # processes building the batches while the window trains

    def percentile(self, q: float) -> float:
        ordered = sorted(self.step_times_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s)

    def median_micro_s(self, *, stepped: bool) -> float | None:
        """The median seconds of the timed micro-steps that did (or did not) end a step."""
        times = [seconds for seconds, final in self.micro_times_s if final == stepped]
        return statistics.median(times) if times else None

    def pairs(self) -> list[tuple[Timed, Timed]]:
        """Each plain timed micro-step and the stepped one after it; a stepped one without a
        plain one before it pairs with nothing. (A window that times a cycle's parts starts a
        cycle of its own: `Trainer.restart_cycle`. Before, it began with a stepped micro-step
        that ended the cycle the warm-up had begun: its batch was the second of a round of two
        workers whose first the warm-up took, ready at once, and counted, it read two DDP ranks
        with two workers each 1.14-1.34x faster than whole cycles, examples/data_bound.py,
        batch 512, accumulation 4.)"""
        pairs, plain = [], None
        for (seconds, stepped), wait in zip(self.micro_times_s, self.micro_waits_s, strict=True):
            if stepped and plain is not None:
                pairs.append((plain, Timed(seconds, wait)))
            plain = None if stepped else Timed(seconds, wait)
        return pairs

    def median_compute_s(self, *, stepped: bool) -> float | None:
        """Of the `pairs`' plain (or stepped) micro-steps, the median seconds less their wait
        for a batch."""
        times = [pair[stepped].compute_s for pair in self.pairs()]
        return statistics.median(times) if times else None

    def mean_wait_s(self) -> float | None:
        """The `pairs`' micro-steps' mean wait for a batch."""
        waits = [timed.wait_s for pair in self.pairs() for timed in pair]
        return statistics.mean(waits) if waits else None

    def relative_error(self, batch_steps: int = 1, *, accumulation: int | None = None) -> float:
        """The standard error of the mean step time over the mean, from the means of
        `PRECISE_BATCHES` runs of consecutive steps, each at least `batch_steps` long (a round
        of the loader's workers). Where fewer fit, from at least PRECISE_MIN_BATCHES runs, and
        scaled to the same confidence: fewer batch means ask for a smaller error. Infinite
        below that many runs. With `accumulation`, of the cycles that long that its timed
        micro-steps estimate (`estimated_cycles_s`) instead of the steps."""
        return self.mean_step(batch_steps, accumulation=accumulation)[1]

    def mean_step(
        self, batch_steps: int = 1, *, accumulation: int | None = None
    ) -> tuple[float, float]:
        """The mean step time of the batches `relative_error` reads, and that error."""
        if accumulation is None:
            return mean_and_error(self.step_times_s, batch_steps)
        return mean_and_error(self.estimated_cycles_s(accumulation), batch_steps)

    def micro_error(self, batch_micro: int = 1, earlier_s: list[float] | None = None) -> float:
        """`relative_error` of the timed micro-steps' mean, plain and stepped ones alike, and
        of the micro-steps of `earlier_s` seconds before them."""
        every = [*(earlier_s or []), *(seconds for seconds, _ in self.micro_times_s)]
        return mean_and_error(every, batch_micro)[1]

    def estimated_cycles_s(self, accumulation: int) -> list[float]:
        """Of the timed micro-steps, each plain one and the stepped one after it: the seconds of
        an optimizer cycle of `accumulation` micro-steps they estimate (`cycle_s`)."""
        overlapped = self.loader_workers > 0
        return [
            cycle_s(
                accumulation,
                plain.compute_s,
                stepped.compute_s,
                (plain.wait_s + stepped.wait_s) / 2,
                overlapped=overlapped,
            )
            for plain, stepped in self.pairs()
        ]


def cycle_s(
    accumulation: int, plain_s: float, stepped_s: float, wait_s: float, *, overlapped: bool
) -> float:
    """An optimizer cycle of `accumulation` micro-steps, from a window of (plain, stepped)
    pairs: the compute of a plain micro-step and of one that ends with the optimizer step
    (their seconds less their waits for a batch), and the mean wait for a batch.

    Waits and compute are apart because a loader's workers deliver batches in rounds: with two
    workers, a micro-step that waits for a round alternates with one that finds its batch ready,
    and (plain, stepped) pairs would time every plain one waiting, every stepped one not (read
    as alike, they gave 0.65x the rate of whole cycles on examples/data_bound.py). A cycle is
    `accumulation / 2` pairs with `accumulation / 2 - 1` optimizer steps fewer. An optimizer
    step fewer saves its extra compute where the loader waits for the training process (no
    workers: it builds the batches itself); with workers that build them meanwhile
    (`overlapped`), only what the process did not wait for batches anyway: nothing once a pair
    waited as long as an optimizer step takes (the loader limits), all of it without waits (the
    compute limits)."""
    pair_s = plain_s + stepped_s + 2 * wait_s
    extra_s = stepped_s - plain_s  # of the optimizer step
    idle_s = 2 * wait_s if overlapped else 0.0
    saved_s = extra_s - min(idle_s, max(extra_s, 0.0))
    return accumulation / 2 * pair_s - (accumulation / 2 - 1) * saved_s


@dataclass(frozen=True)
class Bounds:
    """When a window may end: the minimums, and the limits that end it regardless."""

    min_steps: int = 1  # optimizer steps; an estimate's (`estimate_accumulation`): its pairs
    # A precise rate (`precise_after_s`) may end the window after this many steps, fewer than
    # `min_steps`; an estimate's micro-steps, if alike, are precise after one pair.
    precise_min_steps: int | None = None
    min_seconds: float = 0.0
    max_steps: int | None = None
    max_seconds: float | None = None  # a budget: ends it even before the minimums
    # Loaders with workers deliver batches in bursts: the window spans at least this many rounds
    # of the workers (`num_workers` micro-batches each), each round `prefetch_factor` times
    # longer with `prefetched_rounds`, so that a burst of prefetched batches drains within it.
    worker_rounds: int = 2
    prefetched_rounds: bool = True
    earlier_micro: int = 0  # micro-batches run before this window that count in those rounds
    stop_at_once: bool = False  # the monitor's stop ends it even before the minimums
    # From then on, a window past its other minimums ends once `Window.relative_error` is at
    # most `PRECISE_RELATIVE_ERROR`, even before `min_seconds`.
    precise_after_s: float | None = None
    # Seconds of whole steps just before the window that join its steps in that test of
    # precision, not in its rate (`EarlyEnd`); an estimate's: of micro-steps, joining its own.
    earlier_steps_s: tuple[float, ...] = ()
    # A window timing the parts of cycles of this many micro-steps: its precision, and the
    # best's bar, are of the cycles that its timed micro-steps estimate.
    estimate_accumulation: int | None = None
    # From `precise_after_s` on, a window also ends once its mean step (or cycle) time is
    # clearly longer than this (its 95 % interval above it): the best trial's so far, as long a
    # window could only narrow the interval of a rate that cannot be the best.
    beat_step_s: float | None = None
    # An estimate's other accumulations (`WindowOrder.sibling_accumulation`): it is clearly
    # below the best only where the cycles of each of these are too, at their global batch.
    sibling_accumulation: tuple[int, ...] = ()
    # A warm-up timing micro-steps ends, once past its minimum seconds, when its micro-steps
    # predict an optimizer cycle longer than this: the window will time the cycle's parts.
    cycle_beyond_s: float | None = None
    # `min_seconds` ends it only after an optimizer step: the window that follows then starts
    # with a whole cycle (a budget, a stop or a cycle too long may still end it within one).
    min_seconds_at_a_step: bool = False
    # `min_seconds` is reached at the step boundary nearest it, not the first after it: half a
    # step (the window's mean so far) short of it counts. A window of steps that are long
    # against it then lasts `min_seconds` on average, rather than up to a step longer.
    nearest_step: bool = False
    # An estimate's second pair is timed only where a pair is shorter than `min_seconds`: one
    # that takes the window's time alone ends it (micro-steps of seconds each, whose two pairs
    # had cost five of them after the first).
    one_long_pair: bool = False
    # DDP ranks decide after every micro-step, not only after optimizer steps: a budget then
    # ends a long cycle in its middle on every rank alike, and an estimate's window may end
    # after the micro-step that shows its pair precise.
    agree_every_micro_step: bool = False


def run_window(
    trainer: StepSource,
    bounds: Bounds,
    *,
    agree: Agreement | None = None,
    monitor: WindowMonitor | None = None,
    time_micro: bool = False,
    clock: Clock = time.perf_counter,
) -> Window:
    """Run micro-steps until the bounds say, then check the losses.

    The window also spans `bounds.worker_rounds` rounds of the loader's workers. A `monitor`
    may end the
    window before `min_seconds`, never before the other minimums unless `stop_at_once`. DDP
    ranks pass `agree` and decide only after optimizer steps (after every micro-step with
    `bounds.agree_every_micro_step`): they stop together, once every rank is done (one waiting
    for the others would hang). `time_micro` times every micro-step,
    synchronising the device after each. With `bounds.precise_after_s`, the window is checked
    every `PRECISE_CHECK_EVERY_S` from then on and ends once its rate is precise, or clearly
    below `bounds.beat_step_s`'s (`Window.below_best`). Time is read from `clock`.
    """
    config = trainer.config
    round_micro = config.num_workers * (config.prefetch_factor if bounds.prefetched_rounds else 1)
    min_micro = bounds.worker_rounds * round_micro - bounds.earlier_micro
    window = Window(loader_workers=config.num_workers)
    trainer.synchronize()
    started = clock()
    timer = _Timer(started, trainer.data_wait_s, time_micro)
    precise = EarlyEnd(bounds, config.num_workers, trainer.cycle)
    while True:
        stepped = trainer.micro_step()
        if time_micro:
            trainer.synchronize()
        now = clock()
        timer.record(window, trainer, stepped, now)
        stop = monitor is not None and monitor()
        if agree is not None and not stepped and not bounds.agree_every_micro_step:
            continue
        ended = stop or precise(window, now - started)
        done = _window_done(window, bounds, min_micro, stop, ended, now - started, stepped) or (
            now - started >= bounds.min_seconds and _cycle_too_long(window, bounds, trainer)
        )
        if agree is not None:  # each rank's count of the points where they decide
            counted = window.micro_batches if bounds.agree_every_micro_step else window.steps
            done = agree.all_done(counted, done)
        if done or (stepped and window.steps == bounds.max_steps):
            if agree is not None:  # one rank's stop stops all: none may wait for the others
                stop = agree.any_rank(stop)
            window.stopped_early = stop and (
                bounds.stop_at_once or now - started < bounds.min_seconds
            )
            window.below_best = precise.below_best and not window.stopped_early
            break
    trainer.synchronize()
    window.elapsed_s = clock() - started
    return timer.closed(window, trainer)


class _Timer:
    """What a window times of each micro-step: its seconds (with `time_micro`, each micro-step's
    and its wait for a batch), each optimizer step's, and the steps' losses."""

    def __init__(self, started: float, wait_s: float, time_micro: bool) -> None:
        self._last_step = self._last_micro = started
        self._wait_before = self._wait_last = wait_s
        self._time_micro = time_micro
        self._losses: list[torch.Tensor] = []

    def record(self, window: Window, trainer: StepSource, stepped: bool, now: float) -> None:
        """Count the micro-step that ended `now`, and the optimizer step it ended, if any."""
        window.micro_batches += 1
        if self._time_micro:
            window.micro_times_s.append((now - self._last_micro, stepped))
            window.micro_waits_s.append(trainer.data_wait_s - self._wait_last)
            self._wait_last = trainer.data_wait_s
        self._last_micro = now
        if stepped:
            self._losses.append(trainer.last_loss)
            window.step_times_s.append(now - self._last_step)
            self._last_step = now
            window.steps += 1

    def closed(self, window: Window, trainer: StepSource) -> Window:
        """The window with its wait for data and its losses, which must be finite."""
        window.data_wait_s = trainer.data_wait_s - self._wait_before
        losses = self._losses
        window.losses = torch.stack(losses).cpu().tolist() if losses else []
        if not all(torch.isfinite(torch.tensor(window.losses))):
            raise DivergedError(f"the loss became non-finite ({_first_bad(window.losses)})")
        return window


def _window_done(
    window: Window,
    bounds: Bounds,
    min_micro: int,
    stop: bool,
    ended: bool,
    elapsed: float,
    stepped: bool,
) -> bool:
    """Whether the window ends now; `stop`: the monitor's, `ended`: it or a precise rate;
    `stepped`: the last micro-step ended an optimizer step."""
    if (stop and bounds.stop_at_once) or (
        bounds.max_seconds is not None and elapsed >= bounds.max_seconds
    ):
        return True
    # An estimate's steps are its (plain, stepped) pairs (`Window.pairs`).
    steps = window.steps if bounds.estimate_accumulation is None else len(window.pairs())
    if window.micro_batches < min_micro:
        return False
    if ended and steps >= min(bounds.min_steps, bounds.precise_min_steps or bounds.min_steps):
        return True
    on_time = elapsed + _short_of_time_s(window, bounds, elapsed) >= bounds.min_seconds and (
        stepped or not bounds.min_seconds_at_a_step
    )
    enough = steps >= bounds.min_steps or (steps >= 1 and _pairs_too_long(window, bounds))
    return enough and on_time


def _pairs_too_long(window: Window, bounds: Bounds) -> bool:
    """With `Bounds.one_long_pair`, whether the estimate's pairs take `min_seconds` each."""
    pairs = window.pairs() if bounds.one_long_pair else []
    return bool(pairs) and min(p.seconds + s.seconds for p, s in pairs) >= bounds.min_seconds


def _short_of_time_s(window: Window, bounds: Bounds, elapsed: float) -> float:
    """With `Bounds.nearest_step`, how far short of `min_seconds` a window may end: half its
    mean step so far (an estimate's: half a pair, one micro-step)."""
    if not bounds.nearest_step:
        return 0.0
    if bounds.estimate_accumulation is not None:
        timed = len(window.micro_times_s)
        return elapsed / timed if timed else 0.0
    return elapsed / window.steps / 2 if window.steps else 0.0


def _cycle_too_long(window: Window, bounds: Bounds, trainer: StepSource) -> bool:
    """Whether the micro-steps timed so far, none of them an optimizer step's, predict a cycle
    longer than `bounds.cycle_beyond_s`."""
    if bounds.cycle_beyond_s is None:
        return False
    micro = window.median_micro_s(stepped=False)
    return micro is not None and trainer.cycle * micro > bounds.cycle_beyond_s


def _first_bad(losses: list[float]) -> str:
    for index, value in enumerate(losses):
        if value != value or value in (float("inf"), float("-inf")):
            return f"{value} at step {index + 1} of the window"
    return "unknown"
