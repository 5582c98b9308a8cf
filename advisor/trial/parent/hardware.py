"""Parent side of the hardware probe: `advisor.trial.child.hardware.probe()` run in a child process.

The child is a fork of the pre-imported trial launcher, as trials are, so that it measures as
they run and the parent never imports torch or holds a CUDA context. An environment the
launcher cannot carry (see `json_safe`) gets a fresh interpreter instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.results import HardwareProfile
from advisor.trial.parent.environment import child_env, json_safe
from advisor.trial.parent.launcher import LauncherGoneError, shared_launcher

__all__ = ["probe_isolated"]


def probe_isolated() -> HardwareProfile:
    """`advisor.trial.child.hardware.probe()` in a child process: a fork of the pre-imported trial
    launcher (the child then measures as trials run), else a fresh interpreter."""
    env = child_env()
    if json_safe(env):
        with contextlib.suppress(LauncherGoneError), tempfile.TemporaryDirectory() as scratch:
            return _probe_forked(env, Path(scratch))
    return _probe_subprocess(env)


def _probe_forked(env: dict[str, str], scratch: Path) -> HardwareProfile:
    out, log = scratch / "hardware.json", scratch / "probe.log"
    cwd = Path.cwd()
    child = shared_launcher(env, cwd).fork(str(out), str(log), str(cwd), job="probe")
    try:
        code = child.wait()
    except BaseException:  # Ctrl-C: the probe goes too
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        raise
    if code != 0 or not out.exists():
        last = (log.read_text().strip().splitlines() or [f"exit code {code}"])[-1]
        raise _probe_failed(last)
    return HardwareProfile.model_validate_json(out.read_text())


def _probe_subprocess(env: dict[str, str]) -> HardwareProfile:
    code = "from advisor.trial.child.hardware import probe; print(probe().model_dump_json())"
    completed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise _probe_failed((completed.stderr.strip().splitlines() or ["no output"])[-1])
    return HardwareProfile.model_validate_json(lines[-1])


def _probe_failed(last_line: str) -> AdvisorError:
    return AdvisorError(
        f"probing the hardware failed ({last_line}): check that torch imports "
        f"with {sys.executable} -c 'import torch'"
    )
