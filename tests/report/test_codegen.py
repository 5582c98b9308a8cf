"""The generated train.py is product code: it must lint clean and train every contract form."""

import csv
import functools
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy
import pytest
import torch

from advisor.knobs import TrialConfig
from advisor.memory import mimalloc_library
from advisor.report.codegen import render_launch_script, render_training_script
from advisor.report.exports import render_export
from advisor.results import (
    BatchSchedule,
    HardwareProfile,
    LrPlan,
    Racer,
    Recommendation,
    ScheduleStage,
    ScheduleSummary,
    TrialResult,
)
from advisor.search.checks import ABSOLUTE, TOLERANCE
from advisor.task import build_task
from advisor.trial.child.hardware import probe
from advisor.trial.child.loop import Trainer
from advisor.trial.child.racing import enter_stage, held_out_split
from advisor.trial.orders import HELD_OUT_MAX, ReferenceOrder
from advisor.trial.parent.preflight import preflight
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY


@functools.cache
def _hardware() -> HardwareProfile:
    return probe()  # measures the matmul peak: once per test session is enough


def _recommendation(spec: str, config: TrialConfig) -> Recommendation:
    # The validation `advisor tune` runs, without its hardware probe (`_hardware` has one).
    checked = preflight(spec, ROOT, "cpu", 300, Path(tempfile.mkdtemp()) / "validate.log")
    return Recommendation(
        advisor_version="test",
        spec=spec,
        workdir=str(ROOT),
        config=config,
        samples_per_s=1000.0,
        peak_memory_bytes=None,
        baseline_config=TrialConfig(batch_size=checked.task.user_batch_size),
        baseline_samples_per_s=500.0,
        speedup=2.0,
        chosen_from_trial=3,
        confirm_runs=(990.0, 1010.0),
        baseline_runs=(500.0,),
        global_batch_changed=config.global_batch_size != checked.task.user_batch_size,
        hardware=_hardware(),
        task=checked.task,
        storage="sqlite:///x.db",
        study_name="s",
        created_at="2026-11-22T00:00:00+00:00",
    )


