"""A dataset whose `__getitem__` does real CPU work, like decoding and augmenting images.

    advisor tune examples/data_bound.py:factory

The model is small, so producing samples, not training on them, limits the speed: this is the
workload where DataLoader workers pay off.
"""

import math

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import Dataset

from advisor import TrainingTask

CLASSES = 10
SAMPLES = 8_192
SIZE = 192  # the "decoded" image, before the crop
CROP = 32


class SyntheticImages(Dataset):
    """Renders each image from its index (a stand-in for JPEG decoding), then augments it."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        generator = torch.Generator().manual_seed(index)
        label = index % CLASSES
        image = _render(label, generator)
        return _augment(image, generator), label


def _render(label: int, generator: torch.Generator) -> torch.Tensor:
    grid = torch.linspace(0, 2 * math.pi, SIZE)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    channels = []
    for channel in range(3):
        phase = torch.rand(1, generator=generator).item() * math.pi
        channels.append(torch.sin((label + 1) * x + phase) * torch.cos((channel + 1) * y))
    noise = 0.3 * torch.randn(3, SIZE, SIZE, generator=generator)
    return torch.stack(channels) + noise


def _augment(image: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    top, left = torch.randint(0, SIZE - CROP * 3 // 2, (2,), generator=generator).tolist()
    crop = image[:, top : top + CROP * 3 // 2, left : left + CROP * 3 // 2]
    crop = functional.interpolate(
        crop[None], size=(CROP, CROP), mode="bilinear", align_corners=False
    )[0]
    if torch.rand(1, generator=generator).item() < 0.5:
        crop = crop.flip(-1)
    blurred = functional.avg_pool2d(crop[None], 3, stride=1, padding=1)[0]
    return (blurred - blurred.mean()) / (blurred.std() + 1e-5)


def factory() -> TrainingTask:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, CLASSES),
    )
    return TrainingTask(
        model=model,
        dataset=SyntheticImages(),
        loss_fn=nn.CrossEntropyLoss(),
        batch_size=32,
    )
