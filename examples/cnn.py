"""A small convolutional network on synthetic 32×32 RGB images.

advisor tune examples/cnn.py:factory
"""

import torch
from torch import nn
from torch.utils.data import TensorDataset

from advisor import TrainingTask

CLASSES = 10
SAMPLES = 4_096


def factory() -> TrainingTask:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(SAMPLES, 3, 32, 32, generator=generator)
    labels = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * 8 * 8, 128),
        nn.ReLU(),
        nn.Linear(128, CLASSES),
    )
    return TrainingTask(
        model=model,
        dataset=TensorDataset(images, labels),
        loss_fn=nn.CrossEntropyLoss(),
        batch_size=64,
    )