def _write_and_run(rec: Recommendation, folder: Path, *args: str) -> subprocess.CompletedProcess:
    script = folder / "train.py"
    script.write_text(render_training_script(rec, folder))
    return subprocess.run(
        [sys.executable, str(script), "--checkpoint", str(folder / "ckpt.pt"), *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _trial_losses(
    spec: str, config: TrialConfig, tmp_path: Path, lr: LrPlan | None = None
) -> tuple[float, ...]:
    """The losses of a trial's first optimizer steps, from the same seed (0), trained as a race
    trains: on all but the held-out slice train.py evaluates."""
    launch = TrialLaunch(spec=spec, cwd=ROOT, warmup_steps=2, trial_seconds=0.1, timeout_s=300)
    order = ReferenceOrder(config=config, lr=lr or LrPlan(), held_out=HELD_OUT_MAX)
    reference = ProcessRunner(launch).run(order, tmp_path / "reference.log")
    assert reference.status == "ok", reference.reason
    return reference.early_losses


def _logged_losses(stdout: str) -> list[float]:
    return [float(loss) for loss in re.findall(r"epoch \d+ step \d+: loss (\S+),", stdout)]


# Every branch of the template: file and module specs, each return form of the factory, each
# batch form, loss from the model or a loss_fn, the optimizer's own or AdamW's implementations,
# loader workers and prefetching, accumulation, autocast, channels-last, an IterableDataset.
@pytest.mark.parametrize(
    ("spec", "knobs"),
    [
        (f"{TINY}:factory", {"amp": "bf16", "num_workers": 1, "accumulation_steps": 2}),
        (
            "tests.workloads.tiny:factory",
            {
                "optimizer_impl": "foreach",
                "num_workers": 1,
                "prefetch_factor": 4,
                "persistent_workers": False,
            },
        ),
        (f"{TINY}:with_optimizer", {"accumulation_steps": 2}),
        (f"{TINY}:dict_task", {"num_workers": 2}),
        (f"{TINY}:dict_with_loss_fn", {"optimizer_impl": "fused"}),
        (f"{TINY}:triple_task", {"accumulation_steps": 4}),
        (f"{TINY}:pair_loss", {}),
        (f"{TINY}:reconstruction", {"amp": "bf16"}),
        (f"{TINY}:iterable_task", {}),
        (f"{TINY}:conv", {"channels_last": True, "optimizer_impl": "fused", "num_workers": 1}),
        (
            f"{TINY}:small_blocks",
            {"activation_checkpointing": "ResidualBlock", "accumulation_steps": 2},
        ),
        pytest.param(
            f"{TINY}:factory",
            {"compile": "default"},
            # On the worker that compiles the same model in tests/test_knobs.py, one after the
            # other: the second finds the kernels in the suite's inductor cache (conftest.py).
            marks=[pytest.mark.slow, pytest.mark.xdist_group("torch-compile")],
        ),
    ],
)
def test_generated_script_reproduces_the_trials_losses(spec, knobs, tmp_path):
    config = TrialConfig(batch_size=32, **knobs)
    rec = _recommendation(spec, config)
    # Inside the project, named uniquely: xdist workers give their tests the same tmp_path names.
    (ROOT / "reports").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="test-codegen-", dir=ROOT / "reports"))
    try:
        completed = _write_and_run(rec, folder, "--max-steps", "3", "--log-every", "1")
        assert completed.returncode == 0, completed.stderr
        assert "done: 3 steps; with warm-up" in completed.stdout
        assert (folder / "ckpt.pt").exists()
    finally:
        shutil.rmtree(folder)
    # The script and the trial loop are two implementations of one loop: the same seed, weights,
    # batches and arithmetic give the same loss at every step.
    if config.compile == "off":
        expected = _trial_losses(spec, config, tmp_path)
        assert _logged_losses(completed.stdout) == pytest.approx(expected, abs=5e-5)
        return
    # Compiled, within the tolerance the search allows the knob, of the eager trial: a compiled
    # trial against its eager twin is tests/test_knobs.py's (one compilation less, ~10 s of CPU).
    expected = _trial_losses(spec, config.maths_twin, tmp_path)
    assert _logged_losses(completed.stdout) == pytest.approx(
        expected, rel=TOLERANCE[config.amp], abs=ABSOLUTE
    )


def test_generated_script_trains_with_the_learning_rate_the_race_chose(tmp_path):
    """LR_SCALE and LR_WARMUP_STEPS: the scaled lr, ramped linearly, as the race trained it."""
    spec = "tests/workloads/convergence.py:big_batch_wins"  # SGD at lr 0.005
    config = TrialConfig(batch_size=64)
    lr = LrPlan(scale=8.0, warmup_steps=4, rule="linear")
    rec = _recommendation(spec, config).model_copy(update={"lr": lr})
    completed = _write_and_run(rec, tmp_path, "--max-steps", "6", "--log-every", "1")
    assert completed.returncode == 0, completed.stderr
    script = (tmp_path / "train.py").read_text()
    assert "LR_SCALE = 8  # the linear rule for global batch 64 (yours: 8)" in script
    assert "LR_WARMUP_STEPS = 4" in script
    logged = [float(v) for v in re.findall(r"lr (\S+)$", completed.stdout, re.MULTILINE)]
    assert logged == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.04, 0.04])  # each step's own
    # The steps after the first depend on the lr: the trial loop, given the same plan, agrees.
    expected = _trial_losses(spec, config, tmp_path, lr)
    assert _logged_losses(completed.stdout)[:3] == pytest.approx(expected, rel=1e-5)
    unscaled = _trial_losses(spec, config, tmp_path)
    assert unscaled[2] != pytest.approx(expected[2], rel=1e-3)


