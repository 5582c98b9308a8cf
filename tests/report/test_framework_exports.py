"""The recommendation as HF TrainingArguments, a Lightning Trainer and an accelerate config: each
export says what was measured, carries the learning-rate rule, names the knobs its framework
cannot set, and loads into the real library (`pip install -e ".[integrations]"`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from advisor.knobs import TrialConfig
from advisor.report.exports import EXPORT_FILES, render_export, write_exports
from advisor.results import (
    BatchSchedule,
    FixedKnob,
    GpuInfo,
    HardwareProfile,
    LrPlan,
    RaceCurve,
    RacePoint,
    Racer,
    Recommendation,
    ScheduleStage,
    ScheduleSummary,
    TaskSummary,
    TrialResult,
)
from tests.conftest import advisor_here

_GPU = GpuInfo(name="A100", memory_bytes=80 * 2**30, capability="8.0", bf16=True)
CPU_DDP = TrialConfig(
    parallel_mode="ddp", world_size=2, batch_size=512, accumulation_steps=4, amp="bf16",
    num_workers=1, prefetch_factor=4,
)  # fmt: skip
CUDA_DDP = TrialConfig(
    device="cuda", parallel_mode="ddp", world_size=2, batch_size=64, amp="fp16",
    num_workers=4, pin_memory=True, cudnn_benchmark=True, compile="default",
    channels_last=True, matmul_precision="high", optimizer_impl="foreach",
)  # fmt: skip
CUDA_DP = TrialConfig(device="cuda", parallel_mode="dp", batch_size=128, amp="bf16")
ONE_PROCESS = TrialConfig(batch_size=32)
CPU_FSDP = TrialConfig(
    parallel_mode="fsdp", world_size=2, batch_size=16, accumulation_steps=2, amp="bf16",
    activation_checkpointing="GPT2Block",
)  # fmt: skip
CUDA_FSDP = TrialConfig(
    device="cuda", parallel_mode="fsdp", world_size=2, batch_size=16, amp="bf16",
    reshard_after_forward=False,
)  # fmt: skip
CUDA_DDP_TWO_MACHINES = TrialConfig(
    device="cuda", parallel_mode="ddp", world_size=4, nnodes=2, batch_size=64, amp="bf16",
)  # fmt: skip
CONFIGS = {
    "cpu-ddp": CPU_DDP, "cuda-ddp": CUDA_DDP, "cuda-dp": CUDA_DP, "one": ONE_PROCESS,
    "cpu-fsdp": CPU_FSDP, "cuda-fsdp": CUDA_FSDP, "cuda-ddp-2-machines": CUDA_DDP_TWO_MACHINES,
}  # fmt: skip


def _recommendation(config: TrialConfig, lr: LrPlan | None = None, **update) -> Recommendation:
    gpus = (_GPU, _GPU) if config.device == "cuda" else ()
    fields = dict(
        advisor_version="test", spec="examples/mlp.py:factory", workdir="/w", config=config,
        samples_per_s=30000.0, peak_memory_bytes=None, baseline_config=ONE_PROCESS,
        baseline_samples_per_s=10000.0, speedup=3.0, chosen_from_trial=7,
        confirm_runs=(30000.0,), baseline_runs=(10000.0,),
        global_batch_changed=config.global_batch_size != 32, lr=lr or LrPlan(),
        hardware=HardwareProfile(
            cpu_model="x", cores=8, memory_bytes=2**34, cpu_capability="AVX2", cpu_bf16=False,
            python_version="3.11", torch_version="2.13.0", gpus=gpus,
        ),
        task=TaskSummary(
            return_kind="tuple", model_class="MLP", num_parameters=1000, dataset_class="T",
            dataset_size=4096, iterable=False, batch_kind="pair", batch_description="?",
            loss_from_model=False, custom_optimizer=False, custom_collate=False,
            user_batch_size=32, repeated_block="GPT2Block",
        ),
        storage="sqlite:///x.db", study_name="mlp-factory", created_at="2026-11-24T00:00:00",
    )  # fmt: skip
    return Recommendation(**{**fields, **update})


def _hf(rec: Recommendation) -> dict:
    return json.loads(render_export(rec, "hf"))


def test_hf_arguments_are_the_measured_knobs_and_ddp_gets_its_launch_line():
    document = _hf(_recommendation(CPU_DDP))
    args = document["training_args"]
    assert args["per_device_train_batch_size"] == 512 and args["gradient_accumulation_steps"] == 4
    assert args["bf16"] is True and args["fp16"] is False and args["use_cpu"] is True
    assert args["dataloader_num_workers"] == 1 and args["dataloader_prefetch_factor"] == 4
    assert args["torch_compile"] is False  # and torchrun's environment picks gloo for DDP
    assert document["launch"] == (
        "OMP_NUM_THREADS=3 torchrun --standalone --nproc_per_node=2 your_script.py"
    )  # (8 cores - 2 ranks x 1 worker) / 2 ranks, as advisor measured it
    assert "3.00x your baseline" in document["about"][1] and "mlp-factory" in document["about"][0]
    # As measured: Trainer would turn it on for a model from transformers, at a cost each step.
    assert args["ddp_find_unused_parameters"] is False
    assert "ddp_find_unused_parameters" not in _hf(_recommendation(ONE_PROCESS))["training_args"]


def test_every_cpu_launch_line_keeps_the_thread_count_advisor_measured_with():
    """One process on 8 cores with no loader workers: 8 threads, in every export."""
    rec = _recommendation(ONE_PROCESS)
    assert _hf(rec)["launch"] == "OMP_NUM_THREADS=8 python your_script.py"
    assert "Launch: OMP_NUM_THREADS=8 python your_script.py" in render_export(rec, "lightning")
    assert "OMP_NUM_THREADS=8 accelerate launch" in render_export(rec, "accelerate")


def test_knobs_a_framework_cannot_set_are_named_with_how_to_apply_them():
    rec = _recommendation(CUDA_DDP)
    hf = _hf(rec)
    assert any(line.startswith("channels_last:") for line in hf["not_in_training_args"])
    assert any(line.startswith("optimizer_impl=foreach") for line in hf["not_in_training_args"])
    assert hf["training_args"]["torch_compile_mode"] == "default" and hf["training_args"]["tf32"]
    lightning = render_export(rec, "lightning")
    assert "# - compile=default: model = torch.compile" in lightning
    assert 'torch.set_float32_matmul_precision("high")' in lightning
    accelerate = render_export(rec, "accelerate")
    assert "# - cudnn.benchmark: torch.backends.cudnn.benchmark = True" in accelerate
    assert yaml.safe_load(accelerate)["dynamo_config"] == {
        "dynamo_backend": "INDUCTOR",
        "dynamo_mode": "default",
    }


def test_a_ddp_run_on_cpu_is_told_how_to_end_without_gloo_aborting_it():
    ending = "torch.distributed.barrier() then os._exit(0)"
    assert any(ending in line for line in _hf(_recommendation(CPU_DDP))["not_in_training_args"])
    for framework in ("lightning", "accelerate"):
        assert ending in " ".join(render_export(_recommendation(CPU_DDP), framework).split())
        for config in (CUDA_DDP, ONE_PROCESS):  # NCCL, or no process group at all
            assert "os._exit" not in render_export(_recommendation(config), framework)


def test_checkpointed_blocks_are_hf_gradient_checkpointing_and_torchs_call_elsewhere():
    rec = _recommendation(TrialConfig(batch_size=32, activation_checkpointing="GPT2Block"))
    hf = _hf(rec)
    assert hf["training_args"]["gradient_checkpointing"] is True
    assert any("gradient_checkpointing_enable()" in line for line in hf["not_in_training_args"])
    for framework in ("lightning", "accelerate"):
        text = " ".join(render_export(rec, framework).replace("#", " ").split())
        assert "apply_activation_checkpointing(model" in text
        assert "check_fn=lambda m: type(m).__name__ == 'GPT2Block'" in text
    assert "gradient_checkpointing" not in _hf(_recommendation(ONE_PROCESS))["training_args"]


def test_fsdp_is_each_frameworks_fsdp2_of_the_block_advisor_sharded():
    """One FSDP unit per GPT2Block, checkpointed by FSDP's own setting (HF refuses it together
    with gradient_checkpointing), resharding as measured, under torchrun."""
    hf = _hf(_recommendation(CPU_FSDP))
    args = hf["training_args"]
    assert args["fsdp"] is True and "gradient_checkpointing" not in args
    assert args["fsdp_config"] == {
        "version": 2, "reshard_after_forward": True, "activation_checkpointing": True,
        "transformer_layer_cls_to_wrap": ["GPT2Block"],
    }  # fmt: skip
    assert hf["launch"].endswith("torchrun --standalone --nproc_per_node=2 your_script.py")
    assert any(line.startswith("FSDP on CPU") for line in hf["not_in_training_args"])
    on_cpu = render_export(_recommendation(CPU_FSDP), "lightning")
    assert "FSDPStrategy(" not in on_cpu  # it raises on accelerator="cpu": train.py instead
    assert "FSDPStrategy refuses accelerator='cpu'" in " ".join(on_cpu.replace("#", " ").split())
    full = {"reshard_after_forward": True, "activation_checkpointing": "GPT2Block"}
    lightning = render_export(_recommendation(CUDA_FSDP.model_copy(update=full)), "lightning")
    assert 'sharding_strategy="FULL_SHARD"' in lightning
    assert "activation_checkpointing_policy=_is_block" in lightning
    assert "apply_activation_checkpointing" not in lightning  # the strategy does it
    accelerate = yaml.safe_load(render_export(_recommendation(CUDA_FSDP), "accelerate"))
    assert accelerate["distributed_type"] == "FSDP"
    assert accelerate["fsdp_config"] == {
        "fsdp_version": 2, "fsdp_reshard_after_forward": False,
        "fsdp_activation_checkpointing": False, "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "fsdp_transformer_layer_cls_to_wrap": "GPT2Block",
    }  # fmt: skip
    cuda = render_export(_recommendation(CUDA_FSDP), "lightning")
    assert 'sharding_strategy="SHARD_GRAD_OP"' in cuda and "FSDP on CPU" not in cuda


def test_data_parallel_is_said_to_have_no_lightning_or_accelerate_counterpart():
    rec = _recommendation(CUDA_DP)
    assert "Lightning 2 has no DataParallel strategy" in render_export(rec, "lightning")
    assert "DataParallel: accelerate has none" in render_export(rec, "accelerate")
    assert "Trainer uses DataParallel on its own" in _hf(rec)["launch"]


def test_one_process_on_a_machine_with_several_gpus_keeps_to_one():
    config = TrialConfig(device="cuda", batch_size=64)
    assert _hf(_recommendation(config))["launch"] == "CUDA_VISIBLE_DEVICES=0 python your_script.py"


def test_a_changed_global_batch_carries_the_learning_rate_rule_everywhere():
    lr = LrPlan(scale=8.0, warmup_steps=50, rule="linear")
    rec = _recommendation(CPU_DDP, lr=lr)
    advice = "multiply your learning rate by 8 (linear rule, global batch 4096 against your 32)"
    assert _hf(rec)["learning_rate"].startswith(advice)
    assert _hf(rec)["training_args"]["warmup_steps"] == 50
    for framework in ("lightning", "accelerate"):
        assert advice in " ".join(render_export(rec, framework).split())
    same_batch = _recommendation(ONE_PROCESS)
    assert "multiply" not in render_export(same_batch, "lightning")


def test_a_measured_optimizer_implementation_becomes_hf_optim_and_a_fixed_one_does_not():
    fused = TrialConfig(batch_size=32, optimizer_impl="fused")
    assert _hf(_recommendation(fused))["training_args"]["optim"] == "adamw_torch_fused"
    fixed = (FixedKnob(name="optimizer_impl", value="default", reason="your optimizer"),)
    assert "optim" not in _hf(_recommendation(ONE_PROCESS, fixed_knobs=fixed))["training_args"]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_lightning_snippet_is_lint_and_format_clean(name, tmp_path):
    path = write_exports(_recommendation(CONFIGS[name]), tmp_path, ("lightning",))[0]
    ruff = [sys.executable, "-m", "ruff"]
    for command in (
        ["check", "--select", "E,F,W,I,B,UP", "--line-length", "100"],
        ["format", "--check", "--line-length", "100"],
    ):
        completed = subprocess.run([*ruff, *command, str(path)], capture_output=True, text=True)
        assert completed.returncode == 0, completed.stdout + completed.stderr


def test_user_strings_stay_in_comments_and_strings(tmp_path):
    rec = _recommendation(CPU_DDP, spec='evil.py:f"""\nimport os\n# x', study_name="a\nb: c")
    folder = tmp_path / "out"
    for path in write_exports(rec, folder):
        text = path.read_text()
        if path.suffix == ".py":
            compile(text, str(path), "exec")
            assert "\nimport os" not in text
        elif path.suffix == ".yaml":
            assert yaml.safe_load(text)["num_processes"] == 2  # no key injected
        else:
            assert json.loads(text)["about"][0].startswith("advisor test, study a\nb: c")


