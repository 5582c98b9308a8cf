"""A speed-up is claimed only where the paired re-runs support it (`advisor.decide.claims`),
and the machine's load is read from outside the trial (`advisor.trial.parent.load`)."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from advisor.decide.claims import BUSY_ROUNDS, COVERAGE, MIN_ROUNDS, busy, judge
from advisor.decide.paired_ratio import paired_ratio
from advisor.decide.race.verdict import MARGIN
from advisor.decide.reruns import rerun_pairs
from advisor.knobs import TrialConfig
from advisor.results import MachineLoad, TrialRecord, TrialResult
from advisor.search.space import build_space
from advisor.settings import TuneSettings
from advisor.trial.orders import ProgressCallback, RaceOrder, TrialOrder, WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import CPU_PROFILE, ROOT, TINY
from tests.scripted_runner import TASK, ScriptedRunner, scripted_tune

QUIET = MachineLoad(cores=2, seconds=2.0, outside_cores=0.02)
LOADED = MachineLoad(cores=2, seconds=2.0, outside_cores=1.0)


def test_rounds_that_agree_confirm_their_typical_ratio():
    verdict = judge([1.95, 2.1, 2.0], [QUIET] * 6)
    # the median of the pairwise geometric means: 2.0 and 2.024 (1.95 with 2.1), halfway in logs
    assert verdict.confirmed and verdict.claimed_speedup == pytest.approx(2.012, abs=5e-4)
    assert verdict.why is None
    assert "confirmed: 3 rounds" in verdict.statement


def test_rounds_that_disagree_claim_no_more_than_the_lowest():
    """The issue's case: re-runs 17-fold apart never claim their median."""
    verdict = judge([0.6, 3.06, 38.4], [LOADED] * 6)
    assert not verdict.confirmed and verdict.claimed_speedup == 0.6
    assert "ranged from 0.60x to 38.40x over 3 rounds" in (verdict.why or "")
    assert "other programs used 1.0 of 2 cores" in (verdict.why or "")
    assert "it claims no speed-up" in verdict.statement


def test_a_busy_machine_needs_more_agreeing_rounds_than_a_quiet_one():
    agreeing = [1.5, 1.52, 1.47, 1.49, 1.51]
    two = judge(agreeing[:2], [QUIET] * 4)
    assert not two.confirmed and "only 2 rounds" in (two.why or "")  # even on a quiet one
    assert judge(agreeing[:MIN_ROUNDS], [QUIET] * 6).confirmed
    busy_too_few = judge(agreeing[:MIN_ROUNDS], [QUIET, LOADED])
    assert not busy_too_few.confirmed and "other programs used" in (busy_too_few.why or "")
    assert judge(agreeing[:BUSY_ROUNDS], [LOADED] * 8).confirmed


def test_the_interval_narrows_as_rounds_are_added_past_one_wild_round():
    """One round at a quarter of the others' ratio: its pairwise means make the first six
    rounds' interval too wide, and from eight rounds on they fall outside it."""
    rounds = [5.0, 2.0, 2.1, 0.5, 1.9, 2.05, 2.0, 1.95]
    six = paired_ratio(rounds[:6], COVERAGE)
    assert six.low < 1.1 and six.high > 3.0 and not judge(rounds[:6], [QUIET] * 12).confirmed
    eight = paired_ratio(rounds, COVERAGE)
    assert eight.typical == pytest.approx(2.0, rel=1e-3) and 1.9 < eight.low < eight.high < 2.1
    assert judge(rounds, [QUIET] * 16).confirmed


def test_a_busy_machine_asks_the_interval_for_more_confidence():
    """Five rounds whose 75 % interval lies within ±15 % of their typical ratio, but not their
    90 % one: confirmed on a quiet machine, not on a busy one."""
    rounds = [1.05, 1.2, 1.22, 1.25, 1.4]
    assert judge(rounds, [QUIET] * 10).confirmed
    verdict = judge(rounds, [LOADED] * 10)
    assert not verdict.confirmed and verdict.claimed_speedup == 1.05  # the lowest round
    assert "other programs used 1.0 of 2 cores" in (verdict.why or "")


