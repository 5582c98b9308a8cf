"""The knob table: one row per knob advisor can search, and `TrialConfig`, the point they make up.

Each knob is a field of `TrialConfig` whose annotation carries its row (`Knob`): the `--knobs`
group, the values to search (ordered from the default outwards), whether it changes the arithmetic
and not only its speed, its title and unit, how it reads in a one-line label, and the rules under
which it cannot matter, each with the reason the report gives. The rules read `Facts` (the device,
the machine, the task), nothing else. Generic code reads the table: the search space, the
`--knobs` groups, labels, the order of reports and knob effects, the numerics check.

Adding a knob takes a field here, plus the one spot in the trial loop (`advisor/trial/loop.py`)
and the one in the training-script template (`advisor/report/templates/train.py.j2`) that apply it.
"""

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticUndefined

__all__ = [
    "BASE_GROUP",
    "KNOB",
    "KNOBS",
    "KNOB_GROUPS",
    "AmpMode",
    "Device",
    "Facts",
    "Knob",
    "ParallelMode",
    "Rule",
    "TrialConfig",
    "parse_parallel",
]

Device = Literal["cpu", "cuda"]
ParallelMode = Literal["none", "dp", "ddp"]
AmpMode = Literal["off", "bf16", "fp16"]
CompileMode = Literal["off", "default", "max-autotune-no-cudagraphs"]
MatmulPrecision = Literal["highest", "high"]
OptimizerImpl = Literal["default", "foreach", "fused"]

BASE_GROUP = "classic"  # always searched; `--knobs` adds the other groups to it


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What the table's rules read: the device searched on, the machine and the user's task."""

    device: Device
    cores: int
    gpus: int = 0
    gpu_bf16: bool = False  # every GPU computes bf16
    gpu_capability: float | None = None  # the lowest compute capability of the GPUs
    cudnn: bool = False
    compiler: bool = False  # torch.compile can build here: triton (CUDA) or a C++ compiler (CPU)
    max_world_size: int | None = None  # --max-world-size
    iterable: bool = False  # the dataset is an IterableDataset
    conv2d: bool = False
    custom_optimizer: bool = False
    # Measured matmul FLOP/s per dtype on the searched device (the slowest GPU's): the probe's.
    matmul_flops: Mapping[str, float] = field(default_factory=dict)
    forced: frozenset[str] = frozenset()  # knobs named one by one in --knobs: searched whatever

    @property
    def world_limit(self) -> int:
        """The most DDP processes: one per GPU (on CPU, per core), capped by --max-world-size."""
        available = self.gpus if self.device == "cuda" else self.cores
        return min(available, self.max_world_size or available)


# Why a knob (or one of its values) cannot matter in these circumstances; None where it can.
Rule = Callable[[Facts], str | None]


def unless(condition: Callable[[Facts], bool], reason: str) -> Rule:
    """The rule that gives `reason` where `condition` does not hold."""
    return lambda facts: None if condition(facts) else reason


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One row of the knob table; `name`, `fields` and `default` come from the annotated field."""

    group: str  # what `--knobs` calls it
    title: str  # what it is, for people
    unit: str = ""  # of its values, where they are numbers
    # The values to search, from the default outwards, or a function of the circumstances; None:
    # set by the settings (batch sizes, accumulation steps: the shape of the global batch).
    values: tuple[Any, ...] | Callable[[Facts], tuple[Any, ...]] | None = None
    changes_maths: bool = False  # computes the step in another order or precision
    fixed_when: tuple[Rule, ...] = ()  # any reason fixes the knob at its default
    dropped_when: Mapping[Any, Rule] = field(default_factory=dict)  # a value that cannot run
    needs: str | None = None  # matters only when this other knob is non-zero
    invalid_on_cpu: Mapping[Any, str] = field(default_factory=dict)  # value -> what to do instead
    tag: str = "{}"  # how a value reads in a configuration's label
    always_shown: bool = False  # in the label even at its default
    order: Callable[[Any], tuple[int, ...]] | None = None  # of values that are not in `values`
    name: str = ""  # the searched parameter; the field's name unless set
    fields: tuple[str, ...] = ()  # the `TrialConfig` fields it sets; the field alone unless set
    default: Any = None

    def candidates(self, facts: Facts) -> tuple[Any, ...]:
        """The values worth measuring in these circumstances, before `dropped_when`."""
        return self.values(facts) if callable(self.values) else self.values or ()

    def order_key(self, value: Any) -> tuple[int, ...]:
        """Where a value stands from the default outwards (for reports and effects)."""
        if self.order is not None:
            return self.order(value)
        listed = self.values if isinstance(self.values, tuple) else ()
        if value in listed:
            return (listed.index(value),)
        if isinstance(value, (int, float)):  # bools too; numbers past the row's values follow them
            return (len(listed), int(value))
        return (len(listed),)

    def label_part(self, config: "TrialConfig") -> str | None:
        """How this knob reads in `config.label()`; None where it says nothing."""
        if self.needs is not None and not getattr(config, self.needs):
            return None
        value = getattr(config, self.name)
        if not self.always_shown and value == self.default:
            return None
        return self.tag.format(value)