SCHEDULE = BatchSchedule(
    stages=(
        ScheduleStage(from_step=0, batch_size=16, accumulation_steps=1),
        ScheduleStage(from_step=2, batch_size=32, accumulation_steps=2, lr_scale=2.0),
        ScheduleStage(from_step=4, batch_size=32, accumulation_steps=4, lr_scale=3.0),
    ),
    rule="sqrt",
)


def _shipped(rec: Recommendation, schedule: BatchSchedule) -> Recommendation:
    """The recommendation with `schedule` shipped, as a schedule race leaves it."""
    config = rec.config.model_copy(
        update={"batch_size": schedule.stages[0].batch_size, "accumulation_steps": 1}
    )
    result = TrialResult(config=config, status="ok")
    racers = tuple(
        Racer(role=role, config=config, lr=LrPlan(), schedule=plan, race_seconds=60, result=result)
        for role, plan in (("fixed", None), ("schedule", schedule))
    )
    summary = ScheduleSummary(
        seconds=60, track=None, rule="test", racers=racers, shipped=1, verdict="it ships"
    )
    return rec.model_copy(update={"schedule": summary})


def _scheduled_trial_losses(spec: str, config: TrialConfig, steps: int) -> list[float]:
    """Each step's loss as a race trial's loop trains the schedule (`enter_stage`), here in
    this process, from the seed a trial child sets."""
    random.seed(0)
    torch.manual_seed(0)
    numpy.random.seed(0)
    task = held_out_split(build_task(spec, ROOT)[0], HELD_OUT_MAX)[0]
    trainer = Trainer(task, config, torch.device("cpu"), seed=0)
    stage = enter_stage(trainer, SCHEDULE, 0, None)
    losses = []
    for step in range(1, steps + 1):
        losses.append(trainer.step().item())
        stage = enter_stage(trainer, SCHEDULE, step, stage)
    trainer.close()
    return losses


def test_generated_script_applies_the_schedule_as_the_trial_did(tmp_path):
    """The stage table at the top of train.py, crossing two boundaries: a new micro-batch (a
    new loader) with a new lr, then more accumulation; the same losses as a race trial's loop."""
    spec = f"{TINY}:factory"
    config = TrialConfig(batch_size=16)
    rec = _shipped(_recommendation(spec, config), SCHEDULE)
    completed = _write_and_run(rec, tmp_path, "--max-steps", "6", "--log-every", "1")
    assert completed.returncode == 0, completed.stderr
    script = (tmp_path / "train.py").read_text()
    assert "Stage(from_step=2, batch_size=32, accumulation_steps=2, lr_scale=2)" in script
    assert "BATCH_SIZE =" not in script  # the table is the one place to edit
    logged = [float(v) for v in re.findall(r"lr (\S+)$", completed.stdout, re.MULTILINE)]
    assert logged == pytest.approx([1e-3, 1e-3, 2e-3, 2e-3, 3e-3, 3e-3])  # steps 1-6
    assert "step 2: stage 2 of 3" in completed.stdout
    expected = _scheduled_trial_losses(spec, config, 6)
    assert _logged_losses(completed.stdout) == pytest.approx(expected, abs=5e-5)


def _metrics(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as rows:
        return list(csv.DictReader(rows))


def _resumed_as_uninterrupted(folder: Path, run) -> str:
    """6 steps, then --resume to 12 (into the second pass over the data), against 12 at once,
    each logging every step: the same weights, train loss and held-out loss. Returns what the
    uninterrupted run printed."""
    every = ("--epochs", "9", "--log-every", "1")
    run("--max-steps", "6", *every, "--checkpoint", "a/c.pt", "--eval-every", "3")
    first = _metrics(folder / "a" / "metrics.csv")
    assert [row["step"] for row in first if row["held_out_loss"]] == ["3", "6"]
    run("--max-steps", "12", *every, "--checkpoint", "a/c.pt", "--resume", "a/c.pt")
    printed = run("--max-steps", "12", *every, "--checkpoint", "b/c.pt")
    resumed, uninterrupted = (
        _metrics(folder / "a" / "metrics.csv"),
        _metrics(folder / "b" / "metrics.csv"),
    )
    assert resumed[: len(first)] == first
    assert resumed[-1]["step"] == uninterrupted[-1]["step"] == "12"
    for field in ("samples", "train_loss", "held_out_loss", "lr"):
        assert resumed[-1][field] == uninterrupted[-1][field], field
    weights = [torch.load(folder / name / "c.pt", weights_only=False)["model"] for name in "ab"]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[1])
    return printed