# --- against the real libraries -----------------------------------------------------------------
@pytest.mark.parametrize("name", CONFIGS)
def test_hf_arguments_build_real_training_arguments(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    rec = _recommendation(CONFIGS[name])
    path = write_exports(rec, tmp_path, ("hf",))[0]
    kwargs = json.loads(path.read_text())["training_args"]
    if rec.config.device == "cuda":  # this machine has no GPU: the rest must still be accepted
        kwargs.update(use_cpu=True, bf16=False, fp16=False, tf32=False, torch_compile=False)
        kwargs.pop("torch_compile_mode", None)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "o"), **kwargs)
    assert args.per_device_train_batch_size == rec.config.batch_size
    assert args.gradient_accumulation_steps == rec.config.accumulation_steps
    assert args.dataloader_num_workers == rec.config.num_workers


def _load_snippet(path: Path):
    spec = importlib.util.spec_from_file_location("advisor_lightning_export", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["cpu-ddp", "one"])
def test_the_lightning_snippet_builds_a_real_trainer(name, tmp_path):
    pytest.importorskip("lightning")
    rec = _recommendation(CONFIGS[name])
    snippet = _load_snippet(write_exports(rec, tmp_path, ("lightning",))[0])
    trainer = snippet.make_trainer(logger=False, enable_checkpointing=False, max_epochs=1)
    assert trainer.accumulate_grad_batches == rec.config.accumulation_steps
    assert trainer.num_devices == rec.config.world_size
    assert str(trainer.precision) == snippet.TRAINER_KWARGS["precision"]