# --- the rules -----------------------------------------------------------------------------------
PARALLEL_MODES: tuple[ParallelMode, ...] = get_args(ParallelMode)
NOT_SHARDABLE = (
    "an IterableDataset cannot be sharded between DDP ranks (DistributedSampler needs an index); "
    "every rank would read the same stream"
)


def _layouts(facts: Facts) -> tuple[str, ...]:
    """One process, DataParallel, and DDP with N processes: every N up to the GPUs; on CPU
    powers of two and all the cores."""
    limit = facts.world_limit
    if facts.device == "cuda":
        worlds = set(range(2, limit + 1))
    else:
        worlds = {2**k for k in range(1, limit.bit_length())} | {limit}
    ddp = () if facts.iterable else tuple(f"ddp-{n}" for n in sorted(worlds) if 2 <= n <= limit)
    return ("none", "dp", *ddp)


def _layout_order(layout: str) -> tuple[int, int]:
    mode, world = parse_parallel(layout)
    return PARALLEL_MODES.index(mode), world


def _one_process(facts: Facts) -> str | None:
    """Why only one process can run here; None where DataParallel or DDP can."""
    if (facts.device == "cuda" and facts.gpus >= 2) or (
        not facts.iterable and facts.world_limit >= 2
    ):
        return None
    if facts.iterable:
        return NOT_SHARDABLE
    if facts.max_world_size == 1:
        return "--max-world-size 1"
    if facts.device == "cuda":
        return "one GPU: DataParallel and DDP need >= 2"
    return f"{facts.world_limit} core: DDP ranks would only share it"


def _worker_counts(facts: Facts) -> tuple[int, ...]:
    if facts.cores <= 4:
        return tuple(range(facts.cores + 1))
    counts = {0, 1, facts.cores}
    counts.update(2**k for k in range(1, facts.cores.bit_length()) if 2**k <= facts.cores)
    return tuple(sorted(counts))


def _compiler(facts: Facts) -> str | None:
    if facts.compiler:
        return None
    if facts.device == "cuda":
        return "torch.compile on CUDA needs triton, which is not installed"
    return "torch.compile's inductor backend needs a C++ compiler on CPU (g++ or clang++)"


def _tf32(facts: Facts) -> str | None:
    if facts.device == "cpu":
        return "TF32 matmuls exist on CUDA GPUs only"
    if (facts.gpu_capability or 0.0) < 8.0:
        return "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    return None


# Low precision whose matmuls run below this fraction of fp32's cannot pay off: a training step
# is at best as fast as its matmuls. Emulated bf16 on a CPU without AVX512-BF16 or AMX runs at
# about 0.01-0.05 of fp32 (REFERENCE.md); native bf16 and GPU fp16 run at 1x to 2x and more. The
# line sits far from both, so that a probe on a busy machine (short products lose most of their
# time to it) does not tip it; anything between is left to the search to measure.
SLOW_PRECISION = 0.25


def _slower_than_fp32(dtype: str) -> Rule:
    """Why `dtype` autocast cannot pay off on the measured matmuls; None where it may."""

    def rule(facts: Facts) -> str | None:
        low, full = facts.matmul_flops.get(dtype), facts.matmul_flops.get("fp32")
        if "amp" in facts.forced or not low or not full or low >= SLOW_PRECISION * full:
            return None
        where = "this CPU" if facts.device == "cpu" else "these GPUs"
        return (
            f"{dtype} matmuls ran at {low / 1e9:,.1f} GFLOP/s on {where} against "
            f"{full / 1e9:,.1f} for fp32 ({low / full:.2f}x): {dtype} autocast cannot pay off "
            "here; search it anyway with --knobs classic,amp"
        )

    return rule


def _first_reason(*rules: Rule) -> Rule:
    return lambda facts: next((reason for rule in rules if (reason := rule(facts))), None)


_needs_cudnn = unless(
    lambda f: f.device == "cuda" and f.cudnn, "no cuDNN on this device: the flag has no effect"
)


