import pytest
from pydantic import ValidationError

from advisor.errors import SettingsError
from advisor.knobs import TrialConfig
from advisor.settings import TuneSettings, settings_error


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


def test_settings_parse_comma_lists():
    settings = TuneSettings(spec="a.py:f", batch_sizes="64, 16,32", accumulation_steps="1,2")
    assert settings.batch_sizes == (16, 32, 64)
    assert settings.accumulation_steps == (1, 2)


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"trials": 0}, "trials: Input should be greater than or equal to 1 (got 0)"),
        ({"batch_sizes": "0,x"}, "batch_sizes: '0,x' is not a comma-separated list"),
        ({"storage": "redis://localhost/0"}, "unknown storage URL scheme 'redis'"),
        ({"storage": "study.db"}, "unknown storage URL scheme 'study.db'"),
        ({"study_name": "a b"}, "is not a usable name"),
        ({"global_batch_size": 64, "batch_sizes": "8,16"}, "exclude each other"),
    ],
)
def test_settings_errors_are_one_line_and_name_the_field(fields, fragment):
    with pytest.raises(ValidationError) as caught:
        TuneSettings(spec="a.py:f", **fields)
    error = settings_error(caught.value)
    assert isinstance(error, SettingsError)
    assert fragment in str(error)
    assert "\n" not in str(error)


def test_settings_collects_every_problem_at_once():
    with pytest.raises(ValidationError) as caught:
        TuneSettings(spec="a.py:f", trials=0, trial_seconds=-1, sampler="annealing")
    message = str(settings_error(caught.value))
    for field in ("trials", "trial_seconds", "sampler"):
        assert f"{field}:" in message


def test_default_study_name_and_paths_come_from_the_spec(tmp_path):
    settings = TuneSettings(spec="examples/mlp.py:factory")
    assert settings.resolved_study_name == "mlp-factory"
    assert str(settings.out_dir) == "reports/mlp-factory"
    assert settings.storage_url.endswith("reports/mlp-factory/study.db")
    assert settings.storage_url.startswith("sqlite:///")
    named = TuneSettings(spec="pkg.models:build", study_name="run1", out=tmp_path)
    assert named.resolved_study_name == "run1"
    assert named.storage_url == f"sqlite:///{tmp_path / 'study.db'}"
