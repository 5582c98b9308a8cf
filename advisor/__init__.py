"""advisor: find, by measurement, the fastest way to train a PyTorch model on this machine."""

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from advisor.errors import (
    AdvisorError,
    BadInputError,
    FactoryError,
    FirstStepError,
    NoFeasibleConfigError,
    SettingsError,
    SpecError,
    StorageError,
)
from advisor.knobs import TrialConfig
from advisor.results import (
    FixedKnob,
    GpuInfo,
    HardwareProfile,
    Recommendation,
    TaskSummary,
    TrialResult,
    TuneResult,
)
from advisor.settings import TuneSettings
from advisor.task import TrainingTask

if TYPE_CHECKING:
    from advisor.api import export, load_result, tune, validate, write_reports, write_script

_API = ("export", "load_result", "tune", "validate", "write_reports", "write_script")


def __getattr__(name: str) -> Any:
    # Lazy: trial processes and factories import advisor; they need no Optuna or Jinja2.
    if name in _API:
        from advisor import api

        return getattr(api, name)
    raise AttributeError(f"module 'advisor' has no attribute {name!r}")


try:
    __version__ = version("advisor")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "AdvisorError",
    "BadInputError",
    "FactoryError",
    "FirstStepError",
    "FixedKnob",
    "GpuInfo",
    "HardwareProfile",
    "NoFeasibleConfigError",
    "Recommendation",
    "SettingsError",
    "SpecError",
    "StorageError",
    "TaskSummary",
    "TrainingTask",
    "TrialConfig",
    "TrialResult",
    "TuneResult",
    "TuneSettings",
    "__version__",
    "export",
    "load_result",
    "tune",
    "validate",
    "write_reports",
    "write_script",
]
