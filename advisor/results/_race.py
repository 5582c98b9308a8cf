"""The race and the schedule's race as data: each `Racer`, and what the decision concluded from
them (`RaceSummary` with its `RaceVerdict`, `ScheduleSummary` with its `ScheduleVerdict`).
`advisor.report.verdicts` words the verdicts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from typing import Any, Literal

from pydantic import Field, model_validator

from advisor.frozen import Frozen
from advisor.knobs import TrialConfig
from advisor.results._convergence import BatchSchedule, LossKind, LrPlan, NoiseTrack, RaceCurve
from advisor.results._trial import TrialResult

__all__ = [
    "RaceSummary",
    "RaceVerdict",
    "Racer",
    "RacerRole",
    "ScheduleSummary",
    "ScheduleVerdict",
    "TimeToLoss",
    "did_not_fall",
    "reference_racer",
]


class RacerRole(str, Enum):
    """Why a configuration races. Its value is what a stored study holds; the reports say it
    in words of their own (`advisor.report.race_view`)."""

    BASELINE = "baseline"  # your configuration
    YOUR_BATCH = "your batch"  # the fastest configuration at your global batch
    CANDIDATE = "candidate"  # the best at another global batch, with a learning rate of its own
    FIXED = "fixed"  # the fixed recommendation a schedule races against
    SCHEDULE = "schedule"  # a batch-size schedule

    def __str__(self) -> str:  # its value, in messages and reports, on every Python
        return str(self.value)


class Racer(Frozen):
    """One configuration in the race, with the learning rate it would ship with."""

    role: RacerRole
    trial: int | None = Field(default=None, description="the search trial it re-runs")
    config: TrialConfig
    lr: LrPlan
    schedule: BatchSchedule | None = Field(
        default=None, description="a schedule racer's stages (`config` is its first)"
    )
    race_seconds: float
    replicate: int = Field(
        default=0, description="which replicate: its seed set the initial weights and data order"
    )
    samples_per_s: float | None = Field(default=None, description="its throughput measurement")
    result: TrialResult
    state: str | None = Field(
        default=None,
        description="where its training state was saved at its end, for the race to go on "
        "from (None: not saved, or the racer already went on)",
    )
    time_to_target_s: float | None = Field(
        default=None, description="training time until its loss first reached the target"
    )
    samples_to_target: float | None = Field(
        default=None, description="samples trained on until its loss first reached the target"
    )
    steps_of_baseline: bool = Field(
        default=False,
        description="it computes the baseline's steps (it differs only in how batches arrive), "
        "so its curve is the baseline's, at its own samples/s, and it did not train",
    )

    @property
    def entrant(self) -> tuple[RacerRole, TrialConfig, LrPlan]:
        """What the racer is across replicates: its role, configuration and learning rate."""
        return (self.role, self.config, self.lr)

    @property
    def curve(self) -> RaceCurve | None:
        return self.result.race if self.result.feasible else None

    @property
    def label(self) -> str:
        if self.schedule is not None:
            lr = "your lr" if self.schedule.rule == "yours" else f"{self.schedule.rule} rule lr"
            return f"{self.schedule.label(self.config.world_size)}, {lr}"
        return f"{self.config.label()}, {self.lr.label}"


def reference_racer(racers: Sequence[Racer]) -> Racer | None:
    """The racer whose lowest loss is the target: the baseline, else the best at the user's
    batch; None if neither has a curve."""
    reference = next((r for r in racers if r.role == "baseline" and r.curve), None)
    return reference or next((r for r in racers if r.role == "your batch" and r.curve), None)


def did_not_fall(racers: Sequence[Racer]) -> bool:
    """Whether the racer that sets the target has run and its loss did not fall
    (`RaceCurve.fell`): then nothing can be timed to it, and the race decides nothing."""
    reference = reference_racer(racers)
    return reference is not None and reference.curve is not None and not reference.curve.fell


RaceVerdictKind = Literal["failed", "no-fall", "won", "close-call", "kept", "won-level", "stated"]


class TimeToLoss(Frozen):
    """How much sooner a configuration reaches your loss than yours, with the interval an
    independent re-measurement falls in (`advisor.decide.race.estimate`): per replicate, the
    ratio of samples to the loss, times the paired samples/s ratio of the re-runs."""

    speedup: float
    low: float
    high: float
    replicates: int = Field(description="replicates of the race the samples ratios come from")
    reached: int | None = Field(
        default=None, description="of them, those in which it reached the loss within its race"
    )
    rounds: int = Field(default=0, description="paired re-run rounds of the samples/s ratio")
    seconds: float = Field(description="the race horizon the claim was decided at")
    target_loss: float | None = Field(
        default=None, description="your loss, the median over replicates of their targets"
    )


class RaceVerdict(Frozen):
    """What the race decided and on which figures, as data (`advisor.report.verdicts` words it):

    - `failed`: the race at your global batch failed (`reason`, the trial's);
    - `no-fall`: your loss did not fall beyond its noise: nothing can be timed to it;
    - `won`: `RaceSummary.winner` reaches your loss sooner than `kept` (the configuration
      it had to beat) by more than `margin`, at the low end of its interval (`best_claim`);
    - `close-call`: `best` may reach it sooner than `kept` by the margin, or not: its
      interval holds both, so `kept`, with fewer changes from yours, stands;
    - `kept`: `kept` stands; `best` came nearest (None: none reached the target), and its
      interval rules out a win by the margin;
    - `won-level` and `precision_kept`: rules of studies stored before the race had replicates;
    - `stated`: a study stored before verdicts were data keeps its sentence (`reason`).

    `kept_claim` and `best_claim` are each one's time to your loss against yours.
    """

    kind: RaceVerdictKind
    kept: int | None = Field(default=None, description="index into racers: the pick at B0")
    best: int | None = Field(default=None, description="index into racers: the best candidate")
    margin: float = Field(default=0.15, description="how much sooner a winner must be")
    precision_kept: bool = False
    reason: str | None = None
    kept_claim: TimeToLoss | None = None
    best_claim: TimeToLoss | None = None


class RaceSummary(Frozen):
    """The convergence race that decided the recommendation (objective time-to-loss)."""

    seconds: float = Field(description="training time each racer had")
    loss_kind: LossKind
    target_loss: float | None = Field(
        description="your loss: where the baseline's curve, made non-increasing, ends in the "
        "race, the median over replicates; None where the race at the user's batch failed or "
        "its loss did not fall (nothing could be timed to it)"
    )
    racers: tuple[Racer, ...]
    winner: int | None = Field(
        description="index into racers; None where no target was set: the user's global batch "
        "is kept"
    )
    verdict: RaceVerdict
    time_to_loss: TimeToLoss | None = Field(
        default=None, description="the winner's time to your loss against yours; None: yours won"
    )
    replicates: int = Field(default=1, description="replicates of the race")
    went_on_from: float | None = Field(
        default=None,
        description="the race's length before its finalists went on to `seconds` "
        "(advisor.decide.race.extend); None where it did not go on",
    )
    first_race: RaceSummary | None = Field(
        default=None, description="the race after `went_on_from` seconds, before it went on"
    )

    @model_validator(mode="before")
    @classmethod
    def _stored_sentences(cls, data: Any) -> Any:
        """A study stored when verdicts were sentences: its sentence is kept as stated."""
        if isinstance(data, dict) and isinstance(data.get("verdict"), str):
            data = {**data, "verdict": {"kind": "stated", "reason": data["verdict"]}}
            first = data.pop("first_verdict", None)
            if first is not None:
                stated = {"kind": "stated", "reason": first}
                data["first_race"] = {**data, "verdict": stated, "went_on_from": None}
        return data


ScheduleVerdictKind = Literal[
    "no-race",
    "race-kept",
    "timeout",
    "processes",
    "long-run-failed",
    "did-not-fall",
    "phi-unmeasured",
    "phi-flat",
    "one-stage",
    "none-reached",
    "ships",
    "not-by-margin",
    "stated",
]


class ScheduleVerdict(Frozen):
    """What the schedule's tune decided, as data (`advisor.report.verdicts` words it). No
    schedule was tried after `no-race`, `race-kept` (the race set no target), `timeout` (it
    takes about `bound_s`, more than `timeout_s`), `processes` (phi is tracked in one process;
    yours runs `processes`), `long-run-failed` (`reason`), `did-not-fall`, `phi-unmeasured`,
    `phi-flat` or `one-stage` (global batch `batch` kept the most goodput throughout). One was
    raced after `none-reached`, `ships` and `not-by-margin` (`best` against `fixed`, indices
    into racers)."""

    kind: ScheduleVerdictKind
    best: int | None = None
    fixed: int | None = None
    margin: float = 0.15
    bound_s: float | None = None
    timeout_s: float | None = None
    processes: int | None = None
    batch: int | None = None
    reason: str | None = None


class ScheduleSummary(Frozen):
    """The batch-size schedule's tune (`--schedule auto`): phi along a long run of the user's
    configuration, the schedule that follows it, and the race at the longer horizon that
    decides whether it ships."""

    seconds: float = Field(description="training time each racer of the schedule race had")
    track: NoiseTrack | None = Field(description="phi along the baseline's run; None if untracked")
    rule: Literal["goodput"] = Field(
        default="goodput",
        description="how the stages were chosen from phi: goodput, samples/s x (phi + B0) / "
        "(phi + B), at each point phi was measured along your run",
    )
    racers: tuple[Racer, ...] = ()
    target_loss: float | None = Field(
        default=None, description="the baseline's lowest loss within the horizon"
    )
    shipped: int | None = Field(
        default=None, description="index into racers of the schedule that ships; None: none"
    )
    verdict: ScheduleVerdict
    cost_s: float = Field(default=0.0, description="wall seconds the schedule's tune took")

    @model_validator(mode="before")
    @classmethod
    def _stored_sentences(cls, data: Any) -> Any:
        """A study stored when verdicts were sentences: its sentence is kept as stated."""
        if isinstance(data, dict) and isinstance(data.get("verdict"), str):
            data = {**data, "verdict": {"kind": "stated", "reason": data["verdict"]}}
        if isinstance(data, dict) and isinstance(data.get("rule"), str):
            data = {**data, "rule": "goodput"}  # the only rule there has been
        return data

    @property
    def schedule(self) -> BatchSchedule | None:
        return self.racers[self.shipped].schedule if self.shipped is not None else None

    @property
    def shipped_racer(self) -> Racer | None:
        return self.racers[self.shipped] if self.shipped is not None else None

    @property
    def speedup(self) -> float | None:
        """The fixed recommendation's time to the target over the shipped schedule's; None if
        none shipped or the fixed one never reached it."""
        shipped = self.shipped_racer
        fixed = next((r for r in self.racers if r.role == "fixed"), None)
        fixed = fixed or next((r for r in self.racers if r.role == "baseline"), None)
        if shipped is None or fixed is None or not fixed.time_to_target_s:
            return None
        return fixed.time_to_target_s / (shipped.time_to_target_s or math.inf)
