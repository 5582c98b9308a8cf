"""The knob table and `TrialConfig`; knobs beyond the classic checklist: selection,
applicability, trials, numerics."""

import shutil

import optuna
import pytest
from pydantic import ValidationError

import advisor
from advisor.api import validate
from advisor.errors import SettingsError
from advisor.knobs import FRAMEWORKS, IN_LOADER, KNOB, KNOB_GROUPS, KNOBS, TrialConfig
from advisor.results import GpuInfo, TrialResult
from advisor.search.checks import maths_problem
from advisor.search.space import build_space
from advisor.settings import TuneSettings
from advisor.trial.orders import ReferenceOrder, WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests import scripted_runner
from tests.conftest import CPU_PROFILE, ROOT, TINY
from tests.scripted_runner import EARLY, TASK, ScriptedRunner, scripted_tune


def test_trial_config_rejects_cpu_only_conflicts_naming_each():
    with pytest.raises(ValidationError) as caught:
        TrialConfig(device="cpu", batch_size=8, amp="fp16", pin_memory=True)
    message = str(caught.value)
    assert "amp='fp16' needs a CUDA device" in message
    assert "pin_memory=True has no effect without CUDA" in message


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"world_size": 2}, "needs parallel_mode='ddp'"),
        ({"parallel_mode": "ddp"}, "needs world_size >= 2"),
        ({"parallel_mode": "dp"}, "needs CUDA GPUs"),
        ({"cudnn_benchmark": True}, "no effect on CPU"),
        ({"reshard_after_forward": False}, "needs parallel_mode='fsdp'"),
        ({"batch_size": 0}, "greater than or equal to 1"),
        ({"surprise": 1}, "Extra inputs are not permitted"),
    ],
)
def test_trial_config_invalid_combinations(fields, fragment):
    with pytest.raises(ValidationError, match=fragment):
        TrialConfig(**{"batch_size": 8, **fields})


def test_trial_config_valid_on_cuda_and_global_batch():
    config = TrialConfig(
        device="cuda",
        parallel_mode="ddp",
        world_size=4,
        batch_size=8,
        accumulation_steps=2,
        amp="fp16",
        pin_memory=True,
        cudnn_benchmark=True,
    )
    assert config.global_batch_size == 64


def test_main_process_threads_leave_cores_to_workers():
    assert TrialConfig(batch_size=8, num_workers=0).main_process_threads(2) == 2
    assert TrialConfig(batch_size=8, num_workers=2).main_process_threads(8) == 6
    assert TrialConfig(batch_size=8, num_workers=4).main_process_threads(2) == 1


BEYOND = ("compile", "channels_last", "matmul_precision", "prefetch_factor",
          "persistent_workers", "optimizer_impl")  # fmt: skip
HAS_CXX = shutil.which("g++") is not None or shutil.which("clang++") is not None


def _space(spec: str, **settings):
    tune = TuneSettings(spec=spec, **settings)
    return build_space(tune, CPU_PROFILE, validate(spec).task)


def test_knob_groups_expand_and_a_misspelt_one_gets_a_suggestion():
    assert TuneSettings(spec="x:y").searched_knobs >= {"amp", "parallel", "num_workers"}
    assert not TuneSettings(spec="x:y").searched_knobs & set(BEYOND)
    chosen = TuneSettings(spec="x:y", knobs="classic,loader,compile").searched_knobs
    assert {"prefetch_factor", "persistent_workers", "compile"} <= chosen
    assert set(BEYOND) <= TuneSettings(spec="x:y", knobs="all").searched_knobs
    with pytest.raises(SettingsError, match="unknown knob group 'compil'; did you mean 'compile'"):
        advisor.api.make_settings("x:y", knobs="classic,compil")


def test_classic_search_fixes_every_newer_knob_with_how_to_search_it():
    space = _space(f"{TINY}:conv")
    fixed = {knob.name: knob.reason for knob in space.fixed}
    assert not set(BEYOND) & set(space.domains)
    assert fixed["compile"] == "not searched: add it with --knobs classic,compile"
    assert fixed["prefetch_factor"] == "not searched: add it with --knobs classic,loader"