@pytest.mark.parametrize("name", CONFIGS)
def test_the_accelerate_config_loads_in_accelerate(name, tmp_path):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig

    rec = _recommendation(CONFIGS[name])
    path = write_exports(rec, tmp_path, ("accelerate",))[0]
    config = ClusterConfig.from_yaml_file(str(path))
    assert config.num_processes == rec.config.world_size
    assert config.mixed_precision == {"off": "no"}.get(rec.config.amp, rec.config.amp)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_accelerate_scalar_parses_to_what_was_meant(name):
    """YAML 1.1 reads a bare NO as false: every scalar is written so PyYAML reads it back."""
    config = CONFIGS[name]
    document = yaml.safe_load(render_export(_recommendation(config), "accelerate"))
    expected = {"none": "NO", "dp": "NO", "ddp": "MULTI_CPU", "fsdp": "FSDP"}[config.parallel_mode]
    if config.device == "cuda" and config.parallel_mode == "ddp":
        expected = "MULTI_GPU"
    assert document["distributed_type"] == expected, document
    assert document["compute_environment"] == "LOCAL_MACHINE"
    assert document["use_cpu"] is (config.device == "cpu")
    assert document["mixed_precision"] == {"off": "no"}.get(config.amp, config.amp)
    fsdp = document.get("fsdp_config") or {}
    assert all(not isinstance(v, str) or v not in ("False", "True") for v in fsdp.values())


