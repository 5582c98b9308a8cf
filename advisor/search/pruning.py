"""Early stopping of search trials: Optuna's pruner interface over their projected throughput.

From its warm-up on, a search trial reports its projected samples/s about every 0.1 s (the step
is the milliseconds since its warm-up began; `advisor.trial.parent.runner` projects it). Once
`CHECK_AFTER` of a window's time has passed (when a search trial's warm-up may have settled and
its window may end, `advisor.trial.child.measure`), a trial projected below `fraction` of the best
finished trial is told to stop, in whatever phase: in its window, it keeps the steps it timed;
before its first, its projection. Far below the best, the shorter measurement cannot change
the choice (single windows vary by about 12 % on the project's VM:
benchmarks/measurement_noise.py), and the time goes to configurations that can win.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial, TrialState

from advisor.search.records import TrialKey
from advisor.trial.protocol import PRECISE_AFTER_FRACTION

__all__ = ["SlowerThanBestPruner", "best_value", "make_pruner", "stop_reason"]

CHECK_AFTER = PRECISE_AFTER_FRACTION  # of the window


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
            self._best[trial.number] = best_value(study)
        best = self._best[trial.number]
        # values are goodput: the projected samples/s over the trial's samples ratio
        ratio = trial.user_attrs.get(TrialKey.SAMPLES_RATIO, 1.0)
        return best is not None and trial.intermediate_values[step] / ratio < self._fraction * best


def stop_reason(projected: float, best: float | None) -> str:
    """Why a trial was stopped, e.g. `stopped: projected 900 samples/s, 16.7x slower than the
    best (15,000)`."""
    if not best or projected <= 0:
        return f"stopped: projected {projected:,.0f} samples/s, far slower than the best"
    return (
        f"stopped: projected {projected:,.0f} samples/s, {best / projected:.1f}x slower than "
        f"the best ({best:,.0f})"
    )


def best_value(study: optuna.Study) -> float | None:
    """The highest value of the study's finished trials: goodput, samples/s where the search
    ranks by samples/s (ineligible ones count 0)."""
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
