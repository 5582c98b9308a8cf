"""Workloads whose convergence is known: a regression with a closed-form noise scale, one where a
bigger batch loses per wall-second and one where it wins.

Throughput is set by sleeping in the forward pass while training (never while evaluating), so the
outcome depends on the measurement, not on this machine's speed.
"""

import time

import torch
from torch import nn
from torch.utils.data import TensorDataset

from advisor import TrainingTask

SAMPLES = 8192


class Throttled(nn.Module):
    """A linear model, from zero weights, whose training forward pass takes at least
    `per_step_s + per_sample_s x batch` seconds."""

    def __init__(self, features: int, per_step_s: float = 0.0, per_sample_s: float = 0.0) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1, bias=False)
        nn.init.zeros_(self.linear.weight)
        self.per_step_s = per_step_s
        self.per_sample_s = per_sample_s

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training and (self.per_step_s or self.per_sample_s):
            time.sleep(self.per_step_s + self.per_sample_s * len(inputs))
        return self.linear(inputs).squeeze(-1)


def _regression(scales: torch.Tensor, noise: float) -> TensorDataset:
    """y = x . w* + noise, x ~ N(0, diag(scales^2)), |w*| = 1."""
    generator = torch.Generator().manual_seed(0)
    features = len(scales)
    inputs = torch.randn(SAMPLES, features, generator=generator) * scales
    truth = torch.ones(features) / features**0.5
    targets = inputs @ truth + noise * torch.randn(SAMPLES, generator=generator)
    return TensorDataset(inputs, targets)


NOISE_FEATURES = 30
NOISE_SIGMA = 1.0
# With x ~ N(0, I), the per-sample gradient of (x.w - y)^2 at w = 0 has |G|^2 = 4|w*|^2 = 4 and
# tr(Sigma) = 4((d + 1)|w*|^2 + sigma^2 d): B_simple = d + 1 + sigma^2 d.
KNOWN_NOISE_SCALE = NOISE_FEATURES + 1 + NOISE_SIGMA**2 * NOISE_FEATURES


def known_noise_scale() -> TrainingTask:
    """Linear regression held at its initial weights (lr 0), where the noise scale is known."""
    return TrainingTask(
        model=Throttled(NOISE_FEATURES),
        dataset=_regression(torch.ones(NOISE_FEATURES), NOISE_SIGMA),
        loss_fn=nn.MSELoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.0),
        batch_size=8,
    )


def big_batch_loses() -> TrainingTask:
    """No label noise, an lr tuned for batch 8, and samples/s that do not grow with the batch:
    every step of a small batch is nearly as good as a big one's, and it takes 32x more steps."""
    scales = torch.tensor([1.0, 0.7, 0.5, 0.3, 0.2, 0.15, 0.1, 0.1])
    return TrainingTask(
        model=Throttled(len(scales), per_sample_s=5e-4),
        dataset=_regression(scales, noise=0.0),
        loss_fn=nn.MSELoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.3),
        batch_size=8,
    )


def big_batch_wins() -> TrainingTask:
    """Noisy labels, a cautious lr, and steps whose cost does not depend on the batch: a big
    batch takes as many steps, each far less noisy, and can afford a larger lr."""
    scales = torch.ones(8)
    return TrainingTask(
        model=Throttled(len(scales), per_step_s=0.02),
        dataset=_regression(scales, noise=3.0),
        loss_fn=nn.MSELoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.005),
        batch_size=8,
    )


class _SlowToLoad(TensorDataset):
    """A dataset whose every sample takes `load_s` to build, as a decoded image would."""

    def __init__(self, data: TensorDataset, load_s: float) -> None:
        super().__init__(*data.tensors)
        self.load_s = load_s

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        time.sleep(self.load_s)
        return super().__getitem__(index)


def input_bound() -> TrainingTask:
    """Clean labels, an lr tuned for batch 16, and samples/s set by loading alone (1 ms a
    sample, whatever the batch): loader workers are the one win, and they keep the batch."""
    scales = torch.tensor([1.0, 0.7, 0.5, 0.3, 0.2, 0.15, 0.1, 0.1])
    return TrainingTask(
        model=Throttled(len(scales)),
        dataset=_SlowToLoad(_regression(scales, noise=0.0), load_s=1e-3),
        loss_fn=nn.MSELoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.3),
        batch_size=16,
    )


GROWING_FEATURES = 16
GROWING_TRUTH = 10.0  # |w*|: the run starts far from its optimum


def noise_grows() -> TrainingTask:
    """Linear regression with label noise, from zero weights far from w* (|w*| = 10), steps of
    at least a millisecond: at w the noise scale is about d + 1 + sigma^2 d / |w - w*|^2, 17 at
    the start, and it grows as the run converges (33 at |w - w*| = 1, 177 at 0.3)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, GROWING_FEATURES, generator=generator)
    truth = torch.full((GROWING_FEATURES,), GROWING_TRUTH / GROWING_FEATURES**0.5)
    targets = inputs @ truth + NOISE_SIGMA * torch.randn(SAMPLES, generator=generator)
    return TrainingTask(
        model=Throttled(GROWING_FEATURES, per_step_s=0.001),
        dataset=TensorDataset(inputs, targets),
        loss_fn=nn.MSELoss(),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.002),
        batch_size=32,
    )
