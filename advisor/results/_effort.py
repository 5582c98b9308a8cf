"""Where a tune's search spent its trials, and the knob values it stopped proposing: the
evidence `TuneResult` carries beside the recommendation."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from advisor.frozen import Frozen

__all__ = ["BatchEffort", "Rejected", "SearchEffort"]


class Rejected(Frozen):
    """A knob value the search stopped proposing, and the trials that showed it cannot win
    (`advisor.search.dominance`)."""

    knob: str
    value: Any
    trials: tuple[int, ...]
    fraction: float = Field(description="the value's best samples/s over the best trial's")
    best_trial: int

    @property
    def reason(self) -> str:
        trials = ", ".join(map(str, self.trials))
        return (
            f"{self.knob}={self.value} rejected: its {len(self.trials)} trials ({trials}) ran "
            f"at most {self.fraction:.2f}x the best (trial {self.best_trial})"
        )


class BatchEffort(Frozen):
    """What the search spent at one global batch."""

    global_batch: int
    ran: int = Field(description="trials that ran (probes included)")
    derived: int = Field(description="configurations derived from a trial's timed parts")
    raced: bool = Field(description="the race ran this global batch")
    yours: bool = Field(description="the user's global batch")


class SearchEffort(Frozen):
    """Where the search's budget went, and the best it found at the user's global batch."""

    batches: tuple[BatchEffort, ...]
    best_at_yours: int | None = Field(
        default=None, description="the search trial fastest at the user's global batch"
    )
    best_at_yours_label: str | None = None
    best_at_yours_speedup: float | None = Field(
        default=None, description="its samples/s over the baseline's (re-runs where both had)"
    )
    on_re_runs: bool = Field(default=False, description="whether the speed-up is of re-runs")
    best_is_yours: bool = Field(
        default=False, description="nothing measured at the user's batch beat their configuration"
    )

    @property
    def ran(self) -> int:
        return sum(b.ran for b in self.batches)

    @property
    def share(self) -> float | None:
        """The fraction of trials that ran at the user's global batch or at one that raced."""
        useful = sum(b.ran for b in self.batches if b.yours or b.raced)
        return useful / self.ran if self.ran else None
