"""`advisor tune --nnodes 2` as a user runs it: the same command on two "machines" (two processes
on 127.0.0.1, one core each), node 0 searching, node 1 serving. Ctrl-C on node 0 stops node 1's
ranks; node 1 killed stops node 0 in one line; the same commands resume."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, free_port, survivors

pytestmark = pytest.mark.slow
NO_TWO_CORES = not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2


def _node(rank: int, port: int, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """`advisor tune` as node `rank`, on core `rank` alone (its share of the machine)."""
    command = [sys.executable, "-m", "advisor", "tune", f"{TINY}:factory", "--nnodes", "2"]
    command += ["--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}", "--out", str(out)]
    command += ["--trials", "5", "--race-seconds", "0", "--confirm-top", "1"]
    command += ["--trial-seconds", "0.3", "--warmup-steps", "2"]
    core = sorted(os.sched_getaffinity(0))[rank]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


def _wait_for(found: object, what: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not found():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _errors(log: Path) -> list[str]:
    text = log.read_text()
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.startswith("error")]


@pytest.mark.skipif(NO_TWO_CORES, reason="each node needs a core of its own")
def test_two_machines_stop_together_and_resume_with_the_same_commands(tmp_path, marked):
    out, served = tmp_path / "node0", tmp_path / "node1"
    logs = [tmp_path / f"run{run}-node{rank}.log" for run in (1, 2, 3) for rank in (0, 1)]

    # Ctrl-C on node 0 while node 1 runs its part of a trial: node 1's ranks stop too.
    port = free_port()
    node0, node1 = _node(0, port, out, logs[0]), _node(1, port, served, logs[1])
    _wait_for(lambda: list((served / "logs").glob("node1-*.log")), "a trial over both machines")
    node0.send_signal(signal.SIGINT)
    assert node0.wait(timeout=60) == 130
    assert node1.wait(timeout=60) == 1
    assert len(_errors(logs[1])) == 1 and "node 0" in _errors(logs[1])[0]
    _wait_for(lambda: not survivors(marked), "node 1's trial processes to end", timeout_s=10)

    # Node 1 killed: node 0 ends in one line, keeping what it measured.
    port = free_port()
    node0, node1 = _node(0, port, out, logs[2]), _node(1, port, served, logs[3])
    _wait_for(lambda: "node 0 searches" in logs[3].read_text(), "node 1 to join")
    os.killpg(node1.pid, signal.SIGKILL)
    assert node0.wait(timeout=180) == 1
    assert len(_errors(logs[2])) == 1 and "node 1 stopped answering after" in _errors(logs[2])[0]
    assert "(baseline)" not in logs[2].read_text()  # measured in the first run, and kept

    port = free_port()
    node0, node1 = _node(0, port, out, logs[4]), _node(1, port, served, logs[5])
    assert node0.wait(timeout=240) == 0, logs[4].read_text()
    assert node1.wait(timeout=30) == 0, logs[5].read_text()
    rows = list(csv.DictReader((out / "trials.csv").open()))
    spanning = [row for row in rows if row["nnodes"] == "2" and row["status"] == "ok"]
    assert spanning and all(row["parallel_mode"] == "ddp" for row in spanning)