@pytest.mark.parametrize("framework", ["hf", "lightning", "accelerate"])
def test_every_export_lists_the_flushed_denormals_train_py_applies(framework):
    assert "torch.set_flush_denormal(True)" in render_export(
        _recommendation(ONE_PROCESS), framework
    )


def test_advisor_export_writes_the_asked_files_and_refuses_a_folder_without_a_result(tmp_path):
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "recommendation.json").write_text(_recommendation(CPU_DDP).model_dump_json())
    written = advisor_here("export", str(folder), "--to", "hf")
    assert written.returncode == 0, written.stderr
    assert sorted(p.name for p in (folder / "exports").iterdir()) == [EXPORT_FILES["hf"]]
    missing = advisor_here("export", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().startswith("error: ") and "does not exist" in missing.stderr


# --- a shipped batch-size schedule --------------------------------------------------------------
SCHEDULE = BatchSchedule(
    stages=(
        ScheduleStage(from_step=0, batch_size=32, accumulation_steps=1),
        ScheduleStage(from_step=2, batch_size=64, accumulation_steps=1, lr_scale=1.5),
        ScheduleStage(from_step=4, batch_size=32, accumulation_steps=4, lr_scale=2.0),
    ),
    rule="sqrt",
)


def _with_schedule(rec: Recommendation) -> Recommendation:
    """`rec` (the fixed recommendation) with `SCHEDULE` shipped, 2x sooner than it."""
    points = (RacePoint(seconds=0, samples=0, steps=0, loss=2.0),)
    timed = {"fixed": 20.0, "schedule": 10.0}
    racers = tuple(
        Racer(
            role=role,
            config=ONE_PROCESS,
            lr=LrPlan(),
            schedule=SCHEDULE if role == "schedule" else None,
            race_seconds=60,
            time_to_target_s=timed[role],
            result=TrialResult(
                config=ONE_PROCESS,
                status="ok",
                race=RaceCurve(loss_kind="held-out", points=points),
            ),
        )
        for role in ("fixed", "schedule")
    )
    summary = ScheduleSummary(
        seconds=60, track=None, rule="r", racers=racers, shipped=1, verdict="it ships"
    )
    return rec.model_copy(update={"schedule": summary})


def test_a_shipped_schedule_is_a_lightning_callback_and_an_hf_note(tmp_path):
    rec = _with_schedule(_recommendation(CPU_DDP))
    hf = _hf(rec)
    assert hf["training_args"]["per_device_train_batch_size"] == 512  # the nearest fixed one
    assert "2.00x sooner" in hf["batch_size_schedule"]["note"]
    assert [s["global_batch"] for s in hf["batch_size_schedule"]["stages"]] == [32, 64, 128]
    if importlib.util.find_spec("transformers") is not None:  # the snippet's callbacks load
        namespace: dict[str, object] = {}
        exec("\n".join(hf["batch_size_schedule"]["callback"]), namespace)
        assert {"StopAtStep", "StageLearningRate"} <= namespace.keys()
    lightning = render_export(rec, "lightning")
    assert "(2, 2, 1.5)," in lightning and "(4, 4, 2)," in lightning
    path = write_exports(rec, tmp_path, ("lightning",))[0]
    completed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "E,F,W,I,B,UP", str(path)],
        capture_output=True,
        text=True,
    )
    assert completed.returncode == 0, completed.stdout


