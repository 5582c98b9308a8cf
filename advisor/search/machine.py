"""What this machine allows: the device a tune is for, the facts the knob table's rules read
(`Facts`: cores, GPUs and their capabilities, cuDNN, a compiler, matmul FLOP/s per dtype, and
what the validated task holds), and the autocast its matmuls run fastest in."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

from advisor.errors import SettingsError
from advisor.knobs import Device, Facts
from advisor.results import HardwareProfile, TaskSummary

__all__ = ["fastest_autocast", "machine_facts", "resolve_device"]

# Peaks within this fraction of the fastest count as equal: bf16 and fp16 matmuls run at one
# peak on current GPUs, and the probes' precision should not flip with the probe's noise.
PEAK_TIE = 0.10


def resolve_device(requested: str, hardware: HardwareProfile) -> Device:
    """The device to tune for: `auto` is CUDA where torch sees a GPU."""
    if requested == "cuda" and not hardware.has_cuda:
        raise SettingsError(
            f"--device cuda, but torch {hardware.torch_version} sees no CUDA GPU: "
            "use --device cpu or install a CUDA build of torch"
        )
    if requested == "auto":
        return "cuda" if hardware.has_cuda else "cpu"
    return requested  # type: ignore[return-value]


def machine_facts(
    device: Device,
    hardware: HardwareProfile,
    task: TaskSummary,
    max_world_size: int | None,
    forced: frozenset[str] = frozenset(),
) -> Facts:
    """What the knob table's rules read, from the probed machine and the validated task;
    `forced` knobs were named one by one in --knobs."""
    capabilities = [float(gpu.capability) for gpu in hardware.gpus]
    return Facts(
        device=device,
        cores=hardware.cores,
        gpus=len(hardware.gpus),
        gpu_bf16=bool(hardware.gpus) and all(gpu.bf16 for gpu in hardware.gpus),
        gpu_capability=min(capabilities, default=None),
        cudnn=hardware.cudnn_version is not None,
        compiler=_can_compile(device),
        max_world_size=max_world_size,
        iterable=task.iterable,
        conv2d=task.conv2d,
        repeated_block=task.repeated_block,
        custom_optimizer=task.custom_optimizer,
        matmul_flops=_matmul_flops(device, hardware),
        forced=forced,
    )


def _matmul_flops(device: Device, hardware: HardwareProfile) -> dict[str, float]:
    """The probe's matmul FLOP/s per dtype on `device`: on CUDA the slowest GPU's."""
    if device == "cpu":
        return dict(hardware.cpu_peak_flops)
    peaks = [gpu.peak_flops for gpu in hardware.gpus]
    dtypes = set.intersection(*(set(peak) for peak in peaks)) if peaks else set()
    return {dtype: min(peak[dtype] for peak in peaks) for dtype in dtypes}


def _can_compile(device: Device) -> bool:
    """Whether torch.compile's backend can build here: triton on CUDA, a C++ compiler on CPU."""
    if device == "cuda":
        return importlib.util.find_spec("triton") is not None
    return any(shutil.which(cxx) for cxx in (os.environ.get("CXX", "g++"), "g++", "clang++"))


def fastest_autocast(values: Iterable[Any], flops: Mapping[str, float]) -> str | None:
    """The autocast among `values` whose measured matmuls run fastest, where faster than fp32's
    (bf16 among peaks within `PEAK_TIE` of each other); None where none is, or none was timed.

    A larger batch puts more of a step into its matmuls, so their measured speed says more
    there than the user's small batch measured of the precision (examples/mlp.py: bf16 and
    fp32 within noise at batch 32, bf16 1.5x fp32's samples/s at 512)."""
    full = flops.get("fp32")
    # An autocast value names its dtype, as the probe's peaks do; "off" is fp32.
    faster = {v: flops[v] for v in values if v != "off" and full and flops.get(v, 0.0) > full}
    if not faster:
        return None
    best = max(faster.values())
    tied = [value for value, peak in faster.items() if peak >= (1 - PEAK_TIE) * best]
    return "bf16" if "bf16" in tied else max(faster, key=lambda value: faster[value])
