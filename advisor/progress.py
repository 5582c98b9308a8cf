"""How a tuning run reports what it is doing; the CLI renders it, the Python API may ignore it."""

from __future__ import annotations

from typing import Protocol

from advisor.knobs import TrialConfig
from advisor.results import NoiseScale, Racer, TrialRecord

__all__ = ["NullProgress", "Progress"]


class Progress(Protocol):
    """How a tuning run reports what it is doing; the CLI shows it live."""

    def stage(self, message: str) -> None:
        """A step of the run outside trials (probing, pre-flight, writing outputs)."""

    def trial_started(self, label: str, config: TrialConfig) -> None:
        """A trial process is starting; `label` says which, e.g. 'trial 3/12' or 'confirm 1/4'."""

    def trial_phase(self, phase: str) -> None:
        """The running trial entered a phase: first_step, warmup, measure."""

    def trial_finished(self, record: TrialRecord, best: float | None) -> None:
        """A trial ended (any status); `best` is the best eligible samples/s so far."""

    def racer_finished(self, racer: Racer) -> None:
        """A race trial ended (any status)."""

    def noise_finished(self, noise: NoiseScale | None, failure: str | None) -> None:
        """The noise-scale trial ended: what it measured, or why it failed (`noise` None)."""


class NullProgress:
    """Progress that shows nothing: the Python API's default."""

    def stage(self, message: str) -> None:
        pass

    def trial_started(self, label: str, config: TrialConfig) -> None:
        pass

    def trial_phase(self, phase: str) -> None:
        pass

    def trial_finished(self, record: TrialRecord, best: float | None) -> None:
        pass

    def racer_finished(self, racer: Racer) -> None:
        pass

    def noise_finished(self, noise: NoiseScale | None, failure: str | None) -> None:
        pass
