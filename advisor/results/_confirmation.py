"""Whether the re-runs support the speed-up claimed: `Confirmation`, in `recommendation.json`.
The search judges it (`advisor.decide.claims`); the console and the reports state it."""

from __future__ import annotations

from pydantic import Field

from advisor.frozen import Frozen

__all__ = [
    "Confirmation",
]


class Confirmation(Frozen):
    """Whether the re-runs support the speed-up claimed (`advisor.decide.claims`): the paired
    speed-ups of the recommendation over the baseline, one per round, and how busy the
    machine was meanwhile."""

    confirmed: bool
    ratios: tuple[float, ...] = Field(description="recommendation ÷ baseline samples/s, by round")
    low: float = Field(
        description="the low end of the interval around their typical ratio (the Hodges-Lehmann "
        "estimate on their logs, advisor.decide.paired_ratio)"
    )
    high: float
    claimed_speedup: float = Field(
        description="the typical ratio where confirmed; else the lowest, the most the runs support"
    )
    outside_cores: float | None = Field(
        default=None, description="the most CPU other programs used during a re-run, in cores"
    )
    cores: int | None = None
    steal_share: float | None = Field(default=None, description="the most a hypervisor took")
    gpu_processes: int | None = Field(default=None, description="other programs on the GPU")
    why: str | None = Field(default=None, description="why unconfirmed, in a sentence")

    @property
    def statement(self) -> str:
        """What the re-runs support, in a sentence."""
        rounds = f"{len(self.ratios)} round{'s' if len(self.ratios) != 1 else ''}"
        if self.confirmed:
            load = ""
            if self.outside_cores is not None and self.outside_cores >= 0.25 and self.cores:
                load = (
                    f", measured while other programs used {self.outside_cores:.1f} of "
                    f"{self.cores} cores"
                )
            return (
                f"confirmed: {rounds} of paired re-runs agree ({self.low:.2f}x to "
                f"{self.high:.2f}x your baseline's samples/s){load}"
            )
        claim = (
            f"it claims no more than {self.claimed_speedup:.2f}x, its lowest round"
            if self.claimed_speedup >= 1
            else "it claims no speed-up"
        )
        return (
            f"unconfirmed: {self.why}; {claim}. Re-measure it (benchmarks/remeasure.py), or "
            "tune again when the machine is quieter"
        )
