"""Child side of the convergence measurements: a race trial and a noise trial.

A race trial trains one configuration from the seeded initial weights for a fixed training time
(`TrialRequest.trial_seconds`) with the learning rate it would ship with, and records the loss as
it goes; given a target loss (`TrialRequest.race_target`), it stops once it reaches it. The
clock counts training only: it starts as the first step begins, so torch.compile's compilation
and cuDNN's autotuning count against the racer, and it stops while the loss is evaluated. For a
map-style dataset the loss is the mean over a fixed held-out slice that no racer trains on,
evaluated in fp32 with the model in eval mode; for an IterableDataset it is the mean training
loss between evaluations.

A noise trial records, per optimizer step, the squared norm of one micro-batch's gradient and of
the whole accumulated (and, under DDP, all-reduced) gradient: the two batch sizes the gradient
noise scale is estimated from (`advisor.search.race.noise`). Under GradScaler the norms are of
the unscaled gradients.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset

from advisor.convergence import GradientNorms, RaceCurve, RacePoint
from advisor.task import TrainingTask
from advisor.trial.child.batches import compute_loss, to_device
from advisor.trial.child.loop import DivergedError, Trainer
from advisor.trial.child.window import Clock

__all__ = [
    "EVALUATIONS",
    "held_out_split",
    "measure_gradient_norms",
    "train_racer",
]

HELD_OUT_MAX = 1024  # samples; enough for a loss within a percent or so, cheap to evaluate
HELD_OUT_FRACTION = 0.1
HELD_OUT_SEED = 2018  # fixed, so that every racer is evaluated on the same samples
EVAL_BATCH = 256
EVALUATIONS = 20  # loss points per race, evenly spaced in training time
NOISE_MIN_STEPS = 10


def held_out_split(task: TrainingTask) -> tuple[TrainingTask, Dataset[Any] | None]:
    """The task training on all but a fixed slice of a map-style dataset, and that slice;
    an IterableDataset (no index) comes back whole, with None."""
    dataset = task.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return task, None
    size = len(dataset)
    count = min(HELD_OUT_MAX, int(size * HELD_OUT_FRACTION))
    if count < 1:
        return task, None
    order = torch.randperm(size, generator=torch.Generator().manual_seed(HELD_OUT_SEED))
    held_out, training = order[:count].tolist(), order[count:].tolist()
    return replace(task, dataset=Subset(dataset, training)), Subset(dataset, held_out)


def train_racer(
    trainer: Trainer,
    task: TrainingTask,
    held_out: Dataset[Any] | None,
    seconds: float,
    target: float | None = None,
    *,
    clock: Clock = time.perf_counter,
) -> RaceCurve:
    """Train for `seconds` of training time, or until the loss reaches `target`; the loss at
    `EVALUATIONS` evenly spaced points. The trainer applies the learning-rate plan
    (`Trainer.lr`). Time is read from `clock`."""
    evaluate = _HeldOut(trainer, task, held_out) if held_out is not None else None
    points = [RacePoint(seconds=0.0, samples=0, steps=0, loss=evaluate())] if evaluate else []
    per_step = trainer.config.global_batch_size
    interval = seconds / EVALUATIONS
    trained_s, steps, losses = 0.0, 0, []
    trainer.synchronize()
    started = clock()
    while True:
        losses.append(trainer.step())
        steps += 1
        next_at = interval * (len(points) + (evaluate is None))  # the initial point counts
        if not _rank_zero_says(trained_s + clock() - started >= next_at, trainer):
            continue
        trainer.synchronize()
        trained_s += clock() - started
        train_loss = _finite_mean(losses)
        losses = []
        loss = evaluate() if evaluate else train_loss
        points.append(
            RacePoint(seconds=trained_s, samples=steps * per_step, steps=steps, loss=loss)
        )
        reached = target is not None and loss <= target
        if _rank_zero_says(trained_s >= seconds or reached, trainer):
            break
        started = clock()
    return RaceCurve(
        loss_kind="held-out" if evaluate else "train",
        held_out_samples=len(held_out) if held_out is not None else None,  # type: ignore[arg-type]
        lr=trainer.lr,
        points=tuple(points),
    )


def measure_gradient_norms(
    trainer: Trainer,
    seconds: float,
    *,
    max_steps: int | None = None,
    clock: Clock = time.perf_counter,
) -> GradientNorms:
    """Train for about `seconds` (at least `NOISE_MIN_STEPS` steps, at most three times as
    long), recording each step's squared gradient norms at one micro-batch and at the whole
    batch. Steps whose gradients are not finite (GradScaler backing off) are left out. With
    `max_steps`, it ends once it has recorded that many, however little time they took: a
    run of known length (`TrialRequest.max_measure_steps`). Time is read from `clock`."""
    config = trainer.config
    if config.accumulation_steps < 2:
        raise ValueError("a noise trial needs accumulation_steps >= 2: two batch sizes")
    small: list[float] = []
    big: list[float] = []
    started = clock()
    while True:
        norms = _NormCapture(trainer)
        trainer.step(on_backward=norms)
        if norms.small is not None and norms.big is not None:
            small.append(norms.small)
            big.append(norms.big)
        elapsed = clock() - started
        done = (len(big) >= NOISE_MIN_STEPS and elapsed >= seconds) or elapsed >= 3 * seconds
        done = done or (max_steps is not None and len(big) >= max_steps)
        if _rank_zero_says(done, trainer):
            break
    return GradientNorms(
        small_batch=config.batch_size,
        big_batch=config.global_batch_size,
        small_sq=tuple(small),
        big_sq=tuple(big),
    )


class _NormCapture:
    """Called after each micro-step's backward: the first micro-batch's gradient, scaled back
    to a mean over that micro-batch, and the whole step's once the last backward is done."""

    def __init__(self, trainer: Trainer) -> None:
        self._trainer = trainer
        self._params = [p for p in trainer.module.parameters() if p.requires_grad]
        self.small: float | None = None
        self.big: float | None = None

    def __call__(self, micro: int) -> None:
        accumulation = self._trainer.config.accumulation_steps
        scale = self._trainer.scaler.get_scale() if self._trainer.scaler.is_enabled() else 1.0
        if micro == 0:  # the loss was divided by the accumulation steps
            self.small = _finite(_squared_norm(self._params) * (accumulation / scale) ** 2)
        if micro == accumulation - 1:
            self.big = _finite(_squared_norm(self._params) / scale**2)


def _squared_norm(params: list[torch.nn.Parameter]) -> float:
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.stack([g.pow(2).sum() for g in grads]).sum().item())


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _finite_mean(losses: list[torch.Tensor]) -> float:
    values = torch.stack(losses).float().cpu()
    if not torch.isfinite(values).all():
        raise DivergedError("the loss became non-finite during the race")
    return float(values.mean().item())


def _rank_zero_says(flag: bool, trainer: Trainer) -> bool:
    """Rank 0's `flag` on every rank (DDP ranks must stop and evaluate after the same steps)."""
    if trainer.config.world_size == 1:
        return flag
    value = torch.tensor([int(flag)], device=trainer.device)
    dist.broadcast(value, src=0)
    return bool(value.item())


class _HeldOut:
    """The mean loss over the held-out slice: fp32, eval mode, no gradients, batches kept on
    the device between evaluations."""

    def __init__(self, trainer: Trainer, task: TrainingTask, dataset: Dataset[Any]) -> None:
        self._trainer = trainer
        self._loss_fn = task.loss_fn
        loader = DataLoader(dataset, batch_size=EVAL_BATCH, collate_fn=task.collate_fn)
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
