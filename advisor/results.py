"""What advisor measured and concluded: hardware, trial results, the recommendation."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.convergence import (
    GradientNorms,
    LossKind,
    LrPlan,
    NoiseScale,
    RaceCurve,
)
from advisor.knobs import BASE_GROUP, KNOBS, Knob, TrialConfig
from advisor.settings import Objective, TuneSettings

__all__ = [
    "Bottleneck",
    "Efficiency",
    "FailurePhase",
    "FixedKnob",
    "GpuInfo",
    "HardwareProfile",
    "KnobEffect",
    "LayoutBest",
    "PrunedProposal",
    "RaceSummary",
    "Racer",
    "RankResult",
    "Recommendation",
    "RejectedValue",
    "StudyContext",
    "TaskSummary",
    "ThroughputPick",
    "TrialRecord",
    "TrialResult",
    "TrialStatus",
    "TuneResult",
    "relative_spread",
    "shown_knobs",
]

# stopped: the search ended it before its window, clearly slower than the best (`reason`).
TrialStatus = Literal["ok", "oom", "timeout", "crashed", "error", "diverged", "stopped"]
FailurePhase = Literal["build", "first_step", "warmup", "measure"]
RECOMMENDATION_SCHEMA_VERSION = 2  # 2: the objective, the race, the noise scale, the lr


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuInfo(_Frozen):
    """One CUDA GPU as the probe saw it."""

    name: str
    memory_bytes: int
    capability: str = Field(description="compute capability, e.g. '8.0'")
    bf16: bool
    peak_flops: dict[str, float] = Field(
        default_factory=dict, description="measured matmul FLOP/s by dtype (fp32 without TF32)"
    )


class HardwareProfile(_Frozen):
    """The machine trials run on; throughput is only comparable on the same profile."""

    cpu_model: str
    cores: int = Field(ge=1, description="CPU cores this process may use")
    memory_bytes: int
    cpu_capability: str = Field(description="torch's CPU kernel level, e.g. AVX512")
    cpu_bf16: bool = Field(description="the CPU has native bf16 instructions (AVX512-BF16/AMX)")
    python_version: str
    torch_version: str
    cuda_version: str | None = None
    cudnn_version: int | None = None
    gpus: tuple[GpuInfo, ...] = ()
    cpu_peak_flops: dict[str, float] = Field(
        default_factory=dict, description="measured matmul FLOP/s on all usable cores, by dtype"
    )

    @property
    def has_cuda(self) -> bool:
        return bool(self.gpus)


class TaskSummary(_Frozen):
    """What the factory built, as the trial child saw it; also shapes the generated script."""

    return_kind: Literal["task", "tuple"]
    model_class: str
    num_parameters: int
    dataset_class: str
    dataset_size: int | None = Field(description="None for an IterableDataset without len()")
    iterable: bool
    batch_kind: Literal["pair", "tuple", "dict", "tensor"]
    batch_description: str = Field(description="shapes and dtypes of one collated batch")
    loss_from_model: bool
    custom_optimizer: bool
    custom_collate: bool
    user_batch_size: int
    conv2d: bool = Field(default=False, description="the model has a Conv2d layer")
    flops_per_sample: float | None = Field(
        default=None, description="forward + backward FLOPs per sample (FlopCounterMode)"
    )
    optimizer_class: str | None = Field(default=None, description="e.g. AdamW, SGD")


class RankResult(_Frozen):
    """One DDP rank's share of a trial."""

    rank: int
    samples_per_s: float
    window_s: float
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    startup_s: float | None = None


class TrialResult(_Frozen):
    """One isolated trial, as the child (or, when it died, the parent) recorded it."""

    config: TrialConfig
    status: TrialStatus
    reason: str | None = None
    failure_phase: FailurePhase | None = None
    error_type: str | None = Field(default=None, description="exception class of an 'error'")
    input_error: str | None = Field(
        default=None,
        description="the kind of BadInputError advisor's own checks raised (spec, factory, "
        "contract); preflight raises a spec or factory error again as its own class",
    )
    samples_per_s: float | None = None
    step_time_median_s: float | None = None
    step_time_p10_s: float | None = None
    step_time_p90_s: float | None = None
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    startup_s: float | None = Field(default=None, description="process start to first step")
    warmup_s: float | None = None
    window_s: float | None = None
    steps_measured: int = 0
    samples_measured: int = 0
    losses: tuple[float, ...] = ()
    early_losses: tuple[float, ...] = Field(
        default=(),
        description="losses of the first optimizer steps from the seeded initial weights, "
        "compared with the same configuration's without the knobs that change the maths",
    )
    first_step_s: float | None = Field(
        default=None, description="the first training step (with torch.compile: compilation)"
    )
    stopped_early: bool = Field(
        default=False, description="the search ended its window early: clearly slower than the best"
    )
    below_best: bool = Field(
        default=False,
        description="a search trial's window ended before its time, once its rate was clearly "
        "below the best so far (the best above its 95 % interval)",
    )
    estimated: bool = Field(
        default=False,
        description="one optimizer cycle did not fit the window: samples/s was estimated from "
        "separately timed micro-steps and optimizer steps",
    )
    sibling_rates: dict[int, float] = Field(
        default_factory=dict,
        description="an estimate's: samples/s at other accumulation steps (the request's "
        "`sibling_accumulation`), from the same timed micro-steps and optimizer steps",
    )
    ranks: tuple[RankResult, ...] = Field(default=(), description="per-rank figures under DDP")
    race: RaceCurve | None = Field(default=None, description="a race trial's loss curve")
    gradient_norms: GradientNorms | None = Field(
        default=None, description="a noise trial's squared gradient norms"
    )
    wall_s: float | None = Field(default=None, description="whole trial as the parent saw it")
    task: TaskSummary | None = None
    log_path: str | None = None

    @property
    def feasible(self) -> bool:
        return self.status == "ok"