def test_two_clusters_of_ratios_confirm_once_enough_rounds_weigh_them():
    """Quiet examples/data_bound.py on the project's VM: pairs near 1.6x and near 2.4x. The
    order statistics' interval spans both clusters at ten rounds; this one does not."""
    rounds = [2.39, 1.58, 1.63, 2.43, 1.53, 2.34, 1.73, 1.79, 1.2, 1.58]
    assert not judge(rounds[:5], [QUIET] * 10).confirmed
    verdict = judge(rounds, [QUIET] * 20)
    assert verdict.confirmed and 1.6 < verdict.claimed_speedup < 1.8


def test_the_interval_keeps_its_coverage_for_any_number_of_rounds():
    """Drawn from a known log-normal ratio, the interval holds the true one in about
    `COVERAGE` of the draws, never fewer: at 3 rounds (all Walsh averages kept) and at 12."""
    import random

    rng = random.Random(0)
    for rounds in (3, 12):
        held = 0
        for _ in range(2000):
            ratios = [2.0 * math.exp(rng.gauss(0.0, 0.2)) for _ in range(rounds)]
            estimate = paired_ratio(ratios, COVERAGE)
            held += estimate.low <= 2.0 <= estimate.high
        assert COVERAGE - 0.03 <= held / 2000 <= 0.95


def test_busy_is_cpu_taken_by_others_stolen_time_or_another_gpu_program():
    assert busy([QUIET, None]) is None
    assert busy([QUIET, LOADED]) == LOADED
    stolen = MachineLoad(cores=8, seconds=1.0, outside_cores=0.0, steal_share=0.08)
    assert busy([stolen]) == stolen
    assert busy([MachineLoad(cores=8, seconds=1.0, outside_cores=0.0, gpu_processes=1)])


def _rerun(number: int, round_: int | None, rate: float) -> TrialRecord:
    result = TrialResult(
        config=TrialConfig(batch_size=32), status="ok", samples_per_s=rate, load=QUIET
    )
    return TrialRecord(number=number, role="confirm", result=result, round=round_)


def test_re_runs_pair_by_round_and_tie_breaks_pair_with_nothing():
    runs = [
        _rerun(3, 1, 200.0),
        _rerun(3, 2, 220.0),
        _rerun(3, None, 999.0),  # a tie-break: the baseline did not run beside it
        _rerun(0, 1, 100.0),
        _rerun(0, 2, 100.0),
        _rerun(0, 3, 90.0),  # its partner failed
    ]
    pairs = rerun_pairs(runs, winner=3, baseline=0)
    assert [(w, b) for w, b, _ in pairs] == [(200.0, 100.0), (220.0, 100.0)]


@contextmanager
def _burning(processes: int) -> Iterator[None]:
    """Other programs, each keeping a core busy."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.mark.parametrize("preloaded", [True, False])
def test_a_trial_reads_the_cpu_other_programs_took(tmp_path, preloaded):
    launch = TrialLaunch(
        spec=f"{TINY}:factory",
        cwd=ROOT,
        warmup_steps=2,
        trial_seconds=1.0,
        timeout_s=120,
        preloaded=preloaded,
    )
    with _burning(2):
        result = ProcessRunner(launch).run(
            WindowOrder(config=TrialConfig(batch_size=32)), tmp_path / "trial.log"
        )
    assert result.status == "ok" and result.load is not None
    assert result.load.outside_cores >= 0.5, result.load
    # from the child's start to its reaping: the window and more, a new launcher's start-up no
    assert launch.trial_seconds <= result.load.seconds <= (result.wall_s or 0.0)


@dataclass
class _Wandering(ScriptedRunner):
    """A machine `load` keeps busy (or not) throughout: each re-run of a configuration other
    than `baseline` measures its scripted rate times the next of `factors` (the last again once
    they are spent); the baseline's re-runs hold still. The paired ratios of the recommendation
    and the baseline then agree within `CLAIM_TOLERANCE`, round after round."""

    baseline: TrialConfig | None = None
    factors: tuple[float, ...] = (1.0, 1.05, 0.975, 1.025)
    load: MachineLoad | None = None

    def answered(
        self, order: TrialOrder, result: TrialResult, on_progress: ProgressCallback | None
    ) -> TrialResult:
        if _whole_cycles(order) and result.samples_per_s and order.config != self.baseline:
            done = sum(_whole_cycles(o) and o.config == order.config for o in self.orders) - 1
            factor = self.factors[min(done, len(self.factors) - 1)]
            result = result.model_copy(update={"samples_per_s": result.samples_per_s * factor})
        return result.model_copy(update={"load": self.load})


def _whole_cycles(order: TrialOrder) -> bool:
    """A re-run's order."""
    return isinstance(order, WindowOrder) and order.whole_cycles


