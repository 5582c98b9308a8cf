"""Probe the machine into a `HardwareProfile`, its matmul peak measured, not read off a datasheet.

`probe()` imports torch in the calling process (and initialises CUDA where present); the tuning
parent runs it in a child (`advisor.trial.runner.probe_isolated`) so that it holds no CUDA context.

The peak is the yardstick for "fraction of peak": a large square matmul is the fastest thing the
hardware does with a given dtype, and a model's training step can at best approach it. It is
what this process can reach, on the cores it may use.
"""

from __future__ import annotations

import os
import platform
import time

import psutil
import torch

from advisor.results import GpuInfo, HardwareProfile

__all__ = ["matmul_flops", "probe", "usable_cores"]

CPU_SIZE = 2048  # 17 GFLOP a product: tens of ms on a core
GPU_SIZE = 8192  # 1.1 TFLOP a product: about a millisecond on a current GPU
REPEATS = 5


def probe() -> HardwareProfile:
    """The machine this process runs on: cores, memory, torch's build, GPUs, matmul peaks."""
    cuda = torch.cuda.is_available()
    return HardwareProfile(
        cpu_model=_cpu_model(),
        cores=usable_cores(),
        memory_bytes=psutil.virtual_memory().total,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        cpu_bf16=_cpu_has_bf16(),
        python_version=platform.python_version(),
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        cudnn_version=torch.backends.cudnn.version() if cuda else None,
        gpus=tuple(_gpu(index) for index in range(torch.cuda.device_count())) if cuda else (),
        cpu_peak_flops=matmul_flops(torch.device("cpu"), _cpu_dtypes()),
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's total."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def matmul_flops(device: torch.device, dtypes: tuple[torch.dtype, ...]) -> dict[str, float]:
    """Best-of-`REPEATS` FLOP/s of an n x n matmul on `device`, for each dtype by name."""
    size = GPU_SIZE if device.type == "cuda" else CPU_SIZE
    return {_name(dtype): _best_rate(device, dtype, size) for dtype in dtypes}


def _gpu(index: int) -> GpuInfo:
    properties = torch.cuda.get_device_properties(index)
    with torch.cuda.device(index):
        bf16 = torch.cuda.is_bf16_supported()
    dtypes = (torch.float32, torch.float16, *((torch.bfloat16,) if bf16 else ()))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 as trials run it: no TF32
    try:
        peak = matmul_flops(torch.device("cuda", index), dtypes)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return GpuInfo(
        name=properties.name,
        memory_bytes=properties.total_memory,
        capability=f"{properties.major}.{properties.minor}",
        bf16=bf16,
        peak_flops=peak,
    )


def _cpu_dtypes() -> tuple[torch.dtype, ...]:
    return (torch.float32, torch.bfloat16) if _cpu_has_bf16() else (torch.float32,)


def _cpu_has_bf16() -> bool:
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _best_rate(device: torch.device, dtype: torch.dtype, size: int) -> float:
    left = torch.randn(size, size, device=device).to(dtype)
    right = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(left, right)  # warm-up: kernel selection, thread pool start
    best = float("inf")
    for _ in range(REPEATS):
        _synchronize(device)
        started = time.perf_counter()
        torch.matmul(left, right)
        _synchronize(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
