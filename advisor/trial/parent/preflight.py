"""The task validated before any search: it builds and takes two real training steps in a child
process, with your own batch size, so that a bad factory fails with one clear message instead of
as N failed trials."""

from __future__ import annotations

from pathlib import Path

from advisor.errors import BadInputError, FactoryError, FirstStepError, SpecError, bad_input
from advisor.knobs import Device, TrialConfig
from advisor.results import TrialResult
from advisor.trial.orders import ValidateOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

__all__ = ["preflight"]


def preflight(
    spec: str, cwd: Path, device: Device, timeout_s: float, log_path: Path
) -> TrialResult:
    """Validate the task with the user's own batch size; raise a `BadInputError` if it fails."""
    launch = TrialLaunch(spec=spec, cwd=cwd, warmup_steps=1, trial_seconds=1.0, timeout_s=timeout_s)
    # batch_size is a placeholder: the child uses the task's own batch size in validate mode.
    config = TrialConfig(device=device, batch_size=1)
    result = ProcessRunner(launch).run(ValidateOrder(config=config), log_path)
    if result.status != "ok":
        raise _explain(result, log_path)
    return result


def _explain(result: TrialResult, log_path: Path) -> BadInputError:
    reason = result.reason or result.status
    phase = result.failure_phase or "build"
    if result.input_error in (SpecError.kind, FactoryError.kind):
        return bad_input(result.input_error, reason)
    if result.status == "timeout":
        return FactoryError(f"validating the task timed out: {reason}; raise --trial-timeout")
    if phase == "build":
        return FactoryError(f"building the training task failed: {reason} (log: {log_path})")
    batch = f" at batch size {result.config.batch_size}"
    if result.status == "oom":
        return FirstStepError(f"the first training step ran out of memory{batch}: lower it")
    if result.status == "diverged":
        return FirstStepError(f"the first training steps{batch} gave a non-finite loss: {reason}")
    if result.status == "crashed":
        return FirstStepError(f"the trial process crashed during {phase}: {reason}")
    shapes = f" (a batch is {result.task.batch_description})" if result.task else ""
    return FirstStepError(
        f"{reason}{shapes}: make the model accept the dataset's batches (log: {log_path})"
    )
