"""`advisor tune --nnodes 2` as a user runs it: the same command on two "machines" (two processes
on 127.0.0.1, one core each), node 0 searching, node 1 serving; node 1 killed mid-tune; then
the same commands again, resuming."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, free_port

pytestmark = pytest.mark.slow
NO_TWO_CORES = not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2


def _node(rank: int, port: int, out: Path, log: Path) -> subprocess.Popen[bytes]:
    """`advisor tune` as node `rank`, on core `rank` alone (its share of the machine)."""
    command = [sys.executable, "-m", "advisor", "tune", f"{TINY}:factory", "--nnodes", "2"]
    command += ["--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    command += ["--out", str(out), "--trials", "4", "--race-seconds", "0", "--confirm-top", "1"]
    core = sorted(os.sched_getaffinity(0))[rank]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}),
    )


def _wait_for(log: Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)


@pytest.mark.skipif(NO_TWO_CORES, reason="each node needs a core of its own")
def test_a_node_killed_mid_tune_stops_node_0_in_one_line_and_the_same_commands_resume(tmp_path):
    port, out = free_port(), tmp_path / "node0"
    logs = [tmp_path / f"node{rank}-{run}.log" for run in (1, 2) for rank in (0, 1)]
    node0, node1 = _node(0, port, out, logs[0]), _node(1, port, tmp_path / "node1", logs[1])
    _wait_for(logs[1], "trial 1: ddp-2x1", timeout_s=240)  # it served a trial over both
    os.killpg(node1.pid, signal.SIGKILL)
    assert node0.wait(timeout=120) == 1
    error = [line for line in logs[0].read_text().splitlines() if line.startswith("error")]
    assert len(error) == 1 and "node 1 stopped answering after" in error[0], error
    assert "Traceback" not in logs[0].read_text()

    port = free_port()
    node0, node1 = _node(0, port, out, logs[2]), _node(1, port, tmp_path / "node1", logs[3])
    assert node0.wait(timeout=240) == 0, logs[2].read_text()
    assert node1.wait(timeout=30) == 0, logs[3].read_text()
    assert "node 1: served" in logs[3].read_text()
    rows = list(csv.DictReader((out / "trials.csv").open()))
    spanning = [row for row in rows if row["nnodes"] == "2" and row["status"] == "ok"]
    assert spanning and all(row["parallel_mode"] == "ddp" for row in spanning)
    assert int(spanning[0]["number"]) < 4  # measured before node 1 was killed, and kept
