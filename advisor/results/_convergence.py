"""What the convergence measurements record: the learning rate a racer trains with, its loss
against training time, the gradient norms of a noise trial, and the noise scale with what it
predicts for each global batch. `advisor.results` builds trial results and the recommendation
from these."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import Field, field_validator

from advisor.frozen import Frozen

__all__ = [
    "REACHED_IN_A_ROW",
    "BatchPrediction",
    "BatchSchedule",
    "GradientNorms",
    "LossKind",
    "LrPlan",
    "LrRule",
    "NoisePoint",
    "NoiseProbe",
    "NoiseScale",
    "NoiseTrack",
    "RaceCurve",
    "RacePoint",
    "ScheduleStage",
    "stop_index",
]

# A racer reaches its target where this many evaluations in a row are at or below it: a single
# chance dip on a plateau does not end its race, nor count as reaching it (`stop_index`).
REACHED_IN_A_ROW = 2


def stop_index(
    losses: Sequence[float], target: float, in_a_row: int = REACHED_IN_A_ROW
) -> int | None:
    """The evaluation at which a racer timed to `target` stops: the last of the first
    `in_a_row` in a row at or below it; None where none are. The trial child stops a racer
    there, and the verdict reads every curve as if it had (so a baseline that trained on is
    read alike)."""
    run = 0
    for index, loss in enumerate(losses):
        run = run + 1 if loss <= target else 0
        if run >= in_a_row:
            return index
    return None


# A race's verdict must hold at targets from the baseline's lowest loss up to this many times its
# curve's noise above it (`RaceCurve.target_losses`).
TARGET_NOISE_BAND = 2.0
# The fewest evaluations in a curve's second half that its noise is estimated from.
NOISE_MIN_POINTS = 6

# The median absolute second difference of independent evaluations of spread sigma, over sigma:
# a second difference has standard deviation sqrt(6) sigma, and a normal's median absolute
# value is 0.6745 of its standard deviation.
_MAD_OF_SECOND_DIFFERENCES = 0.6745 * math.sqrt(6)

LossKind = Literal["held-out", "train"]
LrRule = Literal["yours", "sqrt", "linear"]


class LrPlan(Frozen):
    """The learning rate a configuration trains with: the user's optimizer's, times `scale`,
    reached by a linear warm-up over the first `warmup_steps` optimizer steps (0: none)."""

    scale: float = Field(default=1.0, gt=0)
    warmup_steps: int = Field(default=0, ge=0)
    rule: LrRule = Field(
        default="yours",
        description="yours: unchanged; sqrt: x sqrt(B/B0), for Adam-like optimizers; linear: "
        "x B/B0 with warm-up, for SGD; both capped",
    )

    @property
    def label(self) -> str:
        if self.rule == "yours":
            return "your lr"
        warmup = f", warm-up {self.warmup_steps} steps" if self.warmup_steps else ""
        return f"lr x{self.scale:.3g} ({self.rule} rule{warmup})"


class RacePoint(Frozen):
    """One evaluation of a racer: the loss after `seconds` of training."""

    seconds: float = Field(
        description="training wall time since the first step began, evaluations left out"
    )
    samples: int = Field(description="samples trained on, all processes")
    steps: int = Field(description="optimizer steps taken")
    loss: float


class RaceCurve(Frozen):
    """The loss of a race trial against training time, from the seeded initial weights."""

    loss_kind: LossKind = Field(
        description="held-out: the mean loss on a fixed slice of the dataset left out of "
        "training; train: the mean training loss between evaluations (IterableDataset)"
    )
    held_out_samples: int | None = None
    lr: LrPlan = LrPlan()
    points: tuple[RacePoint, ...]
    noise_probes: tuple[NoiseProbe, ...] = Field(
        default=(), description="a tracked race's gradient norms along the run"
    )

    @property
    def final_loss(self) -> float:
        return self.points[-1].loss

    @property
    def best_loss(self) -> float:
        """The lowest loss of the race: its end, unless the loss rose again."""
        return min(point.loss for point in self.points)

    @property
    def fell(self) -> bool:
        """Whether the loss fell in the race: the lowest of its evaluations smoothed as running
        medians of three (a single dip or spike does not count) below its first by more than
        TARGET_NOISE_BAND times their spread. A held-out curve's first evaluation is of the
        initial weights, a training loss's of the first steps. The spread is from the
        evaluations' second differences, which a steady fall leaves at zero, by their median
        (a spike moves it little), so that it is estimated even from a short curve; where
        the loss did not fall (flat, or rising from the start), the time another racer takes
        to match it is a chance dip's."""
        losses = [point.loss for point in self.points]
        if len(losses) < 3:
            return len(losses) == 2 and losses[1] < losses[0]
        inner = range(1, len(losses) - 1)
        smoothed = [statistics.median(losses[i - 1 : i + 2]) for i in inner]
        bends = [abs(losses[i - 1] - 2 * losses[i] + losses[i + 1]) for i in inner]
        spread = statistics.median(bends) / _MAD_OF_SECOND_DIFFERENCES
        return losses[0] - min(smoothed) > TARGET_NOISE_BAND * spread

    @property
    def noise(self) -> float:
        """The spread of single evaluations about the curve's trend: the residuals' standard
        deviation about a quadratic fitted to its second half, where a loss curve bends least;
        0 with fewer than NOISE_MIN_POINTS evaluations there."""
        end = self.points[-1].seconds
        half = [point for point in self.points if point.seconds >= end / 2]
        if len(half) < NOISE_MIN_POINTS:
            return 0.0
        seconds = np.array([point.seconds for point in half])
        losses = np.array([point.loss for point in half])
        trend = np.polyval(np.polyfit(seconds, losses, 2), seconds)
        return math.sqrt(float(np.sum((losses - trend) ** 2)) / (len(half) - 3))

    @property
    def target_losses(self) -> tuple[float, ...]:
        """The losses a race's verdict must hold at: the lowest, and that plus TARGET_NOISE_BAND
        times the curve's noise (where it has any). Where the curve has flattened, its lowest
        evaluation is its level less a chance dip, and the time another racer takes to match
        that dip is noise too: on a GPU, one racer matched a plateau's lowest evaluation 6.27x
        sooner than the baseline, then 1.30x in the next tune. Where the curve still falls, the
        two are close."""
        band = TARGET_NOISE_BAND * self.noise
        return (self.best_loss, self.best_loss + band) if band > 0 else (self.best_loss,)


