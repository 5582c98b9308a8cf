"""What the parent hands a trial child (JSON in); the child answers with a `TrialResult`."""

from __future__ import annotations

import signal
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.convergence import BatchSchedule, LrPlan, RaceCurve
from advisor.knobs import TrialConfig
from advisor.results import TrialResult

__all__ = [
    "EARLY_STEPS",
    "HELD_OUT_MAX",
    "PRECISE_AFTER_FRACTION",
    "PROGRESS_INTERVAL_S",
    "RACE_EVALUATIONS",
    "TRACK_POINTS",
    "TrialRequest",
    "died_without_result",
]

# Of `trial_seconds`: when a search trial's warm-up may have settled and its window may end
# (advisor.trial.child.measure), and so when the parent may start judging it
# (advisor.search.pruning).
PRECISE_AFTER_FRACTION = 0.125
# Optimizer steps whose losses the numerics check compares (advisor.search.checks).
EARLY_STEPS = 3
# Noise-scale probes along a tracked race, besides the one at its start (trial.child.racing).
TRACK_POINTS = 5
# Loss points a race records by default, evenly spaced in training time (trial.child.racing).
RACE_EVALUATIONS = 20
# Samples of a race's held-out slice at most: enough for a loss within a percent or so.
HELD_OUT_MAX = 1024
# A search trial tells the parent how far it got at most this often (at micro-step ends).
PROGRESS_INTERVAL_S = 0.1


class TrialRequest(BaseModel):
    """One trial as the parent orders it: what to build, the configuration, how to measure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str
    cwd: str
    config: TrialConfig
    # validate: the user's batch size, one step; reference: the first steps' losses only;
    # race: train for `trial_seconds` recording the loss; noise: record gradient norms.
    mode: Literal["trial", "validate", "reference", "race", "noise"] = "trial"
    lr: LrPlan = Field(default=LrPlan(), description="race: the learning rate to train with")
    race_target: float | None = Field(
        default=None, description="race: stop once the loss reaches this (None: train on)"
    )
    schedule: BatchSchedule | None = Field(
        default=None, description="race: the batch-size schedule to train with, stage by stage"
    )
    track_noise: bool = Field(
        default=False, description="race: measure gradient norms for phi along the run"
    )
    held_out: int = Field(
        default=HELD_OUT_MAX,
        ge=1,
        le=HELD_OUT_MAX,
        description="race: samples of the held-out slice at most (every racer of a race the same)",
    )
    race_state: str | None = Field(
        default=None,
        description="race: where the racer's training state is saved at its end, or, with "
        "`continues`, loaded from at its start (advisor.trial.child.racer_state)",
    )
    continues: RaceCurve | None = Field(
        default=None,
        description="race: the curve of the race this one goes on from, to `trial_seconds` in all",
    )
    evaluations: int = Field(
        default=RACE_EVALUATIONS,
        ge=TRACK_POINTS,
        description="race: loss points over the training time, evenly spaced (a benchmark "
        "that trains a fast-converging model long asks for more)",
    )
    warmup_steps: int = Field(default=3, ge=1)
    whole_cycles: bool = Field(
        default=False,
        description="time whole optimizer cycles however long they take (re-runs of finalists); "
        "else warm-up and window keep to `trial_seconds` each, and a cycle too long for the "
        "window is timed in parts",
    )
    trial_seconds: float = Field(default=3.0, gt=0)
    precise_window: bool = Field(
        default=False,
        description="a search trial's window may end from an eighth of `trial_seconds` on, once "
        "the rate it measures is precise (advisor.trial.child.early_end.PRECISE_RELATIVE_ERROR)",
    )
    beat_samples_per_s: float | None = Field(
        default=None,
        gt=0,
        description="with `precise_window`: the best search trial's samples/s so far; the window "
        "may also end once its rate is clearly below it",
    )
    sibling_accumulation: tuple[int, ...] = Field(
        default=(),
        description="a search trial's: other accumulation steps the search may try at the same "
        "configuration. Where one of their cycles is too long for the window, this trial's is "
        "timed in parts too, and its result gives their samples/s (`sibling_rates`)",
    )
    max_measure_steps: int | None = Field(
        default=None,
        ge=1,
        description="at most this many steps: a window's optimizer steps, a noise trial's "
        "recorded gradient norms (a run of known length, whatever the machine's speed)",
    )
    seed: int = 0
    launched_at: float = Field(description="time.time() when the parent started the child")
    result_path: str
    phase_path: str | None = None
    progress_path: str | None = Field(
        default=None, description="where the window's running throughput is appended"
    )
    stop_path: str | None = Field(
        default=None, description="a file the parent creates to end the window early"
    )


def died_without_result(config: TrialConfig, who: str, code: int, hint: str = "") -> TrialResult:
    """The result of a process (`who`, e.g. "rank 1") that exited with `code` and no report.

    SIGKILL is what the kernel's OOM killer sends, so it reads as `oom`; anything else crashed.
    """
    if code == -signal.SIGKILL:
        return TrialResult(
            config=config,
            status="oom",
            reason=f"{who} was killed by SIGKILL, which is what the kernel's OOM killer does "
            "when host memory runs out",
        )
    if code < 0:
        known = {member.value: member.name for member in signal.Signals}
        reason = f"{who} died of {known.get(-code, f'signal {-code}')}"
    else:
        reason = f"{who} exited with code {code} without a result{hint}"
    return TrialResult(config=config, status="crashed", reason=reason)
