"""A pre-imported trial launcher: every trial is a fork of a process that has torch loaded.

A fresh interpreter spends about 2 s before a trial's first step: 1.1 s importing torch and
0.9 s importing `torch._dynamo`, which every optimizer's constructor pulls in
(`benchmarks/trial_overhead.py`). The launcher pays that once per advisor process. It is
started as `python -m advisor.trial.parent.launcher` in a session of its own, imports torch and the
trial code, and never runs a tensor operation or touches CUDA, so a fork of it is as clean as a
new process: each trial child gets a copy of that state, becomes the leader of a new session
(the runner kills its whole group), and runs `advisor.trial.child.worker.main` with its output
in the trial's log.

`multiprocessing`'s forkserver is not used: it re-imports the caller's `__main__` in every
child, which re-runs a user's script that calls `advisor.tune` without a main guard.

Protocol: one JSON line per trial on the launcher's stdin (`LaunchOrder`), answered by one
line with the child's pid and, once the launcher has reaped it, one with its return code
(negative for a signal, as `subprocess` reports it). The launcher exits on end of input, and
when its parent dies it kills the running trial's group and exits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from advisor.frozen import Frozen
from advisor.trial.parent.lines import JsonLines, end_helper
from advisor.trial.parent.preload import import_ahead, package_of

__all__ = [
    "ForkedTrial",
    "LaunchOrder",
    "Launcher",
    "LauncherGoneError",
    "UnsafePreloadError",
    "shared_launcher",
]

PRELOAD = ("torch", "torch._dynamo", "torch.optim", "advisor.trial.child.worker")
REAP_POLL_S = 0.01
READY_TIMEOUT_S = 120.0
# Set anew for every test and phase: by pytest, and by advisor's own tests to tag the processes
# each test starts (tests/conftest.py). torch and advisor never read them.
PER_CALL_VARIABLES = frozenset({"PYTEST_CURRENT_TEST", "ADVISOR_TEST_MARK"})


class LaunchOrder(Frozen):
    """One trial for the launcher to start."""

    number: int = Field(description="echoed in the launcher's answers, to pair them with orders")
    job: Literal["trial", "probe"] = Field(
        default="trial",
        description="trial: run the TrialRequest at request_path; probe: write the "
        "HardwareProfile there",
    )
    request_path: str
    log_path: str
    cwd: str
    env: dict[str, str]
    preload: tuple[str, ...] = Field(
        default=(),
        description="installed packages the trial's module imports: the launcher imports "
        "them first, once (`advisor.trial.parent.preload`)",
    )


class LauncherGoneError(RuntimeError):
    """The launcher process exited while a trial was running."""


class UnsafePreloadError(LauncherGoneError):
    """A package the launcher imported for the trials left it unsafe to fork, or its import
    did not end within PRELOAD_TIMEOUT_S (`advisor.trial.parent.preload.import_ahead`): that
    launcher is gone, and none after it imports the package."""

    def __init__(self, entry: str, why: str = "left advisor's trial launcher unsafe to fork"):
        super().__init__(f"importing {entry} {why}")
        self.package = package_of(entry)
        _UNSAFE.add(self.package)


# Packages that made a launcher unsafe to fork: the trials import them themselves.
_UNSAFE: set[str] = set()
# The longest the parent waits for one package's import in the launcher: transformers took
# 2.1 s on the 2-core VM. One that takes longer is left to the trials, and their timeouts.
PRELOAD_TIMEOUT_S = 60.0


# --- the launcher process ----------------------------------------------------------------------
def main() -> int:
    """The launcher process: import torch once, then fork one trial child per order on stdin."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it closes our stdin
    for module in PRELOAD:
        __import__(module)
    parent = os.getppid()
    _send({"ready": os.getpid()})
    for line in sys.stdin:
        order = LaunchOrder.model_validate_json(line)
        unsafe = import_ahead(order.preload, announce=_announcer(order.number))
        if unsafe is not None:  # no child of this process is safe now
            _send({"order": order.number, "unsafe_preload": unsafe})
            return 3
        with warnings.catch_warnings():  # torch's import leaves an idle BLAS thread behind
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            _run_child(order)  # never returns
        _send({"order": order.number, "pid": pid})
        returncode = _reap(pid, parent)
        if returncode is None:  # the parent is gone: so is its trial
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            return 1
        _send({"order": order.number, "pid": pid, "returncode": returncode})
    return 0


def _announcer(number: int) -> Callable[[str], None]:
    """Tells the parent which package the launcher imports now, for order `number`."""
    return lambda entry: _send({"order": number, "importing": entry})


def _send(message: dict[str, int | str]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _reap(pid: int, parent: int) -> int | None:
    """Wait for the child; None if the launcher's parent died first."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if os.getppid() != parent:
            return None
        time.sleep(REAP_POLL_S)


def _run_child(order: LaunchOrder) -> None:
    """In the forked child: become a trial process, run the trial, exit. Never returns."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _redirect(order.log_path)
        os.chdir(order.cwd)
        sys.path[0] = order.cwd  # as `python -m advisor.trial.child.worker` run there would have it
        os.environ.clear()
        os.environ.update(order.env)
        from advisor.trial.child import worker

        worker.exit_with_parent()
        if order.job == "probe":
            from advisor.trial.child.hardware import write_profile

            code = write_profile(order.request_path)
        else:
            code = worker.main([order.request_path])
    except BaseException:  # a fork must never return into the launcher's loop
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _redirect(log_path: str) -> None:
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # not the launcher's order pipe
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)


