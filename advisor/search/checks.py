"""Checks that decide whether a task or a configuration can be used, beyond "it trained".

- **memory**: a finished trial must leave the memory headroom the settings ask for, and a batch
  that ran out of memory rules out larger ones with the same other knobs, without running them.
- **numerics**: a knob that changes the arithmetic must not change what the model learns.
  `torch.compile`, channels-last convolutions, TF32 matmuls and fused or foreach optimizers
  compute the same training step in another order or precision. Each trial records the losses
  of its first optimizer steps from the seeded initial weights (`TrialResult.early_losses`); a
  configuration with such a knob is compared with its twin, the same configuration without them
  (same batch, same AMP, same seed: the same batches from the same weights), and rejected when a
  loss differs by more than the tolerance. The twin's losses come from a measured trial of that
  configuration, or else from a short reference run of it (`mode="reference"`: its first steps
  only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from advisor.knobs import KNOBS, TrialConfig
from advisor.results import HardwareProfile, TrialRecord, TrialResult
from advisor.search.memory import memory_limit
from advisor.settings import TuneSettings
from advisor.trial.orders import ReferenceOrder, TrialRunner
from advisor.trial.protocol import EARLY_STEPS

__all__ = ["NumericsCheck", "known_out_of_memory", "maths_problem", "memory_problem"]


# --- memory ------------------------------------------------------------------------------------
# Knobs that do not change the memory one micro-batch needs: accumulation only repeats it.
_MEMORY_NEUTRAL = {"batch_size", "accumulation_steps"}
_LAYOUT = _MEMORY_NEUTRAL | {"parallel_mode", "world_size", "reshard_after_forward"}


def memory_problem(
    result: TrialResult, hardware: HardwareProfile, settings: TuneSettings
) -> str | None:
    """Why a finished trial's peak memory is over the budget (`--memory-budget`), or leaves
    less than the headroom free; None when it fits."""
    if not result.feasible or result.peak_memory_bytes is None:
        return None
    limit = memory_limit(settings.memory_budget, settings.memory_headroom, result.config, hardware)
    return limit.problem(result.peak_memory_bytes)


def known_out_of_memory(config: TrialConfig, records: Iterable[TrialRecord]) -> str | None:
    """Why `config` cannot fit, known without running it: a trial with every other knob the
    same (accumulation aside) and a batch no larger ran out of memory or left too little free.

    Peak memory grows with the micro-batch, so the larger batch needs at least as much. On CPU
    the ranks of a DDP or FSDP trial share the host and their peaks add up: each holds its own
    micro-batch's activations and together at least one copy of the model's state, so N ranks
    need at least the memory of one process at the same micro-batch (measured: 2.38 and 2.62
    GiB for DDP and FSDP with two ranks, 1.06 GiB alone; `fsdp_memory` in docs/benchmarks.md).
    """
    for record in records:
        tried = record.result.config
        if tried.batch_size > config.batch_size or not _no_smaller(tried, config):
            continue
        which = f"batch {tried.batch_size}" + (
            " in one process" if tried.world_size < config.world_size else ""
        )
        if record.result.status == "oom":
            return (
                f"batch {config.batch_size} needs at least the memory of {which}, which ran "
                f"out of memory in trial {record.number} with the same other knobs"
            )
        if record.infeasible_reason is not None:
            return (
                f"batch {config.batch_size} needs at least the memory of {which}, whose "
                f"{record.infeasible_reason} in trial {record.number}"
            )
    return None


def _no_smaller(tried: TrialConfig, config: TrialConfig) -> bool:
    """Whether `config` needs at least `tried`'s memory at a micro-batch no smaller: the same
    other knobs, and the same layout or, on CPU, `tried` one process and `config` ranks."""
    if _same_but_batch(tried, config):
        return True
    spread = config.device == "cpu" and tried.world_size == 1 and config.distributed
    return spread and tried.model_dump(exclude=_LAYOUT) == config.model_dump(exclude=_LAYOUT)


def _same_but_batch(first: TrialConfig, second: TrialConfig) -> bool:
    return first.model_dump(exclude=_MEMORY_NEUTRAL) == second.model_dump(exclude=_MEMORY_NEUTRAL)


# --- numerics ----------------------------------------------------------------------------------
# Relative tolerance per AMP setting: fp32 reorderings move a loss by about 1e-6 and TF32 by
# about 1e-3; under autocast the twin rounds differently too.
TOLERANCE = {"off": 0.01, "bf16": 0.05, "fp16": 0.05}
ABSOLUTE = 1e-6


class NumericsCheck:
    """Twin losses per configuration, remembered from trials or measured on demand."""

    def __init__(self, runner: TrialRunner, logs_dir: Path) -> None:
        self._runner = runner
        self._logs_dir = logs_dir
        self._twins: dict[TrialConfig, TrialResult] = {}

    def remember(self, result: TrialResult) -> None:
        """Keep a measured trial's early losses, if it is some configuration's twin and has all
        of them (a trial timed in parts keeps only its first step's and warm-up's)."""
        whole = len(result.early_losses) >= EARLY_STEPS
        if result.feasible and whole and result.config == result.config.maths_twin:
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
            self._twins[twin] = self._runner.run(
                ReferenceOrder(config=twin), log, on_phase=on_phase
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
        f"{row.name}={getattr(config, row.name)}"
        for row in KNOBS
        if row.changes_maths and getattr(config, row.name) != getattr(twin, row.name)
    ]
    return " and ".join(changed)
