"""Early stopping of search trials: Optuna's pruner interface over the window's throughput.

A search trial reports its running samples/s every 0.1 s of its timed window (the step is the
elapsed window in milliseconds). Once `after` of the window has passed, a trial running below
`fraction` of the best finished trial is told to stop: its window ends there, and the trial
keeps the shorter measurement. Far below the best, the shorter window cannot change the choice
(single windows vary by about 12 % on the project's VM: benchmarks/measurement_noise.py), and
the time goes to configurations that can win.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["SlowerThanBestPruner", "make_pruner"]

CHECK_AFTER = 0.3  # of the window


class SlowerThanBestPruner(optuna.pruners.BasePruner):
    """Prune a trial whose latest reported throughput is below `fraction` x the best value of
    the study's finished trials, from step `first_step` on."""

    def __init__(self, fraction: float, first_step: int) -> None:
        self._fraction = fraction
        self._first_step = first_step
        self._best: dict[int, float | None] = {}  # per trial: the best when it first asked

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self._first_step:
            return False
        if trial.number not in self._best:
            self._best[trial.number] = _best_value(study)
        best = self._best[trial.number]
        return best is not None and trial.intermediate_values[step] < self._fraction * best


def _best_value(study: optuna.Study) -> float | None:
    values = [
        trial.value
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if trial.value
    ]
    return max(values, default=None)


def make_pruner(fraction: float, trial_seconds: float) -> optuna.pruners.BasePruner:
    """The pruner for `--early-stop FRACTION` (0: none) over windows of `trial_seconds`."""
    if not fraction:
        return optuna.pruners.NopPruner()
    return SlowerThanBestPruner(fraction, first_step=round(CHECK_AFTER * trial_seconds * 1000))
