import tempfile

import pytest
import torch

from advisor import TrainingTask
from advisor.api import validate
from advisor.errors import (
    BadInputError,
    ContractError,
    FactoryError,
    FirstStepError,
    SpecError,
    bad_input,
)
from advisor.task import build_task, callable_to_spec, resolve_spec
from tests.conftest import TINY


def test_file_spec_and_module_spec_resolve_to_the_same_factory():
    from_file = resolve_spec(f"{TINY}:factory")
    from_module = resolve_spec("tests.workloads.tiny:factory")
    assert from_file.__name__ == from_module.__name__ == "factory"


def test_tuple_return_is_normalised():
    task, kind = build_task(f"{TINY}:factory")
    assert kind == "tuple"
    assert isinstance(task.model, torch.nn.Module)
    assert isinstance(task.loss_fn, torch.nn.CrossEntropyLoss)
    assert task.optimizer is None and task.batch_size is None


def test_training_task_return_is_kept():
    task, kind = build_task(f"{TINY}:dict_task")
    assert kind == "task"
    assert task.batch_size == 16 and task.loss_fn is None


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        ("no_colon", SpecError, "is not a factory spec"),
        ("missing/file.py:factory", SpecError, "file 'missing/file.py' not found"),
        ("no_such_package.models:factory", SpecError, "module 'no_such_package.models' not found"),
        (f"{TINY}:nope", SpecError, "has no attribute 'nope'"),
        (f"{TINY}:not_callable", SpecError, "is a int, not a callable"),
        (
            "tests/workloads/broken_import.py:f",
            SpecError,
            "raised RuntimeError: this module is broken",
        ),
        (f"{TINY}:raises", FactoryError, "raised ValueError: cannot find the data folder"),
        (f"{TINY}:wrong_type", FactoryError, "returned int"),
        (f"{TINY}:not_a_module", FactoryError, "the model is a str, not a torch.nn.Module"),
        (f"{TINY}:empty_dataset", FactoryError, "the dataset is empty"),
    ],
)
def test_bad_specs_and_factories_get_clear_errors(spec, error, fragment):
    with pytest.raises(error, match=fragment) as caught:
        build_task(spec)
    assert "\n" not in str(caught.value)


def test_a_missing_factory_gets_the_closest_name_and_what_the_file_offers():
    with pytest.raises(SpecError, match=r"did you mean 'factory'\? zero-argument functions"):
        resolve_spec(f"{TINY}:factori")
    with pytest.raises(SpecError) as caught:
        resolve_spec(f"{TINY}:nope")
    offered = str(caught.value).split("zero-argument functions there: ")[1].split(", ")
    assert "conv" in offered and "dict_cross_entropy" not in offered  # it takes arguments


def test_optimizer_instance_is_rejected_with_the_fix():
    with pytest.raises(FactoryError, match=r"functools\.partial"):
        from advisor.task import _check_task

        model = torch.nn.Linear(2, 2)
        _check_task(
            TrainingTask(model=model, dataset=[1], optimizer=torch.optim.SGD(model.parameters()))
        )


def test_lambdas_cannot_be_sent_to_trial_processes():
    with pytest.raises(SpecError, match="lambda or closure"):
        callable_to_spec(lambda: None)


def test_module_level_callable_becomes_a_module_spec():
    from tests.workloads import tiny

    assert callable_to_spec(tiny.factory) == "tests.workloads.tiny:factory"


@pytest.mark.parametrize(
    ("spec", "error", "fragment"),
    [
        (f"{TINY}:nope", SpecError, "has no attribute 'nope'"),  # found only by importing it
        (f"{TINY}:raises", FactoryError, "cannot find the data folder"),
        (f"{TINY}:bad_shapes", FirstStepError, "the first training step failed with RuntimeError"),
    ],
)
def test_validation_in_a_child_raises_the_error_the_child_found(spec, error, fragment):
    with pytest.raises(error, match=fragment) as caught:
        validate(spec)
    assert type(caught.value) is error


def test_each_kind_of_bad_input_names_one_error_class():
    kinds = [cls.kind for cls in (SpecError, FactoryError, ContractError, FirstStepError)]
    assert len(set(kinds)) == len(kinds)
    assert type(bad_input("contract", "m")) is ContractError
    assert type(bad_input("no such kind", "m")) is BadInputError


def test_validation_keeps_its_log_only_when_it_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    assert validate(f"{TINY}:factory").log_path is None
    assert list(tmp_path.iterdir()) == []  # nothing to read

    with pytest.raises(FactoryError, match="raised ValueError"):  # all the log would say
        validate(f"{TINY}:raises")
    assert list(tmp_path.iterdir()) == []  # a log no message names is not left behind

    with pytest.raises(FirstStepError, match=r"\(log: .*validate\.log\)"):
        validate(f"{TINY}:bad_shapes")
    assert [log.name for log in tmp_path.glob("*/*")] == ["validate.log"]  # the error names it
