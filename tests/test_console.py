"""What a user sees while a tune runs: plain lines in logs, a live line on a terminal."""

import io
from typing import get_args

from rich.console import Console

from advisor.console import NOT_GOING_ON, ConsoleProgress, stage_text
from advisor.decide.race.extend import NotGoingOn
from advisor.knobs import TrialConfig
from advisor.progress import Stage
from advisor.results import NoiseScale, TrialRecord, TrialResult

CONFIG = TrialConfig(batch_size=32, amp="bf16")


def _record(number: int, status: str, rate: float | None = None, reason: str | None = None):
    result = TrialResult(config=CONFIG, status=status, samples_per_s=rate, reason=reason)
    return TrialRecord(number=number, role="search", result=result)


def _run(progress: ConsoleProgress) -> None:
    progress.stage("probing hardware")
    progress.trial_started("trial 1/3", CONFIG)
    progress.trial_phase("warmup")
    progress.trial_finished(_record(0, "ok", 1234.0), 1234.0)
    progress.trial_started("trial 2/3", CONFIG)
    progress.trial_finished(_record(1, "oom", reason="out of memory"), 1234.0)


def test_plain_lines_when_output_is_not_a_terminal():
    buffer = io.StringIO()
    _run(ConsoleProgress(Console(file=buffer, force_terminal=False, width=200)))
    assert buffer.getvalue().splitlines() == [
        "· probing hardware",
        "  trial 1/3  bs=32 acc=1 amp=bf16 workers=0 …",
        "✓ trial 1/3  bs=32 acc=1 amp=bf16 workers=0       1,234 samples/s",
        "  trial 2/3  bs=32 acc=1 amp=bf16 workers=0 …",
        "✗ trial 2/3  bs=32 acc=1 amp=bf16 workers=0  oom out of memory",
    ]


def test_live_line_shows_phase_best_so_far_and_failures_by_kind():
    progress = ConsoleProgress(Console(file=io.StringIO(), force_terminal=False), quiet=True)
    _run(progress)
    progress.trial_started("trial 3/3", CONFIG)
    line = progress.status_text("measure")
    assert line == (
        "trial 3/3  bs=32 acc=1 amp=bf16 workers=0 · measuring · best 1,234 samples/s"
        " · failed: 1 oom"
    )


def test_quiet_prints_nothing():
    buffer = io.StringIO()
    _run(ConsoleProgress(Console(file=buffer, force_terminal=True), quiet=True))
    assert buffer.getvalue() == ""


def test_a_stopped_trial_says_why_and_is_no_failure():
    buffer = io.StringIO()
    progress = ConsoleProgress(Console(file=buffer, force_terminal=False, width=200))
    progress.trial_started("trial 2/3", CONFIG)
    reason = "stopped: projected 31 samples/s, 39.8x slower than the best (1,234)"
    stopped = _record(1, "stopped", 31.0, reason).model_copy(
        update={"result": TrialResult(config=CONFIG, status="stopped", samples_per_s=31.0,
                                      reason=reason, failure_phase="warmup")}
    )  # fmt: skip
    progress.trial_finished(stopped, 1234.0)
    assert buffer.getvalue().splitlines()[-1] == (
        f"– trial 2/3  bs=32 acc=1 amp=bf16 workers=0  {reason} (during its warm-up)"
    )
    progress.trial_started("trial 3/3", CONFIG)
    assert "failed" not in progress.status_text("measure")


def test_the_noise_scale_trial_ends_its_live_line_with_what_it_measured():
    buffer = io.StringIO()
    terminal = Console(file=buffer, force_terminal=True, color_system=None, width=200)
    progress = ConsoleProgress(terminal)
    noise = NoiseScale(value=59.6, low=15.3, high=104.0, small_batch=64, big_batch=512, steps=135)
    progress.trial_started("noise-scale trial", CONFIG)
    progress.noise_finished(noise, None)
    # Its spinner stopped (before, it kept spinning under the re-runs and the race).
    assert progress._status is None
    measured = "phi = 59.6 (95 % interval 15.3-104), 135 steps"
    assert f"✓ noise-scale trial  bs=32 acc=1 amp=bf16 workers=0  {measured}" in buffer.getvalue()


def test_a_failed_noise_scale_trial_says_why():
    buffer = io.StringIO()
    progress = ConsoleProgress(Console(file=buffer, force_terminal=False, width=200))
    progress.trial_started("noise-scale trial", CONFIG)
    progress.noise_finished(None, "error: RuntimeError: boom")
    assert buffer.getvalue().splitlines()[-1] == (
        "✗ noise-scale trial  bs=32 acc=1 amp=bf16 workers=0  failed error: RuntimeError: boom"
    )


def test_why_a_race_does_not_go_on_is_worded_from_its_reason():
    """The decision says which reason (`why_not_go_on`) and how far it went; the console words
    it: every reason has its words."""
    assert set(NOT_GOING_ON) == set(get_args(NotGoingOn))
    stays = stage_text(Stage(kind="race-stays", label="no-other-batch"))
    assert (
        stays == "the race kept your global batch and does not go on: no other global batch raced"
    )
    alone = stage_text(Stage(kind="race-went-on-alone", seconds=10, until_s=30))
    assert alone.startswith("after 30 s of replicate 1, the other global batch cannot win")
    assert alone.endswith("the verdict after 10 s stands")