class TrialRecord(_Frozen):
    """A trial as stored in the study: its Optuna number, role and result."""

    number: int
    role: Literal["baseline", "search", "confirm", "duplicate"]
    result: TrialResult
    infeasible_reason: str | None = Field(
        default=None,
        description="why an 'ok' trial is still not eligible (e.g. memory)",
    )
    duplicate_of: int | None = None
    derived_from: int | None = Field(
        default=None,
        description="the trial whose timed micro-steps and optimizer steps gave this "
        "configuration's samples/s (the same configuration at another accumulation steps)",
    )
    worker: str | None = Field(default=None, description="the worker that measured it")

    @property
    def eligible(self) -> bool:
        return self.result.feasible and self.infeasible_reason is None

    @property
    def note(self) -> str:
        """What a reader needs to know beyond the figures: why it failed or is not eligible,
        which trial it repeats, or that its window was cut short."""
        if self.infeasible_reason or self.result.reason:
            return self.infeasible_reason or self.result.reason or ""
        if self.duplicate_of is not None:
            return f"same configuration as trial {self.duplicate_of}"
        if self.result.stopped_early:
            return (
                f"stopped after {self.result.window_s or 0:.1f} s of its window: far slower "
                "than the best so far"
            )
        if self.result.below_best:
            return (
                f"window ended after {self.result.window_s or 0:.1f} s: clearly slower than the "
                "best so far"
            )
        if self.result.estimated and self.result.sibling_rates:
            others = ", ".join(map(str, sorted(self.result.sibling_rates)))
            return (
                "estimated from timed micro-steps and optimizer steps, which also gave its "
                f"samples/s at accumulation {others}"
            )
        if self.result.estimated:
            return (
                "estimated from timed micro-steps and optimizer steps: one optimizer cycle "
                "did not fit the window"
            )
        return ""


class FixedKnob(_Frozen):
    """A knob advisor did not search, with the value used and why."""

    name: str
    value: str
    reason: str


class KnobEffect(_Frozen):
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


class RejectedValue(_Frozen):
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


class PrunedProposal(_Frozen):
    """A configuration the sampler proposed that advisor did not run, and why."""

    number: int
    params: dict[str, str | int | bool]
    reason: str


class Bottleneck(_Frozen):
    """What limits the winner, as its own measurements and its neighbours' show."""

    kind: Literal["input", "overhead", "compute"]
    explanation: str = Field(description="one sentence, citing the trials it rests on")
    trials: tuple[int, ...]


class Efficiency(_Frozen):
    """The recommendation's FLOP rate against the machine's measured matmul peak."""

    flops_per_sample: float = Field(description="forward + backward, as FlopCounterMode counts")
    achieved_flops: float = Field(description="flops_per_sample x samples/s")
    peak_flops: float = Field(description="measured matmul FLOP/s for the dtype, all devices")
    dtype: str
    devices: str = Field(description="what the peak was measured on, e.g. '2 CPU cores'")
    fraction_of_peak: float


class LayoutBest(_Frozen):
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


class StudyContext(_Frozen):
    """What a tune stores with its study before the first trial, so that even an interrupted
    study can be reported without the machine or the user's code."""

    advisor_version: str
    workdir: str = Field(description="the folder the spec resolves from")
    baseline_config: TrialConfig
    fixed_knobs: tuple[FixedKnob, ...] = ()
    hardware: HardwareProfile
    task: TaskSummary


class Racer(_Frozen):
    """One configuration in the race, with the learning rate it would ship with."""

    role: Literal["baseline", "your batch", "candidate"]
    trial: int | None = Field(default=None, description="the search trial it re-runs")
    config: TrialConfig
    lr: LrPlan
    race_seconds: float
    samples_per_s: float | None = Field(default=None, description="its throughput measurement")
    result: TrialResult
    time_to_target_s: float | None = Field(
        default=None, description="training time until its loss first reached the target"
    )

    @property
    def curve(self) -> RaceCurve | None:
        return self.result.race if self.result.feasible else None

    @property
    def label(self) -> str:
        return f"{self.config.label()}, {self.lr.label}"


class RaceSummary(_Frozen):
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
    verdict: str = Field(description="why the winner won, or why nothing could, in a sentence")


class ThroughputPick(_Frozen):
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


class Recommendation(_Frozen):
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
    speedup: float | None
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
    race: RaceSummary | None = None
    noise_scale: NoiseScale | None = None
    throughput_pick: ThroughputPick | None = Field(
        default=None, description="the fastest in samples/s, where the race chose another"
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


class TuneResult(_Frozen):
    """What `advisor.tune()` returns."""

    settings: TuneSettings
    recommendation: Recommendation
    trials: tuple[TrialRecord, ...]
    confirmations: tuple[TrialRecord, ...]
    pruned: tuple[PrunedProposal, ...] = Field(
        default=(), description="proposals not run: impossible or known not to fit"
    )
    out_dir: Path


def relative_spread(rates: Sequence[float]) -> float:
    """Half the range of repeated measurements over their median; 0 for fewer than two."""
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / 2 / statistics.median(rates)
