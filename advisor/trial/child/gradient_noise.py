"""Child side of the gradient noise scale: a noise trial records, per optimizer step, the squared
norm of one micro-batch's gradient and of the whole accumulated (and, under DDP, all-reduced)
gradient, the two batch sizes the noise scale is estimated from (`advisor.noise_scale`); a
tracked race probes phi the same way at points along its run. Under GradScaler the norms are of
the unscaled gradients."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from advisor.noise_scale import estimate_noise_scale
from advisor.results import GradientNorms, NoiseProbe, RacePoint
from advisor.trial.child.batches import compute_loss
from advisor.trial.child.loop import Trainer
from advisor.trial.child.steps import Clock

__all__ = [
    "PROBE_MIN_S",
    "PROBE_SHARE",
    "measure_gradient_norms",
    "noise_probe",
    "probe_noise",
    "rank_zero_says",
]

NOISE_MIN_STEPS = 10
PROBE_MICRO = 8  # micro-batches in a probe's big batch
PROBE_MIN_GROUPS = 8  # gradient pairs a probe averages at least,
PROBE_MAX_GROUPS = 128  # and at most, stopping once
PROBE_PRECISION = 0.5  # phi's 95 % interval is within this fraction of its value,
PROBE_SHARE = 0.05  # or the probe took this share of the race's training time,
PROBE_MIN_S = 1.0  # or this long if that is more


def noise_probe(trainer: Trainer, point: RacePoint | None, seconds: float) -> NoiseProbe:
    """Gradient norms where the run is now, with the run's position and loss (None before a
    first evaluation of a training loss); the parent estimates phi from them."""
    return NoiseProbe(
        seconds=point.seconds if point else 0.0,
        samples=point.samples if point else 0,
        loss=point.loss if point else None,
        norms=probe_noise(trainer, seconds=seconds),
    )


def probe_noise(
    trainer: Trainer,
    micro: int = PROBE_MICRO,
    *,
    seconds: float = math.inf,
    min_groups: int = PROBE_MIN_GROUPS,
    max_groups: int = PROBE_MAX_GROUPS,
    clock: Clock = time.perf_counter,
) -> GradientNorms:
    """Squared gradient norms at one micro-batch and at `micro` of them, at the current
    weights, group after group: at least `min_groups`, then until phi's 95 % interval is within
    `PROBE_PRECISION` of its value, `seconds` have passed or `max_groups` are in. The
    gradients are computed and dropped, never applied, so the run goes on as if not measured
    (but for the micro-batches its stream gave the probe). Under fp16 the loss is scaled as
    the GradScaler scales it and the norms are unscaled. One process only; time is read from
    `clock`."""
    if trainer.config.world_size > 1:
        raise ValueError("the noise scale is tracked in one process")
    params = [p for p in trainer.module.parameters() if p.requires_grad]
    scale = trainer.scaler.get_scale() if trainer.scaler.is_enabled() else 1.0
    batch = trainer.config.batch_size
    small: list[float] = []
    big: list[float] = []
    trainer.optimizer.zero_grad(set_to_none=True)
    started = clock()
    for group in range(max_groups):
        pair = _probe_pair(trainer, params, micro, scale)
        if pair is not None:
            small.append(pair[0])
            big.append(pair[1])
        if group + 1 >= min_groups and clock() - started >= seconds:
            break
        if group + 1 >= min_groups and len(big) >= 2:
            estimate = estimate_noise_scale(small, big, batch, batch * micro)
            if estimate.value and (estimate.high or math.inf) - estimate.value < (
                PROBE_PRECISION * estimate.value
            ):
                break
    return GradientNorms(
        small_batch=batch, big_batch=batch * micro, small_sq=tuple(small), big_sq=tuple(big)
    )


def _probe_pair(
    trainer: Trainer, params: list[torch.nn.Parameter], micro: int, scale: float
) -> tuple[float, float] | None:
    """One micro-batch's squared gradient norm and that of `micro` micro-batches' mean; None
    where either is not finite. The gradients are dropped."""
    first = math.nan
    for index in range(micro):
        with trainer.autocast():
            loss = compute_loss(trainer.module, trainer.next_batch(), trainer.loss_fn)
        (loss.float() * (scale / micro)).backward()
        if index == 0:
            first = _squared_norm(params) * (micro / scale) ** 2
    whole = _squared_norm(params) / scale**2
    trainer.optimizer.zero_grad(set_to_none=True)
    return (first, whole) if math.isfinite(first) and math.isfinite(whole) else None


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
        if rank_zero_says(done, trainer):
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


def rank_zero_says(flag: bool, trainer: Trainer) -> bool:
    """Rank 0's `flag` on every rank (DDP ranks must stop and evaluate after the same steps)."""
    if trainer.config.world_size == 1:
        return flag
    value = torch.tensor([int(flag)], device=trainer.device)
    dist.broadcast(value, src=0)
    return bool(value.item())