@pytest.mark.slow
def test_a_resumed_run_continues_exactly_as_an_uninterrupted_one(tmp_path):
    """On CPU in fp32, one process: 461 samples trained on (51 held out), 7 optimizer steps of
    2 micro-batches of 32 per pass; the checkpoint at step 6 stops inside the first pass. The
    model has dropout: the evaluations at steps 3 and 6 of the run resumed, which the other run
    does not make, must draw nothing from the RNG it reads."""
    config = TrialConfig(batch_size=32, accumulation_steps=2)
    rec = _recommendation(f"{TINY}:small_blocks", config)

    def run(*args: str) -> str:
        completed = _write_and_run(rec, tmp_path, *args)
        assert completed.returncode == 0, completed.stderr
        assert "held-out loss" in completed.stdout
        return completed.stdout

    _resumed_as_uninterrupted(tmp_path, run)


@pytest.mark.slow
def test_a_copy_of_the_script_elsewhere_runs_from_any_folder_and_runs_epochs(tmp_path):
    """Copied into your repository and run from `/`: the factory resolves from where advisor
    ran, or from --factory and --factory-root where you moved it."""
    rec = _recommendation(f"{TINY}:factory", TrialConfig(batch_size=128))
    (tmp_path / "generated").mkdir()
    script = tmp_path / "generated" / "train.py"
    script.write_text(render_training_script(rec, script.parent))
    copy = tmp_path / "elsewhere" / "train.py"
    copy.parent.mkdir()
    shutil.copy(script, copy)

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, str(copy), "--checkpoint", str(tmp_path / "c.pt"), *args]
        return subprocess.run(
            command, cwd="/", capture_output=True, text=True, timeout=180, check=False
        )

    completed = run("--epochs", "2")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.count("epoch ") == 2  # 461 samples / 128 = 3 steps per epoch
    module = run("--max-steps", "1", "--factory", "tests.workloads.tiny:factory")
    assert module.returncode == 0, module.stderr
    moved = run("--max-steps", "1", "--factory-root", str(tmp_path))
    assert moved.returncode != 0 and "tiny.py" in moved.stderr  # not found where it was told


