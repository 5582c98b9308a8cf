import pytest
from pydantic import ValidationError

from advisor.errors import SettingsError
from advisor.settings import TuneSettings, settings_error


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


def test_several_machines_meet_where_the_flags_or_the_launcher_say(monkeypatch):
    for name in ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValidationError, match="needs --rdzv-endpoint"):
        TuneSettings(spec="x.py:f", nnodes=2)
    with pytest.raises(ValidationError, match="number the machines 0 to nnodes - 1"):
        TuneSettings(spec="x.py:f", nnodes=2, node_rank=2, rdzv_endpoint="h:1")
    monkeypatch.setenv("MASTER_ADDR", "node0.cluster")
    monkeypatch.setenv("SLURM_NODEID", "1")
    settings = TuneSettings(spec="x.py:f", nnodes=2)
    assert (settings.node_rank, settings.rdzv_endpoint) == (1, "node0.cluster:29500")
    assert TuneSettings(spec="x.py:f").node_rank is None  # one machine: the launcher's unread
