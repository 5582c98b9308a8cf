"""Simulate another machine's bf16 in every Python process started with this folder on PYTHONPATH.

    PYTHONPATH=benchmarks/simulate ADVISOR_SIMULATE_BF16=slow:20 advisor tune ...

`ADVISOR_SIMULATE_BF16` says which machine:
- `slow:N`: bf16 matmuls and convolutions take N times as long as in fp32 (a CPU without native
  bf16, where they are emulated). They run in fp32, then the extra time is slept (for a product
  autograd records, three times as much: its backward pass computes two more).
- `fp32`: bf16 matmuls and convolutions run in fp32 and are rounded to bf16, so bf16 costs about
  what fp32 does (a machine where bf16 neither helps nor hurts).

Either way the result does not depend on whether this CPU computes bf16 natively.

Benchmarks and tests use it so that both kinds of machine are covered on any CPU. Python imports
`sitecustomize` at start-up, so trial children, DDP ranks and the hardware probe all see it.
"""

from __future__ import annotations

import os
import time
from typing import Any

SPEC = os.environ.get("ADVISOR_SIMULATE_BF16", "")

if SPEC:
    import torch
    from torch.overrides import TorchFunctionMode

    MATMULS = {
        torch.matmul,
        torch.mm,
        torch.bmm,
        torch.addmm,
        torch.einsum,
        torch.nn.functional.linear,
        torch.nn.functional.conv1d,
        torch.nn.functional.conv2d,
        torch.Tensor.matmul,
        torch.Tensor.__matmul__,
        torch.Tensor.mm,
    }

    def _bf16_now(args: tuple[Any, ...]) -> bool:
        if any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 for a in args):
            return True
        return torch.is_autocast_enabled("cpu") and (
            torch.get_autocast_dtype("cpu") == torch.bfloat16
        )

    def _as_fp32(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
            return value.float()
        return value

    class SimulatedBf16(TorchFunctionMode):
        """Slows down bf16 matmuls, or runs them in fp32, as `SPEC` says."""

        def __init__(self, spec: str) -> None:
            super().__init__()
            kind, _, factor = spec.partition(":")
            if kind not in ("slow", "fp32"):
                raise ValueError(f"ADVISOR_SIMULATE_BF16={spec!r}: use slow:N or fp32")
            self.kind = kind
            self.factor = float(factor or 20)

        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if func not in MATMULS or not _bf16_now(args):
                return func(*args, **kwargs)
            inputs = tuple(_as_fp32(a) for a in args)
            with torch.autocast("cpu", enabled=False):
                started = time.perf_counter()
                out = func(*inputs, **kwargs)
                took = time.perf_counter() - started
            if self.kind == "slow":  # a product in autograd has two more in the backward pass
                time.sleep((self.factor - 1) * took * (3 if out.requires_grad else 1))
            return out.to(torch.bfloat16)

    SimulatedBf16(SPEC).__enter__()  # for the life of the process