def test_all_knobs_on_cpu_search_what_can_matter_and_say_why_not_the_rest():
    conv = _space(f"{TINY}:conv", knobs="all")
    mlp = _space(f"{TINY}:factory", knobs="all")
    fixed = {knob.name: knob.reason for knob in mlp.fixed}
    assert conv.domains["channels_last"] == (False, True)
    assert "the model has no Conv2d" in fixed["channels_last"]
    assert fixed["matmul_precision"] == "TF32 matmuls exist on CUDA GPUs only"
    assert mlp.domains["prefetch_factor"] == (2, 4)
    assert mlp.domains["optimizer_impl"] == ("default", "foreach", "fused")
    if HAS_CXX:
        assert mlp.domains["compile"] == ("off", "default", "max-autotune-no-cudagraphs")
    # Without workers, prefetching cannot matter: those combinations are one configuration.
    params = {name: values[-1] for name, values in mlp.domains.items()}
    params["num_workers"] = 0
    assert mlp.config_from_params(params).prefetch_factor == 2


def test_without_workers_the_loader_knobs_make_no_second_configuration():
    space = _space(
        f"{TINY}:factory",
        knobs="classic,loader",
        batch_sizes="16",
        accumulation_steps="1",
        max_world_size=1,
    )
    # amp 2 x (no workers, or 2 worker counts x prefetch 2 x persistent 2): 2 x (1 + 8)
    assert space.size == 18


def _trial(spec: str, config: TrialConfig, tmp_path, mode: str = "trial") -> TrialResult:
    launch = TrialLaunch(spec=spec, cwd=ROOT, warmup_steps=2, trial_seconds=0.3, timeout_s=600)
    return ProcessRunner(launch).run(_order(mode, config), tmp_path / f"{config.label()}.log")


@pytest.mark.parametrize(
    ("spec", "knobs"),
    [
        (f"{TINY}:conv", {"channels_last": True}),
        (f"{TINY}:factory", {"optimizer_impl": "fused"}),
        (f"{TINY}:factory", {"optimizer_impl": "foreach", "amp": "bf16"}),
        (f"{TINY}:factory", {"num_workers": 1, "prefetch_factor": 4, "persistent_workers": False}),
    ],
)
def test_each_knob_trains_and_keeps_the_maths_of_its_twin(spec, knobs, tmp_path):
    config = TrialConfig(batch_size=16, **knobs)
    result = _trial(spec, config, tmp_path)
    twin = _trial(spec, config.maths_twin, tmp_path, mode="reference")
    assert result.status == "ok", result.reason
    assert twin.status == "ok" and twin.samples_per_s is None  # first steps only, no window
    assert len(result.early_losses) == len(twin.early_losses) == 3
    assert maths_problem(result, twin) is None


@pytest.mark.slow
@pytest.mark.xdist_group(
    "torch-compile"
)  # beside train.py's compile (tests/report/test_codegen.py)
@pytest.mark.skipif(not HAS_CXX, reason="torch.compile's inductor needs a C++ compiler on CPU")
def test_a_compiled_trial_times_its_compilation_apart_from_its_steps(tmp_path):
    # Batch 32, as tests/report/test_codegen.py compiles it: the suite compiles its kernels once.
    eager = _trial(f"{TINY}:factory", TrialConfig(batch_size=32), tmp_path)
    compiled = _trial(f"{TINY}:factory", TrialConfig(batch_size=32, compile="default"), tmp_path)
    assert compiled.status == "ok", compiled.reason
    assert compiled.first_step_s > 10 * eager.first_step_s  # the compilation
    # ... and none of it in the window's steps (how long a window runs: tests/trial/test_budget.py)
    assert compiled.steps_measured >= 3 and compiled.step_time_median_s < compiled.first_step_s / 10
    assert maths_problem(compiled, eager) is None


