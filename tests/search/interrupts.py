"""A progress that interrupts a race after its first racer, as Ctrl-C would."""

from advisor.knobs import TrialConfig
from advisor.progress import NullProgress
from advisor.results import Racer


class StopAfterFirstRacer(NullProgress):
    """Raises KeyboardInterrupt when the first racer it saw start has finished; counts the
    racers started (`started`)."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def trial_started(self, label: str, config: TrialConfig) -> None:
        self.started.append(label)

    def racer_finished(self, racer: Racer) -> None:
        if len(self.started) == 1:
            raise KeyboardInterrupt
