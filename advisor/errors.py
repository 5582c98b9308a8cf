"""Errors advisor raises on purpose.

Every message says what is wrong *and* how to fix it; the CLI prints it as one line.

    AdvisorError                      root; carries the process exit code
    ├── BadInputError (exit 2)        the user's input cannot be used
    │   ├── SpecError                 a factory spec cannot be resolved
    │   ├── FactoryError              the factory raised or returned something unusable
    │   ├── FirstStepError            the task builds, but its first training step fails
    │   ├── SettingsError             an invalid flag or setting
    │   └── StorageError              a storage URL advisor cannot use
    └── NoFeasibleConfigError (exit 3) every measured configuration failed
"""

from __future__ import annotations

__all__ = [
    "AdvisorError",
    "BadInputError",
    "FactoryError",
    "FirstStepError",
    "NoFeasibleConfigError",
    "SettingsError",
    "SpecError",
    "StorageError",
]


class AdvisorError(Exception):
    """Root of advisor's exceptions."""

    exit_code = 1


class BadInputError(AdvisorError, ValueError):
    """The user's input cannot be used; nothing was measured with it."""

    exit_code = 2


class SpecError(BadInputError):
    """A `file.py:attr` or `pkg.mod:attr` spec cannot be resolved to a callable."""


class FactoryError(BadInputError):
    """The factory raised, or returned something that is not a training task."""


class FirstStepError(BadInputError):
    """The task was built but its first training step raised."""


class SettingsError(BadInputError):
    """A flag or setting has an invalid value."""


class StorageError(BadInputError):
    """A storage URL cannot be used."""


class NoFeasibleConfigError(AdvisorError, RuntimeError):
    """Every configuration failed; the message summarises why, by count."""

    exit_code = 3
