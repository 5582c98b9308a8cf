"""GPU code paths: CUDA AMP with fp16 + GradScaler, pinned memory, cudnn.benchmark and
cudnn.deterministic, TF32, multi-GPU.

Skipped without CUDA (see conftest.py); run them wherever a GPU is available.
"""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from advisor.knobs import TrialConfig
from advisor.search.checks import maths_problem
from advisor.trial.child.hardware import probe
from advisor.trial.orders import ReferenceOrder, WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY
from tests.report.test_codegen import (
    _logged_losses,
    _recommendation,
    _trial_losses,
    _write_and_run,
)

pytestmark = pytest.mark.gpu


def _trial(tmp_path: Path, **knobs) -> object:
    launch = TrialLaunch(
        spec=f"{TINY}:factory", cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=300
    )
    return ProcessRunner(launch).run(
        WindowOrder(config=TrialConfig(device="cuda", batch_size=64, **knobs)), tmp_path / "t.log"
    )


def test_probe_sees_the_gpu():
    hardware = probe()
    assert hardware.gpus and hardware.gpus[0].memory_bytes > 2**30
    assert hardware.cuda_version and hardware.cudnn_version


@pytest.mark.parametrize(
    "knobs",
    [
        {"amp": "fp16"},
        {"amp": "fp16", "accumulation_steps": 4},
        {"amp": "bf16", "cudnn_benchmark": True},
        {"num_workers": 2, "pin_memory": True},
        {"cudnn_benchmark": True, "cudnn_deterministic": True},
    ],
)
def test_cuda_trial_paths(tmp_path, knobs):
    result = _trial(tmp_path, **knobs)
    assert result.status == "ok", result.reason
    assert result.samples_per_s > 0
    assert 0 < result.peak_memory_bytes < probe().gpus[0].memory_bytes


def test_cuda_out_of_memory_is_status_oom(tmp_path):
    launch = TrialLaunch(
        spec=f"{TINY}:hog_device_memory",
        cwd=ROOT,
        warmup_steps=2,
        trial_seconds=0.2,
        timeout_s=300,
    )
    result = ProcessRunner(launch).run(
        WindowOrder(config=TrialConfig(device="cuda", batch_size=16)), tmp_path / "t.log"
    )
    assert result.status == "oom", result.reason


OTHER_GPU_PROGRAM = (
    "import time, torch; x = torch.ones(1, device='cuda'); print('ready', flush=True); "
    "time.sleep(300)"
)


def test_nvml_counts_another_program_on_the_gpu_and_not_the_trials_own(tmp_path):
    """A trial alone on the GPU sees no other program there (its own processes, and advisor's,
    are not others: in a container NVML may not name them as we do); with another program
    holding a CUDA context, its load counts it."""
    pytest.importorskip("pynvml")
    alone = _trial(tmp_path)
    assert alone.status == "ok", alone.reason
    assert alone.load is not None
    if alone.load.gpu_processes is None:
        pytest.skip("NVML names processes by another PID namespace's numbers here")
    assert alone.load.gpu_processes == 0
    other = subprocess.Popen(
        [sys.executable, "-c", OTHER_GPU_PROGRAM], stdout=subprocess.PIPE, text=True
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "ready"
        shared = _trial(tmp_path)
        assert shared.status == "ok", shared.reason
        assert shared.load is not None and shared.load.gpu_processes == 1
    finally:
        other.kill()
        other.wait()


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


two_gpus = pytest.mark.skipif(_gpus() < 2, reason="needs 2 CUDA GPUs")


@two_gpus
@pytest.mark.parametrize(
    "knobs",
    [
        {"parallel_mode": "ddp", "world_size": 2, "amp": "fp16", "accumulation_steps": 2},
        {"parallel_mode": "dp", "amp": "bf16"},
    ],
    ids=["ddp-nccl", "dp"],
)
def test_multi_gpu_trials(tmp_path, knobs):
    result = _trial(tmp_path, **knobs)
    assert result.status == "ok", result.reason
    assert result.samples_per_s > 0
    if knobs["parallel_mode"] == "ddp":
        assert [rank.rank for rank in result.ranks] == [0, 1]
        assert all(rank.peak_memory_bytes > 0 for rank in result.ranks)


def test_deterministic_cudnn_keeps_the_maths_of_its_twin(tmp_path):
    launch = TrialLaunch(
        spec=f"{TINY}:conv", cwd=ROOT, warmup_steps=2, trial_seconds=0.3, timeout_s=300
    )
    config = TrialConfig(device="cuda", batch_size=64, cudnn_deterministic=True)
    result = ProcessRunner(launch).run(WindowOrder(config=config), tmp_path / "d.log")
    twin = ProcessRunner(launch).run(
        ReferenceOrder(config=config.maths_twin), tmp_path / "twin.log"
    )
    assert result.status == "ok", result.reason
    assert maths_problem(result, twin) is None


@pytest.mark.parametrize(
    "knobs",
    [
        {"amp": "fp16", "num_workers": 2, "pin_memory": True, "cudnn_benchmark": True},
        {"amp": "bf16", "accumulation_steps": 2, "channels_last": True, "matmul_precision": "high"},
    ],
    ids=["fp16-scaler-pinned-workers", "bf16-accumulation-channels-last"],
)
def test_generated_script_trains_on_cuda_as_the_trial_did(knobs, tmp_path):
    spec = f"{TINY}:conv"
    config = TrialConfig(device="cuda", batch_size=32, **knobs)
    (ROOT / "reports").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="test-gpu-codegen-", dir=ROOT / "reports"))
    try:
        completed = _write_and_run(
            _recommendation(spec, config), folder, "--max-steps", "3", "--log-every", "1"
        )
        assert completed.returncode == 0, completed.stderr
        assert "done: 3 steps; with warm-up" in completed.stdout
    finally:
        shutil.rmtree(folder)
    # Same seed, weights and batches; autotuned and low-precision kernels may round apart.
    expected = _trial_losses(spec, config, tmp_path)
    assert _logged_losses(completed.stdout) == pytest.approx(expected, rel=1e-2)


