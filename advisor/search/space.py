"""The search space for one machine and one task: searched domains, fixed knobs and the baseline.

Knobs that cannot have an effect on the probed hardware are fixed, not searched, and each carries
the reason. Everything else is left to measurement.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from itertools import product
from math import prod
from typing import TYPE_CHECKING, Any

from advisor.errors import SettingsError
from advisor.knobs import KNOB_GROUPS, Device, TrialConfig, parse_parallel
from advisor.results import FixedKnob, HardwareProfile, TaskSummary
from advisor.settings import TuneSettings

if TYPE_CHECKING:
    import optuna

__all__ = ["SearchSpace", "build_space", "resolve_device"]

BATCH_SCALES = (-2, -1, 0, 1, 2, 3, 4, 5)  # powers of two around the user's batch size


@dataclass(frozen=True)
class SearchSpace:
    device: Device
    domains: dict[str, tuple[Any, ...]]
    fixed_values: dict[str, Any]
    fixed: tuple[FixedKnob, ...]
    baseline: TrialConfig
    global_batch_size: int | None = None
    accumulation_choices: tuple[int, ...] = (1,)
    dataset_size: int | None = None

    @cached_property
    def size(self) -> int:
        """How many distinct configurations the space holds, counted by factors: only batch,
        accumulation and layout can make a combination impossible, and without loader workers
        the loader knobs make no difference (so no product of every domain is built)."""
        coupled = [n for n in ("batch_size", "accumulation_steps", "parallel") if n in self.domains]
        possible = sum(
            1
            for combo in product(*(self.domains[n] for n in coupled))
            if self.problem(dict(zip(coupled, combo, strict=True))) is None
        )
        loader = ("prefetch_factor", "persistent_workers")
        per_worker_count = prod(len(self.domains[n]) for n in loader if n in self.domains)
        workers = self.domains.get("num_workers", (self.fixed_values.get("num_workers", 0),))
        free = prod(
            len(values)
            for name, values in self.domains.items()
            if name not in (*coupled, "num_workers", *loader)
        )
        return possible * free * sum(per_worker_count if w else 1 for w in workers)

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        return {
            name: trial.suggest_categorical(name, values) for name, values in self.domains.items()
        }

    def problem(self, params: dict[str, Any]) -> str | None:
        """Why a combination of searched values is no configuration at all, or None.

        Such combinations exist because the domains are a product: under `--global-batch-size`
        a micro-batch may not divide the global batch at some world size, and DDP ranks each
        read only their share of the dataset.
        """
        values = self._values(params)
        batch, world = values["batch_size"], values.get("world_size", 1)
        total = self.global_batch_size
        if total is not None and total % (batch * world):
            return f"global batch {total} is no multiple of batch {batch} x {world} processes"
        if total is not None and total // (batch * world) not in self.accumulation_choices:
            return (
                f"global batch {total} with batch {batch} x {world} processes needs "
                f"{total // (batch * world)} accumulation steps, not one of "
                f"{list(self.accumulation_choices)}"
            )
        if world > 1 and self.dataset_size is not None and batch * world > self.dataset_size:
            return (
                f"each of {world} ranks reads {self.dataset_size // world} samples, "
                f"fewer than batch {batch}"
            )
        return None

    def config_from_params(self, params: dict[str, Any]) -> TrialConfig:
        return TrialConfig(device=self.device, **self._values(params))

    def params_of(self, config: TrialConfig) -> dict[str, Any]:
        return {name: getattr(config, name) for name in self.domains}

    def contains(self, config: TrialConfig) -> bool:
        return all(getattr(config, name) in values for name, values in self.domains.items())

    def all_configs(self) -> list[TrialConfig]:
        return [
            self.config_from_params(params)
            for params in self._all_params()
            if self.problem(params) is None
        ]

    def _all_params(self) -> list[dict[str, Any]]:
        names = list(self.domains)
        return [dict(zip(names, combo, strict=True)) for combo in product(*self.domains.values())]

    def _values(self, params: dict[str, Any]) -> dict[str, Any]:
        """TrialConfig fields from searched params: `parallel` is mode and world size together."""
        values = {**self.fixed_values, **params}
        if not values.get("num_workers"):  # without workers these cannot matter: one config
            values["prefetch_factor"], values["persistent_workers"] = 2, True
        if "parallel" in values:
            values["parallel_mode"], values["world_size"] = parse_parallel(values.pop("parallel"))
        if self.global_batch_size is not None:
            per_step = values["batch_size"] * values.get("world_size", 1)
            values["accumulation_steps"] = max(1, self.global_batch_size // per_step)
        return values


def resolve_device(requested: str, hardware: HardwareProfile) -> Device:
    if requested == "cuda" and not hardware.has_cuda:
        raise SettingsError(
            f"--device cuda, but torch {hardware.torch_version} sees no CUDA GPU: "
            "use --device cpu or install a CUDA build of torch"
        )
    if requested == "auto":
        return "cuda" if hardware.has_cuda else "cpu"
    return requested  # type: ignore[return-value]


class _Builder:
    """Collects searched domains and fixed knobs (with reasons) while the space is built."""

    def __init__(self) -> None:
        self.domains: dict[str, tuple[Any, ...]] = {}
        self.fixed_values: dict[str, Any] = {}
        self.fixed: list[FixedKnob] = []

    def search(self, name: str, values: tuple[Any, ...]) -> None:
        self.domains[name] = values

    def fix(self, name: str, value: Any, reason: str) -> None:
        self.fixed_values[name] = value
        self.note(name, str(value), reason)

    def note(self, name: str, value: str, reason: str) -> None:
        self.fixed.append(FixedKnob(name=name, value=value, reason=reason))


def build_space(
    settings: TuneSettings, hardware: HardwareProfile, task: TaskSummary
) -> SearchSpace:
    device = resolve_device(settings.device, hardware)
    space = _Builder()
    worlds = _add_parallel_domain(settings, device, hardware, task, space)
    _add_batch_domains(settings, task, worlds, space)
    space.search("amp", _amp_values(device, hardware))
    if device == "cpu":
        space.note("amp", "off|bf16", "fp16 autocast needs CUDA; CPU autocast uses bf16")
    _add_loader_domains(device, hardware, task, space)
    if device == "cuda" and hardware.cudnn_version is not None:
        space.search("cudnn_benchmark", (False, True))
    else:
        space.fix("cudnn_benchmark", False, "no cuDNN on this device: the flag has no effect")
    _add_beyond_classic(settings, device, hardware, task, space)
    baseline = _baseline(settings, task, device, space.domains["batch_size"])
    return SearchSpace(
        device=device,
        domains=space.domains,
        fixed_values=space.fixed_values,
        fixed=tuple(space.fixed),
        baseline=baseline,
        global_batch_size=settings.global_batch_size,
        accumulation_choices=settings.accumulation_steps,
        dataset_size=task.dataset_size,
    )


def _add_parallel_domain(
    settings: TuneSettings,
    device: Device,
    hardware: HardwareProfile,
    task: TaskSummary,
    space: _Builder,
) -> tuple[int, ...]:
    """Search single process, DataParallel and DDP world sizes where they can run; return the
    process counts in the space."""
    available = len(hardware.gpus) if device == "cuda" else hardware.cores
    limit = min(available, settings.max_world_size or available)
    worlds = () if task.iterable else _world_sizes(device, limit)
    choices = ["none"]
    if device == "cuda" and len(hardware.gpus) >= 2:
        choices.append("dp")
    choices.extend(f"ddp-{world}" for world in worlds)
    if len(choices) == 1:
        space.fix("parallel_mode", "none", _single_process_reason(settings, device, task, limit))
        return (1,)
    space.search("parallel", tuple(choices))
    if device == "cpu":
        space.note("parallel_mode", "none|ddp", "DataParallel needs >= 2 CUDA GPUs")
    return (1, *worlds)


def _world_sizes(device: Device, limit: int) -> tuple[int, ...]:
    """DDP process counts: every count up to the GPUs; on CPU powers of two and all cores."""
    if device == "cuda":
        return tuple(range(2, limit + 1))
    counts = {2**k for k in range(1, limit.bit_length())} | {limit}
    return tuple(sorted(n for n in counts if 2 <= n <= limit))


def _single_process_reason(
    settings: TuneSettings, device: Device, task: TaskSummary, limit: int
) -> str:
    if task.iterable:
        return (
            "an IterableDataset cannot be sharded between DDP ranks (DistributedSampler needs "
            "an index); every rank would read the same stream"
        )
    if settings.max_world_size == 1:
        return "--max-world-size 1"
    if device == "cuda":
        return "one GPU: DataParallel and DDP need >= 2"
    return f"{limit} core: DDP ranks would only share it"


def _add_batch_domains(
    settings: TuneSettings, task: TaskSummary, worlds: tuple[int, ...], space: _Builder
) -> None:
    limit = task.dataset_size or 2**31
    if settings.global_batch_size is not None:
        total = settings.global_batch_size
        splits = {a * w for a in settings.accumulation_steps for w in worlds}
        micro = sorted({total // n for n in splits if total % n == 0 and total // n <= limit})
        if not micro:
            raise SettingsError(
                f"no micro-batch fits global batch {total} with accumulation steps "
                f"{list(settings.accumulation_steps)} and {limit} samples: choose another "
                "--global-batch-size"
            )
        space.search("batch_size", tuple(micro))
        space.note(
            "accumulation_steps",
            "derived",
            f"global batch {total} = batch x accumulation x processes",
        )
        return
    user = task.user_batch_size
    wanted = settings.batch_sizes or tuple(
        sorted({max(1, user * 2**k if k >= 0 else user >> -k) for k in BATCH_SCALES})
    )
    sizes = tuple(b for b in wanted if b <= limit)
    if not sizes:
        raise SettingsError(
            f"every batch size {list(wanted)} exceeds the dataset's {limit} samples: "
            "pass smaller --batch-sizes"
        )
    space.search("batch_size", sizes)
    space.search("accumulation_steps", settings.accumulation_steps)


def _amp_values(device: Device, hardware: HardwareProfile) -> tuple[str, ...]:
    if device == "cpu":
        return ("off", "bf16")
    if all(gpu.bf16 for gpu in hardware.gpus):
        return ("off", "fp16", "bf16")
    return ("off", "fp16")


def _add_loader_domains(
    device: Device, hardware: HardwareProfile, task: TaskSummary, space: _Builder
) -> None:
    if task.iterable:
        space.fix(
            "num_workers",
            0,
            "an IterableDataset is replicated in every worker unless it shards itself with "
            "get_worker_info(); advisor does not change what your data means",
        )
    else:
        space.search("num_workers", _worker_counts(hardware.cores))
    if device == "cuda":
        space.search("pin_memory", (False, True))
    else:
        space.fix(
            "pin_memory", False, "no CUDA device: pinned memory only speeds host-to-GPU copies"
        )


def _add_beyond_classic(
    settings: TuneSettings,
    device: Device,
    hardware: HardwareProfile,
    task: TaskSummary,
    space: _Builder,
) -> None:
    """compile, channels_last, matmul precision, loader prefetching and the optimizer's
    implementation: searched when `--knobs` names them and they can matter here."""
    wanted = settings.searched_knobs
    workers = any(space.domains.get("num_workers", (0,)))
    offers: list[tuple[str, tuple[Any, ...], str | None]] = [
        ("compile", ("off", "default", "max-autotune-no-cudagraphs"), _compile_problem(device)),
        ("channels_last", (False, True), None if task.conv2d else NO_CONV2D),
        ("matmul_precision", ("highest", "high"), _tf32_problem(device, hardware)),
        ("prefetch_factor", (2, 4), None if workers else NO_WORKERS),
        ("persistent_workers", (True, False), None if workers else NO_WORKERS),
        ("optimizer_impl", ("default", "foreach", "fused"), _optimizer_problem(task)),
    ]
    for name, values, problem in offers:
        default = TrialConfig.model_fields[name].default
        if name not in wanted:
            group = next(g for g, knobs in KNOB_GROUPS.items() if name in knobs)
            space.fix(name, default, f"not searched: add it with --knobs classic,{group}")
        elif problem is not None:
            space.fix(name, default, problem)
        else:
            space.search(name, values)


NO_CONV2D = "only 4-D convolution inputs have a channels-last layout; the model has no Conv2d"
NO_WORKERS = "only DataLoader workers prefetch, and num_workers is fixed at 0"


def _compile_problem(device: Device) -> str | None:
    if device == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs triton, which is not installed"
        return None
    if not any(shutil.which(cxx) for cxx in (os.environ.get("CXX", "g++"), "g++", "clang++")):
        return "torch.compile's inductor backend needs a C++ compiler on CPU (g++ or clang++)"
    return None


def _tf32_problem(device: Device, hardware: HardwareProfile) -> str | None:
    if device == "cpu":
        return "TF32 matmuls exist on CUDA GPUs only"
    if any(float(gpu.capability) < 8.0 for gpu in hardware.gpus):
        return "TF32 needs an Ampere or newer GPU (compute capability 8.0)"
    return None


def _optimizer_problem(task: TaskSummary) -> str | None:
    if task.custom_optimizer:
        return "your factory builds its own optimizer; advisor does not change its arguments"
    return None


def _worker_counts(cores: int) -> tuple[int, ...]:
    if cores <= 4:
        return tuple(range(cores + 1))
    counts = {0, 1, cores}
    counts.update(2**k for k in range(1, cores.bit_length()) if 2**k <= cores)
    return tuple(sorted(counts))


def _baseline(
    settings: TuneSettings, task: TaskSummary, device: Device, sizes: tuple[int, ...]
) -> TrialConfig:
    """The user's configuration: their batch size (or the nearest searched one), fp32, no loader
    workers, no pinning, benchmark off."""
    total = settings.global_batch_size
    if total is not None:  # one process: the accumulation must be one the settings allow
        sizes = tuple(b for b in sizes if total // b in settings.accumulation_steps)
        if not sizes:
            raise SettingsError(
                f"no micro-batch makes global batch {total} in one process with accumulation "
                f"steps {list(settings.accumulation_steps)}: choose another --global-batch-size"
            )
    batch = min(sizes, key=lambda b: (abs(b - task.user_batch_size), b))
    return TrialConfig(
        device=device,
        batch_size=batch,
        accumulation_steps=1 if total is None else total // batch,
    )
