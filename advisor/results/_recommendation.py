"""What advisor concluded from its measurements: the race, the recommendation and the evidence
for it, and the `TuneResult` a tune returns. The search decides these (`advisor.search`); the
reports render them (`advisor.report`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from advisor.frozen import Frozen
from advisor.knobs import BASE_GROUP, KNOBS, Knob, TrialConfig
from advisor.memory import BudgetSummary
from advisor.results._confirmation import Confirmation
from advisor.results._convergence import (
    BatchSchedule,
    LossKind,
    LrPlan,
    NoiseScale,
    NoiseTrack,
    RaceCurve,
)
from advisor.results._trial import (
    HardwareProfile,
    PrunedProposal,
    TaskSummary,
    TrialRecord,
    TrialResult,
)
from advisor.settings import Objective, TuneSettings

__all__ = [
    "BatchEffort",
    "Bottleneck",
    "Efficiency",
    "FixedKnob",
    "KnobEffect",
    "LayoutBest",
    "RaceSummary",
    "RaceVerdict",
    "Racer",
    "Recommendation",
    "Rejected",
    "RejectedValue",
    "ScheduleSummary",
    "ScheduleVerdict",
    "SearchEffort",
    "StudySetup",
    "ThroughputPick",
    "TuneResult",
    "did_not_fall",
    "reference_racer",
    "shown_knobs",
]

# 2: the objective, the race, the noise scale, the lr; 3: the verdicts as data
RECOMMENDATION_SCHEMA_VERSION = 3


class FixedKnob(Frozen):
    """A knob advisor did not search, with the value used and why."""

    name: str
    value: str
    reason: str


class KnobEffect(Frozen):
    """What changing one knob alone did: pairs of trials that differ in nothing else."""

    knob: str
    from_value: str
    to_value: str
    ratio: float = Field(description="median over the pairs of samples/s after ÷ before")
    pairs: tuple[tuple[int, int], ...] = Field(description="(trial before, trial after)")
    pair_ratios: tuple[float, ...] = Field(description="samples/s after ÷ before, per pair")
    data_wait_before: float | None = Field(default=None, description="median data-wait fraction")
    data_wait_after: float | None = None
    note: str = Field(default="", description="e.g. after how many steps compilation pays off")


class RejectedValue(Frozen):
    """A knob value none of whose trials could be used while other values of the knob could."""

    knob: str
    value: str
    trials: tuple[int, ...] = Field(description="the failed trials with this value")
    failures: str = Field(description="their failures by kind, e.g. '2 diverged'")
    counterparts: tuple[tuple[int, int], ...] = Field(
        default=(),
        description="(usable trial, failed trial) pairs that differ in this knob alone",
    )
    explanation: str


class Bottleneck(Frozen):
    """What limits the winner, as its own measurements and its neighbours' show."""

    kind: Literal["input", "overhead", "compute"]
    explanation: str = Field(description="one sentence, citing the trials it rests on")
    trials: tuple[int, ...]


class Efficiency(Frozen):
    """The recommendation's FLOP rate against the machine's measured matmul peak."""

    flops_per_sample: float = Field(description="forward + backward, as FlopCounterMode counts")
    achieved_flops: float = Field(description="flops_per_sample x samples/s")
    peak_flops: float = Field(description="measured matmul FLOP/s for the dtype, all devices")
    dtype: str
    devices: str = Field(description="what the peak was measured on, e.g. '2 CPU cores'")
    fraction_of_peak: float


class LayoutBest(Frozen):
    """The best search trial of one parallel layout (`none`, `dp`, `ddp-N`)."""

    parallel: str
    trials: int = Field(description="configurations measured with this layout")
    feasible: int
    best_trial: int | None = None
    samples_per_s: float | None = Field(default=None, description="its search window")
    rerun_samples_per_s: float | None = Field(
        default=None, description="median of its re-runs after the search"
    )
    config_label: str | None = None


class StudySetup(Frozen):
    """What a tune stores with its study before the first trial, so that even an interrupted
    study can be reported without the machine or the user's code."""

    advisor_version: str
    workdir: str = Field(description="the folder the spec resolves from")
    baseline_config: TrialConfig
    fixed_knobs: tuple[FixedKnob, ...] = ()
    hardware: HardwareProfile
    task: TaskSummary


class Racer(Frozen):
    """One configuration in the race, with the learning rate it would ship with."""

    role: Literal["baseline", "your batch", "candidate", "fixed", "schedule"]
    trial: int | None = Field(default=None, description="the search trial it re-runs")
    config: TrialConfig
    lr: LrPlan
    schedule: BatchSchedule | None = Field(
        default=None, description="a schedule racer's stages (`config` is its first)"
    )
    race_seconds: float
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


RaceVerdictKind = Literal["failed", "no-fall", "won", "won-level", "kept", "stated"]


class RaceVerdict(Frozen):
    """What the race decided and on which figures, as data (`advisor.report.verdicts` words it):

    - `failed`: the race at your global batch failed (`reason`, the trial's);
    - `no-fall`: your loss did not fall beyond its noise: nothing can be timed to it;
    - `won`: the candidate `RaceSummary.winner` reached the target more than `margin` sooner
      than `kept`, the best at your global batch;
    - `won-level`: in a race that went on, a larger global batch reached it no later;
    - `kept`: `kept` stands; `best` is the other global batch that came nearest (None: none
      reached the target); `precision_kept`: the faster racer at your batch changed the
      precision without earning it, so your configuration stands;
    - `stated`: a study stored before verdicts were data keeps its sentence (`reason`).
    """

    kind: RaceVerdictKind
    kept: int | None = Field(default=None, description="index into racers: the pick at B0")
    best: int | None = Field(default=None, description="index into racers: the best candidate")
    margin: float = Field(default=0.15, description="how much sooner a winner must be")
    precision_kept: bool = False
    reason: str | None = None