def _blocks_trial(tmp_path: Path, mode: str = "trial", factory: str = "blocks", **knobs):
    launch = TrialLaunch(
        spec=f"{TINY}:{factory}", cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=300
    )
    config = TrialConfig(device="cuda", batch_size=128, **knobs)
    result = ProcessRunner(launch).run(
        _order(mode, config), tmp_path / f"{config.label()}-{mode}.log"
    )
    assert result.status == "ok", result.reason
    return result


def test_checkpointing_on_cuda_keeps_the_losses_and_lowers_the_peak(tmp_path):
    """8 blocks x 128 samples x 65,536 floats of activations (256 MiB) off; one block's on."""
    off = _blocks_trial(tmp_path, "reference")
    on = _blocks_trial(tmp_path, "reference", activation_checkpointing="ResidualBlock")
    assert on.early_losses == pytest.approx(off.early_losses, rel=1e-5)
    plain = _blocks_trial(tmp_path)
    checkpointed = _blocks_trial(tmp_path, activation_checkpointing="ResidualBlock")
    assert (plain.peak_memory_bytes or 0) - (checkpointed.peak_memory_bytes or 0) > 128 * 2**20


@pytest.mark.parametrize("amp", ["off", "bf16"])
def test_fsdp_with_one_rank_trains_on_cuda_as_one_process_does(tmp_path, amp):
    """One NCCL rank over a CUDA mesh: the sharding and MixedPrecisionPolicy paths run; with
    nothing to shard across, the first loss is one process's. One rank reads through a
    DistributedSampler, one process through a shuffled loader: over a dataset of one batch
    without dropout both see the same samples. Only the first loss (before a step) is compared:
    the tower's later losses run away at lr 1e-3 and amplify summation order."""
    same = {"factory": "one_batch_blocks", "amp": amp}
    alone = _blocks_trial(tmp_path, "reference", **same)
    sharded = _blocks_trial(tmp_path, "reference", parallel_mode="fsdp", world_size=1, **same)
    tolerance = 1e-2 if amp == "bf16" else 1e-4  # bf16 parameters, not only bf16 matmuls
    assert sharded.early_losses[0] == pytest.approx(alone.early_losses[0], rel=tolerance)
    assert _blocks_trial(tmp_path, parallel_mode="fsdp", world_size=1, amp=amp).samples_per_s


def _order(mode: str, config: TrialConfig) -> WindowOrder | ReferenceOrder:
    """A search trial's order, or with `mode` "reference" the numerics reference's."""
    return ReferenceOrder(config=config) if mode == "reference" else WindowOrder(config=config)


@two_gpus
def test_a_trial_over_two_machines_of_one_gpu_each_trains_the_losses_of_one_with_two(
    tmp_path, monkeypatch
):
    """NCCL across two "machines" on this host, each seeing one GPU of its own (both ranks are
    LOCAL_RANK 0): node 1 is `advisor tune --node-rank 1` seeing the second GPU only."""
    import os

    from advisor.trial.nodes import Rendezvous
    from advisor.trial.parent.nodes import NodeHost
    from tests.conftest import free_port

    port = free_port()
    command = [sys.executable, "-m", "advisor", "tune", f"{TINY}:factory", "--nnodes", "2"]
    command += ["--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    node1 = subprocess.Popen(
        [*command, "--out", str(tmp_path / "node1")],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    launch = TrialLaunch(
        spec=f"{TINY}:factory", cwd=ROOT, warmup_steps=2, trial_seconds=0.5, timeout_s=300
    )
    config = TrialConfig(device="cuda", batch_size=64, parallel_mode="ddp", world_size=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    where = Rendezvous(nnodes=2, node_rank=0, host="127.0.0.1", port=port)
    with NodeHost(where) as host:
        host.wait_for_nodes()
        spanning = config.model_copy(update={"nnodes": 2})
        two = ProcessRunner(launch, nodes=host).run(
            ReferenceOrder(config=spanning), tmp_path / "two.log"
        )
    said, _ = node1.communicate(timeout=60)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    one = ProcessRunner(launch).run(ReferenceOrder(config=config), tmp_path / "one.log")
    assert two.status == "ok", (two.reason, said)
    assert node1.returncode == 0, said
    assert two.early_losses == pytest.approx(one.early_losses, rel=1e-4)
