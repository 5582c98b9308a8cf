"""A wide MLP learning a clean teacher, with momentum SGD at a learning rate chosen for its batch
of 32: a workload where the highest-throughput batch (4096 on a 2-core CPU) never reaches the
loss batch 32 gets in a minute, while a moderately larger one does, sooner
(benchmarks/convergence.py).

    advisor tune examples/teacher.py:factory

The factory returns a plain tuple with its own optimizer, so this file needs no import of advisor.
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES = 32
WIDTH = 1024
SAMPLES = 32_768


def _teacher(generator: torch.Generator) -> nn.Module:
    teacher = nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, 1))
    with torch.no_grad():
        for parameter in teacher.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return teacher


def sgd(params):
    """Momentum SGD at lr 0.05: the example's choice for its batch of 32."""
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def factory():
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    with torch.no_grad():
        targets = _teacher(generator)(inputs).squeeze(-1) / 8  # exact labels, no noise
    model = nn.Sequential(
        nn.Linear(FEATURES, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, 1),
        nn.Flatten(0),
    )
    return model, TensorDataset(inputs, targets), nn.MSELoss(), sgd