def test_a_knob_that_changes_the_losses_is_named_with_the_step():
    twin = TrialResult(config=TrialConfig(batch_size=8), status="ok", early_losses=(0.7, 0.69))
    config = TrialConfig(batch_size=8, channels_last=True)
    close = TrialResult(config=config, status="ok", early_losses=(0.7001, 0.6901))
    wrong = TrialResult(config=config, status="ok", early_losses=(0.7, 0.9))
    assert maths_problem(close, twin) is None
    assert maths_problem(wrong, twin) == (
        "channels_last=True changed the maths: the loss of step 2 was 0.9 against 0.69 "
        "without (tolerance 1%)"
    )


def _conv_wrong_in_channels_last(config: TrialConfig) -> tuple[float, ...]:
    """conv_wrong_in_channels_last's first losses: channels-last computes something else."""
    return tuple(1.3 * loss for loss in EARLY) if config.channels_last else EARLY


def test_a_tune_rejects_a_knob_that_changes_the_maths_and_reports_why(tmp_path, monkeypatch):
    # a model with a Conv2d, as conv_wrong_in_channels_last builds: channels-last is searched
    monkeypatch.setattr(scripted_runner, "TASK", TASK.model_copy(update={"conv2d": True}))
    settings = TuneSettings(
        spec=f"{TINY}:factory",
        knobs="classic,channels_last",
        objective="throughput",
        sampler="grid",
        trials=12,
        batch_sizes="16",
        accumulation_steps="1",
        max_world_size=1,
        trial_seconds=0.3,
        warmup_steps=1,
        confirm_top=1,
        out=tmp_path,
    )
    # channels-last is the fastest: only its maths keeps it from the recommendation
    runner = ScriptedRunner(
        rate=lambda config: 1000.0 * (2.0 if config.channels_last else 1.0),
        early=_conv_wrong_in_channels_last,
    )

    result = scripted_tune(settings, runner)

    nhwc = [t for t in result.trials if t.result.config.channels_last and t.role == "search"]
    checked = [t for t in nhwc if t.result.status == "ok"]  # not stopped early as far slower
    assert checked and all("channels_last=True changed the maths" in t.note for t in checked)
    assert not result.recommendation.config.channels_last
    report = (tmp_path / "report.md").read_text()
    assert "channels_last=True rejected" in report
    study = optuna.load_study(
        study_name=settings.resolved_study_name, storage=f"sqlite:///{tmp_path}/study.db"
    )
    assert {t.params["channels_last"] for t in study.trials if t.params} == {False, True}


_IMPLEMENTATION_GAIN = {"default": 1.0, "foreach": 1.05, "fused": 1.1}


def _factory_with_optimizers(config: TrialConfig) -> float:
    """factory's samples/s: growing with the micro-batch, a little more with a fused or
    foreach optimizer step."""
    return 100.0 * config.batch_size * _IMPLEMENTATION_GAIN[config.optimizer_impl]


def test_every_optimizer_implementation_is_measured_on_the_best_configuration(tmp_path):
    settings = TuneSettings(
        spec=f"{TINY}:factory",
        knobs="classic,optimizer",
        objective="throughput",
        trials=6,
        batch_sizes="16,64",
        accumulation_steps="1",
        max_world_size=1,
        trial_seconds=0.3,
        warmup_steps=1,
        confirm_top=1,
        out=tmp_path,
    )
    result = scripted_tune(settings, ScriptedRunner(rate=_factory_with_optimizers))
    search = [t for t in result.trials if t.role in ("baseline", "search")]
    best = max((t for t in search if t.eligible), key=lambda t: t.result.samples_per_s)

    def without_impl(config: TrialConfig) -> TrialConfig:
        return config.model_copy(update={"optimizer_impl": "default"})

    # The last trials go to the best configuration with one newer knob changed, unless the
    # sampler measured that already: every implementation runs beside the best's other knobs.
    implementations = {
        t.result.config.optimizer_impl
        for t in search
        if without_impl(t.result.config) == without_impl(best.result.config)
    }
    assert implementations == {"default", "foreach", "fused"}
    effects = [e for e in result.recommendation.knob_effects if e.knob == "optimizer_impl"]
    assert any(best.number in pair for e in effects for pair in e.pairs)


