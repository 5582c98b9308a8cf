import optuna
import pytest

from advisor.errors import SettingsError
from advisor.results import GpuInfo, TaskSummary
from advisor.search.space import build_space
from advisor.settings import TuneSettings
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


def test_cpu_space_searches_ddp_up_to_the_cores_or_the_cap():
    assert build_space(TuneSettings(spec="a.py:f"), CPU, TASK).domains["parallel"] == (
        "none",
        "ddp-2",
    )
    many = CPU.model_copy(update={"cores": 12})
    assert build_space(TuneSettings(spec="a.py:f"), many, TASK).domains["parallel"] == (
        "none",
        "ddp-2",
        "ddp-4",
        "ddp-8",
        "ddp-12",
    )
    capped = build_space(TuneSettings(spec="a.py:f", max_world_size=4), many, TASK)
    assert capped.domains["parallel"] == ("none", "ddp-2", "ddp-4")
    single = build_space(TuneSettings(spec="a.py:f", max_world_size=1), many, TASK)
    assert "parallel" not in single.domains
    assert _fixed(single)["parallel_mode"].reason == "--max-world-size 1"
    one_core = build_space(TuneSettings(spec="a.py:f"), CPU.model_copy(update={"cores": 1}), TASK)
    assert "parallel" not in one_core.domains
    assert [knob.name for knob in one_core.fixed].count("parallel_mode") == 1
    assert "1 core" in _fixed(one_core)["parallel_mode"].reason


def test_ddp_configs_split_the_cores_between_ranks():
    space = build_space(TuneSettings(spec="a.py:f"), CPU, TASK)
    ddp = space.config_from_params({**space.params_of(space.baseline), "parallel": "ddp-2"})
    assert (ddp.parallel_mode, ddp.world_size, ddp.global_batch_size) == ("ddp", 2, 64)
    assert ddp.main_process_threads(CPU.cores) == 1
    assert space.params_of(ddp)["parallel"] == "ddp-2" and space.contains(ddp)


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
    sharded = tuple(f"fsdp-{n}{tail}" for n in (2, 3, 4) for tail in ("", "-grad-op"))
    assert space.domains["parallel"] == ("none", "dp", "ddp-2", "ddp-3", "ddp-4", *sharded)
    assert space.memory_gated  # FSDP waits until memory binds (test_staging)
    assert "parallel_mode" not in _fixed(space)
    configs = space.all_configs()
    assert all(config.device == "cuda" for config in configs)
    layouts = {(c.parallel_mode, c.world_size) for c in configs}
    assert layouts == {("none", 1), ("dp", 1)} | {
        (mode, n) for mode in ("ddp", "fsdp") for n in (2, 3, 4)
    }
    assert any(c.parallel_mode == "ddp" and c.amp == "fp16" for c in configs)


def test_one_gpu_runs_one_process_and_says_why():
    one = FOUR_A100.model_copy(update={"gpus": FOUR_A100.gpus[:1]})
    space = build_space(TuneSettings(spec="a.py:f"), one, TASK)
    assert "parallel" not in space.domains
    assert "one GPU" in _fixed(space)["parallel_mode"].reason


def test_gpu_without_bf16_offers_only_fp16():
    old = FOUR_A100.model_copy(
        update={"gpus": (GpuInfo(name="V100", memory_bytes=2**34, capability="7.0", bf16=False),)}
    )
    assert build_space(TuneSettings(spec="a.py:f"), old, TASK).domains["amp"] == ("off", "fp16")


def test_probes_take_the_precision_whose_matmuls_the_probe_timed_fastest():
    """A larger batch spends more of a step in matmuls: its probe takes the autocast the
    hardware probe timed fastest, bf16 where it ties with fp16; none where fp32 is fastest."""
    native = CPU.model_copy(update={"cpu_peak_flops": {"fp32": 1.7e11, "bf16": 3.7e11}})
    assert build_space(TuneSettings(spec="a.py:f"), native, TASK).probe_amp == "bf16"
    slower = CPU.model_copy(update={"cpu_peak_flops": {"fp32": 1.7e11, "bf16": 1.2e11}})
    assert build_space(TuneSettings(spec="a.py:f"), slower, TASK).probe_amp is None
    assert build_space(TuneSettings(spec="a.py:f"), CPU, TASK).probe_amp is None  # not timed
    peaks = {"fp32": 1.9e13, "fp16": 3.1e14, "bf16": 2.9e14}
    gpus = tuple(gpu.model_copy(update={"peak_flops": peaks}) for gpu in FOUR_A100.gpus)
    a100 = FOUR_A100.model_copy(update={"gpus": gpus})
    assert build_space(TuneSettings(spec="a.py:f"), a100, TASK).probe_amp == "bf16"
    fp16_only = {**peaks, "bf16": 1.5e14}
    gpus = tuple(gpu.model_copy(update={"peak_flops": fp16_only}) for gpu in FOUR_A100.gpus)
    faster_fp16 = FOUR_A100.model_copy(update={"gpus": gpus})
    assert build_space(TuneSettings(spec="a.py:f"), faster_fp16, TASK).probe_amp == "fp16"


def test_cuda_requested_without_a_gpu_is_a_clear_error():
    with pytest.raises(SettingsError, match="sees no CUDA GPU: use --device cpu"):
        build_space(TuneSettings(spec="a.py:f", device="cuda"), CPU, TASK)


