from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import psutil
import pytest

from advisor.results import HardwareProfile

ROOT = Path(__file__).resolve().parent.parent
TINY = "tests/workloads/tiny.py"

# The suite runs three xdist workers on as few as two cores. OpenMP threads that spin while they
# wait for work then burn the cores the other workers' trials need: idle ones sleep instead,
# here and in every process a test starts (they inherit the environment). In one run on two cores
# this cut the CPU time of test_knobs, test_study and test_codegen by 9 % (283 -> 256 s).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# torch.compile's inductor compiles its kernels in this process rather than in a pool of
# interpreters of its own: one fewer set of processes beside the three workers (in one run, the
# compiled train.py test took 28 s of CPU this way, 31 s with the pool).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# A described 2-core CPU machine, for tests of pure functions of the hardware profile.
CPU_PROFILE = HardwareProfile(
    cpu_model="test CPU",
    cores=2,
    memory_bytes=24 * 2**30,
    cpu_capability="AVX512",
    cpu_bf16=True,
    python_version="3.11",
    torch_version="2.13.0+cpu",
)


# The cheapest tune that still runs every stage a test of the command line needs: one process,
# short windows, one finalist, two rounds of re-runs (a busy CI machine would otherwise add
# rounds up to ten while the claim is unconfirmed: tests/decide/test_claims.py tests that), and
# no race (tests of the race run it on their own).
FAST_TUNE = ("--trial-seconds", "0.3", "--warmup-steps", "2", "--max-world-size", "1",
             "--confirm-top", "1", "--confirm-max-repeats", "2",
             "--objective", "throughput")  # fmt: skip


def trials_counted(attrs: list[dict]) -> int:
    """Stored trials as `--trials` counts them, from their user attributes: each that ran, and
    the siblings one derived from its timed parts (`advisor.search.siblings`) as one more."""
    ran = [a for a in attrs if "derived_from" not in a]
    return len(ran) + len({a["derived_from"] for a in attrs if "derived_from" in a})


def run_advisor(
    *args: str, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m advisor ARGS` from the repository root, as a user runs it (`env`: variables
    set for it, on top of this process's)."""
    return subprocess.run(
        [sys.executable, "-m", "advisor", *args],
        cwd=ROOT,
        env={**os.environ, **env} if env else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def advisor_here(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`advisor ARGS` through its entry point in this process, returned as `run_advisor` returns
    it: the same code, without an interpreter and a trial launcher of its own (about 3.7 s of CPU
    a tune; its trials fork from this process's launcher). `run_advisor` starts a real process:
    for signals, a killed parent, tunes side by side, a preloaded allocator, the entry point.

    Its Ctrl-C handlers are not installed here, `env` is set only while it runs, and the warnings
    it raises are written to its stderr as a fresh interpreter would print them."""
    from advisor.cli import main  # the command's imports, for the tests that use it

    stdout, stderr = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(signal, "signal"))
        stack.enter_context(mock.patch.dict(os.environ, env or {}))
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        raised = stack.enter_context(warnings.catch_warnings(record=True))
        _interpreter_warning_filters()
        try:
            main(list(args))
        except SystemExit as exited:
            code = exited.code
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in raised
    )
    returncode = code if isinstance(code, int) else (0 if code is None else 1)
    return subprocess.CompletedProcess(list(args), returncode, stdout.getvalue(),
                                       stderr.getvalue() + shown)  # fmt: skip


def _interpreter_warning_filters() -> None:
    """The filters a Python started without -W has (pytest's are not a user's)."""
    warnings.resetwarnings()
    warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
    for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
        warnings.filterwarnings("ignore", category=category, append=True)


# First: xdist's own hook reads the groups off the items on each worker, and a conftest's hook would
# otherwise run after it (the worker's plugin registers later), too late to be seen.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _group_by_module_fixture(items)
    # The slow ones first, each module's in its order: xdist hands out tests in this order, and
    # a long test that starts last keeps one worker busy while the others have nothing left.
    items.sort(key=lambda item: "slow" not in item.keywords)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _group_by_module_fixture(items: list[pytest.Item]) -> None:
    """Tests that share a module-scoped fixture (a whole tune) run on one xdist worker, so
    that it is built once (`--dist loadgroup`); the others go wherever a worker is free."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = sorted(
            name
            for name, definitions in (info.name2fixturedefs.items() if info else ())
            if definitions and definitions[-1].scope == "module"
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{','.join(shared)}"))


@pytest.fixture(scope="session", autouse=True)
def _private_temporary_folder() -> Iterator[None]:
    """What the suite's processes leave in the temporary folder goes into one of its own per
    xdist worker, removed at the end, not into /tmp run after run: the trial scratch of a
    parent a test kills, and a failed validation's log, which advisor keeps where its message
    names it. Short, beside /tmp: sockets are made there."""
    folder = tempfile.mkdtemp(prefix="advisor-tests-")
    os.chmod(folder, 0o711)  # others may pass through, as in /tmp: the PostgreSQL server's user
    os.environ["TMPDIR"] = folder  # every process a test starts
    tempfile.tempdir = folder  # this one's
    yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _shared_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The suite's tunes share one hardware probe per set of probe-shaping variables
    (`ADVISOR_PROBE_CACHE`): a second of matmul timing on both cores for each of dozens of
    tunes. tests/trial/test_hardware.py probes for real."""
    shared = tmp_path_factory.getbasetemp().parent  # one folder for all xdist workers
    os.environ.setdefault("ADVISOR_PROBE_CACHE", str(shared / "hardware-probe.json"))
    # torch.compile's kernels, compiled once for the suite: a compiled trial and the train.py
    # that compiles the same model share them (by default each xdist worker's TMPDIR has its own).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(shared / "torchinductor"))


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs resolve relative to the working directory, as they do for users."""
    monkeypatch.chdir(ROOT)


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch) -> str:
    """Tag every process this test starts (they inherit the environment), to find leftovers."""
    mark = f"advisor-test-{uuid.uuid4()}"
    monkeypatch.setenv("ADVISOR_TEST_MARK", mark)
    return mark


def survivors(mark: str) -> list[psutil.Process]:
    """Live processes started under the `marked` fixture's tag, other than this one and the
    trial launcher it shares with later tests (`advisor.trial.parent.launcher`, tested on its
    own)."""
    found = []
    for process in psutil.process_iter():
        try:
            ours = process.environ().get("ADVISOR_TEST_MARK") == mark
            launcher = _is_launcher(process) and not _is_launcher(process.parent())
            alive = process.status() != psutil.STATUS_ZOMBIE
            if ours and alive and not launcher and process.pid != os.getpid():
                found.append(process)
        except psutil.Error:
            continue
    return found


def _is_launcher(process: psutil.Process | None) -> bool:
    """The launcher or one of its forks: trial children and their loader workers."""
    return process is not None and "advisor.trial.parent.launcher" in process.cmdline()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 a moment ago, for a server a test starts."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
