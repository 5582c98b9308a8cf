"""Probe the machine into a `HardwareProfile`, its matmul peak measured, not read off a datasheet.

`probe()` imports torch in the calling process (and initialises CUDA where present); the tuning
parent runs it in a child (`advisor.trial.parent.hardware.probe_isolated`), so that it holds no
CUDA context.

The peak is the yardstick for "fraction of peak": a large square matmul is the fastest thing the
hardware does with a given dtype, and a model's training step can at best approach it. It is
what this process can reach, on the cores it may use. Every low precision autocast could use is
timed too, bf16 on every CPU: where the CPU has no native bf16 it is emulated, 20-45x slower than
fp32, and the search space leaves out what the measurement says cannot pay off
(`advisor.knobs`, the amp row).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections.abc import Iterator

import psutil
import torch

from advisor.memory import preloaded_allocator, running_allocator
from advisor.results import GpuInfo, HardwareProfile

__all__ = ["matmul_flops", "probe", "usable_cores", "write_profile"]

CPU_SIZE = 2048  # 17 GFLOP a product: tens of ms on a core
GPU_SIZE = 8192  # 1.1 TFLOP a product: about a millisecond on a current GPU
# Timed products of each dtype: at least MIN_PRODUCTS, more until they add up to TIMED_S (at most
# MAX_PRODUCTS). The fastest counts: on a loaded machine most short products lose time to it.
MIN_PRODUCTS = 3
MAX_PRODUCTS = 50
TIMED_S = 0.1
# The size doubles from here until one product takes `LONG_ENOUGH_S` (or the size above is
# reached): an emulated bf16 product of 2048 takes seconds on two cores, one of 256 tens of ms.
SMALLEST = 256
LONG_ENOUGH_S = 0.02


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
        cpu_peak_flops=matmul_flops(torch.device("cpu"), (torch.float32, torch.bfloat16)),
        allocator=running_allocator(),
        allocator_preload=preloaded_allocator(),
        python_executable=sys.executable,
    )


def write_profile(path: str) -> int:
    """Probe and write the profile as JSON to `path` (the launcher's probe job); exit code 0."""
    profile = probe()
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w") as out:
        out.write(profile.model_dump_json())
    os.replace(temporary, path)
    return 0


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), not the machine's total."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def matmul_flops(device: torch.device, dtypes: tuple[torch.dtype, ...]) -> dict[str, float]:
    """The fastest FLOP/s of an n x n matmul on `device`, for each dtype by name.

    The first dtype is the yardstick: its rate is timed on all of the device, n growing to the
    device's size unless a product already takes `LONG_ENOUGH_S`. Every other dtype's rate is the
    yardstick's times its speed ratio to it (`_speed_ratios`), timed on one thread on a CPU: a
    short product on several threads can lose most of its time to whatever else keeps the
    machine's cores busy (one thread waits for another), one on a single thread only its share.
    """
    largest = GPU_SIZE if device.type == "cuda" else CPU_SIZE
    yardstick = dtypes[0]
    operands = _sized_operands(device, yardstick, largest)
    seconds = _best_seconds({yardstick: operands}, device)[yardstick]
    peak = 2 * operands[0].shape[0] ** 3 / seconds
    with _one_cpu_thread(device):
        speed = _speed_ratios(device, dtypes, largest)
    return {_name(dtype): peak * speed[dtype] for dtype in dtypes}


def _speed_ratios(
    device: torch.device, dtypes: tuple[torch.dtype, ...], largest: int
) -> dict[torch.dtype, float]:
    """Each dtype's speed over the first's, timed at the smaller of their two sizes (so that a
    small size's lower efficiency weighs on both), their products taking turns."""
    yardstick = dtypes[0]
    speed = {yardstick: 1.0}
    for dtype in dtypes[1:]:
        operands = _sized_operands(device, dtype, largest)
        reference = _sized_operands(device, yardstick, operands[0].shape[0])
        common = reference[0].shape[0]
        if operands[0].shape[0] > common:
            operands = _operands(device, dtype, common)
        timed = _best_seconds({yardstick: reference, dtype: operands}, device)
        speed[dtype] = timed[yardstick] / timed[dtype]
    return speed


@contextlib.contextmanager
def _one_cpu_thread(device: torch.device) -> Iterator[None]:
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _best_seconds(
    operands: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor, float]], device: torch.device
) -> dict[torch.dtype, float]:
    """The fastest product of each dtype's operands (their first already timed), the dtypes
    taking turns, each until its products add up to `TIMED_S` (see `MIN_PRODUCTS`)."""
    best = {dtype: seconds for dtype, (_, _, seconds) in operands.items()}
    spent = dict(best)
    for products in range(1, MAX_PRODUCTS):
        wanted = {
            dtype: ops
            for dtype, ops in operands.items()
            if products < MIN_PRODUCTS or spent[dtype] < TIMED_S
        }
        if not wanted:
            break
        for dtype, (left, right, _) in wanted.items():
            took = _timed_product(left, right, device)
            best[dtype], spent[dtype] = min(best[dtype], took), spent[dtype] + took
    return best


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


def _sized_operands(
    device: torch.device, dtype: torch.dtype, largest: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Square operands of the size whose product takes `LONG_ENOUGH_S` (at most `largest`),
    and the seconds of that product."""
    size = SMALLEST
    while True:
        left, right, first = _operands(device, dtype, size)
        if size >= largest or first >= LONG_ENOUGH_S:
            return left, right, first
        size *= 2


def _operands(
    device: torch.device, dtype: torch.dtype, size: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Random square operands of `size`, and the seconds of their product after a warm-up one
    (kernel selection, the thread pool)."""
    left = torch.randn(size, size, device=device).to(dtype)
    right = torch.randn(size, size, device=device).to(dtype)
    torch.matmul(left, right)
    return left, right, _timed_product(left, right, device)


def _timed_product(left: torch.Tensor, right: torch.Tensor, device: torch.device) -> float:
    _synchronize(device)
    started = time.perf_counter()
    torch.matmul(left, right)
    _synchronize(device)
    return time.perf_counter() - started


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _name(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
