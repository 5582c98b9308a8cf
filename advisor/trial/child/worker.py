"""Trial child: measure one configuration and write a `TrialResult` as JSON.

Run as `python -m advisor.trial.child.worker REQUEST.json` by `advisor.trial.parent.runner`, in
a process group of its own. A single-process trial is measured here; a DDP trial is supervised
from here, its ranks in the same process group. Failures are data (`status`), never an
exception escaping to the parent.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from advisor.results import TrialResult
from advisor.trial.child.measure import measure_request
from advisor.trial.protocol import TrialRequest

__all__ = ["exit_with_parent", "main", "run_request"]


def run_request(request: TrialRequest) -> TrialResult:
    """Run one trial and return its result."""
    if request.config.distributed:
        from advisor.trial.child.distributed import run_distributed

        return run_distributed(request)
    return measure_request(request)


def _write_atomically(result: TrialResult, path: str) -> None:
    temporary = f"{path}.tmp-{os.getpid()}"
    Path(temporary).write_text(result.model_dump_json(indent=2))
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> int:
    """Run the trial a request file describes and write its result; `python -m` entry point."""
    args = sys.argv[1:] if argv is None else argv
    request = TrialRequest.model_validate_json(Path(args[0]).read_text())
    _temporary_files_with_the_trial(request)
    result = run_request(request)
    _write_atomically(result, request.channel.result_path)
    print(f"advisor: trial {result.status}: {result.samples_per_s or 0:.1f} samples/s")
    return 0


def _temporary_files_with_the_trial(request: TrialRequest) -> None:
    """Make multiprocessing's temporary folder (`pymp-*`, where loader workers and DDP ranks
    make their sockets) in the trial's scratch folder, which the parent removes: the trial exits
    without its finalizers, and its workers are killed. Forked workers and ranks inherit it.
    Only multiprocessing's: torch's compiler cache and the user's files stay where
    `tempfile.gettempdir()` says. Not where its sockets' paths would pass the length a Unix
    socket's path may have: they would fail to bind."""
    scratch = Path(request.channel.result_path).parent
    if len(str(scratch)) + len(_SOCKET_IN_TEMPORARY_FOLDER) <= _LONGEST_SOCKET_PATH:
        folder = tempfile.mkdtemp(prefix="pymp-", dir=scratch)
        # what multiprocessing.util.get_temp_dir() returns from now on, here and in children
        multiprocessing.process.current_process()._config["tempdir"] = folder  # type: ignore[attr-defined]


_SOCKET_IN_TEMPORARY_FOLDER = "/pymp-12345678/listener-12345678"  # multiprocessing's names
_LONGEST_SOCKET_PATH = 103  # sockaddr_un holds 104 bytes on macOS, 108 on Linux, NUL included


def exit_with_parent() -> None:
    """Kill this trial's process group if the parent dies (SIGKILL, closed terminal, ...).

    The trial runs in a session of its own, so nothing else would stop a hung trial, its loader
    workers and its DDP ranks once the parent is gone.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


if __name__ == "__main__":
    exit_with_parent()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter shutdown: a non-daemon thread left by user code would hang it after the
    # result is written. The parent kills what is left of the process group.
    os._exit(code)
