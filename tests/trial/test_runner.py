"""Real trials in real child processes: every status the study can see."""

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from advisor.knobs import TrialConfig
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY, survivors

FAULTS = "tests/workloads/faults.py"


def _run(
    name: str,
    tmp_path: Path,
    timeout_s: float = 120,
    trial_seconds=0.3,
    workload: str = TINY,
    **config,
):
    launch = TrialLaunch(
        spec=f"{workload}:{name}",
        cwd=ROOT,
        warmup_steps=2,
        trial_seconds=trial_seconds,
        timeout_s=timeout_s,
    )
    phases: list[str] = []
    result = ProcessRunner(launch).run(
        WindowOrder(config=TrialConfig(batch_size=config.pop("batch_size", 16), **config)),
        tmp_path / "trial.log",
        on_phase=phases.append,
    )
    return result, phases


def test_ok_trial_records_every_measurement(tmp_path):
    result, phases = _run("factory", tmp_path, num_workers=1, accumulation_steps=2, amp="bf16")
    assert result.status == "ok", result.reason
    assert result.samples_per_s > 0
    # (how long the warm-up and window last: tests/trial/test_budget.py, on a fake clock)
    assert result.steps_measured >= 3
    assert result.step_time_p10_s <= result.step_time_median_s <= result.step_time_p90_s
    assert 0 <= result.data_wait_fraction <= 1
    assert result.peak_memory_bytes > 10 * 2**20
    assert 0 < result.startup_s < result.wall_s
    assert result.warmup_s is not None and result.window_s is not None
    assert all(loss == loss for loss in result.losses) and result.losses
    assert result.task.batch_description == "(float32[16, 8], int64[16])"
    assert phases == ["first_step", "warmup", "measure"]
    assert "trial ok" in Path(result.log_path).read_text()


def test_window_spans_two_worker_cycles(tmp_path):
    bare, _ = _run("factory", tmp_path, trial_seconds=1e-6)
    assert bare.steps_measured == 2  # the minimum without workers, for steps that long
    result, _ = _run("factory", tmp_path, trial_seconds=1e-6, num_workers=2)
    assert result.status == "ok"
    assert result.steps_measured == 2 * 2 * 2  # num_workers x prefetch_factor x 2


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_trial_leaves_no_temporary_files(tmp_path, monkeypatch, knobs):
    # Its loader workers are killed, not shut down: their multiprocessing folders (pymp-*) must
    # still go, here with the trial's scratch folder.
    temporary = Path(tempfile.mkdtemp(prefix="t-", dir="/tmp"))  # short: sockets are made there
    monkeypatch.setenv("TMPDIR", str(temporary))  # the trial launcher's, and so its children's
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # this process's
    try:
        result, _ = _run("factory", tmp_path, num_workers=2, **knobs)
        left = list(temporary.iterdir())
    finally:
        shutil.rmtree(temporary)

    assert result.status == "ok", result.reason
    # (torch's compiler cache, made there by the trial launcher, is meant to stay)
    assert [path.name for path in left if path.name.startswith(("pymp-", "advisor-"))] == []


@pytest.mark.parametrize("spec", ["dict_task", "triple_task", "iterable_task"])
def test_every_batch_form_of_the_contract_trains(spec, tmp_path):
    result, _ = _run(spec, tmp_path)
    assert result.status == "ok", result.reason


def test_user_error_is_status_error_with_the_first_step_named(tmp_path):
    result, _ = _run("bad_shapes", tmp_path)
    assert result.status == "error"
    assert result.failure_phase == "first_step"
    assert result.reason.startswith("the first training step failed with RuntimeError")
    assert result.error_type == "RuntimeError"
    assert "Traceback" in Path(result.log_path).read_text()


def test_out_of_memory_error_is_status_oom(tmp_path):
    result, _ = _run("oom_above_64", tmp_path, batch_size=128)
    assert result.status == "oom"
    assert "simulated: tried to allocate" in result.reason
    fits, _ = _run("oom_above_64", tmp_path, batch_size=64)
    assert fits.status == "ok"


def test_non_finite_loss_is_status_diverged(tmp_path):
    result, _ = _run("nan_loss", tmp_path)
    assert result.status == "diverged"
    assert "non-finite" in result.reason