@pytest.mark.parametrize(
    ("load", "rounds", "confirmed"),
    [(LOADED, 4, False), (QUIET, MIN_ROUNDS, True)],  # a busy machine, and a quiet one alike
    ids=["busy", "quiet"],
)
def test_a_tune_on_a_busy_machine_claims_only_what_its_re_runs_support(
    tmp_path, load, rounds, confirmed
):
    settings = TuneSettings(
        spec=f"{TINY}:factory",
        out=tmp_path,
        trials=4,
        trial_seconds=0.5,
        objective="throughput",
        confirm_top=1,
        confirm_max_repeats=4,
    )
    baseline = build_space(settings, CPU_PROFILE, TASK).baseline
    result = scripted_tune(settings, _Wandering(baseline=baseline, load=load))
    rec = result.recommendation
    assert rec.config != rec.baseline_config  # a speed-up to claim
    confirmation = rec.confirmation
    assert confirmation is not None and confirmation.outside_cores == load.outside_cores
    # Rounds that agree: a quiet machine confirms at MIN_ROUNDS; a busy one needs BUSY_ROUNDS,
    # more than --confirm-max-repeats allows, so its claim stays unconfirmed.
    assert len(confirmation.ratios) == rounds and confirmation.confirmed == confirmed
    report = (tmp_path / "report.md").read_text()
    if confirmed:
        assert rec.speedup is not None and confirmation.low <= rec.speedup * 1.15
        assert "**Unconfirmed.**" not in report
    else:
        assert rec.speedup == min(confirmation.ratios)
        assert confirmation.why is not None and "other programs used 1.0 of 2 cores" in (
            confirmation.why
        )
        assert "**Unconfirmed.**" in report and confirmation.why in report
    rounds_run = [c.round for c in result.confirmations if c.number == rec.chosen_from_trial]
    assert len([r for r in rounds_run if r is not None]) == len(confirmation.ratios)


@dataclass
class _FadingAfterTheRace(ScriptedRunner):
    """A larger global batch's samples/s that the re-runs before the race measured, and the
    rounds that confirm the race's winner after it no longer find: the machine changed."""

    batch0: int = 32

    def answered(
        self, order: TrialOrder, result: TrialResult, on_progress: ProgressCallback | None
    ) -> TrialResult:
        raced = any(isinstance(o, RaceOrder) for o in self.orders)
        other_batch = order.config.global_batch_size != self.batch0
        if raced and _whole_cycles(order) and other_batch and result.samples_per_s:
            faded = 1000.0 * math.sqrt(self.batch0)  # the baseline's rate: no speed-up left
            result = result.model_copy(update={"samples_per_s": faded})
        return result


def test_a_race_winner_its_confirming_rounds_no_longer_support_is_not_recommended(tmp_path):
    """The race's winner (a larger global batch, 2x the samples/s in the re-runs before it)
    measures no faster in the rounds that confirm it: decided again with those rounds, its
    interval holds no win by the margin, so your global batch is kept and says why."""
    settings = TuneSettings(
        spec=f"{TINY}:factory", out=tmp_path, trials=6, trial_seconds=0.5,
        max_world_size=1, confirm_top=1, confirm_max_repeats=4, race_seconds=2.0,
    )  # fmt: skip
    runner = _FadingAfterTheRace()
    result = scripted_tune(settings, runner)
    rec, race = result.recommendation, result.recommendation.race
    assert race is not None and race.first_race is None
    raced = [o for o in runner.orders if isinstance(o, RaceOrder)]
    assert any(o.config.global_batch_size != 32 for o in raced)
    after = runner.orders[runner.orders.index(raced[-1]) :]
    rounds = [o for o in after if _whole_cycles(o) and o.config.global_batch_size != 32]
    assert rounds, "the race's winner was confirmed after the race"
    assert rec.config.global_batch_size == 32 and not rec.global_batch_changed
    assert race.verdict.kind in ("close-call", "kept") and race.verdict.best_claim is not None
    assert race.verdict.best_claim.low < 1 + MARGIN
