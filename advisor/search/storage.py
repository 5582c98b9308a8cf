"""Open the Optuna study a tuning run writes to, and report its storage's failures in one line;
keep passwords out of everything we print."""

from __future__ import annotations

import contextlib
import errno
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path

import optuna
from optuna.storages._rdb import models as _rdb_models  # the trials table's schema
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from sqlalchemy import update
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import (
    IntegrityError,
    OperationalError,
    ProgrammingError,
    SQLAlchemyError,
)

from advisor.errors import DiskFullError, StorageError
from advisor.settings import mask_url

__all__ = [
    "STALE_AFTER_S",
    "disk_full_is_one_line",
    "load_study",
    "make_storage",
    "open_study",
    "optimize_one",
]

HEARTBEAT_S = 5
STALE_AFTER_S = 30
# How long a write waits for another SQLite connection's lock before it fails; sqlite3's own
# default, 5 s, is shorter than a busy machine can hold a lock.
SQLITE_BUSY_TIMEOUT_S = 120
JOURNAL_PREFIX = "journal:///"
OPEN_ATTEMPTS = 5


def make_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage for a URL: `journal:///file.log` (or `journal:////abs/file.log`, the
    slashes as in SQLite URLs) is a journal file; anything else an SQLAlchemy database URL."""
    if url.startswith(JOURNAL_PREFIX):
        path = Path(url.removeprefix(JOURNAL_PREFIX))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    # A heartbeat marks trials of a worker that died (SIGKILL, lost machine) as stale; Optuna
    # fails them when the next trial starts, so they do not stay RUNNING forever.
    sqlite = make_url(url).get_backend_name() == "sqlite"
    engine_kwargs = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if sqlite else {}
    with warnings.catch_warnings():  # "experimental" since Optuna 2.9; users need not see it
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        storage = _HeartbeatTolerantStorage(
            url,
            engine_kwargs=engine_kwargs,
            heartbeat_interval=HEARTBEAT_S,
            grace_period=STALE_AFTER_S,
        )
    if sqlite:
        _write_ahead_log(storage.engine)
    return storage


class _HeartbeatTolerantStorage(optuna.storages.RDBStorage):
    """An RDB storage whose heartbeat skips a beat the database cannot take (locked, a lost
    connection) instead of printing a traceback from its thread: a trial is stale only after
    STALE_AFTER_S without one, and a save that keeps failing ends the search (`optimize_one`)."""

    def record_heartbeat(self, trial_id: int) -> None:
        with contextlib.suppress(optuna.exceptions.StorageInternalError, SQLAlchemyError):
            super().record_heartbeat(trial_id)

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        """Pop an enqueued trial (WAITING to RUNNING) in one conditional UPDATE.

        Optuna reads that the trial is WAITING, then writes RUNNING, and relies on SELECT ...
        FOR UPDATE to let one worker through. SQLite ignores FOR UPDATE and Python's sqlite3
        starts its transaction only at the write, so two workers both popped the same trial,
        both measured it, and the second failed with "Cannot tell a COMPLETE trial" (seen in
        CI; optuna/optuna#4621). `UPDATE ... WHERE state = 'WAITING'` changes one row for one
        worker on every database. Any other change, or a trial no longer WAITING (finished:
        Optuna raises; running: False), is Optuna's.
        """
        if state == TrialState.RUNNING and values is None:
            trials = _rdb_models.TrialModel.__table__
            started = datetime.now()  # naive local time, as Optuna's own pop stores it
            with self.engine.begin() as connection:
                popped = connection.execute(
                    update(trials)
                    .where(trials.c.trial_id == trial_id, trials.c.state == TrialState.WAITING)
                    .values(state=TrialState.RUNNING, datetime_start=started)
                ).rowcount
            if popped == 1:
                return True
        return super().set_trial_state_values(trial_id, state, values)


def _write_ahead_log(engine: Engine) -> None:
    """Let readers of an SQLite study (`advisor report`, optuna-dashboard, the sqlite3 shell)
    leave its writer alone: in SQLite's default journal, a reader that keeps a transaction open
    blocks every commit, and the search would fail once the busy timeout runs out. The mode is
    stored in the file; where it cannot be set (a file system without shared memory), SQLite
    keeps its journal and the busy timeout still applies."""
    with contextlib.suppress(OperationalError), engine.connect() as connection:
        connection.exec_driver_sql("PRAGMA journal_mode=WAL")


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
        if "file is not a database" in message:  # SQLite's SQLITE_NOTADB: left as it is
            raise StorageError(
                f"{mask_url(url)} is not a study advisor can read (file is not a database): "
                "move it away, or give another --out or --storage"
            ) from exc
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


@contextlib.contextmanager
def disk_full_is_one_line(url: str) -> Iterator[None]:
    """A storage write that fails for want of space anywhere in the block (a trial, an
    enqueued proposal, a stored racer) becomes a `DiskFullError`: what the study saved before
    is kept, and the same command resumes."""
    try:
        yield
    except (optuna.exceptions.StorageInternalError, SQLAlchemyError) as exc:
        if not _disk_full(exc):
            raise
        raise _disk_full_error(url) from exc


def _disk_full_error(url: str) -> DiskFullError:
    return DiskFullError(
        f"the disk is full: {mask_url(url)} cannot save more; the trials finished before are "
        "kept: free some space and run the same command to resume"
    )


def _disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` or an error it came from is SQLite's SQLITE_FULL or ENOSPC."""
    while exc is not None:
        if "disk is full" in str(exc) or getattr(exc, "errno", None) == errno.ENOSPC:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def optimize_one(study: optuna.Study, objective: Callable[[optuna.Trial], float], url: str) -> None:
    """One trial of `objective`; a storage that cannot save it ends the run with a StorageError.

    Optuna reports a failed save of a finished trial as `AssertionError("Should not reach.")`,
    with the storage's error as its context; both become one line that says what was kept.
    """
    try:
        study.optimize(objective, n_trials=1)
    except (optuna.exceptions.StorageInternalError, SQLAlchemyError, AssertionError) as exc:
        cause = exc if not isinstance(exc, AssertionError) else exc.__context__
        if not isinstance(cause, (optuna.exceptions.StorageInternalError, SQLAlchemyError)):
            raise
        if _disk_full(cause):
            raise _disk_full_error(url) from exc
        while cause.__cause__ is not None:  # Optuna's wrapper says less than SQLite's error
            cause = cause.__cause__
        reason = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise StorageError(
            f"cannot save a trial to {mask_url(url)} ({reason}); the trials finished before it "
            "are kept: run the same command to resume once the storage is free"
        ) from exc


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