def test_every_row_lists_its_default_first_and_only_values_a_config_accepts():
    for row in KNOBS:
        if isinstance(row.values, tuple):
            assert row.values[0] == row.default, row.name
            for value in row.values:  # each value makes a valid configuration somewhere
                device = "cuda" if value in row.invalid_on_cpu else "cpu"
                TrialConfig(device=device, batch_size=8, num_workers=1, **{row.name: value})
        assert row.group in KNOB_GROUPS and row.name in KNOB_GROUPS[row.group]
        assert row.fields[0] in TrialConfig.model_fields
        if row.needs is not None:  # a knob it needs is built before it, and is its own field
            assert KNOBS.index(KNOB[row.needs]) < KNOBS.index(row)
            assert KNOB[row.needs].fields == (row.needs,)


def test_every_row_says_how_each_framework_sets_its_knob():
    """The exports read the table: a row without a framework's counterpart would be dropped
    from that framework's file without a word."""
    for row in KNOBS:
        assert set(FRAMEWORKS) <= set(row.exports), row.name
        for target, counterpart in row.exports.items():
            said = counterpart.settings or counterpart.by_hand or counterpart.where
            assert said is not None, (row.name, target)
        if any(c is IN_LOADER for c in row.exports.values()):  # then the loader takes it
            assert row.exports["loader"].settings is not None, row.name


def test_labels_tell_every_configuration_of_a_space_apart():
    space = _space(f"{TINY}:conv", knobs="all", batch_sizes="16,32", accumulation_steps="1,2")
    configs = space.all_configs()
    assert len(configs) == space.size > 100
    assert len({config.label() for config in configs}) == len(configs)


def test_the_maths_twin_resets_exactly_the_knobs_that_change_the_maths():
    changed = {row.name: row.values[-1] for row in KNOBS if row.changes_maths}
    config = TrialConfig(device="cuda", batch_size=8, amp="bf16", **changed)
    assert config.maths_twin == TrialConfig(device="cuda", batch_size=8, amp="bf16")
    assert KNOB["compile"].changes_maths and not KNOB["amp"].changes_maths


def test_deterministic_cudnn_is_searched_only_where_cudnn_runs():
    task = validate(f"{TINY}:conv").task
    settings = TuneSettings(spec=f"{TINY}:conv", knobs="classic,determinism")
    cpu = build_space(settings, CPU_PROFILE, task)
    fixed = {knob.name: knob.reason for knob in cpu.fixed}
    assert fixed["cudnn_deterministic"] == "no cuDNN on this device: the flag has no effect"
    gpu = CPU_PROFILE.model_copy(
        update={
            "cuda_version": "12.8",
            "cudnn_version": 91000,
            "gpus": (GpuInfo(name="G", memory_bytes=2**34, capability="8.0", bf16=True),),
        }
    )
    assert build_space(settings, gpu, task).domains["cudnn_deterministic"] == (False, True)
    classic = build_space(TuneSettings(spec=f"{TINY}:conv"), gpu, task)
    assert "cudnn_deterministic" not in classic.domains


def test_fsdp_layouts_are_searched_only_under_a_memory_budget():
    """FSDP saves memory at the cost of communication: without a budget the layouts are as
    before; with one, FSDP with as many ranks as DDP, resharding after the forward pass or
    keeping the gathered parameters for the backward pass."""
    task = validate(f"{TINY}:blocks").task
    profile = CPU_PROFILE  # two cores
    plain = build_space(TuneSettings(spec=f"{TINY}:blocks"), profile, task)
    assert plain.domains["parallel"] == ("none", "ddp-2")
    budget = TuneSettings(spec=f"{TINY}:blocks", memory_budget="2GiB")
    layouts = build_space(budget, profile, task).domains["parallel"]
    assert layouts == ("none", "ddp-2", "fsdp-2", "fsdp-2-grad-op")
    configs = [build_space(budget, profile, task).config_from_params(
        {"parallel": layout, "batch_size": 8}) for layout in layouts[2:]]  # fmt: skip
    assert [(c.parallel_mode, c.world_size, c.reshard_after_forward) for c in configs] == [
        ("fsdp", 2, True),
        ("fsdp", 2, False),
    ]
    assert [c.parallel for c in configs] == list(layouts[2:])