class GradientNorms(Frozen):
    """Squared gradient norms per optimizer step at two batch sizes, for the noise scale: one
    micro-batch (on rank 0) and the whole accumulated, all-reduced batch."""

    small_batch: int
    big_batch: int
    small_sq: tuple[float, ...]
    big_sq: tuple[float, ...]


class BatchPrediction(Frozen):
    """What the noise scale predicts for one global batch, next to what the search measured."""

    global_batch: int
    samples_per_s: float = Field(description="the best search window at this global batch")
    samples_ratio: float = Field(
        description="samples to the same loss relative to your batch: (phi + B) / (phi + B0)"
    )
    predicted_speedup: float = Field(
        description="time to the same loss, relative to your batch at its best throughput"
    )
    raced: bool = False


class NoiseScale(Frozen):
    """The gradient noise scale phi = tr(Sigma)/|G|^2, measured early in the baseline's training."""

    value: float | None = Field(description="None when the signal did not rise above the noise")
    low: float | None = None
    high: float | None = None
    small_batch: int
    big_batch: int
    steps: int
    predictions: tuple[BatchPrediction, ...] = ()


class NoiseProbe(Frozen):
    """Gradient norms measured at one point of a tracked race, out of its training time."""

    seconds: float = Field(description="training time of the run when they were measured")
    samples: int = Field(description="samples the run had trained on by then")
    loss: float | None = Field(description="the run's loss there; None before a training loss")
    norms: GradientNorms


class NoisePoint(Frozen):
    """The noise scale measured at one point of a longer run, with its 95 % interval (None
    where the signal did not rise above the noise there)."""

    seconds: float = Field(description="training time of the run when it was measured")
    samples: int = Field(description="samples the run had trained on by then")
    loss: float | None = Field(description="the run's loss there")
    value: float | None
    low: float | None = None
    high: float | None = None


class NoiseTrack(Frozen):
    """The noise scale along a run of the user's configuration, from its initial weights on:
    measured between steps, out of the training time, with gradients the run does not apply."""

    points: tuple[NoisePoint, ...]

    @property
    def measured(self) -> tuple[NoisePoint, ...]:
        return tuple(point for point in self.points if point.value is not None)

    @property
    def grew(self) -> bool:
        """Whether phi grew beyond its noise: the low end of a later point's 95 % interval above
        the high end of the first measured point's."""
        measured = self.measured
        if len(measured) < 2 or measured[0].high is None:
            return False
        return any((point.low or 0.0) > measured[0].high for point in measured[1:])


class ScheduleStage(Frozen):
    """One stage of a batch-size schedule: from optimizer step `from_step` on, micro-batches of
    `batch_size` per process, `accumulation_steps` of them per step, and the learning rate the
    user's optimizer was built with times `lr_scale`."""

    from_step: int = Field(ge=0)
    batch_size: int = Field(ge=1)
    accumulation_steps: int = Field(ge=1)
    lr_scale: float = Field(default=1.0, gt=0)


class BatchSchedule(Frozen):
    """A global batch that grows as training goes on: stages in the order they apply, every
    other knob as the configuration it belongs to."""

    stages: tuple[ScheduleStage, ...] = Field(min_length=1)
    rule: LrRule = Field(description="how each stage's lr scale was set: yours keeps it at 1")

    @field_validator("stages")
    @classmethod
    def _ordered(cls, stages: tuple[ScheduleStage, ...]) -> tuple[ScheduleStage, ...]:
        if stages[0].from_step != 0:
            raise ValueError("the first stage must start at step 0")
        steps = [stage.from_step for stage in stages]
        if steps != sorted(set(steps)):
            raise ValueError(f"stages must start at increasing steps, not {steps}")
        return stages

    def stage_at(self, step: int) -> ScheduleStage:
        """The stage optimizer step `step` (counted from 0) trains in."""
        return [stage for stage in self.stages if stage.from_step <= step][-1]

    def global_batches(self, world_size: int) -> tuple[int, ...]:
        return tuple(s.batch_size * s.accumulation_steps * world_size for s in self.stages)

    def label(self, world_size: int) -> str:
        parts = [
            f"{batch} from step {stage.from_step}"
            for batch, stage in zip(self.global_batches(world_size), self.stages, strict=True)
        ]
        return "global batch " + ", then ".join(parts)
