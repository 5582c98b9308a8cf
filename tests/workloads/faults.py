"""Workloads that fail where real ones do: inside DataLoader workers, in native code, and a
mix of faults spread over the search space (tests of the fault matrix, issue #5)."""

import ctypes
import os
import signal
import time

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from tests.workloads.tiny import Faulty, _data, _fault_factory, _model

SAMPLES = 512


class LoaderFault(Dataset):
    """The tiny dataset, except that `__getitem__` misbehaves inside a loader worker when the
    loader has `workers` workers (any number when None)."""

    def __init__(self, fault, workers: int | None = None) -> None:
        self.data = _data(SAMPLES)
        self.fault = fault
        self.workers = workers

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int):
        info = get_worker_info()
        if info is not None and self.workers in (None, info.num_workers):
            self.fault(index)
        return self.data[index]


def _raise_in_worker(index: int) -> None:
    raise ValueError(f"simulated: cannot decode sample {index}")


def _hang_in_worker(index: int) -> None:
    time.sleep(3600)


_items_served = 0  # in this loader worker


def _stuck_after_a_batch(index: int) -> None:
    """Serves one batch of 16, then hangs, deaf to SIGTERM (as a blocked native read can be)."""
    global _items_served
    _items_served += 1
    if _items_served > 16:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(3600)


def worker_raises():
    return _model(), LoaderFault(_raise_in_worker), nn.CrossEntropyLoss()


def worker_hangs():
    return _model(), LoaderFault(_hang_in_worker), nn.CrossEntropyLoss()


def worker_stuck_after_a_batch():
    return _model(), LoaderFault(_stuck_after_a_batch), nn.CrossEntropyLoss()


def _null_dereference(model: Faulty, features: torch.Tensor) -> None:
    ctypes.string_at(0)  # as a broken native extension would


segfault = _fault_factory(_null_dereference)


class Mixed(nn.Module):
    """Trains at batch 32 in fp32. Under autocast the loss turns NaN (as an fp16-unsafe model's
    does); batch 128 runs out of memory, or aborts the process under autocast."""

    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        autocast = torch.is_autocast_enabled(features.device.type)
        if features.shape[0] >= 128:
            if autocast:
                os.abort()
            raise torch.OutOfMemoryError("simulated: tried to allocate 8.00 GiB")
        out = self.net(features)
        return out * float("nan") if autocast else out


def _mixed_loader_fault(index: int) -> None:
    info = get_worker_info()
    if info is not None and info.num_workers == 1:
        time.sleep(3600)  # one worker: the loader hangs
    raise ValueError(f"simulated: cannot decode sample {index}")  # two workers: it raises


def mixed():
    """A fault in every corner of its space: only batch 32, fp32, no loader workers trains."""
    return Mixed(), LoaderFault(_mixed_loader_fault), nn.CrossEntropyLoss()


def _corrupt_after_the_validation(model: Faulty, features: torch.Tensor) -> None:
    if model.calls > 4:  # advisor's validation takes two steps: every trial takes more
        raise ValueError("simulated: corrupt record")


corrupt = _fault_factory(_corrupt_after_the_validation)


HOSTILE = 'rich [/] markup, <script>alert("x")</script> | a pipe,\nand a "quoted" newline'


def _raise_markup_above_32(model: Faulty, features: torch.Tensor) -> None:
    if features.shape[0] > 32:
        raise ValueError(HOSTILE)  # as user code's messages may be


hostile = _fault_factory(_raise_markup_above_32)