def test_abort_is_status_crashed_with_the_signal(tmp_path):
    result, _ = _run("abort", tmp_path)
    assert result.status == "crashed"
    assert "SIGABRT" in result.reason


def test_sigkill_reads_as_the_oom_killer(tmp_path):
    result, _ = _run("sigkill", tmp_path)
    assert result.status == "oom"
    assert "SIGKILL" in result.reason


@pytest.mark.slow
def test_hang_times_out_and_kills_the_whole_group(tmp_path, marked):
    result, _ = _run("hang", tmp_path, timeout_s=12, num_workers=2)
    assert result.status == "timeout"
    assert "no result after 12 s" in result.reason
    assert result.wall_s < 30
    assert survivors(marked) == []


def test_an_error_in_a_loader_worker_is_status_error_with_its_message(tmp_path):
    result, _ = _run("worker_raises", tmp_path, workload=FAULTS, num_workers=2)
    assert result.status == "error"
    assert "ValueError" in result.reason and "simulated: cannot decode sample" in result.reason


@pytest.mark.slow
def test_a_hung_loader_worker_times_out_and_nothing_is_left(tmp_path, marked):
    result, _ = _run("worker_hangs", tmp_path, workload=FAULTS, timeout_s=12, num_workers=2)
    assert result.status == "timeout"
    assert "no result after 12 s" in result.reason
    assert survivors(marked) == []


def test_a_segfault_is_status_crashed_with_the_signal(tmp_path):
    result, _ = _run("segfault", tmp_path, workload=FAULTS)
    assert result.status == "crashed"
    assert "SIGSEGV" in result.reason


def test_result_counts_even_if_user_threads_keep_the_child_alive(tmp_path, marked):
    result, _ = _run("lingering_thread", tmp_path, timeout_s=60)
    assert result.status == "ok", result.reason
    assert result.wall_s < 30
    assert survivors(marked) == []


def test_trial_dies_with_its_parent(tmp_path, marked):
    parent_code = (
        "from pathlib import Path\n"
        "from advisor.knobs import TrialConfig\n"
        "from advisor.trial.orders import WindowOrder\n"
        "from advisor.trial.parent.runner import ProcessRunner, TrialLaunch\n"
        f"launch = TrialLaunch(spec='{TINY}:hang', cwd=Path('{ROOT}'), warmup_steps=1,"
        " trial_seconds=0.2, timeout_s=600)\n"
        f"order = WindowOrder(config=TrialConfig(batch_size=16, num_workers=1))\n"
        f"ProcessRunner(launch).run(order, Path('{tmp_path}/t.log'))\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=ROOT)
    deadline = time.monotonic() + 60
    while len(survivors(marked)) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(survivors(marked)) >= 3  # parent, trial child, loader worker
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 15
    while survivors(marked) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert survivors(marked) == []


def test_bad_factory_fails_in_build_phase(tmp_path):
    result, phases = _run("raises", tmp_path)
    assert (result.status, result.failure_phase, result.error_type) == (
        "error",
        "build",
        "FactoryError",
    )
    assert "cannot find the data folder" in result.reason
    assert phases == []


def test_warm_up_settles_an_fp16_loss_scale():
    import torch

    from advisor.task import build_task
    from advisor.trial.child.loop import Trainer
    from advisor.trial.child.warmup import SCALER_STABLE_STEPS, WarmUpTerms, warm_up

    task, _ = build_task(f"{TINY}:factory")
    # fp16 is a CUDA knob; the GradScaler logic is the same on CPU, so bypass the validator.
    config = TrialConfig.model_construct(
        **{**TrialConfig(batch_size=16).model_dump(), "amp": "fp16"}
    )
    trainer = Trainer(task, config, torch.device("cpu"))
    trainer.scaler._init_scale = 2.0**60  # far too high: the scale must back off repeatedly
    scales = []
    micro_step = trainer.micro_step

    def recording_step():
        stepped = micro_step()
        if stepped:
            scales.append(trainer.scaler.get_scale())
        return stepped

    trainer.micro_step = recording_step
    warm_up(trainer, WarmUpTerms(steps=1))
    assert scales[0] < 2.0**60 and len(scales) > 40  # it kept warming up while backing off
    assert len(set(scales[-SCALER_STABLE_STEPS - 1 :])) == 1  # and stopped once it held still
