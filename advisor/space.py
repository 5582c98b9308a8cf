"""The search space for one machine and one task: searched domains, fixed knobs and the baseline.

Knobs that cannot have an effect on the probed hardware are fixed, not searched, and each carries
the reason. Everything else is left to measurement.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import TYPE_CHECKING, Any

from advisor.config import Device, TrialConfig, TuneSettings
from advisor.errors import SettingsError
from advisor.results import FixedKnob, HardwareProfile, TaskSummary

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

    @property
    def size(self) -> int:
        count = 1
        for values in self.domains.values():
            count *= len(values)
        return count

    def suggest(self, trial: optuna.Trial) -> TrialConfig:
        params = {
            name: trial.suggest_categorical(name, values) for name, values in self.domains.items()
        }
        return self.config_from_params(params)

    def config_from_params(self, params: dict[str, Any]) -> TrialConfig:
        values = {**self.fixed_values, **params}
        if self.global_batch_size is not None:
            values["accumulation_steps"] = self.global_batch_size // values["batch_size"]
        return TrialConfig(device=self.device, **values)

    def params_of(self, config: TrialConfig) -> dict[str, Any]:
        return {name: getattr(config, name) for name in self.domains}

    def contains(self, config: TrialConfig) -> bool:
        return all(getattr(config, name) in values for name, values in self.domains.items())

    def all_configs(self) -> list[TrialConfig]:
        names = list(self.domains)
        return [
            self.config_from_params(dict(zip(names, combo, strict=True)))
            for combo in product(*self.domains.values())
        ]


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
    space.fix("parallel_mode", "none", _parallel_reason(device, hardware))
    _add_batch_domains(settings, task, space)
    space.search("amp", _amp_values(device, hardware))
    if device == "cpu":
        space.note("amp", "off|bf16", "fp16 autocast needs CUDA; CPU autocast uses bf16")
    _add_loader_domains(device, hardware, task, space)
    if device == "cuda" and hardware.cudnn_version is not None:
        space.search("cudnn_benchmark", (False, True))
    else:
        space.fix("cudnn_benchmark", False, "no cuDNN on this device: the flag has no effect")
    baseline = _baseline(settings, task, device, space.domains["batch_size"])
    return SearchSpace(
        device=device,
        domains=space.domains,
        fixed_values=space.fixed_values,
        fixed=tuple(space.fixed),
        baseline=baseline,
        global_batch_size=settings.global_batch_size,
    )


def _parallel_reason(device: Device, hardware: HardwareProfile) -> str:
    if device == "cuda" and len(hardware.gpus) >= 2:
        return (
            f"{len(hardware.gpus)} GPUs found, but this version measures single-process "
            "training only; DataParallel/DDP trials are not implemented yet"
        )
    if device == "cuda":
        return "one GPU: DataParallel needs >= 2; DDP trials are not implemented yet"
    return "DataParallel needs >= 2 CUDA GPUs; DDP trials are not implemented yet"


def _add_batch_domains(settings: TuneSettings, task: TaskSummary, space: _Builder) -> None:
    limit = task.dataset_size or 2**31
    if settings.global_batch_size is not None:
        total = settings.global_batch_size
        micro = [total // a for a in settings.accumulation_steps if total % a == 0]
        micro = sorted(b for b in micro if b <= limit)
        if not micro:
            raise SettingsError(
                f"no micro-batch fits global batch {total} with accumulation steps "
                f"{list(settings.accumulation_steps)} and {limit} samples: choose another "
                "--global-batch-size"
            )
        space.search("batch_size", tuple(micro))
        space.note("accumulation_steps", "derived", f"global batch {total} = batch x accumulation")
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
    batch = min(sizes, key=lambda b: (abs(b - task.user_batch_size), b))
    total = settings.global_batch_size
    return TrialConfig(
        device=device,
        batch_size=batch,
        accumulation_steps=1 if total is None else total // batch,
    )
