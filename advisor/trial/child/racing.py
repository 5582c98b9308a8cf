"""Child side of the convergence measurements: a race trial and a noise trial.

A race trial trains one configuration from its replicate's seeded initial weights with the
learning rate it would ship with, and records the held-out loss whenever the samples it trained
on reach a count of the race's grid (`RaceOrder.grid`, shared by every racer, so that all are
judged at the same sample counts; one with a target skips the counts while its training loss
is still far above it, `_RaceRun.far_above`); it stops after `RaceOrder.seconds` of training,
or once it reaches a target loss (`RaceOrder.target`) or can no longer win
(`RaceOrder.max_samples`). The clock counts training only: it starts as the first step begins,
so torch.compile's compilation and cuDNN's autotuning count against the racer, and it stops
while the loss is evaluated. For a map-style dataset the loss is the mean over a fixed held-out
slice that no racer trains on, evaluated in fp32 with the model in eval mode; for an
IterableDataset it is the mean training loss between evaluations.

A noise trial's gradient norms, and the probes of phi along a tracked race, are
`advisor.trial.child.gradient_noise`'s.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from advisor.results import (
    BatchSchedule,
    NoiseProbe,
    RaceCurve,
    RacePoint,
    ScheduleStage,
    stop_index,
)
from advisor.task import TrainingTask
from advisor.trial.child.batches import compute_loss, to_device
from advisor.trial.child.gradient_noise import (
    PROBE_MIN_S,
    PROBE_SHARE,
    noise_probe,
    rank_zero_says,
)
from advisor.trial.child.loop import DivergedError, Trainer
from advisor.trial.child.steps import Clock
from advisor.trial.orders import HELD_OUT_MAX, TRACK_POINTS, RaceOrder, held_out_count

__all__ = [
    "TRACK_POINTS",
    "enter_stage",
    "held_out_split",
    "time_evaluation",
    "train_racer",
]

HELD_OUT_SEED = 2018  # fixed, so that every racer is evaluated on the same samples
EVAL_BATCH = 256
PROBE_GRACE = 0.025  # of the race time: a noise probe's point may come this much early
# A racer with a target evaluates the grid's counts from the first at which its training loss
# has come this share of the way from its first held-out loss down to the target (`far_above`).
FAR_ABOVE = 0.5


def held_out_split(
    task: TrainingTask, most: int = HELD_OUT_MAX
) -> tuple[TrainingTask, Dataset[Any] | None]:
    """The task training on all but a fixed slice of a map-style dataset (a tenth, `most`
    samples at most), and that slice; an IterableDataset (no index) comes back whole, with
    None."""
    dataset = task.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return task, None
    size = len(dataset)
    count = held_out_count(size, most)
    if count < 1:
        return task, None
    order = torch.randperm(size, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    held_out, training = order[:count].tolist(), order[count:].tolist()
    return replace(task, dataset=Subset(dataset, training)), Subset(dataset, held_out)


def train_racer(
    trainer: Trainer,
    task: TrainingTask,
    held_out: Dataset[Any] | None,
    order: RaceOrder,
    *,
    clock: Clock = time.perf_counter,
) -> RaceCurve:
    """Train until `order.seconds` of training time, the loss reaches `order.target`, the
    samples pass `order.max_samples` or the last count of `order.grid`; the loss at each count
    of the grid (the first step at or past it), and where the time runs out. The trainer
    applies the learning-rate plan (`Trainer.lr`) and, with a `schedule`, each stage from its
    step on. With `track_noise`, the noise scale is measured at the start and at
    `TRACK_POINTS` evaluations, out of the training time (`probe_noise`). A racer that
    `continues` an earlier race's curve (its state loaded, `advisor.trial.child.racer_state`)
    goes on from its last point, and returns the whole curve. Time is read from `clock`."""
    evaluate = _HeldOut(trainer, task, held_out) if held_out is not None else None
    run = _RaceRun.starting(trainer, evaluate, order)
    losses: list[torch.Tensor] = []
    trainer.synchronize()
    started = clock()
    while True:
        losses.append(trainer.step())
        run.stepped(trainer, order.schedule)
        due = run.samples >= run.next_samples or run.trained_s + clock() - started >= order.seconds
        if not rank_zero_says(due, trainer):
            continue
        trainer.synchronize()
        train_loss = _finite_mean(losses)
        trained_s = clock() - started
        losses = []
        if rank_zero_says(run.far_above(order, trained_s, train_loss), trainer):
            run.skipped(trained_s)
        else:
            loss = run.evaluated(trainer, trained_s, train_loss, evaluate, order)
            if rank_zero_says(run.finished(order, loss), trainer):
                break
        started = clock()
    return RaceCurve(
        loss_kind="held-out" if evaluate else "train",
        held_out_samples=len(held_out) if held_out is not None else None,  # type: ignore[arg-type]
        lr=trainer.lr,
        points=tuple(run.points),
        noise_probes=tuple(run.track),
    )


@dataclass
class _RaceRun:
    """Where a race stands: its points and noise probes so far, the training time, steps and
    samples behind it, the schedule's stage, and the sample count it evaluates at next."""

    points: list[RacePoint]
    track: list[NoiseProbe]
    probe_s: float
    grid: tuple[int, ...]
    stage: ScheduleStage | None
    trained_s: float = 0.0
    steps: int = 0
    samples: int = 0
    next_samples: float = math.inf
    evaluating: bool = False  # from its first evaluation after the start on, at every count

    @classmethod
    def starting(cls, trainer: Trainer, evaluate: _HeldOut | None, order: RaceOrder) -> _RaceRun:
        """A race from its first evaluation, or from the last point of the curve it
        `continues`; tracked, with the noise scale probed at its start."""
        continues = order.continues
        points = list(continues.points) if continues is not None else []
        if evaluate and not points:
            points.append(RacePoint(seconds=0.0, samples=0, steps=0, loss=evaluate()))
        probe_s = max(PROBE_SHARE * order.seconds, PROBE_MIN_S)
        first = points[0] if points else None
        track = [noise_probe(trainer, first, probe_s)] if order.track_noise else []
        last = points[-1] if continues is not None and points else None
        stage = enter_stage(trainer, order.schedule, last.steps if last else 0, None)
        run = cls(points, track, probe_s, order.grid, stage, evaluating=continues is not None)
        if last is not None:
            run.trained_s, run.steps, run.samples = last.seconds, last.steps, last.samples
        run.next_samples = run.next_count()
        return run

    def next_count(self) -> float:
        """The grid's first count past the samples trained on (infinite past its last)."""
        return next((count for count in self.grid if count > self.samples), math.inf)

    def stepped(self, trainer: Trainer, schedule: BatchSchedule | None) -> None:
        """Count an optimizer step, and enter the schedule's next stage where it starts."""
        self.steps += 1
        self.samples += trainer.config.global_batch_size
        self.stage = enter_stage(trainer, schedule, self.steps, self.stage)

    def far_above(self, order: RaceOrder, trained_s: float, train_loss: float) -> bool:
        """Whether the held-out evaluation due now can be skipped: the racer has a target, has
        evaluated nothing since its start, this is a count of the grid that does not end its
        race, and its training loss since the last count lies above the target by more than
        `FAR_ABOVE` of the height of its first held-out loss over it. Its crossing lies between
        two later counts, evaluated as every racer's are; the counts before it cost as much as
        training on examples/hf_gpt2.py (39 evaluations took 10.9 s of a racer's 23.8)."""
        target = order.target
        if self.evaluating or target is None or order.track_noise or not self.points:
            return False
        ends = (
            self.trained_s + trained_s >= order.seconds
            or self.samples >= self.grid[-1]
            or (order.max_samples is not None and self.samples >= order.max_samples)
        )
        start = self.points[0].loss
        return not ends and train_loss > target + FAR_ABOVE * (start - target)

    def skipped(self, trained_s: float) -> None:
        """Count `trained_s` of training, and go on to the grid's next count, unevaluated."""
        self.trained_s += trained_s
        self.next_samples = self.next_count()

    def evaluated(
        self,
        trainer: Trainer,
        trained_s: float,
        train_loss: float,
        evaluate: _HeldOut | None,
        order: RaceOrder,
    ) -> float:
        """Record the point after `trained_s` more of training, and a noise probe at the first
        evaluation at or past each of TRACK_POINTS even shares of the run (`probe_due`).
        Returns the point's loss."""
        self.trained_s += trained_s
        self.evaluating = True
        loss = evaluate() if evaluate else train_loss
        point = RacePoint(seconds=self.trained_s, samples=self.samples, steps=self.steps, loss=loss)
        self.points.append(point)
        self.next_samples = self.next_count()
        share = probe_due(len(self.track), order.seconds)
        if order.track_noise and self.trained_s >= share:
            self.track.append(noise_probe(trainer, point, self.probe_s))
        return loss

    def finished(self, order: RaceOrder, loss: float) -> bool:
        """Whether the race is over for this racer after the point whose loss is `loss`."""
        losses = [point.loss for point in self.points[-order.in_a_row :]]
        target = order.target
        reached = target is not None and stop_index(losses, target, order.in_a_row) is not None
        beyond = order.max_samples is not None and self.samples >= order.max_samples
        return reached or beyond or self.trained_s >= order.seconds or self.samples >= self.grid[-1]


