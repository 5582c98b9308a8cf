"""What advisor concluded from its measurements: the recommendation and the evidence for it, and
the `TuneResult` a tune returns. `advisor.decide` decides these; `advisor.report` renders them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from advisor.frozen import Frozen
from advisor.knobs import BASE_GROUP, KNOBS, Knob, TrialConfig
from advisor.memory import BudgetSummary
from advisor.results._confirmation import Confirmation
from advisor.results._convergence import (
    LrPlan,
    NoiseScale,
)
from advisor.results._effort import Rejected, SearchEffort
from advisor.results._race import RaceSummary, ScheduleSummary, TimeToLoss
from advisor.results._trial import (
    HardwareProfile,
    PrunedProposal,
    TaskSummary,
    TrialRecord,
)
from advisor.settings import Objective, TuneSettings

__all__ = [
    "Bottleneck",
    "Efficiency",
    "FixedKnob",
    "KnobEffect",
    "LayoutBest",
    "Notice",
    "Recommendation",
    "RejectedValue",
    "StudySetup",
    "ThroughputPick",
    "Tie",
    "TuneResult",
    "shown_knobs",
]

# 2: the objective, the race, the noise scale, the lr; 3: the verdicts as data; 4: the race
# in replicates, and `time_to_loss` with its interval
RECOMMENDATION_SCHEMA_VERSION = 4


class FixedKnob(Frozen):
    """A knob advisor did not search, or searched over fewer values than it has, with the
    value(s) and why."""

    name: str
    value: str
    reason: str
    kind: Literal["fixed", "limited", "derived"] = Field(
        default="fixed",
        description="fixed: not searched; limited: searched over `value` ('|' between values) "
        "only; derived: set by the others (accumulation from the global batch)",
    )


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
    compile_extra_s: float | None = Field(
        default=None, description="compile: how much longer the compiled first step took"
    )
    compile_saved_s: float | None = Field(
        default=None, description="compile: how much shorter a compiled step was (median)"
    )
    note: str = Field(default="", description="a study stored when this was a sentence keeps it")

    @property
    def pays_off(self) -> bool:
        """Whether there is a one-off cost to weigh (`advisor.report.verdicts` words it)."""
        return bool(self.note) or self.compile_extra_s is not None


class _Explained(Frozen):
    """A finding stored as data (`advisor.report.verdicts` words it); a study stored when it was
    a sentence (its `explanation`) keeps that sentence in `stated`."""

    stated: str | None = Field(
        default=None, description="a study stored when this was a sentence keeps its sentence"
    )

    @model_validator(mode="before")
    @classmethod
    def _stored_sentence(cls, data: Any) -> Any:
        if isinstance(data, dict) and "explanation" in data:
            data = {**data, "stated": data["explanation"]}
            del data["explanation"]
        return data


class RejectedValue(_Explained):
    """A knob value none of whose trials could be used while other values of the knob could."""

    knob: str
    value: str
    trials: tuple[int, ...] = Field(description="the failed trials with this value")
    failures: str = Field(description="their failures by kind, e.g. '2 diverged'")
    counterparts: tuple[tuple[int, int], ...] = Field(
        default=(),
        description="(usable trial, failed trial) pairs that differ in this knob alone",
    )
    cited: int | None = Field(
        default=None, description="the failed trial whose failure is quoted: the first pair's"
    )
    cited_kind: str = Field(default="", description="how it failed, e.g. 'diverged'")
    cited_reason: str = Field(default="", description="the reason it recorded")


class Bottleneck(_Explained):
    """What limits the winner, as its own measurements and its neighbours' show, as data
    (`advisor.report.verdicts` words it): the winner `trial` waited for data `wait` of its
    window; where a trial differing in batch size alone ran after it, the batch went from
    `batch_from` to `batch_to` and gave `ratio` x. `trials`: every trial it rests on."""

    kind: Literal["input", "overhead", "compute"]
    trials: tuple[int, ...]
    trial: int | None = None
    wait: float | None = None
    batch_from: str | None = None
    batch_to: str | None = None
    ratio: float | None = None


class Efficiency(Frozen):
    """The recommendation's FLOP rate against the machine's measured matmul peak."""

    flops_per_sample: float = Field(description="forward + backward, as FlopCounterMode counts")
    achieved_flops: float = Field(description="flops_per_sample x samples/s")
    peak_flops: float = Field(description="measured matmul FLOP/s for the dtype, all devices")
    dtype: str
    devices: str = Field(description="what the peak was measured on, e.g. '2 CPU cores'")
    fraction_of_peak: float

    @property
    def share_of_peak(self) -> float | None:
        """The share of the peak to print: none above 1, where the probe measured the peak
        while another program took the machine (training cannot outrun its own matmuls)."""
        return self.fraction_of_peak if self.fraction_of_peak <= 1 else None


class LayoutBest(Frozen):
    """The best search trial of one parallel layout (`none`, `dp`, `ddp-N`)."""

    parallel: str
    global_batch: int | None = Field(
        default=None, description="the global batch every layout is compared at"
    )
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


NoticeKind = Literal[
    "batch-unchecked", "race-short", "baseline-over-budget", "baseline-failed", "stated"
]


class Notice(Frozen):
    """What a reader must know beside the recommendation, as data (`advisor.report.verdicts`
    words it): `batch-unchecked` (the global batch changes from `baseline_batch` to `batch` and
    no race checked it: the tune stopped before its race, or `throughput` ranks without one),
    `race-short` (the race covered only its first `race_seconds`), `baseline-over-budget`,
    `baseline-failed`; `stated`: a study stored when notes were sentences keeps its `text`."""

    kind: NoticeKind
    batch: int | None = None
    baseline_batch: int | None = None
    throughput: bool = False
    race_seconds: float | None = None
    text: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _stored_sentence(cls, data: Any) -> Any:
        return {"kind": "stated", "text": data} if isinstance(data, str) else data


class Tie(Frozen):
    """How a tie within measurement noise was decided (`advisor.decide.reruns`), as data
    (`advisor.report.verdicts` words it): trials `fast` and `slow` re-ran `runs` times each,
    their medians `gap` apart (a share of the slower), each with its re-runs' spread; `kept`
    changes fewer knobs from your baseline. `stated`: a study stored when this was a sentence
    keeps its sentence."""

    fast: int = 0
    slow: int = 0
    runs: int = 0
    gap: float = 0.0
    fast_spread: float = 0.0
    slow_spread: float = 0.0
    kept: int = 0
    stated: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _stored_sentence(cls, data: Any) -> Any:
        return {"stated": data} if isinstance(data, str) else data


class ThroughputPick(Frozen):
    """The configuration with the highest samples/s, when the race chose another."""

    config: TrialConfig
    trial: int
    samples_per_s: float


def shown_knobs(rec: Recommendation) -> tuple[Knob, ...]:
    """The knobs a recommendation table lists: those of the base group, and each other one that
    was searched or differs from the baseline (a classic tune need not list unchanged rows)."""
    fixed = {knob.name for knob in rec.fixed_knobs if knob.kind == "fixed"}
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
    close_call: Tie | None = Field(
        default=None, description="how a tie within measurement noise was decided"
    )
    objective: Objective = "throughput"
    lr: LrPlan = Field(default=LrPlan(), description="the learning rate train.py applies")
    time_to_loss_speedup: float | None = Field(
        default=None,
        description="how much sooner the recommendation reaches your loss: `time_to_loss`'s "
        "speedup (kept for readers of schema 3)",
    )
    time_to_loss: TimeToLoss | None = Field(
        default=None,
        description="how much sooner the recommendation reaches your loss, with the interval "
        "an independent re-measurement falls in; None where yours stands or nothing raced",
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
    warnings: tuple[Notice, ...] = ()
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