class RaceSummary(Frozen):
    """The convergence race that decided the recommendation (objective time-to-loss)."""

    seconds: float = Field(description="training time each racer had")
    loss_kind: LossKind
    target_loss: float | None = Field(
        description="the baseline's lowest loss in the race (its end-of-race loss, unless its "
        "loss rose again), or that plus twice the noise of its evaluations where the verdict "
        "there is the smaller claim; None where the race at the user's batch failed or its "
        "loss did not fall (nothing could be timed to it)"
    )
    racers: tuple[Racer, ...]
    winner: int | None = Field(
        description="index into racers; None where no target was set: the user's global batch "
        "is kept"
    )
    verdict: RaceVerdict
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


class ThroughputPick(Frozen):
    """The configuration with the highest samples/s, when the race chose another."""

    config: TrialConfig
    trial: int
    samples_per_s: float


def shown_knobs(rec: Recommendation) -> tuple[Knob, ...]:
    """The knobs a recommendation table lists: those of the base group, and each other one that
    was searched or differs from the baseline (a classic tune need not list unchanged rows)."""
    fixed = {knob.name for knob in rec.fixed_knobs}
    return tuple(
        row
        for row in KNOBS
        if row.group == BASE_GROUP
        or row.fields[0] not in fixed
        or getattr(rec.config, row.name) != getattr(rec.baseline_config, row.name)
    )


class Recommendation(Frozen):
    """The chosen configuration and the evidence for it (`recommendation.json`)."""

    schema_version: int = RECOMMENDATION_SCHEMA_VERSION
    provisional: bool = Field(
        default=False,
        description="the tune stopped before re-measuring its finalists: the figures are single "
        "search windows, and no training script is written",
    )
    advisor_version: str
    spec: str
    workdir: str = Field(description="the folder the spec resolves from")
    config: TrialConfig
    samples_per_s: float
    peak_memory_bytes: int | None
    baseline_config: TrialConfig
    baseline_samples_per_s: float | None = Field(description="None when the baseline failed")
    speedup: float | None = Field(
        description="over the baseline's samples/s: the typical ratio of the paired re-runs "
        "(`confirmation`) where they confirm it, else the lowest; without pairs, the medians' "
        "ratio"
    )
    chosen_from_trial: int
    confirm_runs: tuple[float, ...] = Field(description="samples/s of each re-run after search")
    baseline_runs: tuple[float, ...] = Field(description="the baseline's re-runs, alongside")
    global_batch_changed: bool
    close_call: str | None = Field(
        default=None, description="how a tie within measurement noise was decided"
    )
    objective: Objective = "throughput"
    lr: LrPlan = Field(default=LrPlan(), description="the learning rate train.py applies")
    time_to_loss_speedup: float | None = Field(
        default=None,
        description="the baseline's race time to its own lowest loss over the winner's",
    )
    confirmation: Confirmation | None = Field(
        default=None,
        description="whether the re-runs support `speedup`; None where no speed-up is claimed",
    )
    race: RaceSummary | None = None
    noise_scale: NoiseScale | None = None
    schedule: ScheduleSummary | None = Field(
        default=None, description="--schedule auto: the schedule's evidence, shipped or not"
    )
    throughput_pick: ThroughputPick | None = Field(
        default=None, description="the fastest in samples/s, where the race chose another"
    )
    memory_budget: BudgetSummary | None = Field(
        default=None, description="--memory-budget, and what went over it"
    )
    warnings: tuple[str, ...] = ()
    fixed_knobs: tuple[FixedKnob, ...] = ()
    parallel_best: tuple[LayoutBest, ...] = Field(
        default=(), description="best search trial per parallel layout"
    )
    knob_effects: tuple[KnobEffect, ...] = Field(
        default=(), description="knob changes measured alone (pairs of trials)"
    )
    rejected_values: tuple[RejectedValue, ...] = Field(
        default=(), description="knob values whose trials all failed, and how"
    )
    bottleneck: Bottleneck | None = None
    efficiency: Efficiency | None = None
    hardware: HardwareProfile
    task: TaskSummary
    storage: str
    study_name: str
    created_at: str

    @property
    def baseline_over_budget(self) -> bool:
        """Your configuration ran but peaked over `--memory-budget`: it has no speed-up base."""
        return self.memory_budget is not None and self.memory_budget.baseline_over


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


class TuneResult(Frozen):
    """What `advisor.tune()` returns."""

    settings: TuneSettings
    recommendation: Recommendation
    trials: tuple[TrialRecord, ...]
    confirmations: tuple[TrialRecord, ...]
    pruned: tuple[PrunedProposal, ...] = Field(
        default=(), description="proposals not run: impossible or known not to fit"
    )
    out_dir: Path
    rejected: tuple[Rejected, ...] = Field(
        default=(), description="knob values the search stopped proposing"
    )
    importances: dict[str, float] = Field(
        default_factory=dict, description="Optuna's parameter importances (PED-ANOVA)"
    )
    effort: SearchEffort | None = Field(
        default=None, description="where the search's budget went, per global batch"
    )