# --- the parent's side -------------------------------------------------------------------------
class ForkedTrial:
    """A trial child started by the launcher, with the part of `Popen`'s interface that the
    runner uses (`pid`, `poll`, `wait`, `returncode`)."""

    def __init__(self, launcher: Launcher, pid: int) -> None:
        self._launcher = launcher
        self.pid = pid
        self.returncode: int | None = None

    @property
    def launcher_pid(self) -> int:
        """The launcher: it reaps this child, and its children's CPU time then counts it."""
        return self._launcher.pid

    def poll(self) -> int | None:
        while self.returncode is None:
            message = self._launcher.read(timeout_s=0.0)
            if message is None:
                break
            if message.get("pid") == self.pid and "returncode" in message:
                self.returncode = message["returncode"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, as `Popen.wait`: raises `subprocess.TimeoutExpired` if it has not
        exited within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = REAP_POLL_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(f"trial {self.pid}", timeout or 0.0)
            message = self._launcher.read(timeout_s=min(left, READY_TIMEOUT_S))
            if message is not None and message.get("pid") == self.pid and "returncode" in message:
                self.returncode = message["returncode"]
        return self.returncode  # type: ignore[return-value]


class Launcher:
    """The parent's handle on one launcher process."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.env = env
        self._process = subprocess.Popen(
            [sys.executable, "-m", "advisor.trial.parent.launcher"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C is the parent's to handle
        )
        assert self._process.stdout is not None
        self._lines = JsonLines(self._process.stdout)
        self._ready = False
        self._orders = 0
        self.imported: set[str] = set()  # what its orders had it import (`LaunchOrder.preload`)

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def fork(
        self,
        request_path: str,
        log_path: str,
        cwd: str,
        job: Literal["trial", "probe"] = "trial",
        preload: tuple[str, ...] = (),
    ) -> ForkedTrial:
        """Start a trial child (or the hardware probe's), the launcher having imported the
        `preload` packages first; raises `LauncherGoneError` if the launcher is not there, and
        `UnsafePreloadError` if one of them left it unsafe to fork or took longer than
        PRELOAD_TIMEOUT_S (the next launcher leaves that package to the trials).

        Anything that stops this call half-way (Ctrl-C, a timeout) kills the launcher: a child
        it started unwatched then dies with it (`advisor.trial.child.worker.exit_with_parent`), and
        the next trial gets a new launcher, never an answer meant for another order.
        """
        self._orders += 1
        order = LaunchOrder(
            number=self._orders,
            job=job,
            request_path=request_path,
            log_path=log_path,
            cwd=cwd,
            env=self.env,
            preload=tuple(entry for entry in preload if package_of(entry) not in _UNSAFE),
        )
        self.imported.update(order.preload)
        try:
            return self._fork(order)
        except BaseException:
            self.kill()
            raise

    def _fork(self, order: LaunchOrder) -> ForkedTrial:
        if not self._ready:
            if self.read(timeout_s=READY_TIMEOUT_S) is None:  # the imports, once
                raise LauncherGoneError("advisor's trial launcher did not start")
            self._ready = True
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write((order.model_dump_json() + "\n").encode())
            stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise LauncherGoneError("advisor's trial launcher is not running") from exc
        importing = None  # the package the launcher imports now, if any
        while True:  # past the exit of an earlier child that nobody waited for
            message = self.read(timeout_s=PRELOAD_TIMEOUT_S if importing else READY_TIMEOUT_S)
            if message is None and importing is not None:
                raise UnsafePreloadError(importing, f"took over {PRELOAD_TIMEOUT_S:g} s")
            if message is None:
                raise LauncherGoneError("advisor's trial launcher did not start the trial")
            if message.get("order") != order.number:
                continue
            if "importing" in message:
                importing = str(message["importing"])
            elif "unsafe_preload" in message:
                raise UnsafePreloadError(str(message["unsafe_preload"]))
            elif "returncode" not in message:
                return ForkedTrial(self, message["pid"])

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        self._process.wait()

    def read(self, timeout_s: float) -> dict[str, Any] | None:
        """The launcher's next message, or None if none came within `timeout_s`."""
        try:
            return self._lines.read(timeout_s)
        except EOFError:
            raise LauncherGoneError("advisor's trial launcher exited unexpectedly") from None

    def close(self) -> None:
        end_helper(self._process, timeout_s=5)


_shared: Launcher | None = None


@atexit.register
def _close_shared() -> None:
    if _shared is not None:
        _shared.close()


def shared_launcher(
    env: dict[str, str], cwd: Path, preload: tuple[str, ...] | None = None
) -> Launcher:
    """This process's launcher, started on first use and again whenever the environment the
    children need has changed (torch read it at import), it imported packages that this
    `preload` does not ask for (another factory's: None, any will do), or the last one died.

    A variable no library reads at import (`PER_CALL_VARIABLES`) only changes what the next
    children get: pytest sets one for every test, and a launcher per test cost the suite
    about 2.5 s of CPU each.
    """
    global _shared
    foreign = _shared is not None and preload is not None and bool(_shared.imported - {*preload})
    stale = _shared is not None and _at_import(_shared.env) != _at_import(env)
    if _shared is not None and (stale or foreign or not _shared.alive):
        _shared.close()
        _shared = None
    if _shared is None:
        _shared = Launcher(env, cwd)
    _shared.env = env  # what each child's environment is set to
    return _shared


def _at_import(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name not in PER_CALL_VARIABLES}


if __name__ == "__main__":
    sys.exit(main())