def probe_due(probed: int, seconds: float) -> float:
    """The training time from which the next noise probe of a tracked race is due, after
    `probed` probes: each of TRACK_POINTS even shares of the run, `PROBE_GRACE` of it early for
    rounding, but the last at the run's end (the evaluation that stops it), never at a sample
    count of the grid just before it."""
    grace = PROBE_GRACE if probed < TRACK_POINTS else 0.0
    return (probed / TRACK_POINTS - grace) * seconds


def time_evaluation(
    trainer: Trainer, task: TrainingTask, clock: Clock = time.perf_counter
) -> float | None:
    """Seconds a held-out evaluation takes per sample, timed on the dataset's first batch of
    up to `EVAL_BATCH` samples, warm (its second run); None for an IterableDataset."""
    dataset = task.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return None
    count = min(EVAL_BATCH, len(dataset))
    evaluate = _HeldOut(trainer, task, Subset(dataset, range(count)))
    evaluate()
    trainer.synchronize()
    started = clock()
    evaluate()
    trainer.synchronize()
    return (clock() - started) / count


def enter_stage(
    trainer: Trainer, schedule: BatchSchedule | None, step: int, current: ScheduleStage | None
) -> ScheduleStage | None:
    """The schedule's stage for optimizer step `step`, applied to the trainer if it is new."""
    if schedule is None:
        return None
    stage = schedule.stage_at(step)
    if stage != current:
        trainer.regroup(stage.batch_size, stage.accumulation_steps)
        trainer.scale_lr(stage.lr_scale)
    return stage