# --- the table -----------------------------------------------------------------------------------
class TrialConfig(BaseModel):
    """One point of the search space: everything that changes how fast a training step runs.

    Every field after `device` is a knob, annotated with its row of the table (`world_size` is
    part of the `parallel` knob).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Device = "cpu"
    parallel_mode: Annotated[
        ParallelMode,
        Knob(
            group=BASE_GROUP,
            title="parallel layout: one process, DataParallel, or DDP with N processes",
            name="parallel",
            fields=("parallel_mode", "world_size"),
            values=_layouts,
            order=_layout_order,
            fixed_when=(_one_process,),
            dropped_when={
                "dp": unless(
                    lambda f: f.device == "cuda" and f.gpus >= 2,
                    "DataParallel needs >= 2 CUDA GPUs",
                ),
            },
            invalid_on_cpu={"dp": "needs CUDA GPUs; on CPU use 'none' or 'ddp'"},
        ),
    ] = "none"
    world_size: int = Field(default=1, ge=1, description="DDP processes; 1 for none and dp")
    batch_size: Annotated[
        int,
        Knob(
            group=BASE_GROUP,
            title="micro-batch",
            unit="samples per process",
            tag="bs={}",
            always_shown=True,
        ),
    ] = Field(ge=1)
    accumulation_steps: Annotated[
        int,
        Knob(
            group=BASE_GROUP,
            title="gradient accumulation",
            unit="micro-batches per optimizer step",
            tag="acc={}",
            always_shown=True,
        ),
    ] = Field(default=1, ge=1)
    amp: Annotated[
        AmpMode,
        Knob(
            group=BASE_GROUP,
            title="mixed precision: the autocast dtype",
            values=("off", "fp16", "bf16"),
            dropped_when={
                "fp16": _first_reason(
                    unless(
                        lambda f: f.device == "cuda",
                        "fp16 autocast needs CUDA; CPU autocast uses bf16",
                    ),
                    _slower_than_fp32("fp16"),
                ),
                "bf16": _first_reason(
                    unless(
                        lambda f: f.device == "cpu" or f.gpu_bf16,
                        "bf16 autocast needs GPUs that compute bf16 (compute capability 8.0)",
                    ),
                    _slower_than_fp32("bf16"),
                ),
            },
            invalid_on_cpu={"fp16": "needs a CUDA device; CPU autocast uses amp='bf16'"},
            tag="amp={}",
            always_shown=True,
        ),
    ] = "off"
    num_workers: Annotated[
        int,
        Knob(
            group=BASE_GROUP,
            title="DataLoader workers",
            unit="processes",
            values=_worker_counts,
            fixed_when=(
                unless(
                    lambda f: not f.iterable,
                    "an IterableDataset is replicated in every worker unless it shards itself "
                    "with get_worker_info(); advisor does not change what your data means",
                ),
            ),
            tag="workers={}",
            always_shown=True,
        ),
    ] = Field(default=0, ge=0)
    pin_memory: Annotated[
        bool,
        Knob(
            group=BASE_GROUP,
            title="page-locked host memory for batches",
            values=(False, True),
            fixed_when=(
                unless(
                    lambda f: f.device == "cuda",
                    "no CUDA device: pinned memory only speeds host-to-GPU copies",
                ),
            ),
            invalid_on_cpu={True: "has no effect without CUDA: set it to False"},
            tag="pin",
        ),
    ] = False
    cudnn_benchmark: Annotated[
        bool,
        Knob(
            group=BASE_GROUP,
            title="cuDNN autotuning of convolution algorithms",
            values=(False, True),
            fixed_when=(_needs_cudnn,),
            invalid_on_cpu={True: "has no effect on CPU: set it to False"},
            tag="cudnn.benchmark",
        ),
    ] = False
    cudnn_deterministic: Annotated[
        bool,
        Knob(
            group="determinism",
            title="deterministic cuDNN algorithms: reproducible runs, at a cost",
            values=(False, True),
            changes_maths=True,
            fixed_when=(_needs_cudnn,),
            invalid_on_cpu={True: "has no effect on CPU: set it to False"},
            tag="cudnn.deterministic",
        ),
    ] = False
    compile: Annotated[
        CompileMode,
        Knob(
            group="compile",
            title="torch.compile mode",
            values=("off", "default", "max-autotune-no-cudagraphs"),
            changes_maths=True,
            fixed_when=(_compiler,),
            tag="compile={}",
        ),
    ] = "off"
    channels_last: Annotated[
        bool,
        Knob(
            group="channels_last",
            title="NHWC memory format for the model and 4-D inputs",
            values=(False, True),
            changes_maths=True,
            fixed_when=(
                unless(
                    lambda f: f.conv2d,
                    "only 4-D convolution inputs have a channels-last layout; the model has no "
                    "Conv2d",
                ),
            ),
            tag="channels_last",
        ),
    ] = False
    matmul_precision: Annotated[
        MatmulPrecision,
        Knob(
            group="matmul_precision",
            title="torch.set_float32_matmul_precision; high = TF32 on CUDA",
            values=("highest", "high"),
            changes_maths=True,
            fixed_when=(_tf32,),
            invalid_on_cpu={"high": "(TF32) needs a CUDA GPU: set it to 'highest'"},
            tag="matmul={}",
        ),
    ] = "highest"
    prefetch_factor: Annotated[
        int,
        Knob(
            group="loader",
            title="loader prefetching",
            unit="batches each worker loads ahead",
            values=(2, 4),
            needs="num_workers",
            tag="prefetch={}",
        ),
    ] = Field(default=2, ge=1)
    persistent_workers: Annotated[
        bool,
        Knob(
            group="loader",
            title="keep the loader workers between epochs",
            values=(True, False),
            needs="num_workers",
            tag="workers-per-epoch",
        ),
    ] = True
    optimizer_impl: Annotated[
        OptimizerImpl,
        Knob(
            group="optimizer",
            title="the optimizer's implementation: torch's default, foreach or fused",
            values=("default", "foreach", "fused"),
            changes_maths=True,
            fixed_when=(
                unless(
                    lambda f: not f.custom_optimizer,
                    "your factory builds its own optimizer; advisor does not change its arguments",
                ),
            ),
            tag="optimizer={}",
        ),
    ] = "default"

    @model_validator(mode="after")
    def _check_combination(self) -> "TrialConfig":
        problems = _combination_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: batch x accumulation x processes."""
        return self.batch_size * self.accumulation_steps * self.world_size

    @property
    def parallel(self) -> str:
        """The parallel layout as one word: `none`, `dp` or `ddp-N` (N ranks)."""
        if self.parallel_mode == "ddp":
            return f"ddp-{self.world_size}"
        return self.parallel_mode

    def main_process_threads(self, cores: int) -> int:
        """Intra-op threads per training process: the cores its loader workers leave free,
        split between the DDP ranks.

        Measured on the 2-core machine (examples/data_bound.py, batch 32, 2 workers): with torch's
        default of a thread per core, the training process and its workers oversubscribe the CPU
        and reach 1,043 samples/s; with the process on the cores left over, 1,821.
        """
        processes = self.world_size
        return max(1, (cores - processes * self.num_workers) // processes)

    def label(self) -> str:
        """A short human-readable description, e.g. `ddp-2 bs=64 acc=2 amp=bf16 workers=2`."""
        return " ".join(part for row in KNOBS if (part := row.label_part(self)) is not None)

    @property
    def maths_twin(self) -> "TrialConfig":
        """This configuration without the knobs that change the arithmetic."""
        return self.model_copy(
            update={name: row.default for row in KNOBS if row.changes_maths for name in row.fields}
        )


def parse_parallel(choice: str) -> tuple[ParallelMode, int]:
    """`none` -> ("none", 1), `dp` -> ("dp", 1), `ddp-4` -> ("ddp", 4)."""
    mode, _, ranks = choice.partition("-")
    if mode in ("none", "dp") and not ranks:
        return mode, 1  # type: ignore[return-value]
    if mode == "ddp" and ranks.isdigit():
        return "ddp", int(ranks)
    raise ValueError(f"{choice!r} is not a parallel layout: use none, dp or ddp-N")


def _combination_problems(config: TrialConfig) -> list[str]:
    problems = []
    if config.parallel_mode in ("none", "dp") and config.world_size != 1:
        problems.append(
            f"world_size={config.world_size} needs parallel_mode='ddp' "
            f"({config.parallel_mode!r} runs one process): set world_size=1"
        )
    if config.num_workers == 0 and config.prefetch_factor != 2:
        problems.append("prefetch_factor needs num_workers > 0: leave it at 2")
    if config.parallel_mode == "ddp" and config.world_size < 2:
        problems.append("parallel_mode='ddp' needs world_size >= 2; use parallel_mode='none'")
    if config.device == "cpu":
        for row in KNOBS:
            value = getattr(config, row.fields[0])
            if value in row.invalid_on_cpu:
                problems.append(f"{row.fields[0]}={value!r} {row.invalid_on_cpu[value]}")
    return problems


def _rows() -> tuple[Knob, ...]:
    """The table in field order, each row completed from its field."""
    rows = []
    for name, info in TrialConfig.model_fields.items():
        row = next((item for item in info.metadata if isinstance(item, Knob)), None)
        if row is None:
            continue
        default = None if info.default is PydanticUndefined else info.default
        rows.append(
            dataclasses.replace(
                row, name=row.name or name, fields=row.fields or (name,), default=default
            )
        )
    return tuple(rows)


KNOBS: tuple[Knob, ...] = _rows()
KNOB: Mapping[str, Knob] = {row.name: row for row in KNOBS}
# `--knobs` names these groups (or single knobs); the base group is always searched.
KNOB_GROUPS: Mapping[str, tuple[str, ...]] = {
    group: tuple(row.name for row in KNOBS if row.group == group)
    for group in dict.fromkeys(row.group for row in KNOBS)
}
