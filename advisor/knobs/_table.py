"""The knob table: one row per knob advisor can search, and `TrialConfig`, the point they make up.

Each knob is a field of `TrialConfig` whose annotation carries its row (`Knob`): the `--knobs`
group, the values to search (ordered from the default outwards), whether it changes the arithmetic
and not only its speed, its title and unit, how it reads in a one-line label, and the rules under
which it cannot matter, each with the reason the report gives. The rules read `Facts` (the device,
the machine, the task), nothing else (`advisor.knobs._rules`). Generic code reads the table: the
search space, the `--knobs` groups, labels, the order of reports and knob effects, the numerics
check.

Each row also names how every framework sets the knob (`exports`, `advisor.knobs._row`). A knob
is a field here (DDP's network knobs' rows are in `_network`), plus the one spot in the trial
loop (`trial/child/loop.py`) and the one in `report/templates/train.py.j2` that apply it."""

from typing import Annotated

from pydantic import Field, model_validator

import advisor.knobs._frameworks as fw
import advisor.knobs._network as net
import advisor.knobs._rules as rules
from advisor.frozen import Frozen
from advisor.knobs._row import (
    FRAMEWORKS,
    IN_LOADER,
    Knob,
    by_hand,
    elsewhere,
    in_loader,
    key,
    setting,
    when_set,
)

__all__ = ["BASE_GROUP", "MEMORY_GROUP", "TrialConfig"]


BASE_GROUP = "classic"  # always searched; `--knobs` adds the other groups to it
MEMORY_GROUP = "memory"  # searched under --memory-budget


