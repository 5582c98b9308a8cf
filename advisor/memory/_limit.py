"""What a trial's peak memory is judged by (`MemoryLimit`), and how the configurations that
ran stood against `--memory-budget` (`BudgetSummary`, in `recommendation.json`). The search
computes both (`advisor.search.memory`); the reports render the summary."""

from __future__ import annotations

from advisor.frozen import Frozen
from advisor.memory._budget import gib

__all__ = [
    "BudgetSummary",
    "MemoryLimit",
]


class MemoryLimit(Frozen):
    """What a trial's peak may reach, and how to say it."""

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


class BudgetSummary(Frozen):
    """How the configurations that ran stood against `--memory-budget`."""

    limit: MemoryLimit
    ran: int  # configurations that ran with a measured peak
    over: tuple[tuple[int, int], ...]  # (trial, peak) of those over the budget
    baseline_peak: int | None
    checkpointing: str | None = None  # what activation checkpointing bought, in a sentence
    allocator_note: str | None = None  # where the host's allocator keeps freed memory

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
        text += f". {self.checkpointing}" if self.checkpointing else ""
        return text + (f" ({self.allocator_note})" if self.allocator_note else "")
