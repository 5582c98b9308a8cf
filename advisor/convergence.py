"""What the convergence measurements record: the learning rate a racer trains with, its loss
against training time, the gradient norms of a noise trial, and the noise scale with what it
predicts for each global batch. `advisor.results` builds trial results and the recommendation
from these."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BatchPrediction",
    "GradientNorms",
    "LossKind",
    "LrPlan",
    "LrRule",
    "NoiseScale",
    "RaceCurve",
    "RacePoint",
]

LossKind = Literal["held-out", "train"]
LrRule = Literal["yours", "sqrt", "linear"]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LrPlan(_Frozen):
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


class RacePoint(_Frozen):
    """One evaluation of a racer: the loss after `seconds` of training."""

    seconds: float = Field(
        description="training wall time since the first step began, evaluations left out"
    )
    samples: int = Field(description="samples trained on, all processes")
    steps: int = Field(description="optimizer steps taken")
    loss: float


class RaceCurve(_Frozen):
    """The loss of a race trial against training time, from the seeded initial weights."""

    loss_kind: LossKind = Field(
        description="held-out: the mean loss on a fixed slice of the dataset left out of "
        "training; train: the mean training loss between evaluations (IterableDataset)"
    )
    held_out_samples: int | None = None
    lr: LrPlan = LrPlan()
    points: tuple[RacePoint, ...]

    @property
    def final_loss(self) -> float:
        return self.points[-1].loss

    @property
    def best_loss(self) -> float:
        """The lowest loss of the race: its end, unless the loss rose again."""
        return min(point.loss for point in self.points)


class GradientNorms(_Frozen):
    """Squared gradient norms per optimizer step at two batch sizes, for the noise scale: one
    micro-batch (on rank 0) and the whole accumulated, all-reduced batch."""

    small_batch: int
    big_batch: int
    small_sq: tuple[float, ...]
    big_sq: tuple[float, ...]


class BatchPrediction(_Frozen):
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


class NoiseScale(_Frozen):
    """The gradient noise scale phi = tr(Sigma)/|G|^2, measured early in the baseline's training."""

    value: float | None = Field(description="None when the signal did not rise above the noise")
    low: float | None = None
    high: float | None = None
    small_batch: int
    big_batch: int
    steps: int
    predictions: tuple[BatchPrediction, ...] = ()