def _order(mode: str, config: TrialConfig) -> WindowOrder | ReferenceOrder:
    """A search trial's order, or with `mode` "reference" the numerics reference's."""
    return ReferenceOrder(config=config) if mode == "reference" else WindowOrder(config=config)


def test_a_layout_over_machines_names_machines_and_processes_on_each_and_reads_back():
    from advisor.knobs import on_one_machine, parse_parallel

    config = TrialConfig(batch_size=8, parallel_mode="fsdp", world_size=8, nnodes=2)
    config = config.model_copy(update={"reshard_after_forward": False})
    assert config.parallel == "fsdp-2x4-grad-op"
    layout = parse_parallel(config.parallel)
    assert (layout.mode, layout.world, layout.nodes, layout.reshard) == ("fsdp", 8, 2, False)
    with pytest.raises(ValueError, match=r"ddp-NxM"):
        parse_parallel("ddp-2y4")
    assert on_one_machine(config.parallel) == "fsdp-4-grad-op"
    assert on_one_machine("ddp-2x1") == "none"


def test_a_tune_over_two_one_core_machines_searches_ddp_across_them():
    settings = TuneSettings(spec="x.py:f", nnodes=2, node_rank=0, rdzv_endpoint="h:29500")
    one_core = CPU_PROFILE.model_copy(update={"cores": 1})
    space = build_space(settings, one_core, TASK)
    assert space.domains["parallel"] == ("none", "ddp-2x1")
    config = space.config_from_params({**space.params_of(space.baseline), "parallel": "ddp-2x1"})
    assert (config.world_size, config.nnodes, config.per_node) == (2, 2, 1)
    alone = build_space(TuneSettings(spec="x.py:f"), one_core, TASK)
    assert "parallel" not in alone.domains


def test_ddp_s_network_knobs_are_searched_over_machines_and_only_under_ddp():
    settings = TuneSettings(spec="x.py:f", nnodes=2, node_rank=0, rdzv_endpoint="h:29500")
    space = build_space(settings, CPU_PROFILE, TASK)
    assert space.domains["bucket_cap_mb"] == (25, 100)
    assert space.domains["gradient_as_bucket_view"] == (False, True)
    assert space.size == len(space.all_configs())  # a knob that cannot apply adds none
    start = space.params_of(space.baseline)
    alone = space.config_from_params({**start, "bucket_cap_mb": 100})
    assert alone == space.baseline  # one process: DDP's buckets are no knob
    ddp = space.config_from_params({**start, "parallel": "ddp-2x1", "bucket_cap_mb": 100})
    assert ddp.bucket_cap_mb == 100 and "bucket=100MB" in ddp.label()
    one_machine = build_space(TuneSettings(spec="x.py:f"), CPU_PROFILE, TASK)
    assert "bucket_cap_mb" not in one_machine.domains
    lightning = KNOB["bucket_cap_mb"].exports["lightning"].by_hand
    assert lightning is not None
    assert lightning(100, ddp) == "strategy=DDPStrategy(bucket_cap_mb=100)"
    assert lightning(100, alone) is None  # one process: nothing to set
    fixed = {knob.name: knob.reason for knob in one_machine.fixed}
    assert fixed["bucket_cap_mb"] == "not searched: add it with --knobs classic,network"
    asked = build_space(TuneSettings(spec="x.py:f", knobs="network"), CPU_PROFILE, TASK)
    assert asked.domains["bucket_cap_mb"] == (25, 100)  # as the fixed knob's reason says
