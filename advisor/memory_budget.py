"""The memory a configuration may use: `--memory-budget`, or the device less the headroom.

A budget is bytes with a unit ("2GiB", "512 MB", "1.5G") or a share of the device ("0.8",
"80%"): of the GPU's memory on CUDA, of the host's physical memory on CPU. Without one, a CUDA
trial may use the GPU less `--memory-headroom` and a CPU trial the host less it: what advisor
always kept free. What it covers is the trial's measured peak (`TrialResult.peak_memory_bytes`):
each GPU's `max_memory_reserved` on CUDA, and on CPU the resident memory of the trial's whole
process tree, every rank and loader worker together, since they share the host.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from advisor.knobs import TrialConfig
from advisor.results import HardwareProfile, TrialRecord

__all__ = ["BudgetSummary", "MemoryBudget", "MemoryLimit", "budget_summary", "gib", "memory_limit"]

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "kib": 2**10,
    "m": 10**6, "mb": 10**6, "mib": 2**20,
    "g": 10**9, "gb": 10**9, "gib": 2**30,
    "t": 10**12, "tb": 10**12, "tib": 2**40,
}  # fmt: skip
_AMOUNT = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z%]*)\s*")


class MemoryBudget(BaseModel):
    """A budget as given: `bytes`, or a `fraction` of the device's memory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

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


class MemoryLimit(BaseModel):
    """What a trial's peak may reach, and how to say it."""

    model_config = ConfigDict(frozen=True)

    bytes: int
    budget: bool  # set by --memory-budget, else the device less the headroom
    where: str  # "GPU" or "host"
    capacity: int

    def problem(self, peak: int) -> str | None:
        """Why a trial with this peak does not fit, or None."""
        if peak <= self.bytes:
            return None
        if self.budget:
            return f"peak {self.where} memory {gib(peak)} > budget {gib(self.bytes)}"
        return (
            f"peak {self.where} memory {gib(peak)} leaves less than "
            f"{1 - self.bytes / self.capacity:.0%} of {gib(self.capacity)} free"
        )


def memory_limit(
    budget: MemoryBudget | None, headroom: float, config: TrialConfig, hardware: HardwareProfile
) -> MemoryLimit:
    """The limit for `config`'s trials: the budget, or the device less the headroom."""
    if config.device == "cuda" and hardware.gpus:
        capacity, where = hardware.gpus[0].memory_bytes, "GPU"
    else:
        capacity, where = hardware.memory_bytes, "host"
    if budget is None:
        return MemoryLimit(
            bytes=int((1 - headroom) * capacity), budget=False, where=where, capacity=capacity
        )
    limit = budget.bytes if budget.bytes is not None else int((budget.fraction or 1) * capacity)
    return MemoryLimit(bytes=limit, budget=True, where=where, capacity=capacity)


class BudgetSummary(BaseModel):
    """How the configurations that ran stood against `--memory-budget`."""

    model_config = ConfigDict(frozen=True)

    limit: MemoryLimit
    ran: int  # configurations that ran with a measured peak
    over: tuple[tuple[int, int], ...]  # (trial, peak) of those over the budget
    baseline_peak: int | None
    checkpointing: str | None = None  # what activation checkpointing bought, in a sentence

    @property
    def baseline_over(self) -> bool:
        return self.baseline_peak is not None and self.baseline_peak > self.limit.bytes

    @property
    def statement(self) -> str:
        """The budget and what went over it, in a sentence."""
        what = "each GPU's peak" if self.limit.where == "GPU" else "the trial's processes together"
        text = f"memory budget {gib(self.limit.bytes)} ({what}): "
        if not self.over:
            return text + f"all {self.ran} configurations that ran kept within it"
        peaks = sorted(peak for _, peak in self.over)
        text += f"{len(self.over)} of {self.ran} configurations that ran went over it (peaks "
        text += f"{gib(peaks[0])}" + (f" to {gib(peaks[-1])})" if len(peaks) > 1 else ")")
        if self.baseline_over:
            text += f"; your configuration among them, at {gib(self.baseline_peak or 0)}"
        return text + (f". {self.checkpointing}" if self.checkpointing else "")


def budget_summary(
    budget: MemoryBudget | None,
    headroom: float,
    trials: list[TrialRecord],
    hardware: HardwareProfile,
    global_batch: int,
) -> BudgetSummary | None:
    """The budget's summary over `trials`, and what checkpointing bought at `global_batch`
    (the recommendation's); None without `--memory-budget`."""
    measured = [
        t
        for t in trials
        if t.role in ("baseline", "search") and t.derived_from is None
        if t.result.peak_memory_bytes
    ]
    if budget is None or not measured:
        return None
    limit = memory_limit(budget, headroom, measured[0].result.config, hardware)
    baseline = next((t for t in measured if t.role == "baseline"), None)
    return BudgetSummary(
        checkpointing=_checkpointing_trade(measured, global_batch, limit),
        limit=limit,
        ran=len(measured),
        over=tuple(
            (t.number, t.result.peak_memory_bytes or 0)
            for t in measured
            if (t.result.peak_memory_bytes or 0) > limit.bytes
        ),
        baseline_peak=baseline.result.peak_memory_bytes if baseline else None,
    )


def _checkpointing_trade(
    measured: list[TrialRecord], global_batch: int, limit: MemoryLimit
) -> str | None:
    """The fastest configuration within the budget at `global_batch` with activation
    checkpointing against the fastest without: their micro-batches and speeds."""
    at_batch = [
        t for t in measured if t.eligible and t.result.config.global_batch_size == global_batch
    ]

    def fastest(checkpointed: bool) -> TrialRecord | None:
        return max(
            (
                t
                for t in at_batch
                if (t.result.config.activation_checkpointing != "off") == checkpointed
            ),
            key=lambda t: t.result.samples_per_s or 0.0,
            default=None,
        )

    on, off = fastest(True), fastest(False)
    if on is None:
        return None
    within = f"within {gib(limit.bytes)}"
    if off is None:
        return (
            f"checkpointing: global batch {global_batch} fits {within} only with it "
            f"(micro-batch {on.result.config.batch_size})"
        )
    ratio = (on.result.samples_per_s or 0.0) / (off.result.samples_per_s or 1.0)
    trade = (
        f"micro-batch {off.result.config.batch_size} → {on.result.config.batch_size} {within}, "
        f"{ratio:.2f}x samples/s at global batch {global_batch}"
    )
    return f"checkpointing: {trade}" if ratio > 1 else f"checkpointing did not pay: {trade}"


def gib(size: int) -> str:
    """A size in GiB, or MiB under one GiB."""
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.0f} MiB"
