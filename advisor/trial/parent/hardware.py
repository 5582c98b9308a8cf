"""Parent side of the hardware probe: `advisor.trial.child.hardware.probe()` run in a child process.

The child is a fork of the pre-imported trial launcher, as trials are, so that it measures as
they run and the parent never imports torch or holds a CUDA context. An environment the
launcher cannot carry (see `json_safe`) gets a fresh interpreter instead.

`ADVISOR_PROBE_CACHE=FILE` keeps the profile in FILE for the next tune that runs on this host,
with this interpreter, these cores and the same probe-shaping variables (`_probe_key`): a
test suite or a CI job that tunes dozens of times probes once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from advisor.errors import AdvisorError
from advisor.results import HardwareProfile
from advisor.trial.parent.environment import child_env, json_safe
from advisor.trial.parent.launcher import LauncherGoneError, shared_launcher

__all__ = ["probe_isolated"]

CACHE_VARIABLE = "ADVISOR_PROBE_CACHE"
CACHE_ENTRIES = 8  # the most recent sets of conditions kept
# Variables that change what the probe reads: threads, the allocator, visible GPUs, the CPU
# kernels torch picks, the interpreter's import path, benchmarks/simulate's machine.
_SHAPING = ("CUDA_", "LD_", "OMP_", "MKL_", "KMP_", "ATEN_", "PYTORCH_", "TORCH", "PYTHONPATH",
            "MIMALLOC_", "MALLOC_", "JEMALLOC_", "ADVISOR_SIMULATE")  # fmt: skip


def probe_isolated() -> HardwareProfile:
    """The machine's profile: from `ADVISOR_PROBE_CACHE` where it holds one probed under the
    same conditions, else probed now (and kept there when the variable is set)."""
    cache = os.environ.get(CACHE_VARIABLE)
    if not cache:
        return _probe()
    key, stored = _probe_key(), _cached(Path(cache))
    if key in stored:
        return stored[key]
    profile = _probe()
    kept = {**dict(list(stored.items())[-CACHE_ENTRIES + 1 :]), key: profile}
    temporary = Path(f"{cache}.tmp-{os.getpid()}")
    with contextlib.suppress(OSError):
        temporary.write_text(json.dumps({k: p.model_dump(mode="json") for k, p in kept.items()}))
        temporary.replace(cache)
    return profile


def _cached(path: Path) -> dict[str, HardwareProfile]:
    """The profiles kept in `path` by key; none where it is missing or not advisor's."""
    try:
        stored = json.loads(path.read_text())
        return {key: HardwareProfile.model_validate(p) for key, p in stored.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _probe_key() -> str:
    """What a probe's reading depends on, short of probing: host, interpreter, usable cores and
    the variables that shape threads, allocator, GPUs and kernels."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    shaping = sorted((k, v) for k, v in os.environ.items() if k.startswith(_SHAPING))
    parts = [socket.gethostname(), sys.executable, cores, shaping]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _probe() -> HardwareProfile:
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