def test_global_batch_mode_trades_micro_batch_against_accumulation_and_ranks():
    space = build_space(TuneSettings(spec="a.py:f", global_batch_size=64), CPU, TASK)
    assert space.domains["batch_size"] == (4, 8, 16, 32, 64)
    assert "accumulation_steps" not in space.domains
    configs = space.all_configs()
    assert {c.global_batch_size for c in configs} == {64}
    assert {(c.batch_size, c.accumulation_steps) for c in configs if c.world_size == 2} == {
        (4, 8),
        (8, 4),
        (16, 2),
        (32, 1),
    }
    assert space.size == len(configs) < 8 * 2 * 3 * 5
    assert space.problem({"batch_size": 64, "parallel": "ddp-2", "amp": "off", "num_workers": 0})
    assert space.baseline.batch_size == 32 and space.baseline.accumulation_steps == 2


def test_global_batch_mode_keeps_to_the_allowed_accumulation_steps():
    settings = TuneSettings(spec="a.py:f", global_batch_size=64, accumulation_steps="1")
    space = build_space(settings, CPU, TASK)
    layouts = {(c.batch_size, c.accumulation_steps, c.world_size) for c in space.all_configs()}
    assert layouts == {(64, 1, 1), (32, 1, 2)}
    assert "needs 2 accumulation steps" in space.problem(
        {**space.params_of(space.baseline), "batch_size": 32}
    )


def test_without_a_race_only_configurations_at_your_global_batch_are_searched():
    """--race-seconds 0 keeps the user's global batch: a configuration at another could not be
    recommended, so the search measures none; the throughput objective still searches them."""
    kept = build_space(TuneSettings(spec="a.py:f", race_seconds=0), CPU, TASK)
    configs = kept.all_configs()
    assert {c.global_batch_size for c in configs} == {TASK.user_batch_size}
    assert (kept.baseline.batch_size, kept.baseline.accumulation_steps) == (32, 1)
    assert {(c.batch_size, c.accumulation_steps, c.world_size) for c in configs} >= {
        (32, 1, 1),
        (16, 2, 1),
        (16, 1, 2),
        (4, 4, 2),
    }
    assert "--race-seconds 0" in _fixed(kept)["accumulation_steps"].reason
    # Your own configuration takes no accumulation, whatever the steps searched besides.
    settings = TuneSettings(spec="a.py:f", race_seconds=0, accumulation_steps="2,4")
    mine = build_space(settings, CPU, TASK).baseline
    assert (mine.batch_size, mine.accumulation_steps, mine.world_size) == (32, 1, 1)
    searched = build_space(
        TuneSettings(spec="a.py:f", race_seconds=0, objective="throughput"), CPU, TASK
    )
    assert len({c.global_batch_size for c in searched.all_configs()}) > 1


def test_without_a_race_your_batch_sizes_are_those_that_make_your_global_batch():
    settings = TuneSettings(spec="a.py:f", race_seconds=0, batch_sizes="8,16,24,64")
    space = build_space(settings, CPU, TASK)
    assert space.domains["batch_size"] == (8, 16)
    with pytest.raises(SettingsError, match=r"of --batch-sizes \[24, 64\] fits global batch 32"):
        build_space(settings.model_copy(update={"batch_sizes": (24, 64)}), CPU, TASK)


def test_ddp_ranks_need_a_full_batch_each():
    small = TASK.model_copy(update={"dataset_size": 100})
    space = build_space(TuneSettings(spec="a.py:f"), CPU, small)
    params = {**space.params_of(space.baseline), "batch_size": 64}
    assert space.problem(params) is None
    assert "each of 2 ranks reads 50 samples" in space.problem({**params, "parallel": "ddp-2"})


def test_batch_sizes_are_capped_by_the_dataset_and_explicit_lists_win():
    small = TASK.model_copy(update={"dataset_size": 100})
    assert build_space(TuneSettings(spec="a.py:f"), CPU, small).domains["batch_size"][-1] == 64
    explicit = TuneSettings(spec="a.py:f", batch_sizes="24,48")
    assert build_space(explicit, CPU, TASK).domains["batch_size"] == (24, 48)
    with pytest.raises(SettingsError, match="exceeds the dataset's 100 samples"):
        build_space(TuneSettings(spec="a.py:f", batch_sizes="128,256"), CPU, small)


def test_under_a_budget_your_batch_can_be_split_by_every_accumulation_choice():
    # Your 32 over the budget can be kept as 4 x 8 without a memory knob: 4 is in the space.
    # Without a budget the space is unchanged.
    budget = TuneSettings(spec="a.py:f", memory_budget="1GiB")
    assert build_space(budget, CPU, TASK).domains["batch_size"] == (
        4, 8, 16, 32, 64, 128, 256, 512, 1024,
    )  # fmt: skip
    three = TuneSettings(spec="a.py:f", memory_budget="1GiB", accumulation_steps=(1, 2, 3))
    assert build_space(three, CPU, TASK).domains["batch_size"][0] == 8  # 32 / 3 is no split


def test_iterable_dataset_keeps_num_workers_at_zero_with_reason():
    stream = TASK.model_copy(update={"iterable": True, "dataset_size": None})
    space = build_space(TuneSettings(spec="a.py:f"), CPU, stream)
    assert "num_workers" not in space.domains
    assert "get_worker_info" in _fixed(space)["num_workers"].reason
    assert "parallel" not in space.domains
    assert "cannot be sharded between DDP ranks" in _fixed(space)["parallel_mode"].reason


def test_suggest_builds_valid_configs_from_an_optuna_trial():
    space = build_space(TuneSettings(spec="a.py:f"), CPU, TASK)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    configs = [space.config_from_params(space.suggest(study.ask())) for _ in range(20)]
    assert len(set(configs)) > 10
    assert space.size == len(space.all_configs()) == 8 * 4 * 2 * 3 * 2
