"""Search budgets, samplers, infeasibility and the no-feasible-configuration exit."""

import optuna
import pytest

import advisor
from advisor.config import TrialConfig
from advisor.results import TrialRecord, TrialResult
from advisor.search import memory_problem
from advisor.selection import failure_summary
from tests.conftest import CPU_PROFILE, TINY, run_advisor

FAST = {"trial_seconds": 0.2, "warmup_steps": 1, "confirm_top": 1}
HOST = CPU_PROFILE.model_copy(update={"memory_bytes": 10 * 2**30})


def _ok(peak_gib: float) -> TrialResult:
    return TrialResult(
        config=TrialConfig(batch_size=8),
        status="ok",
        samples_per_s=1.0,
        peak_memory_bytes=int(peak_gib * 2**30),
    )


def test_memory_headroom_makes_a_fast_trial_ineligible():
    assert memory_problem(_ok(8.9), HOST, headroom=0.1) is None
    problem = memory_problem(_ok(9.5), HOST, headroom=0.1)
    assert problem == "peak host memory 9.5 GiB leaves less than 10% of 10.0 GiB free"


def test_failure_summary_counts_reasons():
    failed = TrialResult(config=TrialConfig(batch_size=8), status="oom", reason="out of memory")
    records = [
        TrialRecord(number=0, role="baseline", result=failed),
        TrialRecord(number=1, role="search", result=failed.model_copy(update={"status": "error"})),
        TrialRecord(number=2, role="search", result=failed),
    ]
    summary = failure_summary(records)
    assert summary.startswith("all 3 trials failed: 2 oom, 1 error (trial 0: out of memory)")


@pytest.mark.slow
def test_grid_sampler_stops_when_the_space_is_exhausted(tmp_path):
    result = advisor.tune(
        f"{TINY}:factory",
        trials=50,
        sampler="grid",
        batch_sizes="32",
        accumulation_steps="1",
        out=tmp_path,
        **FAST,
    )
    measured = [t for t in result.trials if t.role != "duplicate"]
    assert len({t.result.config for t in measured}) == len(measured) == 6  # amp 2 x workers 3


@pytest.mark.slow
def test_timeout_stops_starting_trials(tmp_path):
    result = advisor.tune(f"{TINY}:factory", trials=20, timeout=0.5, out=tmp_path, **FAST)
    assert [t.role for t in result.trials] == ["baseline"]
    assert result.recommendation.config == result.recommendation.baseline_config
    report = (tmp_path / "report.md").read_text()
    assert "Your configuration was the fastest one measured" in report


@pytest.mark.slow
def test_every_trial_failing_exits_3_with_the_reasons(tmp_path):
    completed = run_advisor(
        "tune",
        f"{TINY}:nan_loss",
        "--trials",
        "2",
        "--trial-seconds",
        "0.2",
        "--out",
        str(tmp_path),
    )
    assert completed.returncode == 3, completed.stderr
    assert "error: all 2 trials failed: 2 diverged" in completed.stderr
    study = optuna.load_study(study_name="tiny-nan_loss", storage=f"sqlite:///{tmp_path}/study.db")
    assert len(study.trials) == 2  # the failures are kept in the study
    assert all(t.constraints == {"feasible": 1.0} and t.value == 0.0 for t in study.trials)
