"""A tabular classifier on 4,194,304 samples generated from their index: more data than a run
of minutes sees, so the loss keeps falling and no sample is trained on twice.

    advisor tune examples/large_data.py:factory

Each sample is a function of its index alone (a counter-based hash), so the dataset is map-style,
shuffles and shards like any other, and costs no memory. The labels come from a fixed random
teacher network, one in ten replaced by a random class: a loss floor the model approaches
slowly, with gradient noise that grows as it does. The factory returns a plain tuple, so this
file needs no import of advisor.
"""

import torch
from torch import nn
from torch.utils.data import Dataset

FEATURES = 64
CLASSES = 10
SAMPLES = 4_194_304
LABEL_NOISE = 0.1


def _uniform(index: torch.Tensor, salt: float, width: int) -> torch.Tensor:
    """Uniform numbers in [0, 1) from each index and column: a hash, not a random state."""
    columns = torch.arange(width, dtype=torch.float64)
    angle = index.to(torch.float64)[:, None] * 12.9898 + columns * 78.233 + salt
    return torch.frac(torch.sin(angle).abs() * 43758.5453)


class GeneratedSamples(Dataset):
    """(features, class) of sample `index`, the same every time it is read."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.teacher = nn.Sequential(nn.Linear(FEATURES, 128), nn.Tanh(), nn.Linear(128, CLASSES))
        with torch.no_grad():
            for parameter in self.teacher.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))

    def __len__(self) -> int:
        return SAMPLES

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A whole batch at once (the DataLoader asks for one like this)."""
        index = torch.tensor(indices)
        inputs = ((_uniform(index, 0.0, FEATURES) * 2 - 1) * 3**0.5).to(torch.float32)
        with torch.no_grad():
            labels = self.teacher(inputs).argmax(dim=1)
        noisy = _uniform(index, 1.0, 2)
        flipped = noisy[:, 0] < LABEL_NOISE
        labels[flipped] = (noisy[flipped, 1] * CLASSES).long().clamp(max=CLASSES - 1)
        return list(zip(inputs.unbind(0), labels.unbind(0), strict=True))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([index])[0]


def factory() -> tuple[nn.Module, Dataset, nn.Module]:
    model = nn.Sequential(
        nn.Linear(FEATURES, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, CLASSES),
    )
    return model, GeneratedSamples(), nn.CrossEntropyLoss()
