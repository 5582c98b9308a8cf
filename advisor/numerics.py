"""The numerics check: a knob that changes the arithmetic must not change what the model learns.

`torch.compile`, channels-last convolutions, TF32 matmuls and fused or foreach optimizers compute
the same training step in another order or precision. Each trial records the losses of its first
optimizer steps from the seeded initial weights (`TrialResult.early_losses`); a configuration with
such a knob is compared with its twin, the same configuration without them (same batch, same AMP,
same seed: the same batches from the same weights), and rejected when a loss differs by more than
the tolerance. The twin's losses come from a measured trial of that configuration, or else from a
short reference run of it (`mode="reference"`: its first steps only).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from advisor.config import MATHS_KNOBS, TrialConfig
from advisor.results import TrialResult
from advisor.trial.runner import TrialLaunch, run_trial

__all__ = ["NumericsCheck", "maths_problem"]

# Relative tolerance per AMP setting: fp32 reorderings move a loss by about 1e-6 and TF32 by
# about 1e-3; under autocast the twin rounds differently too.
TOLERANCE = {"off": 0.01, "bf16": 0.05, "fp16": 0.05}
ABSOLUTE = 1e-6


class NumericsCheck:
    """Twin losses per configuration, remembered from trials or measured on demand."""

    def __init__(self, launch: TrialLaunch, logs_dir: Path) -> None:
        self._launch = launch
        self._logs_dir = logs_dir
        self._twins: dict[TrialConfig, TrialResult] = {}

    def remember(self, result: TrialResult) -> None:
        """Keep a measured trial's early losses, if it is some configuration's twin."""
        if result.feasible and result.early_losses and result.config == result.config.maths_twin:
            self._twins.setdefault(result.config, result)

    def problem(
        self, result: TrialResult, on_phase: Callable[[str], None] | None = None
    ) -> str | None:
        """Why a feasible trial's configuration cannot be recommended on numerical grounds."""
        twin = result.config.maths_twin
        if not result.feasible or twin == result.config:
            return None
        if twin not in self._twins:
            log = self._logs_dir / f"reference-{len(self._twins) + 1}.log"
            self._twins[twin] = run_trial(
                self._launch, twin, log, mode="reference", on_phase=on_phase
            )
        return maths_problem(result, self._twins[twin])


def maths_problem(result: TrialResult, reference: TrialResult) -> str | None:
    """How `result`'s early losses depart from its twin's beyond the tolerance, or None."""
    knobs = _changed_knobs(result.config)
    if not reference.feasible:
        return (
            f"its numerics could not be checked: the same configuration without {knobs} "
            f"failed ({reference.status}: {reference.reason})"
        )
    tolerance = TOLERANCE[result.config.amp]
    pairs = zip(result.early_losses, reference.early_losses, strict=False)
    for step, (got, want) in enumerate(pairs, start=1):
        if not abs(got - want) <= tolerance * abs(want) + ABSOLUTE:  # also catches NaN
            return (
                f"{knobs} changed the maths: the loss of step {step} was {got:.6g} against "
                f"{want:.6g} without (tolerance {tolerance:.0%})"
            )
    return None


def _changed_knobs(config: TrialConfig) -> str:
    twin = config.maths_twin
    changed = [
        f"{name}={getattr(config, name)}"
        for name in MATHS_KNOBS
        if getattr(config, name) != getattr(twin, name)
    ]
    return " and ".join(changed)
