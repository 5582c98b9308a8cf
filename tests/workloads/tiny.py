"""Tiny real workloads for the tests: each factory builds in milliseconds and trains on CPU."""

import functools
import os
import sys
import time

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from advisor import TrainingTask

_DYNAMO_PRELOADED = "torch._dynamo" in sys.modules  # before this module made any optimizer

FEATURES = 8
SAMPLES = 512


def _data(samples: int = SAMPLES) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(samples, FEATURES, generator=generator)
    return TensorDataset(inputs, (inputs.sum(dim=1) > 0).long())


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2))


def factory():
    """The plain tuple form: (model, dataset, loss_fn)."""
    return _model(), _data(), nn.CrossEntropyLoss()


class LossModel(nn.Module):
    """Takes dict batches and returns {"loss": ...}: the loss_fn=None contract."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, features: torch.Tensor, label: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.net(features), label)}


class DictDataset(Dataset):
    def __init__(self) -> None:
        self.inner = _data()

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        features, label = self.inner[index]
        return {"features": features, "label": label}


def dict_task() -> TrainingTask:
    """TrainingTask form, dict batches, model returns the loss, custom optimizer, batch 16."""
    return TrainingTask(
        model=LossModel(),
        dataset=DictDataset(),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),
        batch_size=16,
    )


class TripleModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, features: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.net(features * scale[:, None])


def triple_task():
    """Batches of three tensors: loss_fn(model(x, scale), y)."""
    base = _data()
    dataset = TensorDataset(base.tensors[0], torch.ones(SAMPLES), base.tensors[1])
    return TripleModel(), dataset, nn.CrossEntropyLoss()


class Stream(IterableDataset):
    def __iter__(self):
        inputs, labels = _data().tensors
        yield from zip(inputs, labels, strict=True)


def iterable_task():
    return _model(), Stream(), nn.CrossEntropyLoss()


def with_optimizer():
    """The 4-tuple form: (model, dataset, loss_fn, a callable that builds the optimizer)."""
    optimizer = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
    return _model(), _data(), nn.CrossEntropyLoss(), optimizer


class Reconstruction(nn.Module):
    """An autoencoder: single-tensor batches in, its own loss out."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 4), nn.ReLU(), nn.Linear(4, FEATURES))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(features), features)


class Features(Dataset):
    def __init__(self) -> None:
        self.inner = _data().tensors[0]

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.inner[index]


def reconstruction():
    """(model, dataset): each batch one tensor, the model returns the loss."""
    return Reconstruction(), Features()


class DictModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, features: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return self.net(features)