# --- the table -----------------------------------------------------------------------------------
class TrialConfig(Frozen):
    """One point of the search space: everything that changes how fast a training step runs.
    Every field after `device` is a knob, annotated with its row of the table (`world_size`,
    `reshard_after_forward` and `nnodes` are part of the `parallel` knob)."""

    device: rules.Device = "cpu"
    parallel_mode: Annotated[
        rules.ParallelMode,
        Knob(
            group=BASE_GROUP,
            title=(
                "parallel layout: one process, DataParallel, DDP with N processes, or FSDP2 "
                "with N (under --memory-budget)"
            ),
            name="parallel",
            fields=("parallel_mode", "world_size", "reshard_after_forward", "nnodes"),
            values=rules.layouts,
            order=rules.layout_order,
            fixed_when=(rules.one_process,),
            dropped_when={
                "dp": rules.unless(
                    lambda f: f.device == "cuda" and f.gpus >= 2,
                    "DataParallel needs >= 2 CUDA GPUs",
                ),
            },
            invalid_on_cpu={"dp": "needs CUDA GPUs; on CPU use 'none' or 'ddp'"},
            exports={
                "hf": elsewhere(
                    "the launch line: torchrun for DDP and FSDP (FSDP's own: fsdp, fsdp_config); "
                    "Trainer wraps several visible GPUs in DataParallel on its own"
                ),
                "lightning": setting(fw.lightning_layout, by_hand=fw.lightning_dp),
                "accelerate": setting(fw.accelerate_layout, by_hand=fw.accelerate_dp),
            },
        ),
    ] = "none"
    world_size: int = Field(default=1, ge=1, description="DDP or FSDP processes; 1 for none and dp")
    nnodes: int = Field(default=1, ge=1, description="machines the processes span (torchrun's)")
    reshard_after_forward: bool = Field(
        default=True,
        description="FSDP: free each block's gathered parameters after its forward pass (False "
        "keeps them for the backward pass: less communication, more memory)",
    )
    batch_size: Annotated[
        int,
        Knob(
            group=BASE_GROUP,
            title="micro-batch",
            unit="samples per process",
            tag="bs={}",
            always_shown=True,
            exports=in_loader(hf=key("per_device_train_batch_size"), loader=key("batch_size")),
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
            exports={
                "hf": key("gradient_accumulation_steps"),
                "lightning": key("accumulate_grad_batches"),
                "accelerate": by_hand(fw.accelerate_accumulation),
            },
        ),
    ] = Field(default=1, ge=1)
    amp: Annotated[
        rules.AmpMode,
        Knob(
            group=BASE_GROUP,
            title="mixed precision: the autocast dtype",
            values=("off", "fp16", "bf16"),
            dropped_when={
                "fp16": rules.first_reason(
                    rules.unless(
                        lambda f: f.device == "cuda",
                        "fp16 autocast needs CUDA; CPU autocast uses bf16",
                    ),
                    rules.slower_than_fp32("fp16"),
                ),
                "bf16": rules.first_reason(
                    rules.unless(
                        lambda f: f.device == "cpu" or f.gpu_bf16,
                        "bf16 autocast needs GPUs that compute bf16 (compute capability 8.0)",
                    ),
                    rules.slower_than_fp32("bf16"),
                ),
            },
            invalid_on_cpu={"fp16": "needs a CUDA device; CPU autocast uses amp='bf16'"},
            tag="amp={}",
            always_shown=True,
            exports={
                "hf": setting(lambda amp, _: {"bf16": amp == "bf16", "fp16": amp == "fp16"}),
                "lightning": key(
                    "precision", {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}.get
                ),
                "accelerate": key("mixed_precision", lambda amp: "no" if amp == "off" else amp),
            },
        ),
    ] = "off"
    num_workers: Annotated[
        int,
        Knob(
            group=BASE_GROUP,
            title="DataLoader workers",
            unit="processes",
            values=rules.worker_counts,
            fixed_when=(
                rules.unless(
                    lambda f: not f.iterable,
                    "an IterableDataset is replicated in every worker unless it shards itself "
                    "with get_worker_info(); advisor does not change what your data means",
                ),
            ),
            tag="workers={}",
            always_shown=True,
            exports=in_loader(hf=key("dataloader_num_workers"), loader=key("num_workers")),
        ),
    ] = Field(default=0, ge=0)
    pin_memory: Annotated[
        bool,
        Knob(
            group=BASE_GROUP,
            title="page-locked host memory for batches",
            values=(False, True),
            fixed_when=(
                rules.unless(
                    lambda f: f.device == "cuda",
                    "no CUDA device: pinned memory only speeds host-to-GPU copies",
                ),
            ),
            invalid_on_cpu={True: "has no effect without CUDA: set it to False"},
            tag="pin",
            exports=in_loader(hf=key("dataloader_pin_memory"), loader=key("pin_memory")),
        ),
    ] = False
    cudnn_benchmark: Annotated[
        bool,
        Knob(
            group=BASE_GROUP,
            title="cuDNN autotuning of convolution algorithms",
            values=(False, True),
            fixed_when=(rules.needs_cudnn,),
            invalid_on_cpu={True: "has no effect on CPU: set it to False"},
            tag="cudnn.benchmark",
            exports={
                "hf": when_set(fw.CUDNN_BENCHMARK),
                "lightning": key("benchmark"),
                "accelerate": when_set(fw.CUDNN_BENCHMARK),
            },
        ),
    ] = False
    cudnn_deterministic: Annotated[
        bool,
        Knob(
            group="determinism",
            title="deterministic cuDNN algorithms: reproducible runs, at a cost",
            values=(False, True),
            changes_maths=True,
            fixed_when=(rules.needs_cudnn,),
            invalid_on_cpu={True: "has no effect on CPU: set it to False"},
            tag="cudnn.deterministic",
            exports={
                "hf": when_set(fw.CUDNN_DETERMINISTIC),
                "lightning": key("deterministic"),
                "accelerate": when_set(fw.CUDNN_DETERMINISTIC),
            },
        ),
    ] = False
    compile: Annotated[
        rules.CompileMode,
        Knob(
            group="compile",
            title="torch.compile mode",
            values=("off", "default", "max-autotune-no-cudagraphs"),
            changes_maths=True,
            fixed_when=(rules.compiler_missing,),
            tag="compile={}",
            exports={
                "hf": setting(fw.hf_compile),
                "lightning": by_hand(fw.compile_by_hand),
                "accelerate": key("dynamo_mode", lambda mode: None if mode == "off" else mode),
            },
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
                rules.unless(
                    lambda f: f.conv2d,
                    "only 4-D convolution inputs have a channels-last layout; the model has no "
                    "Conv2d",
                ),
            ),
            tag="channels_last",
            exports=dict.fromkeys(FRAMEWORKS, when_set(fw.CHANNELS_LAST)),
        ),
    ] = False
    matmul_precision: Annotated[
        rules.MatmulPrecision,
        Knob(
            group="matmul_precision",
            title="torch.set_float32_matmul_precision; high = TF32 on CUDA",
            values=("highest", "high"),
            changes_maths=True,
            fixed_when=(rules.tf32_missing,),
            invalid_on_cpu={"high": "(TF32) needs a CUDA GPU: set it to 'highest'"},
            tag="matmul={}",
            exports={
                "hf": key("tf32", lambda precision: precision == "high"),
                "lightning": elsewhere("the export's code: torch.set_float32_matmul_precision"),
                "accelerate": by_hand(fw.matmul_by_hand),
            },
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
            exports={
                "hf": fw.with_workers("dataloader_prefetch_factor"),
                **dict.fromkeys(("lightning", "accelerate"), IN_LOADER),
                "loader": fw.loader_with_workers("prefetch_factor"),
            },
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
            exports={
                "hf": fw.with_workers("dataloader_persistent_workers", without=False),
                **dict.fromkeys(("lightning", "accelerate"), IN_LOADER),
                "loader": fw.loader_with_workers("persistent_workers"),
            },
        ),
    ] = True
    optimizer_impl: Annotated[
        rules.OptimizerImpl,
        Knob(
            group="optimizer",
            title="the optimizer's implementation: torch's default, foreach or fused",
            values=("default", "foreach", "fused"),
            changes_maths=True,
            fixed_when=(
                rules.unless(
                    lambda f: not f.custom_optimizer,
                    "your factory builds its own optimizer; advisor does not change its arguments",
                ),
            ),
            tag="optimizer={}",
            exports={
                "hf": setting(fw.hf_optimizer, by_hand=fw.hf_foreach, when_searched=True),
                "lightning": by_hand(
                    fw.optimizer_by_hand(" in configure_optimizers"), when_searched=True
                ),
                "accelerate": by_hand(fw.optimizer_by_hand(), when_searched=True),
            },
        ),
    ] = "default"
    activation_checkpointing: Annotated[
        str,
        Knob(
            group=MEMORY_GROUP,
            title="activation checkpointing of the model's repeated blocks (off, or their class)",
            values=rules.checkpoint_values,
            fixed_when=(rules.no_repeated_block, rules.memory_unbound),
            tag="ckpt={}",
            exports={
                "hf": setting(fw.hf_checkpointing, by_hand=fw.hf_checkpointing_note),
                "lightning": by_hand(fw.lightning_checkpointing),
                "accelerate": by_hand(fw.accelerate_checkpointing),
            },
        ),
    ] = "off"
    bucket_cap_mb: net.BucketCapMb = net.DEFAULT_BUCKET_MB  # the network knobs (`_network`)
    gradient_as_bucket_view: net.GradientAsBucketView = False

    @model_validator(mode="after")
    def _check_combination(self) -> "TrialConfig":
        from advisor.knobs._index import combination_problems  # the index reads this class

        problems = combination_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step: batch x accumulation x processes."""
        return self.batch_size * self.accumulation_steps * self.world_size

    @property
    def parallel(self) -> str:
        """The parallel layout as one word: `none`, `dp`, `ddp-N` (N ranks), `fsdp-N`, or
        `fsdp-N-grad-op` (FSDP keeping the gathered parameters for the backward pass)."""
        ranks = f"{self.nnodes}x{self.per_node}" if self.nnodes > 1 else f"{self.world_size}"
        if self.parallel_mode == "ddp":
            return f"ddp-{ranks}"
        if self.parallel_mode == "fsdp":
            return f"fsdp-{ranks}{'' if self.reshard_after_forward else rules.GRAD_OP}"
        return self.parallel_mode

    @property
    def per_node(self) -> int:
        """Processes on each machine: `world_size` over `nnodes`."""
        return self.world_size // self.nnodes

    @property
    def distributed(self) -> bool:
        """Whether it runs ranks of a process group (DDP or FSDP) under torchrun."""
        return self.parallel_mode in ("ddp", "fsdp")

    def main_process_threads(self, cores: int) -> int:
        """Intra-op threads per training process: the cores its loader workers leave free,
        split between the DDP ranks.

        Measured on the 2-core machine (examples/data_bound.py, batch 32, 2 workers): with torch's
        default of a thread per core, the training process and its workers oversubscribe the CPU
        and reach 1,043 samples/s; with the process on the cores left over, 1,821.
        """
        processes = self.per_node  # `cores` are one machine's
        return max(1, (cores - processes * self.num_workers) // processes)

    def label(self) -> str:
        """A short human-readable description, e.g. `ddp-2 bs=64 acc=2 amp=bf16 workers=2`."""
        from advisor.knobs._index import KNOBS

        return " ".join(part for row in KNOBS if (part := row.label_part(self)) is not None)

    @property
    def maths_twin(self) -> "TrialConfig":
        """This configuration without the knobs that change the arithmetic."""
        from advisor.knobs._index import KNOBS

        return self.model_copy(
            update={name: row.default for row in KNOBS if row.changes_maths for name in row.fields}
        )
