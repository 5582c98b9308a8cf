"""When a search trial's window may end before its time: once the rate it measures is precise,
or clearly below the best trial's (`EarlyEnd`), from the step times of a `Window`
(`advisor.trial.child.window`) and the limits of its `Bounds`.
"""

from __future__ import annotations

import math
from typing import Protocol

__all__ = [
    "PRECISE_BATCHES",
    "PRECISE_MIN_BATCHES",
    "PRECISE_RELATIVE_ERROR",
    "EarlyEnd",
    "EndLimits",
    "TimedSteps",
    "clearly_longer",
    "mean_and_error",
]


class TimedSteps(Protocol):
    """What `EarlyEnd` reads of a window (`advisor.trial.child.window.Window`)."""

    step_times_s: list[float]

    def mean_step(
        self, batch_steps: int = 1, *, accumulation: int | None = None
    ) -> tuple[float, float]: ...

    def micro_error(self, batch_micro: int = 1, earlier_s: list[float] | None = None) -> float: ...

    def estimated_cycles_s(self, accumulation: int) -> list[float]: ...


class EndLimits(Protocol):
    """What `EarlyEnd` reads of a window's limits (`advisor.trial.child.window.Bounds`)."""

    @property
    def precise_after_s(self) -> float | None: ...

    @property
    def earlier_steps_s(self) -> tuple[float, ...]: ...

    @property
    def estimate_accumulation(self) -> int | None: ...

    @property
    def beat_step_s(self) -> float | None: ...

    @property
    def sibling_accumulation(self) -> tuple[int, ...]: ...


# A window that may end once precise: its mean step time from batch means of consecutive steps
# (loaders and allocators make neighbouring steps alike, so single steps overstate precision).
PRECISE_BATCHES = 8
# The standard error of the mean step time over the mean, from PRECISE_BATCHES batch means: half
# the spread from one run to the next (a coefficient of variation of 9-17 % on a 2-core VM,
# benchmarks/measurement_noise.py), which a longer window does not reduce.
PRECISE_RELATIVE_ERROR = 0.05
# Steps long enough that fewer than PRECISE_BATCHES fit are batched one by one, at least this
# many: the same confidence interval (Student's t) then asks for a smaller standard error.
PRECISE_MIN_BATCHES = 3
_T_975 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365}  # by degrees of freedom
PRECISE_CHECK_EVERY_S = 0.05


def mean_and_error(every: list[float], batch_steps: int) -> tuple[float, float]:
    """The mean of these step times, from up to PRECISE_BATCHES batch means of `batch_steps` or
    more steps each (the latest), and its relative error (`Window.relative_error`): NaN and
    infinite below PRECISE_MIN_BATCHES batches."""
    count = min(PRECISE_BATCHES, len(every) // batch_steps)
    if count < PRECISE_MIN_BATCHES:
        return math.nan, math.inf
    size = len(every) // count
    times = every[len(every) - size * count :]
    means = [sum(times[i : i + size]) / size for i in range(0, len(times), size)]
    mean = sum(means) / len(means)
    variance = sum((m - mean) ** 2 for m in means) / (len(means) - 1)
    standard_error = math.sqrt(variance / len(means)) / mean
    return mean, standard_error * _T_975[count - 1] / _T_975[PRECISE_BATCHES - 1]


class EarlyEnd:
    """Whether a window's rate is precise enough to end it, or clearly below the best's: checked
    from `bounds.precise_after_s` on, every PRECISE_CHECK_EVERY_S (each check reads every step
    time); once it is, it stays so. An estimate is precise once the cycles its pairs of
    micro-steps estimate are, or its micro-steps alike, plain and stepped ones: where the
    optimizer step adds little, a cycle is as precise as its micro-steps. Steps just before
    the window (`Bounds.earlier_steps_s`; an estimate's: micro-steps) may show its steps (its
    micro-steps) precise sooner: they only widen the spread where their one-off costs made
    them longer. With too few pairs for their own interval, an estimate's cycle is taken to be
    as precise as its micro-steps in the test against the best's too."""

    def __init__(self, bounds: EndLimits, workers: int, cycle: int) -> None:
        after_s = bounds.precise_after_s
        self._next_s = math.inf if after_s is None else after_s
        # a batch mean spans a round of the workers: steps (or estimated cycles), micro-steps
        self._batch_steps = max(1, math.ceil(workers / cycle))
        self._batch_micro = max(1, workers)
        self._accumulation = bounds.estimate_accumulation
        self._beat_step_s = bounds.beat_step_s
        # An estimate's parts also give the rate at these accumulations (`TrialResult.
        # sibling_rates`): below the best only where each of them is too.
        self._siblings = bounds.sibling_accumulation if self._accumulation is not None else ()
        self._earlier_s = list(bounds.earlier_steps_s)
        self._ended = False
        self.below_best = False  # it ended so, not precise

    def __call__(self, window: TimedSteps, elapsed_s: float) -> bool:
        if self._ended or elapsed_s < self._next_s:
            return self._ended
        self._next_s = elapsed_s + PRECISE_CHECK_EVERY_S
        _, error, _ = self._interval(window, self._accumulation)
        if error <= PRECISE_RELATIVE_ERROR:
            self._ended = True
        elif self._beat_step_s is not None and self._below_best(window, self._beat_step_s):
            self._ended = self.below_best = True
        return self._ended

    def _interval(self, window: TimedSteps, accumulation: int | None) -> tuple[float, float, float]:
        """The mean step (or estimated cycle of `accumulation` micro-steps), its relative
        error, and the relative half-width of its 95 % interval."""
        mean, error = window.mean_step(self._batch_steps, accumulation=accumulation)
        half_width = error * _T_975[PRECISE_BATCHES - 1]  # of the 95 % interval, relative
        if accumulation is not None:
            error = min(error, window.micro_error(self._batch_micro))
            if self._earlier_s:  # micro-steps alike with the one before the window
                error = min(error, window.micro_error(self._batch_micro, self._earlier_s))
            cycles = window.estimated_cycles_s(accumulation)
            if math.isnan(mean) and cycles:  # too few pairs for their own interval
                mean = sum(cycles) / len(cycles)
                half_width = error * _T_975[PRECISE_BATCHES - 1]  # as precise as its micro-steps
        elif self._earlier_s:  # steps alike with those before the window: precise sooner
            every = self._earlier_s + window.step_times_s
            error = min(error, mean_and_error(every, self._batch_steps)[1])
        return mean, error, half_width

    def _below_best(self, window: TimedSteps, beat_s: float) -> bool:
        """Whether the window's steps, and the cycles of each sibling accumulation, are clearly
        longer than the best's at their global batch (`beat_s` is at the window's own)."""
        for accumulation in (self._accumulation, *self._siblings):
            mean, _, half_width = self._interval(window, accumulation)
            bar_s = beat_s * (accumulation or 1) / (self._accumulation or 1)
            estimate = accumulation is not None
            if not clearly_longer(window, mean, half_width, bar_s, estimate=estimate):
                return False
        return True


def clearly_longer(
    window: TimedSteps, mean: float, half_width: float, beat_s: float, *, estimate: bool
) -> bool:
    """Whether a window's step (or estimated cycle) time is clearly longer than `beat_s`: the
    95 % interval around its batch means' lies above it, and so does the interval around the
    mean the window will report (all its steps over their time; an estimate reports its own)."""
    steps = window.step_times_s
    reported = mean if estimate or not steps else sum(steps) / len(steps)
    return min(mean, reported) * (1 - half_width) > beat_s
