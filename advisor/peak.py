"""The machine's measured matmul throughput, the yardstick for "fraction of peak".

A large square matmul is the fastest thing the hardware does with a given dtype; a model's
training step can at best approach it. Measured, not taken from a datasheet: what this process
can reach, on the cores it may use.
"""

from __future__ import annotations

import time

import torch

__all__ = ["matmul_flops"]

CPU_SIZE = 2048  # 17 GFLOP a product: tens of ms on a core
GPU_SIZE = 8192  # 1.1 TFLOP a product: about a millisecond on a current GPU
REPEATS = 5


def matmul_flops(device: torch.device, dtypes: tuple[torch.dtype, ...]) -> dict[str, float]:
    """Best-of-`REPEATS` FLOP/s of an n x n matmul on `device`, for each dtype by name."""
    size = GPU_SIZE if device.type == "cuda" else CPU_SIZE
    return {_name(dtype): _best_rate(device, dtype, size) for dtype in dtypes}


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
