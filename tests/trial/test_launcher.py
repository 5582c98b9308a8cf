"""The pre-imported launcher: trials forked from it are as isolated as fresh interpreters."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from advisor.knobs import TrialConfig
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.environment import child_env
from advisor.trial.parent.launcher import shared_launcher
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from advisor.trial.protocol import Channel, TrialRequest
from tests.conftest import ROOT, TINY, survivors


def _launch(timeout_s: float = 120, preloaded: bool = True) -> TrialLaunch:
    return TrialLaunch(
        spec=f"{TINY}:factory",
        cwd=ROOT,
        warmup_steps=2,
        trial_seconds=0.3,
        timeout_s=timeout_s,
        preloaded=preloaded,
    )


def _trial(launch: TrialLaunch, name: str, tmp_path, on_phase=None):
    launch.spec = f"{TINY}:{name}"
    config = TrialConfig(batch_size=16)
    return ProcessRunner(launch).run(
        WindowOrder(config=config), tmp_path / f"{name}.log", on_phase=on_phase
    )


def test_a_trial_finds_torch_imported_unless_asked_for_a_fresh_interpreter(tmp_path):
    forked = _trial(_launch(), "says_what_was_imported", tmp_path)
    fresh = _trial(_launch(preloaded=False), "says_what_was_imported", tmp_path)
    assert forked.reason.endswith("torch._dynamo preloaded: True")
    assert fresh.reason.endswith("torch._dynamo preloaded: False")


def test_a_trial_cannot_change_the_state_the_next_one_starts_from(tmp_path):
    launch = _launch()
    leaky = _trial(launch, "float64_default", tmp_path)
    clean = _trial(launch, "factory", tmp_path)
    assert leaky.task.batch_description == "(float64[16, 8], int64[16])"
    assert clean.task.batch_description == "(float32[16, 8], int64[16])"


def test_each_test_s_variable_reaches_the_children_of_one_launcher(tmp_path, monkeypatch):
    """pytest sets PYTEST_CURRENT_TEST anew for every test: that needs no new launcher, but the
    children get the new value; any other change does need one (torch read it at import)."""

    def seen() -> tuple[int, str]:
        reason = _trial(_launch(), "says_its_environment", tmp_path).reason
        return shared_launcher(child_env(), ROOT).pid, reason

    monkeypatch.setenv("PYTEST_CURRENT_TEST", "first")
    first, reason = seen()
    assert "'PYTEST_CURRENT_TEST': 'first', 'ADVISOR_ECHO': None" in reason
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "second")
    second, reason = seen()
    assert second == first and "'PYTEST_CURRENT_TEST': 'second'" in reason
    monkeypatch.setenv("ADVISOR_ECHO", "on")
    third, reason = seen()
    assert third != first and "'ADVISOR_ECHO': 'on'" in reason


def test_a_crashing_trial_leaves_the_launcher_serving(tmp_path, marked):
    launch = _launch()
    crashed = _trial(launch, "abort", tmp_path)
    launcher = shared_launcher(child_env(), ROOT).pid
    ok = _trial(launch, "factory", tmp_path)
    assert crashed.status == "crashed" and "SIGABRT" in crashed.reason
    assert ok.status == "ok", ok.reason
    assert shared_launcher(child_env(), ROOT).pid == launcher
    assert survivors(marked) == []


def test_a_killed_launcher_fails_its_trial_and_the_next_trial_gets_a_new_one(tmp_path, marked):
    launch = _launch(timeout_s=60)

    def kill_launcher(phase: str) -> None:
        if phase == "first_step":
            os.kill(shared_launcher(child_env(), ROOT).pid, signal.SIGKILL)

    hung = _trial(launch, "hang", tmp_path, on_phase=kill_launcher)
    assert hung.status == "crashed"
    assert hung.reason == "advisor's trial launcher exited unexpectedly"
    assert hung.wall_s < 30  # not the 60 s timeout
    deadline = time.monotonic() + 10
    while survivors(marked) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert survivors(marked) == []  # the hung trial went with its launcher
    assert _trial(launch, "factory", tmp_path).status == "ok"


def test_the_launcher_and_its_trial_exit_with_their_parent(tmp_path, marked):
    parent_code = (
        "from pathlib import Path\n"
        "from advisor.knobs import TrialConfig\n"
        "from advisor.trial.orders import WindowOrder\n"
        "from advisor.trial.parent.runner import ProcessRunner, TrialLaunch\n"
        f"launch = TrialLaunch(spec='{TINY}:hang', cwd=Path('{ROOT}'), warmup_steps=1,"
        " trial_seconds=0.2, timeout_s=600)\n"
        f"order = WindowOrder(config=TrialConfig(batch_size=16))\n"
        f"ProcessRunner(launch).run(order, Path('{tmp_path}/t.log'))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=ROOT)
    deadline = time.monotonic() + 60
    while len(_tagged(marked)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(_tagged(marked)) == 3  # parent, launcher, trial child
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 15
    while _tagged(marked) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _tagged(marked) == []


def _tagged(mark: str) -> list[psutil.Process]:
    """Every live process with the tag, the launcher included."""
    found = []
    for process in psutil.process_iter():
        try:
            ours = process.environ().get("ADVISOR_TEST_MARK") == mark
            if ours and process.pid != os.getpid() and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def test_an_environment_that_is_no_utf8_gets_a_fresh_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_TEST_LATIN1", "caf\udce9")  # b"caf\xe9" from a latin-1 shell
    result = _trial(_launch(), "says_what_was_imported", tmp_path)
    assert result.reason.endswith("torch._dynamo preloaded: False")


def test_waiting_on_a_forked_trial_ends_when_it_exits_or_at_the_timeout(tmp_path):
    """The runner sleeps between its looks at a trial by waiting on it: a finished trial must
    wake it at once (a fixed sleep had added up to 0.2 s to every trial's wall)."""
    launcher = shared_launcher(child_env(), ROOT)
    request = TrialRequest(
        order=WindowOrder(config=TrialConfig(batch_size=16)),
        spec=f"{TINY}:hang",
        cwd=str(ROOT),
        channel=Channel(launched_at=time.time(), result_path=str(tmp_path / "result.json")),
    )
    (tmp_path / "request.json").write_text(request.model_dump_json())
    hung = launcher.fork(str(tmp_path / "request.json"), str(tmp_path / "hang.log"), str(ROOT))
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            hung.wait(timeout=0.5)
        assert hung.returncode is None
    finally:
        os.killpg(hung.pid, signal.SIGKILL)
    assert hung.wait(timeout=60) == -signal.SIGKILL
    failing = launcher.fork(str(tmp_path / "missing.json"), str(tmp_path / "f.log"), str(ROOT))
    started = time.monotonic()
    assert failing.wait(timeout=60) == 1  # no request to read
    assert time.monotonic() - started < 30  # woken by the exit, not by the timeout