def test_tensorboard_gets_the_metrics_rows_and_without_the_package_one_line(tmp_path):
    """--tensorboard FOLDER: the figures of metrics.csv as scalars at their steps; where the
    tensorboard package cannot be imported (a stand-in that fails shadows it), the run stops
    at once with one line saying what to install."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    rec = _recommendation(f"{TINY}:factory", TrialConfig(batch_size=128))
    args = ("--max-steps", "2", "--log-every", "1", "--tensorboard", "board")
    completed = _write_and_run(rec, tmp_path, *args)
    assert completed.returncode == 0, completed.stderr
    events = accumulator.EventAccumulator(str(tmp_path / "board")).Reload()
    rows = [row for row in _metrics(tmp_path / "metrics.csv") if row["train_loss"]]
    logged = [(point.step, point.value) for point in events.Scalars("train_loss")]
    assert logged == [(int(row["step"]), pytest.approx(float(row["train_loss"]))) for row in rows]
    assert [point.step for point in events.Scalars("held_out_loss")] == [2]

    missing = tmp_path / "missing"
    (missing / "tensorboard").mkdir(parents=True)
    (missing / "tensorboard" / "__init__.py").write_text("raise ImportError('not here')\n")
    env = dict(os.environ, PYTHONPATH=str(missing))
    script = [sys.executable, str(tmp_path / "train.py"), *args]
    refused = subprocess.run(script, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "--tensorboard needs the tensorboard package: pip install tensorboard"
    )


def _launch(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """`sh launch.sh ARGS` in `folder`, with this interpreter's torchrun on the PATH; it must
    succeed."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    launched = subprocess.run(
        ["sh", str(folder / "launch.sh"), *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert launched.returncode == 0, launched.stderr[-3000:]
    return launched


DDP_CONFIG = TrialConfig(  # with DDP's network knobs off their defaults
    batch_size=32,
    accumulation_steps=2,
    parallel_mode="ddp",
    world_size=2,
    bucket_cap_mb=100,
    gradient_as_bucket_view=True,
)


@pytest.mark.slow
def test_a_ddp_script_trains_as_the_trial_did_resumes_exactly_and_runs_alone(tmp_path):
    """Under DDP-2 through launch.sh: rank 0 logs the losses the DDP trial's rank 0 recorded
    from the same seed; 6 steps resumed to 12 end where 12 uninterrupted do (each rank's shard
    of the pass, the same state in both); started plainly, it is one process."""
    rec = _recommendation(f"{TINY}:small_blocks", DDP_CONFIG)
    (tmp_path / "launch.sh").write_text(render_launch_script(rec))
    script = tmp_path / "train.py"
    script.write_text(render_training_script(rec, tmp_path))
    assert f"torchrun --standalone --nproc_per_node=2 {script}" in script.read_text()
    printed = _resumed_as_uninterrupted(tmp_path, lambda *a: _launch(tmp_path, *a).stdout)
    expected = _trial_losses(f"{TINY}:small_blocks", DDP_CONFIG, tmp_path)
    assert _logged_losses(printed)[:3] == pytest.approx(expected, abs=5e-5)
    # 461 samples trained on (51 held out) in 2 shards of 230 = 7 micro-batches of 32 a pass in
    # each process: 2 passes take 7 optimizer steps of 2; only rank 0 reports, counting both's.
    assert printed.count("epoch 1 done at step 7") == 1, printed
    assert printed.count("done: 12 steps") == 1 and " 0 samples/s" not in printed
    alone = _write_and_run(rec, tmp_path, "--max-steps", "3")
    assert alone.returncode == 0, alone.stderr
    assert "done: 3 steps; with warm-up" in alone.stdout


FSDP_CONFIG = TrialConfig(
    batch_size=16,
    accumulation_steps=2,
    parallel_mode="fsdp",
    world_size=2,
    activation_checkpointing="ResidualBlock",
)


@pytest.mark.slow
def test_an_fsdp_script_trains_as_the_trial_did_and_resumes_whole_tensors_into_shards(tmp_path):
    """Under FSDP-2 with checkpointed blocks: rank 0 logs the FSDP trial's losses; the checkpoint
    holds whole tensors under your model's own names (torch.distributed.checkpoint's state-dict
    API gathers them), and resumed, every process keeps its shard of them. The run resumed had
    evaluated at steps 3 and 6, the one it is held against had not: evaluations draw nothing from
    the RNG the blocks' dropout reads."""
    rec = _recommendation(f"{TINY}:small_blocks", FSDP_CONFIG)
    (tmp_path / "launch.sh").write_text(render_launch_script(rec))
    script = tmp_path / "train.py"
    script.write_text(render_training_script(rec, tmp_path))
    assert 'SHARD_BLOCK = "ResidualBlock"' in script.read_text()
    printed = _resumed_as_uninterrupted(tmp_path, lambda *a: _launch(tmp_path, *a).stdout)
    expected = _trial_losses(f"{TINY}:small_blocks", FSDP_CONFIG, tmp_path)
    assert _logged_losses(printed)[:3] == pytest.approx(expected, abs=5e-5)
    saved = torch.load(tmp_path / "b" / "c.pt", weights_only=True)
    model = build_task(f"{TINY}:small_blocks", ROOT)[0].model
    assert {name: tensor.shape for name, tensor in saved["model"].items()} == {
        name: tensor.shape for name, tensor in model.state_dict().items()
    }
    model.load_state_dict(saved["model"])


@pytest.mark.parametrize(
    "config",
    [
        TrialConfig(batch_size=64, amp="bf16"),
        DDP_CONFIG,
        FSDP_CONFIG,
        TrialConfig(device="cuda", batch_size=64, amp="fp16", parallel_mode="dp", pin_memory=True),
        TrialConfig(
            device="cuda",
            batch_size=64,
            compile="max-autotune-no-cudagraphs",
            channels_last=True,
            matmul_precision="high",
            cudnn_deterministic=True,
            optimizer_impl="foreach",
            num_workers=2,
            prefetch_factor=4,
        ),
    ],
    ids=["single", "ddp", "fsdp", "dp", "beyond-classic"],
)
def test_generated_script_is_lint_and_format_clean(config, tmp_path):
    rec = _recommendation(f"{TINY}:dict_task", config)
    script = tmp_path / "train.py"
    script.write_text(render_training_script(rec, Path("reports/dict-task")))
    ruff = [sys.executable, "-m", "ruff"]
    lint = subprocess.run(
        [*ruff, "check", "--select", "E,F,W,I,B,UP", "--line-length", "100", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout
    fmt = subprocess.run(
        [*ruff, "format", "--check", "--line-length", "100", str(script)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert fmt.returncode == 0, fmt.stdout


def test_user_strings_become_inert_python_literals(tmp_path):
    rec = _recommendation(f"{TINY}:factory", TrialConfig(batch_size=32))
    payload = 'x"""\nimport os; os.killpg(0, 9)\n"""'
    hostile = rec.model_copy(update={"study_name": payload, "spec": rec.spec + "\\"})
    source = render_training_script(hostile, tmp_path)
    module = compile(source, "train.py", "exec")
    assert "killpg" not in module.co_names  # the payload stayed inside the docstring


def test_launch_sh_and_the_exports_start_the_run_under_the_allocator_measured(tmp_path):
    rec = _recommendation(f"{TINY}:factory", TrialConfig(batch_size=64))
    glibc = rec.hardware.model_copy(update={"allocator": "glibc", "allocator_preload": None})
    assert "LD_PRELOAD" not in render_launch_script(rec.model_copy(update={"hardware": glibc}))
    library = mimalloc_library()
    if library is None:
        pytest.skip("cmeel-mimalloc is not installed")
    measured = glibc.model_copy(update={"allocator": "mimalloc", "allocator_preload": str(library)})
    rec = rec.model_copy(update={"hardware": measured})
    (tmp_path / "launch.sh").write_text(render_launch_script(rec))
    # A stand-in train.py that says what it runs under: launch.sh starts it as it would yours.
    (tmp_path / "train.py").write_text(
        "from advisor.memory import running_allocator\nprint(running_allocator())\n"
    )
    env_free = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "environ", env_free)
        assert _launch(tmp_path).stdout.strip() == "mimalloc"
    assert f"LD_PRELOAD={library} " in render_export(rec, "hf")


def test_launch_sh_runs_the_interpreter_advisor_measured_with_unless_python_is_set(tmp_path):
    """Not whatever `python` is first on the PATH: the venv advisor measured in."""
    rec = _recommendation(f"{TINY}:factory", TrialConfig(batch_size=64))
    measured = rec.hardware.model_copy(update={"python_executable": sys.executable})
    script = render_launch_script(rec.model_copy(update={"hardware": measured}))
    (tmp_path / "launch.sh").write_text(script)
    (tmp_path / "train.py").write_text("import sys\nprint(sys.executable)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"} | {"PATH": "/usr/bin:/bin"}

    def started(**extra: str) -> str:
        launched = subprocess.run(
            ["sh", str(tmp_path / "launch.sh")], env=env | extra, capture_output=True,
            text=True, timeout=60, check=True,
        )  # fmt: skip
        return launched.stdout.strip()

    assert started() == sys.executable
    other = shutil.which("python3", path="/usr/bin:/bin")
    if other is not None:
        assert started(PYTHON=other) == other
