"""How a tuning run reports what it is doing; the CLI renders it, the Python API may ignore it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from advisor.knobs import TrialConfig
from advisor.results import NoiseScale, Racer, TrialRecord

__all__ = ["NullProgress", "Progress", "Stage"]

StageKind = Literal[
    "racing",
    "race-replicate",
    "race-goes-on",
    "race-stays",
    "race-went-on-alone",
    "race-skips",
    "schedule-tracks",
    "schedule-races",
    "same-error",
]


@dataclass(frozen=True)
class Stage:
    """A step of the decision, as data (`advisor.console` words it): `racing` `count`
    configurations for `seconds` each; the race's replicate `count` begins from a seed of its
    own (`race-replicate`); the race kept your batch and `count` finalists go on to
    `seconds` (`race-goes-on`), or it stays at its length for the reason `label`
    (`race-stays`: an `advisor.decide.race.extend.NotGoingOn`), or replicate 1 went on to
    `until_s` and the other batch cannot win, so the verdict after `seconds` stands
    (`race-went-on-alone`); your loss did not fall, so `count` racers are skipped
    (`race-skips`); the schedule's tune trains your configuration for `seconds`
    (`schedule-tracks`) and races `label` for at most `seconds` to `loss`
    (`schedule-races`); your baseline and the next `count` trials all raised `label`
    (`same-error`)."""

    kind: StageKind
    count: int = 0
    seconds: float = 0.0
    loss: float = 0.0
    label: str = ""
    until_s: float = 0.0


class Progress(Protocol):
    """How a tuning run reports what it is doing; the CLI shows it live."""

    def stage(self, message: str | Stage) -> None:
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

    def stage(self, message: str | Stage) -> None:
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
