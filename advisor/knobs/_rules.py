"""When a knob, or one of its values, cannot matter: `Facts` (the device, the machine, the task)
and the rules of the knob table (`advisor.knobs`) that read them, each giving the reason the
report shows; and the values some knobs search in these circumstances."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, get_args

__all__ = [
    "GRAD_OP",
    "NOT_SHARDABLE",
    "SLOW_PRECISION",
    "AmpMode",
    "CompileMode",
    "Device",
    "Facts",
    "Layout",
    "MatmulPrecision",
    "OptimizerImpl",
    "ParallelMode",
    "Rule",
    "checkpoint_values",
    "compiler_missing",
    "first_reason",
    "layout_order",
    "layouts",
    "memory_unbound",
    "needs_cudnn",
    "no_repeated_block",
    "on_one_machine",
    "one_process",
    "parse_parallel",
    "slower_than_fp32",
    "tf32_missing",
    "unless",
    "worker_counts",
]

# The values of the knobs whose domains are words.
AmpMode = Literal["off", "bf16", "fp16"]
CompileMode = Literal["off", "default", "max-autotune-no-cudagraphs"]
MatmulPrecision = Literal["highest", "high"]
OptimizerImpl = Literal["default", "foreach", "fused"]

Device = Literal["cpu", "cuda"]
ParallelMode = Literal["none", "dp", "ddp", "fsdp"]


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
    repeated_block: str | None = None  # the class of the model's repeated block, if any
    memory_budget: bool = False  # --memory-budget is set
    nodes: int = 1  # machines in the tune (--nnodes), each like this one

    @property
    def memory_searched(self) -> bool:
        """Whether the memory knobs (activation checkpointing, FSDP) are in the space: under a
        budget; and on CUDA, where the search holds them back until a trial runs out of memory
        or comes within the headroom (`advisor.search.memory.memory_gate`)."""
        return self.memory_budget or self.device == "cuda"

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


PARALLEL_MODES: tuple[ParallelMode, ...] = get_args(ParallelMode)
NOT_SHARDABLE = (
    "an IterableDataset cannot be sharded between DDP ranks (DistributedSampler needs an index); "
    "every rank would read the same stream"
)


def layouts(facts: Facts) -> tuple[str, ...]:
    """One process, DataParallel, and DDP with N processes: every N up to the GPUs; on CPU
    powers of two and all the cores. Where memory can bind (`Facts.memory_searched`) also FSDP2
    with as many processes, resharding the parameters after the forward pass (`fsdp-N`) or
    keeping them for the backward pass (`fsdp-N-grad-op`): it saves memory at the cost of
    communication. In a tune over several machines, the same over N machines with M processes
    on each (`ddp-NxM`, `fsdp-NxM`)."""
    limit = facts.world_limit
    if facts.device == "cuda":
        worlds = set(range(2, limit + 1))
    else:
        worlds = {2**k for k in range(1, limit.bit_length())} | {limit}
    ranks = () if facts.iterable else tuple(n for n in sorted(worlds) if 2 <= n <= limit)
    spans = tuple(f"{n}" for n in ranks) + _across_machines(facts, ranks)
    ddp = tuple(f"ddp-{ranks}" for ranks in spans)
    sharded = spans if facts.memory_searched else ()
    fsdp = tuple(f"fsdp-{n}{suffix}" for n in sharded for suffix in ("", GRAD_OP))
    return ("none", "dp", *ddp, *fsdp)


def _across_machines(facts: Facts, ranks: tuple[int, ...]) -> tuple[str, ...]:
    """`NxM`: N machines (powers of two and all of them) with M processes each, as many as one
    machine runs (`ranks`) or one, at most --max-world-size in all."""
    if facts.nodes < 2 or facts.iterable:
        return ()
    machines = sorted({2**k for k in range(1, facts.nodes.bit_length())} | {facts.nodes})
    cap = facts.max_world_size
    return tuple(f"{n}x{m}" for n in machines for m in (1, *ranks) if cap is None or n * m <= cap)


def layout_order(layout: str) -> tuple[int, int, int, int]:
    """Where a layout stands: by parallel mode (one process, DataParallel, DDP, FSDP), then
    ranks, machines, resharding before not."""
    parsed = parse_parallel(layout)
    return PARALLEL_MODES.index(parsed.mode), parsed.world, parsed.nodes, int(not parsed.reshard)


def one_process(facts: Facts) -> str | None:
    """Why only one process can run here; None where DataParallel or DDP can."""
    if (facts.device == "cuda" and facts.gpus >= 2) or (
        not facts.iterable and max(facts.world_limit, facts.nodes) >= 2
    ):
        return None
    if facts.iterable:
        return NOT_SHARDABLE
    if facts.max_world_size == 1:
        return "--max-world-size 1"
    if facts.device == "cuda":
        return "one GPU: DataParallel and DDP need >= 2"
    return f"{facts.world_limit} core: DDP ranks would only share it"


def worker_counts(facts: Facts) -> tuple[int, ...]:
    """DataLoader worker counts to search: every count up to 4 cores; past that 0, 1, the
    powers of two and all the cores."""
    if facts.cores <= 4:
        return tuple(range(facts.cores + 1))
    counts = {0, 1, facts.cores}
    counts.update(2**k for k in range(1, facts.cores.bit_length()) if 2**k <= facts.cores)
    return tuple(sorted(counts))


def checkpoint_values(facts: Facts) -> tuple[str, ...]:
    """Activation checkpointing: off, or on for the model's repeated blocks."""
    return ("off", facts.repeated_block) if facts.repeated_block else ("off",)


