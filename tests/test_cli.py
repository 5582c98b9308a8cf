"""The `advisor` command as users run it: a real subprocess each time."""

import json
import subprocess

import pytest

from tests.conftest import TINY, run_advisor


def advisor(*args: str) -> subprocess.CompletedProcess[str]:
    return run_advisor(*args, timeout=240)


def _one_line_error(completed: subprocess.CompletedProcess[str]) -> str:
    """Besides progress lines (`· ...`), stderr holds exactly one line: the error."""
    lines = [line for line in completed.stderr.strip().splitlines() if not line.startswith("·")]
    assert completed.returncode == 2, completed.stderr
    assert "Traceback" not in completed.stderr
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tune", "missing.py:factory"], "file 'missing.py' not found"),
        (["tune", "no_such_module:factory"], "module 'no_such_module' not found"),
        (["validate", f"{TINY}:nope"], "has no attribute 'nope'"),
        (["validate", f"{TINY}:not_callable"], "not a callable"),
        (["validate", f"{TINY}:raises"], "raised ValueError: cannot find the data folder"),
        (["validate", f"{TINY}:wrong_type"], "returned int; return advisor.TrainingTask"),
        (["validate", f"{TINY}:not_a_module"], "not a torch.nn.Module"),
        (["validate", f"{TINY}:empty_dataset"], "the dataset is empty"),
        (["tune", f"{TINY}:bad_shapes"], "the first training step failed with RuntimeError"),
        (["tune", f"{TINY}:factory", "--trials", "0"], "trials: Input should be greater"),
        (["tune", f"{TINY}:factory", "--batch-sizes", "0,x"], "'0,x' is not a comma-separated"),
        (["tune", f"{TINY}:factory", "--trials", "x"], "'x' is not a valid integer"),
        (["tune", f"{TINY}:factory", "--storage", "redis://h/0"], "unknown storage URL scheme"),
        (["tune", f"{TINY}:factory", "--sampler", "annealing"], "'annealing' is not one of"),
        (["codegen", "README.md"], "README.md is not a recommendation.json advisor can read"),
        (["codegen", "missing.json"], "'missing.json' does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, fragment, tmp_path):
    if args[0] == "tune":
        args = [*args, "--out", str(tmp_path)]
    assert fragment in _one_line_error(advisor(*args))


def test_first_step_error_names_the_batch_it_saw(tmp_path):
    line = _one_line_error(advisor("validate", f"{TINY}:bad_shapes"))
    assert "a batch is (float32[32, 8], int64[32])" in line


def test_debug_shows_the_traceback():
    completed = advisor("--debug", "validate", f"{TINY}:nope")
    assert completed.returncode == 2
    assert "Traceback" in completed.stderr


def test_version_and_help():
    assert advisor("--version").stdout.startswith("advisor, version ")
    for command in ("tune", "probe", "validate", "codegen"):
        assert advisor(command, "--help").returncode == 0


def test_probe_json_describes_this_machine():
    profile = json.loads(advisor("probe", "--json").stdout)
    assert profile["cores"] >= 1 and profile["memory_bytes"] > 0
    assert profile["torch_version"].startswith("2.")
    assert "AVX" in profile["cpu_capability"] or profile["cpu_capability"] in (
        "DEFAULT",
        "NEON",
        "SVE256",
    )
    assert isinstance(profile["gpus"], list)


def test_validate_prints_model_size_shapes_and_step_time():
    completed = advisor("validate", f"{TINY}:dict_task")
    assert completed.returncode == 0, completed.stderr
    assert "LossModel" in completed.stdout
    assert "{features: float32[16, 8], label: int64[16]}" in completed.stdout
    assert "step time" in completed.stdout