def test_the_lightning_schedule_callback_grows_the_batch_in_real_training(tmp_path):
    """Real Lightning steps: each stage's accumulation and learning rate from its step on."""
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    snippet = _load_snippet(
        write_exports(_with_schedule(_recommendation(ONE_PROCESS)), tmp_path, ("lightning",))[0]
    )

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.seen: list[tuple[int, int, float]] = []

        def training_step(self, batch, batch_idx):
            trainer = self.trainer
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            self.seen.append((trainer.global_step, trainer.accumulate_grad_batches, lr))
            inputs, targets = batch
            return torch.nn.functional.mse_loss(self.net(inputs).squeeze(-1), targets)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = TensorDataset(torch.randn(2048, 4), torch.randn(2048))
    loader = DataLoader(data, shuffle=True, **snippet.DATALOADER_KWARGS)
    assert loader.batch_size == 32  # the first stage's micro-batch, kept throughout
    module = Regression()
    trainer = snippet.make_trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, max_steps=6
    )
    trainer.fit(module, loader)
    by_step = {step: (accumulation, lr) for step, accumulation, lr in module.seen}
    assert by_step[0] == (1, pytest.approx(0.1)) and by_step[1] == (1, pytest.approx(0.1))
    assert by_step[2] == (2, pytest.approx(0.15)) and by_step[3] == (2, pytest.approx(0.15))
    assert by_step[4] == (4, pytest.approx(0.2)) and by_step[5] == (4, pytest.approx(0.2))
    assert trainer.global_step == 6


# --- real steps in each framework ---------------------------------------------------------------
STEPPED = TrialConfig(batch_size=16, accumulation_steps=2, amp="bf16", num_workers=1)


def _seen_by_forward():
    """A regression model that records, per forward, its batch and whether autocast was on."""
    import torch

    class Regression(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.seen: list[tuple[int, bool]] = []

        def forward(self, x, labels=None):
            self.seen.append((x.shape[0], torch.is_autocast_enabled("cpu")))
            prediction = self.net(x).squeeze(-1)
            loss = torch.nn.functional.mse_loss(prediction.float(), labels.float())
            return {"loss": loss}

    return Regression()


def test_hf_trainer_trains_real_steps_with_the_exported_arguments(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    training_args = json.loads(
        write_exports(_recommendation(STEPPED), tmp_path, ("hf",))[0].read_text()
    )["training_args"]
    generator = torch.Generator().manual_seed(0)
    dataset = [
        {"x": torch.randn(4, generator=generator), "labels": torch.randn((), generator=generator)}
        for _ in range(256)
    ]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "o"), max_steps=3, report_to=[], save_strategy="no",
        logging_strategy="no", **training_args,
    )  # fmt: skip
    model = _seen_by_forward()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset)
    assert trainer.get_train_dataloader().num_workers == STEPPED.num_workers
    trainer.train()
    assert trainer.state.global_step == 3
    # 3 optimizer steps of 2 micro-batches of 16, each under bf16 autocast
    assert model.seen == [(16, True)] * 6