def no_repeated_block(facts: Facts) -> str | None:
    """Why activation checkpointing has nothing to wrap; None where a block repeats."""
    if facts.repeated_block:
        return None
    return (
        "no module class with layers of its own repeats in a ModuleList or Sequential: there "
        "is no block to checkpoint"
    )


def memory_unbound(facts: Facts) -> str | None:
    """Why the memory knobs cannot pay: nothing asked for less memory than the host has (on
    CUDA they are searched once memory binds)."""
    if facts.memory_searched or "activation_checkpointing" in facts.forced:
        return None
    return (
        "memory does not bind: it trades compute for memory, so it is searched under "
        "--memory-budget (or --knobs activation_checkpointing)"
    )


def compiler_missing(facts: Facts) -> str | None:
    """Why torch.compile cannot build here; None where it can."""
    if facts.compiler:
        return None
    if facts.device == "cuda":
        return "torch.compile on CUDA needs triton, which is not installed"
    return "torch.compile's inductor backend needs a C++ compiler on CPU (g++ or clang++)"


def tf32_missing(facts: Facts) -> str | None:
    """Why TF32 matmuls do not exist here; None where they do."""
    if facts.device == "cpu":
        return "TF32 matmuls exist on CUDA GPUs only"
    if (facts.gpu_capability or 0.0) < 8.0:
        return "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    return None


# Low precision whose matmuls run below this fraction of fp32's cannot pay off: a training step
# is at best as fast as its matmuls. Emulated bf16 on a CPU without AVX512-BF16 or AMX runs at
# about 0.01-0.05 of fp32 (docs/method.md, "The probe and the search space"); native bf16 and
# GPU fp16 run at 1x to 2x and more. The line sits far from both, so that a probe on a busy
# machine (short products lose most of their time to it) does not tip it; anything between is
# left to the search to measure.
SLOW_PRECISION = 0.25


def slower_than_fp32(dtype: str) -> Rule:
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


def first_reason(*rules: Rule) -> Rule:
    """The rule that gives the first of these rules' reasons, None where none gives one."""
    return lambda facts: next((reason for rule in rules if (reason := rule(facts))), None)


needs_cudnn = unless(
    lambda f: f.device == "cuda" and f.cudnn, "no cuDNN on this device: the flag has no effect"
)


GRAD_OP = "-grad-op"  # FSDP that keeps the gathered parameters from forward to backward


class Layout(NamedTuple):
    """A parallel layout's fields of `TrialConfig`."""

    mode: ParallelMode
    world: int
    reshard: bool = True  # FSDP: free the gathered parameters after the forward pass
    nodes: int = 1  # machines the ranks span


def parse_parallel(choice: str) -> Layout:
    """`none`, `dp`, `ddp-4`, `fsdp-2`, `fsdp-2-grad-op`, or over machines `ddp-2x4` (2 machines,
    4 processes each) as `TrialConfig` fields."""
    mode, _, rest = choice.partition("-")
    if mode in ("none", "dp") and not rest:
        return Layout(mode, 1)  # type: ignore[arg-type]
    ranks = rest.removesuffix(GRAD_OP) if mode == "fsdp" else rest
    nodes, _, per_node = ranks.partition("x") if "x" in ranks else ("1", "", ranks)
    if mode in ("ddp", "fsdp") and nodes.isdigit() and per_node.isdigit():
        world = int(nodes) * int(per_node)
        return Layout(mode, world, reshard=ranks == rest, nodes=int(nodes))  # type: ignore[arg-type]
    raise ValueError(
        f"{choice!r} is not a parallel layout: use none, dp, ddp-N, fsdp-N or fsdp-N-grad-op "
        "(over machines ddp-NxM, fsdp-NxM: N machines, M processes each)"
    )


def on_one_machine(choice: str) -> str:
    """A layout over machines as one of them runs it: `ddp-2x4` -> `ddp-4`, `ddp-2x1` -> `none`."""
    layout = parse_parallel(choice)
    per_node = layout.world // layout.nodes
    if per_node == 1:
        return "none"
    return f"{layout.mode}-{per_node}{'' if layout.reshard else GRAD_OP}"