def _finite_mean(losses: list[torch.Tensor]) -> float:
    values = torch.stack(losses).float().cpu()
    if not torch.isfinite(values).all():
        raise DivergedError("the loss became non-finite during the race")
    return float(values.mean().item())


class _HeldOut:
    """The mean loss over the held-out slice: fp32, eval mode, no gradients, batches kept on
    the device between evaluations."""

    def __init__(self, trainer: Trainer, task: TrainingTask, dataset: Dataset[Any]) -> None:
        self._trainer = trainer
        self._loss_fn = task.loss_fn
        # Its own generator: reading the slice draws nothing from the RNG training reads.
        loader = DataLoader(
            dataset, batch_size=EVAL_BATCH, collate_fn=task.collate_fn, generator=torch.Generator()
        )
        size = len(dataset)  # type: ignore[arg-type]
        self._batches = [to_device(batch, trainer.device, False) for batch in loader]
        starts = range(0, size, EVAL_BATCH)
        self._weights = [min(EVAL_BATCH, size - start) / size for start in starts]

    def __call__(self) -> float:
        model = self._trainer.module
        model.eval()
        try:
            with torch.no_grad():
                total = sum(
                    weight * compute_loss(model, batch, self._loss_fn).float()
                    for batch, weight in zip(self._batches, self._weights, strict=True)
                )
        finally:
            model.train()
        loss = float(torch.as_tensor(total).item())
        if not math.isfinite(loss):
            raise DivergedError(f"the held-out loss became non-finite ({loss})")
        return loss
