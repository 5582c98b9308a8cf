"""What the parent reads from a running trial child: the phases it enters and its progress,
from which it projects the trial's samples/s for the search's pruner, and the stop it may
order (`ProgressReader`). It reads time through an injected clock, so its tests drive it with a
fake one."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

from advisor.results import FailurePhase, TrialResult
from advisor.trial.orders import PhaseCallback, ProgressCallback
from advisor.trial.protocol import PROGRESS_INTERVAL_S, TrialRequest

__all__ = ["STALL_S", "ProgressReader"]

# No progress line for two reporting intervals: the child is inside a micro-step that has lasted
# one at least, and its rate so far is bounded by counting that micro-step as finished now.
STALL_S = 2 * PROGRESS_INTERVAL_S


@dataclass(frozen=True)
class _Stop:
    """The parent's order to stop a trial: why, on what projection, in which phase, when."""

    reason: str
    samples_per_s: float
    phase: str
    at: float  # the watch's clock: time.monotonic()


class ProgressReader:
    """What the parent reads from a running child: its phases and its progress, from which it
    projects the trial's samples/s for `on_progress`."""

    def __init__(
        self,
        request: TrialRequest,
        on_phase: PhaseCallback | None,
        on_progress: ProgressCallback | None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._request = request
        self._clock = clock
        self._on_phase = on_phase
        self._on_progress = on_progress
        self._phases: list[str] = []
        self._progress: list[tuple[float, float]] = []  # (child's seconds, samples)
        self._last_seen: float | None = None  # parent's clock: warm-up start, then last line
        self._last_step = -1
        self._startup_s: float | None = None  # until the warm-up began, as the parent saw it
        config = request.config
        # samples of a round of the loader's workers, one micro-batch each, on every rank
        self._per_round = config.batch_size * config.world_size * max(1, config.num_workers)
        self.stop: _Stop | None = None

    @property
    def phase(self) -> str:
        return self._phases[-1] if self._phases else "build"

    def read(self, *, progress: bool = True) -> None:
        """Take in new phases and, with `progress`, new progress lines (which may stop it)."""
        for phase in _new_lines(self._request.channel.phase_path, len(self._phases)):
            self._phases.append(phase)
            if phase == "warmup":
                self._last_seen = self._clock()
                self._startup_s = time.time() - self._request.channel.launched_at
            if self._on_phase is not None:
                self._on_phase(phase)
        if not progress or self._on_progress is None or self.stop is not None:
            return
        if self._last_seen is None:
            return
        fresh = _new_lines(self._request.channel.progress_path, len(self._progress))
        for line in fresh:
            elapsed_s, samples = (float(field) for field in line.split())
            self._progress.append((elapsed_s, samples))
        now = self._clock()
        if fresh:
            self._last_seen = now
        projection = self._projection(now - self._last_seen)
        if projection is not None and (fresh or now - self._last_seen > STALL_S):
            self._report(*projection)

    def _projection(self, stalled_s: float) -> tuple[float, float] | None:
        """(seconds since the warm-up began, projected samples/s): the rate over the later half
        of the progress so far (start-up effects fade), at least a round of the loader's
        workers long, bounded, while the child has been quiet for `STALL_S`, by counting the
        round it waits in as finished now. Loader workers deliver batches in rounds: a step
        that waits for one may take several steps' time, and the next steps none."""
        elapsed_s, samples = self._progress[-1] if self._progress else (0.0, 0.0)
        half_s, half_samples = next(
            (
                (e, n)
                for e, n in reversed(self._progress)
                if e <= elapsed_s / 2 and n <= samples - self._per_round
            ),
            (0.0, 0.0),
        )
        rate = (samples - half_samples) / (elapsed_s - half_s) if elapsed_s > half_s else None
        if stalled_s > STALL_S:
            elapsed_s += stalled_s
            bound = (samples + self._per_round - half_samples) / (elapsed_s - half_s)
            rate = bound if rate is None else min(rate, bound)
        return None if rate is None else (elapsed_s, rate)

    def _report(self, elapsed_s: float, samples_per_s: float) -> None:
        assert self._on_progress is not None
        step = max(self._last_step + 1, round(elapsed_s * 1000))
        self._last_step = step
        reason = self._on_progress(step / 1000, samples_per_s)
        if reason is not None:
            Path(self._request.channel.stop_path or "").touch()
            self.stop = _Stop(reason, samples_per_s, self.phase, self._clock())

    def stopped(self, result: TrialResult) -> TrialResult:
        """The child's (or the parent's) result, with why and when the parent stopped it."""
        stop = self.stop
        if stop is None or (result.feasible and not result.stopped_early):
            return result  # not stopped, or its window had ended anyway
        if result.feasible:  # a shorter window, measured
            return result.model_copy(update={"reason": stop.reason})
        if result.status != "stopped":  # it failed on its own before the stop arrived
            return result
        return result.model_copy(
            update={
                "reason": stop.reason,
                "samples_per_s": stop.samples_per_s,
                "failure_phase": result.failure_phase or _phase(stop.phase),
                # killed before it wrote its result: its start-up as the parent saw it
                "startup_s": result.startup_s if result.startup_s is not None else self._startup_s,
            }
        )


def _phase(name: str) -> FailurePhase | None:
    return cast(FailurePhase, name) if name in get_args(FailurePhase) else None


def _new_lines(path: str | None, seen: int) -> list[str]:
    """The complete lines of an appended file after the first `seen` (the last may be partial)."""
    if path is None or not Path(path).exists():
        return []
    return Path(path).read_text().split("\n")[:-1][seen:]
