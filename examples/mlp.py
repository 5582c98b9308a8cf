"""A tabular MLP on synthetic data: the smallest realistic advisor workload.

    advisor tune examples/mlp.py:factory

The factory returns a plain tuple, so this file needs no import of advisor.
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset

FEATURES = 64
CLASSES = 10
SAMPLES = 16_384


def factory() -> tuple[nn.Module, TensorDataset, nn.Module]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    # A learnable target: the class is the argmax of a fixed random projection.
    targets = (inputs @ torch.randn(FEATURES, CLASSES, generator=generator)).argmax(dim=1)
    model = nn.Sequential(
        nn.Linear(FEATURES, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, CLASSES),
    )
    return model, TensorDataset(inputs, targets), nn.CrossEntropyLoss()
