"""The knobs of one trial (`TrialConfig`) and the settings of a tuning run (`TuneSettings`).

Defaults live here and nowhere else: the CLI passes only the flags a user set.
"""

from __future__ import annotations

import difflib
import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from advisor.errors import SettingsError

__all__ = [
    "KNOB_GROUPS",
    "MATHS_KNOBS",
    "TUNED_KNOBS",
    "AmpMode",
    "Device",
    "ParallelMode",
    "SamplerName",
    "TrialConfig",
    "TuneSettings",
    "parse_parallel",
    "settings_error",
]

ParallelMode = Literal["none", "dp", "ddp"]
AmpMode = Literal["off", "bf16", "fp16"]
CompileMode = Literal["off", "default", "max-autotune-no-cudagraphs"]
MatmulPrecision = Literal["highest", "high"]
OptimizerImpl = Literal["default", "foreach", "fused"]
Device = Literal["cpu", "cuda"]
SamplerName = Literal["tpe", "random", "grid"]

DEFAULT_BATCH_SIZE = 32
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
STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql", "journal")


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


class TuneSettings(BaseModel):
    """Everything `advisor tune` / `advisor.tune()` accepts; the CLI maps flags one-to-one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    spec: str = Field(min_length=1, description="factory spec: path/file.py:attr or pkg.mod:attr")
    trials: int = Field(default=20, ge=1, description="distinct configurations to measure")
    timeout: float | None = Field(default=None, gt=0, description="search budget in seconds")
    trial_seconds: float = Field(default=3.0, gt=0, description="timed window of one trial")
    warmup_steps: int = Field(default=3, ge=1, description="optimizer steps before timing")
    trial_timeout: float | None = Field(
        default=None,
        gt=0,
        description="hard limit per trial in seconds (default 120 + 10 x window)",
    )
    global_batch_size: int | None = Field(default=None, ge=1)
    batch_sizes: tuple[int, ...] | None = None
    accumulation_steps: tuple[int, ...] = (1, 2, 4, 8)
    max_world_size: int | None = Field(
        default=None,
        ge=1,
        description="most DDP ranks to try (default: one per GPU, or per core on CPU); 1 = none",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    storage: str | None = Field(default=None, description="Optuna storage URL")
    study_name: str | None = None
    out: Path | None = Field(default=None, description="output directory")
    worker: str | None = Field(
        default=None,
        description="this worker's name in a shared study (default: the host name); --trials "
        "counts the configurations this worker measured",
    )
    seed: int = 0
    sampler: SamplerName = "tpe"
    early_stop: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        description="end a search trial's window after 30% of it when its throughput is below "
        "this fraction of the best so far; 0 never ends one early",
    )
    knobs: tuple[str, ...] = Field(
        default=("classic",),
        description="knob groups (or knobs) to search: classic, all, or a comma-separated list "
        f"of {', '.join(KNOB_GROUPS)} and single knob names",
    )
    confirm_top: int = Field(default=3, ge=1, description="finalists re-measured")
    confirm_repeats: int = Field(default=2, ge=1, description="re-runs per finalist")
    memory_headroom: float = Field(default=0.1, ge=0, lt=1)

    @field_validator("batch_sizes", "accumulation_steps", mode="before")
    @classmethod
    def _parse_int_list(cls, value: object) -> object:
        if isinstance(value, str):
            items = [item.strip() for item in value.split(",") if item.strip()]
            if not items or not all(item.isdigit() and int(item) >= 1 for item in items):
                raise ValueError(
                    f"{value!r} is not a comma-separated list of positive integers (e.g. 16,32,64)"
                )
            return tuple(int(item) for item in items)
        return value

    @field_validator("batch_sizes", "accumulation_steps")
    @classmethod
    def _positive_unique(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not value or any(item < 1 for item in value):
            raise ValueError(f"{list(value)} must be a non-empty list of integers >= 1")
        return tuple(sorted(set(value)))

    @field_validator("knobs", mode="before")
    @classmethod
    def _parse_knobs(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("knobs")
    @classmethod
    def _known_knobs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        known = ("all", *KNOB_GROUPS, *TUNED_KNOBS)
        for name in value:
            if name not in known:
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(
                    f"unknown knob group {name!r}{hint} (use classic, all, or some of "
                    f"{', '.join(known[1:])})"
                )
        if not value:
            raise ValueError("name at least one knob group, e.g. classic")
        return value

    @property
    def searched_knobs(self) -> frozenset[str]:
        """The knobs `knobs` names, groups expanded."""
        names: set[str] = set()
        for name in self.knobs:
            if name == "all":
                names.update(TUNED_KNOBS)
            else:
                names.update(KNOB_GROUPS.get(name, (name,)))
        return frozenset(names)

    @field_validator("storage")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = value.split("://", 1)[0].split("+", 1)[0] if "://" in value else ""
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(
                f"unknown storage URL scheme {scheme or value!r}: use sqlite:///path/study.db, "
                "journal:///path/study.log, postgresql://user:pass@host/db or "
                "mysql://user:pass@host/db"
            )
        return value

    @field_validator("study_name", "worker")
    @classmethod
    def _name_is_usable(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", value):
            raise ValueError(
                f"{value!r} is not a usable name: use letters, digits, '.', '_' or '-'"
            )
        return value

    @model_validator(mode="after")
    def _batch_modes_exclusive(self) -> TuneSettings:
        if self.global_batch_size is not None and self.batch_sizes is not None:
            raise ValueError(
                "global_batch_size and batch_sizes exclude each other: with a fixed global "
                "batch advisor derives the micro-batches; choose one"
            )
        return self

    @property
    def resolved_study_name(self) -> str:
        """The study name, derived from the spec when none was given (stable across runs)."""
        if self.study_name:
            return self.study_name
        module, _, attr = self.spec.rpartition(":")
        stem = Path(module).stem if module.endswith(".py") else module.rsplit(".", 1)[-1]
        name = re.sub(r"[^A-Za-z0-9_.-]+", "-", f"{stem}-{attr}").strip("-.")
        return name or "study"

    @property
    def trial_timeout_s(self) -> float:
        return self.trial_timeout or 120.0 + 10.0 * self.trial_seconds

    @property
    def out_dir(self) -> Path:
        return self.out if self.out is not None else Path("reports") / self.resolved_study_name

    @property
    def worker_name(self) -> str:
        return self.worker or socket.gethostname()

    @property
    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.out_dir / 'study.db').resolve()}"


def settings_error(exc: ValidationError, prefix: str = "invalid settings") -> SettingsError:
    """Turn a pydantic error into one line naming every problem; an unknown name comes with
    the closest valid one."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "settings"
        if error["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown setting{_closest_setting(where)}")
            continue
        message = str(error["msg"]).removeprefix("Value error, ")
        got = error.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        problems.append(f"{where}: {message}{shown}")
    return SettingsError(f"{prefix}: " + "; ".join(problems))


def _closest_setting(name: str) -> str:
    close = difflib.get_close_matches(name, TuneSettings.model_fields, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
