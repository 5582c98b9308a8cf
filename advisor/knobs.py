"""The knobs of one trial: `TrialConfig`, everything that changes how fast a training step runs."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "KNOB_GROUPS",
    "MATHS_KNOBS",
    "TUNED_KNOBS",
    "AmpMode",
    "Device",
    "ParallelMode",
    "TrialConfig",
    "parse_parallel",
]

ParallelMode = Literal["none", "dp", "ddp"]
AmpMode = Literal["off", "bf16", "fp16"]
CompileMode = Literal["off", "default", "max-autotune-no-cudagraphs"]
MatmulPrecision = Literal["highest", "high"]
OptimizerImpl = Literal["default", "foreach", "fused"]
Device = Literal["cpu", "cuda"]

# The knobs a search can vary, as `TrialConfig` attributes (`parallel` = mode and world size).
TUNED_KNOBS = (
    "parallel",
    "batch_size",
    "accumulation_steps",
    "amp",
    "num_workers",
    "pin_memory",
    "cudnn_benchmark",
    "compile",
    "channels_last",
    "matmul_precision",
    "prefetch_factor",
    "persistent_workers",
    "optimizer_impl",
)
# `--knobs` names these groups (or single knobs); `classic` is the default search.
KNOB_GROUPS: dict[str, tuple[str, ...]] = {
    "classic": TUNED_KNOBS[:7],
    "compile": ("compile",),
    "channels_last": ("channels_last",),
    "matmul_precision": ("matmul_precision",),
    "loader": ("prefetch_factor", "persistent_workers"),
    "optimizer": ("optimizer_impl",),
}
# Knobs that change the arithmetic, not only its speed: checked against their twin's losses.
MATHS_KNOBS = ("compile", "channels_last", "matmul_precision", "optimizer_impl")


class TrialConfig(BaseModel):
    """One point of the search space: everything that changes how fast a training step runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Device = "cpu"
    parallel_mode: ParallelMode = "none"
    world_size: int = Field(default=1, ge=1)
    batch_size: int = Field(ge=1, description="per-process micro-batch")
    accumulation_steps: int = Field(default=1, ge=1)
    amp: AmpMode = "off"
    cudnn_benchmark: bool = False
    num_workers: int = Field(default=0, ge=0)
    pin_memory: bool = False
    compile: CompileMode = Field(default="off", description="torch.compile mode")
    channels_last: bool = Field(default=False, description="NHWC memory format for 4-D inputs")
    matmul_precision: MatmulPrecision = Field(
        default="highest", description="torch.set_float32_matmul_precision; high = TF32 on CUDA"
    )
    prefetch_factor: int = Field(default=2, ge=1, description="batches each worker loads ahead")
    persistent_workers: bool = Field(
        default=True, description="keep loader workers between epochs (with num_workers > 0)"
    )
    optimizer_impl: OptimizerImpl = Field(
        default="default", description="the optimizer's foreach/fused implementation"
    )

    @model_validator(mode="after")
    def _check_combination(self) -> TrialConfig:
        problems = _combination_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def global_batch_size(self) -> int:
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
        """A short human-readable description, e.g. `bs=64 acc=2 amp=bf16 workers=2`."""
        parts = [
            f"bs={self.batch_size}",
            f"acc={self.accumulation_steps}",
            f"amp={self.amp}",
        ]
        parts.append(f"workers={self.num_workers}")
        if self.parallel_mode != "none":
            parts.insert(0, self.parallel)
        if self.pin_memory:
            parts.append("pin")
        if self.cudnn_benchmark:
            parts.append("cudnn.benchmark")
        if self.compile != "off":
            parts.append(f"compile={self.compile}")
        if self.channels_last:
            parts.append("channels_last")
        if self.matmul_precision != "highest":
            parts.append(f"matmul={self.matmul_precision}")
        if self.num_workers and self.prefetch_factor != 2:
            parts.append(f"prefetch={self.prefetch_factor}")
        if self.num_workers and not self.persistent_workers:
            parts.append("workers-per-epoch")
        if self.optimizer_impl != "default":
            parts.append(f"optimizer={self.optimizer_impl}")
        return " ".join(parts)

    @property
    def maths_twin(self) -> TrialConfig:
        """This configuration without the knobs that change the arithmetic (`MATHS_KNOBS`)."""
        return self.model_copy(
            update={name: TrialConfig.model_fields[name].default for name in MATHS_KNOBS}
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
        if config.amp == "fp16":
            problems.append("amp='fp16' needs a CUDA device; CPU autocast uses amp='bf16'")
        if config.pin_memory:
            problems.append("pin_memory=True has no effect without CUDA: set it to False")
        if config.cudnn_benchmark:
            problems.append("cudnn_benchmark=True has no effect on CPU: set it to False")
        if config.parallel_mode == "dp":
            problems.append("parallel_mode='dp' needs CUDA GPUs; on CPU use 'none' or 'ddp'")
        if config.matmul_precision != "highest":
            problems.append("matmul_precision='high' (TF32) needs a CUDA GPU: set it to 'highest'")
    return problems
