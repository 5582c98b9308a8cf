"""A recommendation that spans several machines: its configuration, and its launch.sh run as two
"machines" on one host (two torchrun agents on 127.0.0.1, as torch's own launcher tests do)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from advisor.knobs import TrialConfig
from advisor.report.codegen import render_launch_script, render_training_script
from tests.conftest import TINY, free_port
from tests.report.test_codegen import _logged_losses, _recommendation, _trial_losses

ONE_MACHINE = TrialConfig(batch_size=32, parallel_mode="ddp", world_size=2)
TWO_MACHINES = ONE_MACHINE.model_copy(update={"nnodes": 2})


def test_machines_need_a_process_group_and_a_world_that_splits_over_them():
    with pytest.raises(ValidationError, match="nnodes=2 needs parallel_mode='ddp' or 'fsdp'"):
        TrialConfig(batch_size=32, nnodes=2)
    with pytest.raises(ValidationError, match="world_size=3 does not split over nnodes=2"):
        TrialConfig(batch_size=32, parallel_mode="ddp", world_size=3, nnodes=2)
    config = TrialConfig(parallel_mode="fsdp", world_size=4, nnodes=2, batch_size=8)
    assert (config.per_node, config.global_batch_size) == (2, 32)
    assert config.main_process_threads(cores=8) == 4  # one machine's cores, its 2 processes


def _write(folder: Path, config: TrialConfig) -> None:
    rec = _recommendation(f"{TINY}:small_blocks", config)
    folder.mkdir()
    (folder / "launch.sh").write_text(render_launch_script(rec))
    (folder / "train.py").write_text(render_training_script(rec, folder))


def _env(**extra: str) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return dict(os.environ, PATH=path, OMP_NUM_THREADS="1", **extra)


ARGS = ("--max-steps", "4", "--log-every", "1", "--checkpoint", "c.pt")


@pytest.mark.slow
def test_a_two_machine_launch_trains_as_one_machine_with_as_many_processes(tmp_path):
    """The same command on both "machines" (the rendezvous host named, as where several share
    an address): they meet, split the ranks, and train the steps a one-machine DDP-2 trial
    trains, loss for loss."""
    _write(tmp_path / "two", TWO_MACHINES)
    launch = (tmp_path / "two" / "launch.sh").read_text()
    assert "--nnodes=2 --nproc_per_node=1" in launch and "srun sh launch.sh" in launch
    common = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "LOCAL_ADDR": "127.0.0.1",
        "RDZV_ID": uuid.uuid4().hex,
    }
    machines = [
        subprocess.Popen(
            ["sh", "launch.sh", *ARGS],
            cwd=tmp_path / "two",
            env=_env(**common, RDZV_CONF=f"is_host={int(host)},join_timeout=60"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host in (True, False)
    ]
    outputs = []
    for machine in machines:
        stdout, stderr = machine.communicate(timeout=240)
        assert machine.returncode == 0, stderr[-3000:]
        outputs.append(stdout)
    logged = [_logged_losses(stdout) for stdout in outputs]
    assert sorted(len(losses) for losses in logged) == [0, 4]  # global rank 0 alone reports

    # One machine's DDP-2 trial, from the same seed, trains the same first steps (its script
    # does too: tests/report/test_codegen.py).
    expected = _trial_losses(f"{TINY}:small_blocks", ONE_MACHINE, tmp_path)
    assert max(logged, key=len)[:3] == pytest.approx(expected, abs=5e-5)
    assert (tmp_path / "two" / "c.pt").exists()
