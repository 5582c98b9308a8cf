"""Whether the re-runs support the speed-up claimed: `Confirmation`, in `recommendation.json`.
The search judges it (`advisor.decide.claims`) and stores what it found; this model says it,
so that a stored study re-renders with today's wording."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, computed_field, model_validator

from advisor.frozen import Frozen
from advisor.results._trial import BUSY_CORES, MachineLoad

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
    unconfirmed: Literal["spread", "few-rounds"] | None = Field(
        default=None,
        description="why not confirmed: the interval reached beyond `tolerance` of the claim, "
        "or too few rounds",
    )
    tolerance: float | None = Field(default=None, description="the interval's allowed width")
    busy_load: MachineLoad | None = Field(
        default=None, description="the busiest load that made the machine busy, if any"
    )
    stated: str | None = Field(
        default=None, description="a study stored when `why` was a sentence keeps its sentence"
    )

    @model_validator(mode="before")
    @classmethod
    def _stored_sentence(cls, data: Any) -> Any:
        if isinstance(data, dict) and "why" in data:
            why = data["why"]
            data = {key: value for key, value in data.items() if key != "why"}
            if "unconfirmed" not in data and why is not None:  # stored as a sentence
                data["stated"] = why
        return data

    @computed_field(description="why unconfirmed, in a sentence")  # type: ignore[prop-decorator]
    @property
    def why(self) -> str | None:
        if self.stated is not None or self.unconfirmed is None:
            return self.stated
        rounds = len(self.ratios)
        if self.unconfirmed == "spread":
            text = (
                f"its re-runs' speed-ups ranged from {min(self.ratios):.2f}x to "
                f"{max(self.ratios):.2f}x over {rounds} rounds, more than "
                f"±{self.tolerance or 0:.0%}"
            )
        else:
            text = f"only {rounds} round{'s' if rounds > 1 else ''} of re-runs"
        if self.busy_load is None:
            return f"{text}, with nothing else seen running: this machine's own speed varied"
        return f"{text}, {_load_text(self.busy_load)}"

    @property
    def statement(self) -> str:
        """What the re-runs support, in a sentence."""
        rounds = f"{len(self.ratios)} round{'s' if len(self.ratios) != 1 else ''}"
        if self.confirmed:
            load = ""
            if (self.outside_cores or 0) >= BUSY_CORES and self.cores:
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


def _load_text(load: MachineLoad) -> str:
    parts = [f"other programs used {load.outside_cores:.1f} of {load.cores} cores"]
    if load.stolen:
        parts.append(f"the hypervisor took {load.steal_share:.0%} of the CPU time")
    if load.gpu_processes:
        parts.append(f"{load.gpu_processes} other program(s) computed on the GPU")
    return " and ".join(parts) + " meanwhile"
