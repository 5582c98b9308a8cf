"""Errors advisor raises on purpose.

Every message says what is wrong *and* how to fix it; the CLI prints it as one line.

    AdvisorError                      root; carries the process exit code
    ├── BadInputError (exit 2)        the user's input cannot be used
    │   ├── SpecError                 a factory spec cannot be resolved
    │   ├── FactoryError              the factory raised or returned something unusable
    │   ├── ContractError             a batch, output or loss breaks the factory contract
    │   ├── FirstStepError            the task builds, but its first training step fails
    │   ├── SettingsError             an invalid flag or setting
    │   └── StorageError              a storage URL advisor cannot use
    ├── DiskFullError (exit 1)        the disk filled while writing; what finished is kept
    ├── NodeLostError (exit 1)        a machine of a tune over several stopped answering
    └── NoFeasibleConfigError (exit 3) every measured configuration failed

A trial child reports a `BadInputError` it raised by its `kind` (`TrialResult.input_error`);
validating a task (preflight) raises a spec or factory error found there again as its own class,
with `bad_input()`, and any other failure of the first steps as a `FirstStepError`.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AdvisorError",
    "BadInputError",
    "ContractError",
    "DiskFullError",
    "FactoryError",
    "FirstStepError",
    "NoFeasibleConfigError",
    "NodeLostError",
    "SettingsError",
    "SpecError",
    "StorageError",
    "bad_input",
]


class AdvisorError(Exception):
    """Root of advisor's exceptions."""

    exit_code = 1


class BadInputError(AdvisorError, ValueError):
    """The user's input cannot be used; nothing was measured with it."""

    exit_code = 2
    kind: ClassVar[str] = "input"


class SpecError(BadInputError):
    """A `file.py:attr` or `pkg.mod:attr` spec cannot be resolved to a callable."""

    kind = "spec"


class FactoryError(BadInputError):
    """The factory raised, or returned something that is not a training task."""

    kind = "factory"


class ContractError(BadInputError):
    """A batch, the model's output or the loss breaks the factory contract, or the task cannot
    run a configuration (a dataset smaller than the batch, or one DDP cannot shard).

    Raised inside trial processes; the trial records it as an `error` with its kind.
    """

    kind = "contract"


class FirstStepError(BadInputError):
    """The task was built but its first training step raised."""

    kind = "first_step"


class SettingsError(BadInputError):
    """A flag or setting has an invalid value."""

    kind = "settings"


class StorageError(BadInputError):
    """A storage URL cannot be used."""

    kind = "storage"


class DiskFullError(AdvisorError, OSError):
    """The disk (or a file size limit) ran out while advisor wrote; every trial that finished
    before is kept, and the same command resumes once there is space."""

    exit_code = 1


class NoFeasibleConfigError(AdvisorError, RuntimeError):
    """Every configuration failed; the message summarises why, by count."""

    exit_code = 3


def bad_input(kind: str, message: str) -> BadInputError:
    """The `BadInputError` subclass whose `kind` this is (a trial child reports only the kind)."""
    classes = [BadInputError]
    while classes:
        cls = classes.pop()
        if cls.kind == kind:
            return cls(message)
        classes.extend(cls.__subclasses__())
    return BadInputError(message)


class NodeLostError(AdvisorError):
    """A machine of a tune over several (`--nnodes`) stopped answering, or never joined:
    nothing that spans the machines can be measured; the finished trials are kept."""
