"""A trial's process group: the child leads a session of its own, so that it and every process
it started (DataLoader workers, DDP ranks) are stopped together, also those that left the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Protocol

import psutil

__all__ = ["GRACE_S", "TrialChild", "kill_group", "signal_group"]

GRACE_S = 3.0


class TrialChild(Protocol):
    """A trial child as the runner watches it: a `Popen` or a `ForkedTrial`."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def kill_group(process: TrialChild) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left, then reap."""
    if process.poll() is not None:
        # The trial finished: whatever is left in its group (orphaned loader workers) goes now.
        signal_group(process.pid, signal.SIGKILL)
        return
    members = _group_members(process.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        signal_group(process.pid, sig)
        for member in members:
            try:
                member.send_signal(sig)
            except psutil.Error:
                continue
        gone_by = time.monotonic() + GRACE_S
        while time.monotonic() < gone_by and _alive(process, members):
            time.sleep(0.05)
        if not _alive(process, members):
            break
    process.wait()


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to process group `pgid`, if it is still there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_members(pid: int) -> list[psutil.Process]:
    """Descendants of the child, recorded so that any that left the group are killed too."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(process: TrialChild, members: list[psutil.Process]) -> bool:
    if process.poll() is None:
        return True
    return any(_member_alive(member) for member in members)


def _member_alive(member: psutil.Process) -> bool:
    try:
        return member.is_running() and member.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:  # reaped between the two calls
        return False
