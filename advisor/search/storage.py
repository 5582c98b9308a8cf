"""Open the Optuna study a tuning run writes to; keep passwords out of everything we print."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import optuna
from optuna.storages.journal import JournalFileBackend
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, OperationalError, ProgrammingError

from advisor.errors import StorageError

__all__ = [
    "load_study",
    "make_storage",
    "mask_url",
    "open_study",
]

HEARTBEAT_S = 5
STALE_AFTER_S = 30
JOURNAL_PREFIX = "journal:///"
OPEN_ATTEMPTS = 5


def mask_url(url: str) -> str:
    """The URL with its password replaced by `***`."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return url.split("@", 1)[-1] if "@" in url else url


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage for a URL: `journal:///file.log` (or `journal:////abs/file.log`, the
    slashes as in SQLite URLs) is a journal file; anything else an SQLAlchemy database URL."""
    if url.startswith(JOURNAL_PREFIX):
        path = Path(url.removeprefix(JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    # A heartbeat marks trials of a worker that died (SIGKILL, lost machine) as stale; Optuna
    # fails them when the next trial starts, so they do not stay RUNNING forever.
    with warnings.catch_warnings():  # "experimental" since Optuna 2.9; users need not see it
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url, heartbeat_interval=HEARTBEAT_S, grace_period=STALE_AFTER_S
        )


def open_study(
    url: str,
    study_name: str,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner | None = None,
) -> optuna.Study:
    """Create the study, or load it when it exists (so the same command resumes)."""
    # advisor reports progress and failures itself; Optuna would log a traceback per Ctrl-C.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        study = _create_or_load(url, study_name, sampler, pruner)
    except ImportError as exc:
        raise StorageError(
            f"cannot open storage {mask_url(url)}: its database driver is missing "
            f"({exc.name or exc}); install it (e.g. pip install psycopg2-binary)"
        ) from exc
    except Exception as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StorageError(
            f"cannot open storage {mask_url(url)}: {message.replace(url, mask_url(url))}; "
            "check the URL, the server and your credentials"
        ) from exc
    return study


def _create_or_load(
    url: str,
    study_name: str,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner | None,
) -> optuna.Study:
    """create_study(load_if_exists=True), retried while another worker creates the same tables
    or study at the same moment: SQLite reports that as an error, not a wait, and PostgreSQL as
    a table that "already exists" when two workers create the schema together."""
    for attempt in range(OPEN_ATTEMPTS):
        try:
            return optuna.create_study(
                study_name=study_name,
                storage=make_storage(url),
                sampler=sampler,
                pruner=pruner,
                direction="maximize",
                load_if_exists=True,
            )
        except (OperationalError, IntegrityError, ProgrammingError) as exc:
            racing = not isinstance(exc, ProgrammingError) or "already exists" in str(exc)
            if not racing or attempt == OPEN_ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def load_study(url: str, study_name: str | None) -> optuna.Study:
    """An existing study; without a name, the only study in the storage."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        storage = make_storage(url)
        names = optuna.get_all_study_names(storage=storage)
    except Exception as exc:
        raise StorageError(f"cannot open storage {mask_url(url)}: {exc}") from exc
    if not names:
        raise StorageError(f"{mask_url(url)} holds no study: check the URL or the folder")
    if study_name is None and len(names) == 1:
        study_name = names[0]
    if study_name not in names:
        wanted = f"no study {study_name!r}" if study_name else "more than one study"
        raise StorageError(
            f"{mask_url(url)} has {wanted} (studies: {', '.join(names)}): pass --study-name NAME"
        )
    return optuna.load_study(study_name=study_name, storage=storage)