def dict_cross_entropy(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(logits, batch["label"])


def dict_with_loss_fn() -> TrainingTask:
    """Dict batches and a loss_fn(output, batch)."""
    return TrainingTask(model=DictModel(), dataset=DictDataset(), loss_fn=dict_cross_entropy)


class PairLoss(nn.Module):
    """Takes (inputs, target) and returns its own loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, features: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(features), label)


def pair_loss():
    """(model, dataset): pair batches, the model returns the loss."""
    return PairLoss(), _data()


# --- bad factories -------------------------------------------------------------------------
not_callable = 5


def raises():
    raise ValueError("cannot find the data folder")


def wrong_type():
    return 42


def not_a_module():
    return "a model", _data(), nn.CrossEntropyLoss()


def empty_dataset():
    return _model(), TensorDataset(torch.empty(0, FEATURES), torch.empty(0)), nn.CrossEntropyLoss()


def bad_shapes():
    """The model expects 10 features; the data has 8."""
    return nn.Linear(10, 2), _data(), nn.CrossEntropyLoss()


def returns_none():
    """Forgot the return statement."""
    _model()


def no_parameters():
    return nn.ReLU(), _data(), nn.CrossEntropyLoss()


def loss_not_scalar():
    """reduction="none": one loss per sample."""
    return _model(), _data(), nn.CrossEntropyLoss(reduction="none")


class _Ragged(Dataset):
    """Samples whose feature counts differ: the default collate cannot stack them."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(FEATURES + index % 2), torch.tensor(index % 2)


def ragged_samples():
    return _model(), _Ragged(), nn.CrossEntropyLoss()


# --- trials that fail in known ways ---------------------------------------------------------
class Faulty(nn.Module):
    """Behaves like the tiny model until `fault` triggers inside forward."""

    def __init__(self, fault) -> None:
        super().__init__()
        self.net = _model()
        self.fault = fault
        self.calls = 0

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.fault(self, features)
        return self.net(features)


def _oom_above_64(model: Faulty, features: torch.Tensor) -> None:
    if features.shape[0] > 64:
        raise torch.OutOfMemoryError("simulated: tried to allocate 8.00 GiB")


def _nan_after_first_steps(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 2:
        with torch.no_grad():
            model.net[0].weight.fill_(float("nan"))


def _hang(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 2:
        time.sleep(3600)


def _abort(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 2:
        os.abort()


def _sigkill(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 2:
        os.kill(os.getpid(), 9)


def _hog_device_memory(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 2:
        torch.empty(2**40, dtype=torch.uint8, device=features.device)  # 1 TiB: a real CUDA OOM


def _fault_factory(fault):
    return lambda: (Faulty(fault), _data(), nn.CrossEntropyLoss())


oom_above_64 = _fault_factory(_oom_above_64)
nan_loss = _fault_factory(_nan_after_first_steps)
hang = _fault_factory(_hang)
abort = _fault_factory(_abort)
sigkill = _fault_factory(_sigkill)
hog_device_memory = _fault_factory(_hog_device_memory)


def hangs_at_build():
    """A factory stuck before it returns (a lock, a network mount)."""
    time.sleep(3600)


def _hang_at_once(model: Faulty, features: torch.Tensor) -> None:
    time.sleep(3600)


hangs_in_first_step = _fault_factory(_hang_at_once)


def says_its_environment():
    """Fails with the values its process got of the variables the launcher tests change."""
    seen = {name: os.environ.get(name) for name in ("PYTEST_CURRENT_TEST", "ADVISOR_ECHO")}
    raise RuntimeError(f"environment: {seen}")


def says_what_was_imported():
    """Fails with a message saying whether torch._dynamo (which only advisor's launcher and an
    optimizer import) was loaded before this module."""
    raise RuntimeError(f"torch._dynamo preloaded: {_DYNAMO_PRELOADED}")


def float64_default():
    """Changes torch's global default dtype, as some user code does; trials after it must not
    see the change."""
    torch.set_default_dtype(torch.float64)
    return factory()


def lingering_thread():
    """Leaves a non-daemon thread running: interpreter shutdown would wait for it forever."""
    import threading

    threading.Thread(target=time.sleep, args=(3600,), name="user-prefetcher").start()
    return factory()


# --- DDP ranks that fail alone ------------------------------------------------------------------
def _on_rank_1(fault):
    """Trigger `fault` in rank 1 only; rank 0 then waits for it in a gradient all-reduce."""

    def maybe(model: Faulty, features: torch.Tensor) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == 1:
            fault(model, features)

    return maybe


def _raise(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 2:
        raise RuntimeError("simulated failure in rank 1's forward")


rank1_raises = _fault_factory(_on_rank_1(_raise))
rank1_hangs = _fault_factory(_on_rank_1(_hang))
rank1_sigkill = _fault_factory(_on_rank_1(_sigkill))


# --- a step time set by the clock, not the arithmetic --------------------------------------
PACE_S = 0.1


def _paced_step(model: Faulty, features: torch.Tensor) -> None:
    """Start each forward at least 100 ms after the last one started.

    Whatever the arithmetic costs (it is far below the pace), every configuration then trains
    at the same number of steps per second, so two of them are a tie by construction. A step
    that a busy machine makes late is not caught up by rushing the next ones: a window that
    began with such a rush would measure faster than the pace.
    """
    last = getattr(model, "last_start", None)
    if last is not None:
        time.sleep(max(0.0, last + PACE_S - time.perf_counter()))
    model.last_start = time.perf_counter()


# Configurations that change only the arithmetic (amp) run at the same speed.
paced = _fault_factory(_paced_step)

BEAT_S = 0.02


def _on_the_beat(model: Faulty, features: torch.Tensor) -> None:
    """Start each forward on a fixed 20 ms beat; a late step is caught up by the next ones, so
    that the average speed holds on a busy machine."""
    beat = getattr(model, "next_beat", None) or time.perf_counter()
    time.sleep(max(0.0, beat - time.perf_counter()))
    model.next_beat = beat + BEAT_S


def _four_beats_under_autocast(model: Faulty, features: torch.Tensor) -> None:
    for _ in range(4 if torch.is_autocast_enabled("cpu") else 1):
        _on_the_beat(model, features)


# bf16 runs at a quarter of fp32's speed, whatever the machine.
slow_with_bf16 = _fault_factory(_four_beats_under_autocast)


MICRO_STEP_S = 0.1


def _a_tenth_of_a_second(model: Faulty, features: torch.Tensor) -> None:
    time.sleep(MICRO_STEP_S)


def _half_a_second_under_autocast(model: Faulty, features: torch.Tensor) -> None:
    if torch.is_autocast_enabled("cpu"):
        time.sleep(0.5)


# Every micro-step takes 0.1 s, whatever the machine: with accumulation, long optimizer cycles.
slow_micro_steps = _fault_factory(_a_tenth_of_a_second)
OPTIMIZER_STEP_S = 0.3


class _SlowStepSGD(torch.optim.SGD):
    """SGD whose every step takes OPTIMIZER_STEP_S more: what accumulation amortises."""

    def step(self, closure=None):
        time.sleep(OPTIMIZER_STEP_S)
        return super().step(closure)


def slow_optimizer_steps():
    """Micro-steps of MICRO_STEP_S and optimizer steps of OPTIMIZER_STEP_S more: a cycle of 0.4 s
    without accumulation, 0.7 s with 4 micro-steps (1.75x the samples/s)."""
    model, data, loss = slow_micro_steps()
    return model, data, loss, functools.partial(_SlowStepSGD, lr=0.05)


# bf16 micro-steps take half a second: hundreds of times slower than fp32 here.
very_slow_with_bf16 = _fault_factory(_half_a_second_under_autocast)


# --- convolutions: the knobs for 4-D inputs -----------------------------------------------------
class _TinyConv(nn.Module):
    """Conv2d over 3x8x8 images; with `perturb_channels_last`, it computes something else when
    its input is channels-last, as a kernel bug in one memory format would."""

    def __init__(self, perturb_channels_last: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 2)
        self.perturb = perturb_channels_last

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = torch.relu(self.conv(images))
        if self.perturb and images.is_contiguous(memory_format=torch.channels_last):
            features = features * 10.0
        return self.head(features.mean(dim=(2, 3)))


def _images() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(SAMPLES, 3, 8, 8, generator=generator)
    return TensorDataset(images, (images.mean(dim=(1, 2, 3)) > 0).long())


def conv():
    return _TinyConv(), _images(), nn.CrossEntropyLoss()


def conv_wrong_in_channels_last():
    return _TinyConv(perturb_channels_last=True), _images(), nn.CrossEntropyLoss()


SAMPLE_S = 0.03


class _SlowSamples(Dataset):
    """Each sample takes 30 ms to load: with two loader workers, batches arrive in pairs, and
    steps alternate between one that waits for a batch and one that finds it ready."""

    def __init__(self) -> None:
        self.inner = _data()

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(SAMPLE_S)
        return self.inner[index]


def slow_samples():
    return _model(), _SlowSamples(), nn.CrossEntropyLoss()


class _Wide(nn.Module):
    """Each sample's 8 features blown up to 8 x 262,144 activations (8 MiB) and back: the memory
    a step needs grows with its micro-batch, far past the allocator's own noise (a CPU trial's
    peak RSS moves by 100-250 MiB with the number of steps it ran), while the parameters stay
    few."""

    def __init__(self, width: int = 262144) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))
        self.head = nn.Linear(FEATURES, 2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        wide = torch.relu(features.unsqueeze(-1) * self.scale)
        return self.head(wide.mean(dim=-1))


def activation_heavy() -> TrainingTask:
    """Batch 32 at about 16 MiB of activations per sample."""
    return TrainingTask(
        model=_Wide(), dataset=_data(), loss_fn=nn.CrossEntropyLoss(), batch_size=32
    )


class ResidualBlock(nn.Module):
    """Features widened to `width` and back, with dropout: a transformer block's shape."""

    def __init__(self, width: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.up = nn.Linear(FEATURES, width)
        self.down = nn.Linear(width, FEATURES)
        self.drop = nn.Dropout(dropout)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return features + self.drop(self.down(torch.relu(self.up(features))))


class Tower(nn.Module):
    def __init__(self, depth: int = 8, width: int = 65536, dropout: float = 0.1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ResidualBlock(width, dropout) for _ in range(depth))
        self.head = nn.Linear(FEATURES, 2)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            features = block(features)
        return self.head(features)


def blocks() -> TrainingTask:
    """Eight repeated blocks of 65,536-wide activations (about 4 MiB per sample in all)."""
    return TrainingTask(
        model=Tower(), dataset=_data(), loss_fn=nn.CrossEntropyLoss(), batch_size=64
    )


def small_blocks() -> TrainingTask:
    """`blocks` two deep and 256 wide: the same dropout to draw random numbers, in milliseconds."""
    return TrainingTask(
        model=Tower(depth=2, width=256),
        dataset=_data(),
        loss_fn=nn.CrossEntropyLoss(),
        batch_size=64,
    )


def one_batch_blocks() -> TrainingTask:
    """`blocks` without dropout over a dataset of one batch: whatever order a sampler reads it
    in, the first loss is the mean over the same 128 samples with the same weights."""
    return TrainingTask(
        model=Tower(dropout=0.0), dataset=_data(128), loss_fn=nn.CrossEntropyLoss(), batch_size=128
    )


def parameter_heavy() -> TrainingTask:
    """Eight blocks of 4M parameters (128 MiB in fp32; with their gradients and AdamW's two
    moments, 512 MiB a copy) and few activations: what each DDP rank holds in full and FSDP
    ranks share."""
    return TrainingTask(
        model=Tower(width=262144), dataset=_data(), loss_fn=nn.CrossEntropyLoss(), batch_size=16
    )
