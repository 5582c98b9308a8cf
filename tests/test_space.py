import optuna
import pytest

from advisor.config import TuneSettings
from advisor.errors import SettingsError
from advisor.results import GpuInfo, TaskSummary
from advisor.space import build_space
from tests.conftest import CPU_PROFILE

CPU = CPU_PROFILE
FOUR_A100 = CPU.model_copy(
    update={
        "cores": 32,
        "cuda_version": "12.8",
        "cudnn_version": 91000,
        "gpus": tuple(
            GpuInfo(name="A100-SXM4-80GB", memory_bytes=80 * 2**30, capability="8.0", bf16=True)
            for _ in range(4)
        ),
    }
)
TASK = TaskSummary(
    return_kind="tuple",
    model_class="M",
    num_parameters=10,
    dataset_class="D",
    dataset_size=4096,
    iterable=False,
    batch_kind="pair",
    batch_description="(x, y)",
    loss_from_model=False,
    custom_optimizer=False,
    custom_collate=False,
    user_batch_size=32,
)


def _fixed(space):
    return {knob.name: knob for knob in space.fixed}


def test_cpu_space_fixes_gpu_knobs_with_reasons_and_searches_the_rest():
    space = build_space(TuneSettings(spec="a.py:f"), CPU, TASK)
    assert space.device == "cpu"
    assert space.domains["amp"] == ("off", "bf16")
    assert space.domains["num_workers"] == (0, 1, 2)
    assert space.domains["accumulation_steps"] == (1, 2, 4, 8)
    assert space.domains["batch_size"] == (8, 16, 32, 64, 128, 256, 512, 1024)
    fixed = _fixed(space)
    assert "no CUDA device" in fixed["pin_memory"].reason
    assert "no cuDNN" in fixed["cudnn_benchmark"].reason
    assert "fp16 autocast needs CUDA" in fixed["amp"].reason
    assert "DataParallel needs >= 2 CUDA GPUs" in fixed["parallel_mode"].reason
    assert "pin_memory" not in space.domains and "cudnn_benchmark" not in space.domains


def test_baseline_is_the_users_configuration():
    baseline = build_space(TuneSettings(spec="a.py:f"), CPU, TASK).baseline
    assert (baseline.batch_size, baseline.accumulation_steps, baseline.amp) == (32, 1, "off")
    assert (baseline.num_workers, baseline.pin_memory, baseline.cudnn_benchmark) == (
        0,
        False,
        False,
    )


def test_multi_gpu_space_searches_fp16_bf16_pinning_and_benchmark():
    space = build_space(TuneSettings(spec="a.py:f"), FOUR_A100, TASK)
    assert space.device == "cuda"
    assert space.domains["amp"] == ("off", "fp16", "bf16")
    assert space.domains["pin_memory"] == (False, True)
    assert space.domains["cudnn_benchmark"] == (False, True)
    assert space.domains["num_workers"] == (0, 1, 2, 4, 8, 16, 32)
    assert "4 GPUs found" in _fixed(space)["parallel_mode"].reason
    assert all(config.device == "cuda" for config in space.all_configs()[:5])


def test_gpu_without_bf16_offers_only_fp16():
    old = FOUR_A100.model_copy(
        update={"gpus": (GpuInfo(name="V100", memory_bytes=2**34, capability="7.0", bf16=False),)}
    )
    assert build_space(TuneSettings(spec="a.py:f"), old, TASK).domains["amp"] == ("off", "fp16")


def test_cuda_requested_without_a_gpu_is_a_clear_error():
    with pytest.raises(SettingsError, match="sees no CUDA GPU: use --device cpu"):
        build_space(TuneSettings(spec="a.py:f", device="cuda"), CPU, TASK)


def test_global_batch_mode_trades_micro_batch_against_accumulation():
    space = build_space(TuneSettings(spec="a.py:f", global_batch_size=64), CPU, TASK)
    assert space.domains["batch_size"] == (8, 16, 32, 64)
    assert "accumulation_steps" not in space.domains
    assert {c.global_batch_size for c in space.all_configs()} == {64}
    assert space.baseline.batch_size == 32 and space.baseline.accumulation_steps == 2


def test_batch_sizes_are_capped_by_the_dataset_and_explicit_lists_win():
    small = TASK.model_copy(update={"dataset_size": 100})
    assert build_space(TuneSettings(spec="a.py:f"), CPU, small).domains["batch_size"][-1] == 64
    explicit = TuneSettings(spec="a.py:f", batch_sizes="24,48")
    assert build_space(explicit, CPU, TASK).domains["batch_size"] == (24, 48)
    with pytest.raises(SettingsError, match="exceeds the dataset's 100 samples"):
        build_space(TuneSettings(spec="a.py:f", batch_sizes="128,256"), CPU, small)


def test_iterable_dataset_keeps_num_workers_at_zero_with_reason():
    stream = TASK.model_copy(update={"iterable": True, "dataset_size": None})
    space = build_space(TuneSettings(spec="a.py:f"), CPU, stream)
    assert "num_workers" not in space.domains
    assert "get_worker_info" in _fixed(space)["num_workers"].reason


def test_suggest_builds_valid_configs_from_an_optuna_trial():
    space = build_space(TuneSettings(spec="a.py:f"), CPU, TASK)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    configs = [space.suggest(study.ask()) for _ in range(20)]
    assert len(set(configs)) > 10
    assert space.size == len(space.all_configs()) == 8 * 4 * 2 * 3
