"""What advisor measured: the hardware, the task, each trial's result and its record in the study.
What it concluded from them is `advisor.results._recommendation`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from enum import Enum
from typing import Literal

from pydantic import Field

from advisor.frozen import Frozen
from advisor.knobs import TrialConfig
from advisor.results._convergence import GradientNorms, RaceCurve

__all__ = [
    "BUSY_CORES",
    "BUSY_STEAL",
    "FailurePhase",
    "GpuInfo",
    "HardwareProfile",
    "MachineLoad",
    "PrunedProposal",
    "RankResult",
    "TaskSummary",
    "TrialRecord",
    "TrialResult",
    "TrialRole",
    "TrialStatus",
    "relative_spread",
]

# stopped: the search ended it before its window, clearly slower than the best (`reason`).
TrialStatus = Literal["ok", "oom", "timeout", "crashed", "error", "diverged", "stopped"]
FailurePhase = Literal["build", "first_step", "warmup", "measure"]


class GpuInfo(Frozen):
    """One CUDA GPU as the probe saw it."""

    name: str
    memory_bytes: int
    capability: str = Field(description="compute capability, e.g. '8.0'")
    bf16: bool
    peak_flops: dict[str, float] = Field(
        default_factory=dict, description="measured matmul FLOP/s by dtype (fp32 without TF32)"
    )


class HardwareProfile(Frozen):
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
    allocator: str = Field(
        "glibc", description="the malloc trials ran under: glibc, or a preloaded mimalloc, ..."
    )
    allocator_preload: str | None = Field(
        None, description="the allocator library in LD_PRELOAD, which a run must preload too"
    )
    python_executable: str | None = Field(
        None, description="the interpreter the trials ran under, which launch.sh runs too"
    )

    @property
    def has_cuda(self) -> bool:
        return bool(self.gpus)


class TaskSummary(Frozen):
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
    repeated_block: str | None = Field(
        default=None, description="the class of the model's repeated block, to checkpoint"
    )
    flops_per_sample: float | None = Field(
        default=None, description="forward + backward FLOPs per sample (FlopCounterMode)"
    )
    optimizer_class: str | None = Field(default=None, description="e.g. AdamW, SGD")


class RankResult(Frozen):
    """One DDP rank's share of a trial."""

    rank: int
    samples_per_s: float
    window_s: float
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    startup_s: float | None = None


# Other programs using a quarter of a core, a hypervisor taking 5 % of the CPU time, or
# another program on the GPU: the measurements may differ from run to run for that alone.
BUSY_CORES = 0.25
BUSY_STEAL = 0.05


class MachineLoad(Frozen):
    """How busy the machine was during a trial, besides the trial and advisor
    (`advisor.trial.parent.load`)."""

    cores: int = Field(description="the machine's logical CPUs")
    seconds: float = Field(description="the wall time it covers: the whole trial")
    outside_cores: float = Field(
        description="CPU time other programs used over the wall time: 1.0 is one core busy"
    )
    steal_share: float = Field(
        default=0.0, description="share of the CPU time a hypervisor gave to other machines"
    )
    gpu_processes: int | None = Field(
        default=None, description="other programs computing on the trial's GPUs (NVML)"
    )

    @property
    def busy(self) -> bool:
        """Whether the load alone may make runs disagree (`BUSY_CORES`, `BUSY_STEAL`, or
        another program on the GPU)."""
        return self.outside_cores >= BUSY_CORES or self.stolen or (self.gpu_processes or 0) > 0

    @property
    def stolen(self) -> bool:
        """Whether a hypervisor took enough CPU time to matter (`BUSY_STEAL`)."""
        return self.steal_share >= BUSY_STEAL


class TrialResult(Frozen):
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
    eval_s_per_sample: float | None = Field(
        default=None,
        description="noise trial: seconds a held-out evaluation takes per sample (fp32, eval "
        "mode, one batch of up to 256); None for an IterableDataset, which has no held-out slice",
    )
    wall_s: float | None = Field(default=None, description="whole trial as the parent saw it")
    load: MachineLoad | None = Field(
        default=None, description="what else the machine ran meanwhile, as the parent saw it"
    )
    task: TaskSummary | None = None
    log_path: str | None = None

    @property
    def feasible(self) -> bool:
        return self.status == "ok"


class TrialRole(str, Enum):
    """Why a trial ran; its value is what a stored study holds."""

    BASELINE = "baseline"  # your configuration, measured first
    SEARCH = "search"  # proposed by the search
    CONFIRM = "confirm"  # a re-run of a finalist
    DUPLICATE = "duplicate"  # a repeat the sampler proposed, answered from the trial it repeats

    def __str__(self) -> str:  # its value, in messages and reports, on every Python
        return str(self.value)


class TrialRecord(Frozen):
    """A trial as stored in the study: its Optuna number, role and result."""

    number: int
    role: TrialRole
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
    round: int | None = Field(
        default=None,
        description="a re-run's round, from 1: the recommendation's and the baseline's re-runs "
        "of one round give one paired speed-up (None: a tie-break re-run)",
    )
    stage: Literal["your batch", "probe", "raced batch"] | None = Field(
        default=None,
        description="the stage of a time-to-loss search that proposed it (None: the baseline, "
        "the sampler, or another objective)",
    )
    samples_ratio: float = Field(
        default=1.0,
        gt=0,
        description="the samples its global batch needs to reach a loss, relative to the "
        "user's batch, by the noise scale at the optimistic end of its interval; 1 where "
        "the search ranks by samples/s (objective throughput, or no noise scale yet)",
    )

    @property
    def eligible(self) -> bool:
        return self.result.feasible and self.infeasible_reason is None

    @property
    def goodput(self) -> float | None:
        """Samples/s over the samples ratio: the rate at which it approaches the user's loss,
        what the search ranks by (AdaptDL's goodput: throughput x statistical efficiency)."""
        rate = self.result.samples_per_s
        return rate / self.samples_ratio if rate is not None else None

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


class PrunedProposal(Frozen):
    """A configuration the sampler proposed that advisor did not run, and why."""

    number: int
    params: dict[str, str | int | bool]
    reason: str


def relative_spread(rates: Sequence[float]) -> float:
    """Half the range of repeated measurements over their median; 0 for fewer than two."""
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / 2 / statistics.median(rates)
