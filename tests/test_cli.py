"""The `advisor` command as users run it, through its entry point in this process
(`tests.conftest.advisor_here`); a real process where one is what is tested: the installed entry
point, and a second tune beside a running one."""

import json
import signal
import subprocess
import sys
import time

import click
import pytest
from click.testing import CliRunner

import advisor.cli as cli_module
from advisor.settings import TuneSettings
from tests.conftest import FAST_TUNE, ROOT, TINY, advisor_here, run_advisor


def _one_line_error(completed: subprocess.CompletedProcess[str]) -> str:
    """Besides progress lines (`· ...`), stderr holds exactly one line: the error."""
    lines = [line for line in completed.stderr.strip().splitlines() if not line.startswith("·")]
    assert completed.returncode == 2, completed.stderr
    assert "Traceback" not in completed.stderr
    assert len(lines) == 1, completed.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


# Spec and flag errors, and a factory that raises, through the command line; what each factory
# error says is tested where it is found (tests/search/test_checks.py).
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["tune", "missing.py:factory"], "file 'missing.py' not found"),
        (["tune", "no_such_module:factory"], "module 'no_such_module' not found"),
        (["validate", f"{TINY}:raises"], "raised ValueError: cannot find the data folder"),
        (["tune", f"{TINY}:bad_shapes"], "the first training step failed with RuntimeError"),
        (["tune", f"{TINY}:factory", "--trials", "0"], "trials: Input should be greater"),
        (["tune", f"{TINY}:factory", "--batch-sizes", "0,x"], "'0,x' is not a comma-separated"),
        (["tune", f"{TINY}:factory", "--trials", "x"], "'x' is not a valid integer"),
        (["tune", f"{TINY}:factory", "--storage", "redis://h/0"], "unknown storage URL scheme"),
        (["tune", f"{TINY}:factory", "--sampler", "annealing"], "'annealing' is not one of"),
        (
            ["tune", f"{TINY}:factory", "--confirm-repeats", "3", "--confirm-max-repeats", "2"],
            "confirm_max_repeats (2) is below confirm_repeats (3)",
        ),
        (["codegen", "README.md"], "README.md is not a recommendation.json advisor can read"),
        (["codegen", "missing.json"], "'missing.json' does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(args, fragment, tmp_path):
    if args[0] == "tune":
        args = [*args, "--out", str(tmp_path)]
    assert fragment in _one_line_error(advisor_here(*args))


@pytest.mark.parametrize(
    ("workload", "phase"), [("hangs_at_build", "build"), ("hangs_in_first_step", "first_step")]
)
def test_a_factory_that_hangs_is_stopped_by_the_trial_timeout_with_the_phase(
    workload, phase, tmp_path
):
    started = time.monotonic()
    completed = advisor_here(
        "tune", f"{TINY}:{workload}", "--trial-timeout", "5", "--out", str(tmp_path)
    )
    line = _one_line_error(completed)
    assert "timed out: no result after 5 s" in line and f"(phase: {phase})" in line, line
    assert "raise --trial-timeout" in line
    assert time.monotonic() - started < 60


def test_debug_shows_the_traceback():
    completed = advisor_here("--debug", "validate", f"{TINY}:nope")
    assert completed.returncode == 2
    assert "Traceback" in completed.stderr


def test_version_and_help():
    cli = cli_module.cli
    assert run_advisor("--version").stdout.startswith("advisor, version ")  # the real entry point
    for command in ("tune", "probe", "validate", "codegen", "export", "report"):
        assert CliRunner().invoke(cli, [command, "--help"]).exit_code == 0, command


def test_tune_help_shows_every_setting_with_the_default_the_settings_hold():
    """A default is written once, in `TuneSettings`; the help reads it from there."""
    output = CliRunner().invoke(cli_module.cli, ["tune", "--help"], terminal_width=1000).output
    shown = " ".join(output.split())
    for name in TuneSettings.model_fields:
        if name != "spec":
            assert f"--{name.replace('_', '-')}" in shown, name
    assert "Training time of each racer" in shown and "[10]" in shown  # race_seconds
    assert "Accumulation steps to try [1,2,4,8]." in shown
    assert "[sqlite:///OUT/study.db]" in shown


def test_probe_json_describes_this_machine():
    profile = json.loads(advisor_here("probe", "--json").stdout)
    assert profile["cores"] >= 1 and profile["memory_bytes"] > 0
    assert profile["torch_version"].startswith("2.")
    assert "AVX" in profile["cpu_capability"] or profile["cpu_capability"] in (
        "DEFAULT",
        "NEON",
        "SVE256",
    )
    assert isinstance(profile["gpus"], list)
    peaks = profile["cpu_peak_flops"]  # measured: a matmul reaches GFLOP/s on any CPU
    assert peaks["fp32"] > 1e8  # 1.4e9 on two cores under four busy processes
    assert peaks["bf16"] > 0  # timed on every CPU, native bf16 or not


def test_validate_prints_model_size_shapes_and_step_time():
    completed = advisor_here("validate", f"{TINY}:dict_task")
    assert completed.returncode == 0, completed.stderr
    assert "LossModel" in completed.stdout
    assert "{features: float32[16, 8], label: int64[16]}" in completed.stdout
    assert "step time" in completed.stdout


def test_a_settings_file_with_many_problems_names_them_all_in_one_line(tmp_path):
    config = tmp_path / "tune.toml"
    config.write_text(
        f'spec = "{TINY}:factory"\n'
        "trials = 0\n"
        "trial_second = 2\n"  # a typo
        'batch-sizes = [16, "x"]\n'
        'sampler = "bayes"\n'
    )
    line = _one_line_error(advisor_here("tune", "--config", str(config)))
    assert line.startswith(f"error: {config}: invalid settings: ")
    for problem in (
        "trials: Input should be greater than or equal to 1 (got 0)",
        "batch_sizes.1: Input should be a valid integer",
        "sampler: Input should be 'tpe', 'random' or 'grid' (got 'bayes')",
        "trial_second: unknown setting; did you mean 'trial_seconds'?",
    ):
        assert problem in line


@pytest.mark.parametrize(
    ("name", "text", "fragment"),
    [
        ("tune.yaml", "trials: 3", "use a .toml or .json settings file"),
        ("tune.json", "{trials: 3", "is not valid JSON"),
        ("tune.toml", "trials = [", "is not valid TOML"),
        ("tune.json", "[1, 2]", "expected a table of settings"),
        ("tune.toml", "trials = 3", "pass SPEC (e.g. mymodel.py:factory), or set spec"),
    ],
)
def test_an_unusable_settings_file_is_one_line(name, text, fragment, tmp_path):
    config = tmp_path / name
    config.write_text(text)
    assert fragment in _one_line_error(advisor_here("tune", "--config", str(config)))


@pytest.mark.slow
def test_a_settings_file_drives_the_tune_and_flags_override_it(tmp_path, monkeypatch):
    """Settings only: the command parsed in this process, the tune it would run recorded."""
    config = tmp_path / "tune.json"
    settings = {"spec": f"{TINY}:factory", "trials": 5, "trial-seconds": 0.2, "warmup_steps": 1}
    config.write_text(
        json.dumps({**settings, "max_world_size": 1, "confirm_top": 1, "race-seconds": 0.5})
    )
    tuned: list[TuneSettings] = []

    def record(settings: TuneSettings, progress: object) -> None:
        tuned.append(settings)
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(cli_module, "tune_with", record)
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # the command's handlers: not here
    args = ["tune", "--config", str(config), "--trials", "1", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli_module.cli, args)
    assert result.exit_code == 0, result.output
    (chosen,) = tuned
    assert (chosen.spec, chosen.trials, chosen.out) == (
        f"{TINY}:factory",
        1,
        tmp_path,
    )  # --trials won
    assert (chosen.trial_seconds, chosen.warmup_steps, chosen.race_seconds) == (0.2, 1, 0.5)
    assert (chosen.max_world_size, chosen.confirm_top) == (1, 1)


def test_a_study_file_that_is_not_a_study_is_named_and_left_alone(tmp_path):
    study = tmp_path / "study.db"
    study.write_bytes(b"not a database, but someone's notes\n" * 100)
    before = study.read_bytes()
    completed = advisor_here("tune", f"{TINY}:factory", "--out", str(tmp_path), "--trials", "2")
    line = _one_line_error(completed)
    assert str(study) in line and "is not a study advisor can read" in line
    assert study.read_bytes() == before  # nothing overwritten


def test_an_output_folder_that_cannot_be_written_is_exit_2(tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("in the way")
    completed = advisor_here("tune", f"{TINY}:factory", "--out", str(blocker / "run"))
    assert str(blocker) in _one_line_error(completed)


def test_a_second_tune_on_the_same_folder_is_refused_and_the_first_goes_on(tmp_path):
    """Two tunes writing one study, its logs and reports at once would interleave them: the
    second is one line and exit 2; the first finishes as if alone."""
    command = [sys.executable, "-m", "advisor", "tune", f"{TINY}:factory", "--trials", "3"]
    command += FAST_TUNE
    first = subprocess.Popen(
        [*command, "--out", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "study.db").exists() and time.monotonic() < deadline:
        time.sleep(0.2)  # the study exists once the first holds the folder
    second = advisor_here(
        "tune", f"{TINY}:factory", "--trials", "3", *FAST_TUNE, "--out", str(tmp_path)
    )
    line = _one_line_error(second)
    assert f"another advisor tune (pid {first.pid}) is running on {tmp_path}" in line
    _, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr
    assert json.loads((tmp_path / "recommendation.json").read_text())["spec"] == f"{TINY}:factory"
