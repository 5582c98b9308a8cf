"""The preflight of a task: two real steps in a trial child at the user's batch size, and a
factory that breaks a contract named in one line that says how to fix it (the command line
prints that line and exits 2: tests/test_cli.py)."""

import pytest

from advisor.errors import BadInputError
from advisor.trial.parent.preflight import preflight
from tests.conftest import ROOT, TINY


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("nope", "has no attribute 'nope'"),
        ("not_callable", "not a callable"),
        ("wrong_type", "returned int; return advisor.TrainingTask"),
        ("not_a_module", "not a torch.nn.Module"),
        ("empty_dataset", "the dataset is empty"),
        ("returns_none", "returned NoneType; return advisor.TrainingTask"),
        ("no_parameters", "has no parameters that require grad"),
        ("loss_not_scalar", "not a scalar: reduce it"),
        ("ragged_samples", "the first training step failed"),
    ],
)
def test_a_factory_that_breaks_the_contract_is_named_in_one_line(name, fragment, tmp_path):
    with pytest.raises(BadInputError) as refused:
        preflight(f"{TINY}:{name}", ROOT, "cpu", 120.0, tmp_path / "validate.log")
    message = str(refused.value)
    assert fragment in message and "\n" not in message, message


def test_a_task_that_trains_passes_with_its_own_batch_size(tmp_path):
    checked = preflight(f"{TINY}:factory", ROOT, "cpu", 120.0, tmp_path / "validate.log")
    assert checked.status == "ok" and checked.task is not None
    assert checked.config.batch_size == checked.task.user_batch_size


def test_a_first_step_error_names_the_batch_it_saw(tmp_path):
    with pytest.raises(BadInputError, match="the first training step failed") as refused:
        preflight(f"{TINY}:bad_shapes", ROOT, "cpu", 120.0, tmp_path / "validate.log")
    assert "a batch is (float32[32, 8], int64[32])" in str(refused.value)