def test_a_lightning_trainer_trains_real_steps_with_the_exported_settings(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    snippet = _load_snippet(write_exports(_recommendation(STEPPED), tmp_path, ("lightning",))[0])
    net = _seen_by_forward()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = net

        def training_step(self, batch, batch_idx):
            inputs, targets = batch
            return self.model(inputs, targets)["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    generator = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(256, 4, generator=generator), torch.randn(256, generator=generator)
    )
    loader = DataLoader(data, shuffle=True, **snippet.DATALOADER_KWARGS)
    trainer = snippet.make_trainer(
        max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Module(), loader)
    assert trainer.global_step == 3 and loader.num_workers == STEPPED.num_workers
    assert net.seen == [(16, True)] * 6


ACCELERATE_SCRIPT = """
import json, sys
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

class Regression(torch.nn.Linear):
    def forward(self, inputs):
        seen.append([inputs.shape[0], torch.is_autocast_enabled("cpu")])
        return super().forward(inputs)


accelerator = Accelerator()
seen, steps = [], 0
model = Regression(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = TensorDataset(torch.randn(256, 4), torch.randn(256))
loader = DataLoader(data, shuffle=True, batch_size=int(sys.argv[1]), num_workers=int(sys.argv[2]))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for inputs, targets in loader:
    with accelerator.accumulate(model):
        prediction = model(inputs).squeeze(-1)
        accelerator.backward(torch.nn.functional.mse_loss(prediction.float(), targets))
        optimizer.step()
        optimizer.zero_grad()
        steps += accelerator.sync_gradients
    if steps == 3:
        break
print(json.dumps({
    "seen": seen, "steps": steps, "accumulation": accelerator.gradient_accumulation_steps,
    "precision": accelerator.mixed_precision, "processes": accelerator.num_processes,
}))
"""


def test_accelerate_launch_trains_real_steps_with_the_exported_config(tmp_path):
    """The export's own launch line, from the folder above exports/ as it says."""
    pytest.importorskip("accelerate")
    import shlex

    config = write_exports(_recommendation(STEPPED), tmp_path, ("accelerate",))[0]
    launch = next(
        line.removeprefix("# Launch: ") for line in config.read_text().splitlines()
        if line.startswith("# Launch: ")
    )  # fmt: skip
    (tmp_path / "your_script.py").write_text(ACCELERATE_SCRIPT)
    words = shlex.split(launch)
    env = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
    command = [word for word in words if word not in {f"{k}={v}" for k, v in env.items()}]
    assert command[:2] == ["accelerate", "launch"]
    completed = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", *command[2:], "16", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, **env},
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-2000:]
    run = json.loads(completed.stdout.strip().splitlines()[-1])
    assert (run["steps"], run["accumulation"], run["processes"]) == (3, 2, 1)
    assert run["precision"] == "bf16" and run["seen"] == [[16, True]] * 6


def test_a_two_machine_recommendation_exports_its_machines_to_every_framework():
    """DDP over 2 machines of 2 GPUs each: accelerate's machines, rank, port and rendezvous;
    Lightning's devices per machine and num_nodes; the same torchrun line for every machine."""
    rec = _recommendation(CUDA_DDP_TWO_MACHINES)
    accelerate = render_export(rec, "accelerate")
    document = yaml.safe_load(accelerate)
    assert (document["num_machines"], document["machine_rank"]) == (2, 0)
    assert (document["num_processes"], document["main_process_port"]) == (4, 29500)
    assert (document["rdzv_backend"], document["same_network"]) == ("c10d", True)
    assert "--machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR" in accelerate
    torchrun = "torchrun --nnodes=2 --nproc_per_node=2 --rdzv-backend=c10d"
    assert torchrun in _hf(rec)["launch"]
    lightning = render_export(rec, "lightning")
    assert '"devices": 2,' in lightning and '"num_nodes": 2,' in lightning
    assert '"strategy": "ddp",' in lightning
