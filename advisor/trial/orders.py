"""The seam between the search and its trials: one typed order per kind of trial, and the
`TrialRunner` that carries an order out (docs/architecture.md, "The trial seam").

- `WindowOrder`: warm up, then time a window of training steps (a search trial or a re-run);
  its result carries samples/s, step times, peak memory and the first steps' losses;
- `ValidateOrder`: one step at the user's own batch size, and its FLOPs (the task's summary);
- `ReferenceOrder`: the first steps from the seeded weights, untimed (`early_losses`);
- `RaceOrder`: train with a learning rate for `seconds` at most, evaluating a held-out slice at
  the race's shared sample counts (`race`, the loss curve), from the seed of its replicate;
- `NoiseOrder`: gradient norms at two batch sizes for `seconds` (`gradient_norms`,
  `eval_s_per_sample`).

The real runner (`advisor.trial.parent.runner.ProcessRunner`) starts each trial in an isolated
process; tests hand the search a scripted one (`tests/scripted_runner.py`), as httpx's tests hand
its client a `MockTransport`. Every runner answers with a `TrialResult` whose status says how the
trial ended; nothing the trial does escapes as an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal, Protocol

from pydantic import Field

from advisor.frozen import Frozen
from advisor.knobs import TrialConfig
from advisor.results import REACHED_IN_A_ROW, BatchSchedule, LrPlan, RaceCurve, TrialResult

__all__ = [
    "HELD_OUT_MAX",
    "REPLICATE_SEED_STEP",
    "TRACK_POINTS",
    "NoiseOrder",
    "PhaseCallback",
    "ProgressCallback",
    "RaceOrder",
    "ReferenceOrder",
    "TrialOrder",
    "TrialRunner",
    "ValidateOrder",
    "WindowOrder",
    "held_out_count",
    "replicate_seed",
]

# Noise-scale probes along a tracked race, besides the one at its start (trial.child.racing).
TRACK_POINTS = 5
# A race's replicate r trains from seed `seed + r * REPLICATE_SEED_STEP`: other initial weights
# and another data order, the same for every racer of the replicate.
REPLICATE_SEED_STEP = 1009
# Samples of a race's held-out slice at most: enough for a loss within a percent or so.
HELD_OUT_MAX = 1024
HELD_OUT_FRACTION = 0.1  # of a map-style dataset, held out by a race (at most HELD_OUT_MAX)


def held_out_count(size: int, most: int = HELD_OUT_MAX) -> int:
    """The samples a race holds out of a map-style dataset of `size`: a tenth, `most` at most."""
    return min(most, int(size * HELD_OUT_FRACTION))


# Called with each phase the trial enters (build, first_step, warmup, measure).
PhaseCallback = Callable[[str], None]
# Called with the seconds since the warm-up began and the projected samples/s; a returned reason
# stops the trial.
ProgressCallback = Callable[[float, float], str | None]


class _Order(Frozen):
    config: TrialConfig


class WindowOrder(_Order):
    """Warm up, then time a window of training steps: a search trial or a re-run."""

    kind: Literal["window"] = "window"
    whole_cycles: bool = Field(
        default=False,
        description="time whole optimizer cycles however long they take (re-runs of finalists); "
        "else warm-up and window keep to the trial's seconds each, and a cycle too long for the "
        "window is timed in parts",
    )
    precise_window: bool = Field(
        default=False,
        description="a search trial's window may end from an eighth of the trial's seconds on, "
        "once the rate it measures is precise (advisor.trial.child.early_end)",
    )
    beat_samples_per_s: float | None = Field(
        default=None,
        gt=0,
        description="with `precise_window`: the best search trial's samples/s so far; the window "
        "may also end once its rate is clearly below it",
    )
    sibling_accumulation: tuple[int, ...] = Field(
        default=(),
        description="other accumulation steps the search may try at the same configuration. "
        "Where one of their cycles is too long for the window, this trial's is timed in parts "
        "too, and its result gives their samples/s (`TrialResult.sibling_rates`)",
    )


class ValidateOrder(_Order):
    """One step at the user's own batch size (the config's batch size is ignored), its FLOPs."""

    kind: Literal["validate"] = "validate"


class ReferenceOrder(_Order):
    """The first optimizer steps' losses from the seeded weights, for the numerics check; with
    `held_out`, trained as a race trains, on all but its held-out slice of that many samples
    at most."""

    kind: Literal["reference"] = "reference"
    lr: LrPlan = LrPlan()
    held_out: int = Field(default=0, ge=0, description="0: the whole dataset")


class RaceOrder(_Order):
    """Train with the learning rate it would ship with, evaluating a held-out slice once the
    samples trained on reach each count of `grid` (the race's, shared by all its racers); stop
    after `seconds` of training, at `target` where one is given, or past `max_samples`."""

    kind: Literal["race"] = "race"
    seconds: float = Field(gt=0, description="training time, in all where it `continues`")
    lr: LrPlan = LrPlan()
    target: float | None = Field(
        default=None,
        description="stop once `in_a_row` evaluations in a row reach this (None: train on)",
    )
    in_a_row: int = Field(
        default=REACHED_IN_A_ROW,
        ge=1,
        description="evaluations in a row at or below `target` that stop the racer "
        "(advisor.results.stop_index)",
    )
    schedule: BatchSchedule | None = Field(
        default=None, description="the batch-size schedule to train with, stage by stage"
    )
    track_noise: bool = Field(default=False, description="measure phi along the run")
    held_out: int = Field(
        default=HELD_OUT_MAX,
        ge=1,
        le=HELD_OUT_MAX,
        description="samples of the held-out slice at most (every racer of a race the same)",
    )
    grid: tuple[int, ...] = Field(
        min_length=1,
        description="the sample counts the loss is evaluated at (ascending); the race stops "
        "after the last",
    )
    max_samples: int | None = Field(
        default=None, description="stop at the first evaluation past this (None: train on)"
    )
    replicate: int = Field(default=0, ge=0, description="which replicate: its seed")
    state: str | None = Field(
        default=None,
        description="where the racer's training state is saved at its end, or, with "
        "`continues`, loaded from at its start (advisor.trial.child.racer_state)",
    )
    continues: RaceCurve | None = Field(
        default=None, description="the curve of the race this one goes on from"
    )


def replicate_seed(seed: int, order: TrialOrder) -> int:
    """The seed a trial of `order` trains from: a race's replicate's own, else `seed`."""
    replicate = order.replicate if isinstance(order, RaceOrder) else 0
    return seed + replicate * REPLICATE_SEED_STEP


class NoiseOrder(_Order):
    """Record squared gradient norms at the micro-batch and the accumulated batch for
    `seconds`, and time a held-out evaluation."""

    kind: Literal["noise"] = "noise"
    seconds: float = Field(gt=0)


TrialOrder = Annotated[
    WindowOrder | ValidateOrder | ReferenceOrder | RaceOrder | NoiseOrder,
    Field(discriminator="kind"),
]


class TrialRunner(Protocol):
    """What carries out a trial order: the real runner starts an isolated process; a test's
    runner answers from a script."""

    def run(
        self,
        order: TrialOrder,
        log_path: Path,
        *,
        on_phase: PhaseCallback | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> TrialResult:
        """Carry out `order`, logging to `log_path`; `on_progress` may stop a window order."""
        ...
