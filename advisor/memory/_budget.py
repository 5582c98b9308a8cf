"""`--memory-budget` as given: bytes with a unit, or a share of the device's memory.

A budget is bytes with a unit ("2GiB", "512 MB", "1.5G") or a share of the device ("0.8",
"80%"): of the GPU's memory on CUDA, of the host's physical memory on CPU. Without one, a CUDA
trial may use the GPU less `--memory-headroom` and a CPU trial the host less it: what advisor
always kept free. What it covers is the trial's measured peak (`TrialResult.peak_memory_bytes`):
each GPU's `max_memory_reserved` on CUDA, and on CPU the resident memory of the trial's whole
process tree, every rank and loader worker together, since they share the host, less the pages
that map files.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import model_validator

from advisor.frozen import Frozen

__all__ = [
    "MemoryBudget",
    "gib",
]

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}  # fmt: skip
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z%]*)\s*")


class MemoryBudget(Frozen):
    """A budget as given: `bytes`, or a `fraction` of the device's memory."""

    bytes: int | None = None
    fraction: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("a memory budget is bytes with a unit (2GiB) or a share (0.8, 80%)")
        if isinstance(value, (int, float)):
            value = str(value)
        if not isinstance(value, str):
            return value
        match = _AMOUNT.fullmatch(value)
        unit = match.group(2).lower() if match else ""
        if match is None or (unit not in _UNITS and unit != "%"):
            raise ValueError(
                f"{value!r} is not a memory budget: give bytes with a unit (2GiB, 512MB) or a "
                "share of the device's memory (0.8 or 80%)"
            )
        amount = float(match.group(1))
        if unit == "%" or (unit == "" and amount <= 1):
            share = amount / 100 if unit == "%" else amount
            if not 0 < share <= 1:
                raise ValueError(f"{value!r}: a share of the device's memory is within (0, 1]")
            return {"fraction": share}
        if amount * _UNITS[unit] < 2**20:
            hint = "no training fits in it" if unit else f"give a unit, e.g. {value.strip()}GiB"
            raise ValueError(f"{value!r} is under 1 MiB: {hint}")
        return {"bytes": int(amount * _UNITS[unit])}

    @model_validator(mode="after")
    def _one_of(self) -> MemoryBudget:
        if (self.bytes is None) == (self.fraction is None):
            raise ValueError("a memory budget is bytes or a fraction, one of them")
        return self

    def __str__(self) -> str:
        return f"{self.fraction:.0%} of the memory" if self.fraction else gib(self.bytes or 0)


def gib(size: int) -> str:
    """A size in GiB to two decimals (one where the second is 0), or MiB under one GiB."""
    if size < 2**30:
        return f"{size / 2**20:.0f} MiB"
    text = f"{size / 2**30:.2f}"
    return f"{text[:-1] if text.endswith('0') else text} GiB"
