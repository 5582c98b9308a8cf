"""What the search, the re-measurements and the checks share while a tune runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from advisor.progress import Progress
from advisor.results import HardwareProfile
from advisor.search.checks import NumericsCheck
from advisor.search.space import SearchSpace
from advisor.settings import TuneSettings
from advisor.trial.orders import TrialRunner

__all__ = ["SearchContext"]


@dataclass(frozen=True)
class SearchContext:
    """What the search and the confirmation runs share."""

    settings: TuneSettings
    space: SearchSpace
    hardware: HardwareProfile
    runner: TrialRunner
    logs_dir: Path
    progress: Progress
    numerics: NumericsCheck | None = None  # None: no check of knobs that change the maths
