"""Every trial keeps to its time budget, whatever its batch: a cycle too long for the window is
timed in parts, and the estimate agrees with timing whole cycles."""

from __future__ import annotations

import pytest

from advisor.knobs import TrialConfig
from advisor.results import TrialResult
from advisor.trial.parent.runner import TrialLaunch, run_trial
from tests.conftest import ROOT, TINY, survivors
from tests.workloads.tiny import (
    MICRO_STEP_S,
    OPTIMIZER_STEP_S,
    SCATTERED_MEAN_S,
    SCATTERED_OPTIMIZER_STEP_S,
    SHORT_MICRO_STEP_S,
)

# Each test here asserts what a trial's clock saw: it runs alone on the machine.
pytestmark = pytest.mark.timing

WINDOW_S = 0.5
ACCUMULATION = 8
CYCLE_S = ACCUMULATION * MICRO_STEP_S  # 0.8 s: longer than the window


def _launch() -> TrialLaunch:
    return TrialLaunch(
        spec=f"{TINY}:slow_micro_steps", cwd=ROOT, warmup_steps=3, trial_seconds=WINDOW_S,
        timeout_s=120,
    )  # fmt: skip


def _near_own(rate: float, own: float) -> bool:
    """Whether a measured rate of steps that sleep is the workload's own: never above it (a sleep
    takes at least its time), and not below 0.6 of it. On CI's two cores, shared by three test
    workers, one DDP trial read 0.71x and the next 0.91x; two such trials disagree by more than
    any bias these tests look for, so each is held to the rate the sleeps set."""
    return 0.6 * own < rate < 1.1 * own


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_cycle_longer_than_the_window_is_estimated_within_the_budget(tmp_path, marked, knobs):
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION, **knobs)

    estimated = run_trial(_launch(), config, tmp_path / "estimated.log")
    whole = run_trial(_launch(), config, tmp_path / "whole.log", whole_cycles=True)

    assert estimated.status == "ok" and whole.status == "ok", (estimated.reason, whole.reason)
    assert estimated.estimated and not whole.estimated
    # Whole cycles take 0.8 s, past the 0.5-s budget: the re-run warms up for one and times
    # two (not three of each); the estimate needs less than two of each.
    assert whole.window_s >= 2 * CYCLE_S and whole.steps_measured == 2
    assert CYCLE_S * 7 / 8 <= whole.warmup_s < 2 * CYCLE_S
    assert estimated.window_s < 2 * CYCLE_S and estimated.warmup_s < 2 * CYCLE_S
    # The parts add up to what whole cycles measure: the workload's own rate and cycle.
    own = config.global_batch_size / CYCLE_S
    assert _near_own(estimated.samples_per_s, own) and _near_own(whole.samples_per_s, own)
    assert _near_own(CYCLE_S / estimated.step_time_median_s, 1.0)
    assert survivors(marked) == []


def test_a_re_run_counts_its_first_micro_step_towards_its_warm_up(tmp_path):
    """DDP ranks end a warm-up only after an optimizer step. A finalist's re-run whose first
    cycle outlasts the window's time only with its first micro-step (the rest, 3 micro-steps,
    0.3 s; the window 0.38 s) warms up for that cycle alone. Counted apart, a second cycle
    followed: on examples/data_bound.py, a quarter of a DDP re-run's wall."""
    config = TrialConfig(batch_size=16, accumulation_steps=4, parallel_mode="ddp", world_size=2)
    launch = TrialLaunch(
        spec=f"{TINY}:slow_micro_steps", cwd=ROOT, warmup_steps=3, trial_seconds=0.38,
        timeout_s=120,
    )  # fmt: skip

    result = run_trial(launch, config, tmp_path / "t.log", whole_cycles=True)

    assert result.status == "ok" and not result.estimated, result.reason
    assert result.warmup_s < 5 * MICRO_STEP_S  # the first cycle's rest (0.3 s), not 0.7 s
    assert result.steps_measured >= 2


def test_a_search_trial_ends_its_warm_up_once_a_cycle_is_known_too_long(tmp_path):
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION)

    result = run_trial(_launch(), config, tmp_path / "t.log", precise_window=True)

    assert result.status == "ok" and result.estimated, result.reason
    # The first micro-step, 0.1 s and past an eighth of the window, predicts a cycle of 0.8 s,
    # more than a third of the window: no warm-up micro-step follows it, let alone a cycle.
    assert result.warmup_s < MICRO_STEP_S / 2
    assert result.window_s < WINDOW_S * 1.5


@pytest.mark.parametrize(
    ("knobs", "warmup_steps"),
    [({}, 0), ({"parallel_mode": "ddp", "world_size": 2}, 0), ({"num_workers": 2}, 2)],
)
def test_a_search_trial_of_long_steps_is_settled_by_its_first_step(tmp_path, knobs, warmup_steps):
    config = TrialConfig(batch_size=16, **knobs)
    launch = _launch()
    launch.trial_seconds = 0.6  # steps of 0.1 s, alike to the millisecond

    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)
    whole = run_trial(launch, config, tmp_path / "whole.log")

    assert search.status == "ok" and whole.status == "ok", (search.reason, whole.reason)
    # The first step outlasted an eighth of the window: the warm-up has settled. With loader
    # workers it has not: the batches they queued meanwhile must drain first (a round of them).
    # The window then spans three steps and two rounds of the workers at least (three rounds
    # pin an idle machine's rate down; on a busy one, steps of 0.12 s reach the window's time
    # after five). Without workers, the first step joins the test of precision: alike, it and
    # two more show the rate precise
    assert warmup_steps * MICRO_STEP_S <= search.warmup_s < (warmup_steps + 1) * MICRO_STEP_S
    assert whole.warmup_s >= 3 * MICRO_STEP_S
    # (`test_window`; a busy machine's jitter may keep them from it).
    assert search.steps_measured >= (max(3, 2 * config.num_workers) if config.num_workers else 2)
    assert whole.steps_measured >= 3
    # No queued batch read as a fast step: a step cannot beat its 0.1-s sleep (a busy machine
    # slows DDP steps, the whole window's more than three).
    assert search.samples_per_s <= 1.05 * config.global_batch_size / MICRO_STEP_S


def test_a_first_step_that_waited_for_the_workers_settles_a_search_trials_warm_up(tmp_path):
    # Two workers take 0.48 s a batch each: the first step waits for their first round, with
    # no time to queue batches beyond it, so the window may follow at once (a step that was
    # long for another reason does not: test above). Its rate is still that of whole windows.
    config = TrialConfig(batch_size=16, num_workers=2)
    launch = TrialLaunch(
        spec=f"{TINY}:slow_samples", cwd=ROOT, warmup_steps=3, trial_seconds=1.5, timeout_s=120
    )

    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)
    whole = run_trial(launch, config, tmp_path / "whole.log")

    assert search.status == "ok" and whole.status == "ok", (search.reason, whole.reason)
    assert search.warmup_s == 0.0 and whole.warmup_s > 0.0
    assert search.samples_per_s == pytest.approx(whole.samples_per_s, rel=0.15)


def test_a_search_trial_estimates_a_cycle_when_three_do_not_fit_its_window(tmp_path):
    config = TrialConfig(batch_size=16, accumulation_steps=4)
    launch = _launch()
    launch.trial_seconds = 1.0  # a cycle of 0.4 s: two fit, three do not

    whole = run_trial(launch, config, tmp_path / "whole.log")
    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)
    again = run_trial(launch, config, tmp_path / "again.log")  # a busy machine's pace drifts

    assert all(r.status == "ok" for r in (search, whole, again)), (search.reason, whole.reason)
    # A search window needs three cycles to be precise: it times the parts instead, in less
    # time than three cycles take (within its own 1 s, but for a busy machine's overrun).
    assert search.estimated and not whole.estimated
    assert search.window_s < 3 * 4 * MICRO_STEP_S
    # Within 10 % of whole cycles, measured before and after it. (Once, on CI's two cores under
    # three test workers, a single whole trial read 157 samples/s and the estimate 130.)
    low, high = sorted((whole.samples_per_s, again.samples_per_s))
    assert 0.9 * low <= search.samples_per_s <= 1.1 * high


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_search_trial_of_alike_micro_steps_estimates_its_cycle_from_one_pair(tmp_path, knobs):
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION, **knobs)

    search = run_trial(_launch(), config, tmp_path / "search.log", precise_window=True)
    whole = run_trial(_launch(), config, tmp_path / "whole.log", whole_cycles=True)

    assert search.status == "ok" and whole.status == "ok", (search.reason, whole.reason)
    # Micro-steps of 0.1 s, with or without the optimizer step: the first micro-step settles
    # the warm-up, and one (plain, stepped) pair alike to it (or, where a busy machine made
    # the first one longer, with the micro-step after it) is precise, short of the 0.5-s window
    # that two pairs would fill.
    assert search.estimated and search.warmup_s == 0.0
    # (Two DDP ranks' all-reduce may leave three micro-steps not alike within 5 %: see below.)
    micro_steps = search.samples_measured // (16 * config.world_size)
    assert micro_steps <= (3 if config.world_size == 1 else 4)
    own = config.global_batch_size / CYCLE_S
    assert _near_own(search.samples_per_s, own) and _near_own(whole.samples_per_s, own)


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_an_estimate_ends_at_the_micro_step_that_shows_its_pair_precise(tmp_path, knobs):
    # A first micro-step unlike the rest (0.3 s, then 0.1 s each): one pair cannot be shown
    # precise with it, but a pair and the micro-step after it are, alone. DDP ranks too decide
    # after that plain micro-step, not only after the next pair's optimizer step.
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION, **knobs)
    launch = _launch()
    launch.spec = f"{TINY}:slow_micro_steps_slow_first"

    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)
    whole = run_trial(launch, config, tmp_path / "whole.log", whole_cycles=True)

    assert search.status == "ok" and whole.status == "ok", (search.reason, whole.reason)
    assert search.estimated and search.warmup_s == 0.0
    # Three micro-steps, not two pairs. Two DDP ranks' all-reduce may make the stepped one a few
    # milliseconds longer than its sleep, and three then not alike within 5 %: the fourth decides
    # (once in 3 runs of the suite, the machine to itself).
    micro_steps = search.samples_measured // (16 * config.world_size)
    assert micro_steps == 3 if config.world_size == 1 else micro_steps in (3, 4)
    own = config.global_batch_size / CYCLE_S  # from the second micro-step on
    assert _near_own(search.samples_per_s, own) and _near_own(whole.samples_per_s, own)


def test_a_search_trial_whose_first_step_is_long_times_two_steps_not_three(tmp_path):
    # Steps of 0.1 s against a 0.15-s window: the first step settles the warm-up, which then
    # times none, and it already says that a step takes more than half the window.
    launch = _launch()
    launch.trial_seconds = 0.15
    config = TrialConfig(batch_size=16)

    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)

    assert search.status == "ok", search.reason
    assert search.warmup_s == 0.0 and search.steps_measured == 2


def test_a_search_window_of_long_steps_spans_one_round_of_the_workers(tmp_path):
    # Steps of 0.1 s against a 0.15-s window, two loader workers: one round of their batches is
    # two steps, which the window times, where two rounds had taken four.
    launch = _launch()
    launch.trial_seconds = 0.15
    config = TrialConfig(batch_size=16, num_workers=2)

    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)
    whole = run_trial(launch, config, tmp_path / "whole.log", whole_cycles=True)

    assert search.status == "ok" and whole.status == "ok", (search.reason, whole.reason)
    assert search.steps_measured == 2
    assert whole.steps_measured >= 4  # a re-run still spans two rounds


def test_a_cycle_that_fits_the_window_is_timed_whole(tmp_path):
    config = TrialConfig(batch_size=16, accumulation_steps=2)
    launch = _launch()
    launch.trial_seconds = 1.0  # a cycle of 0.2 s: five fit

    result = run_trial(launch, config, tmp_path / "t.log")

    assert result.status == "ok" and not result.estimated
    assert result.steps_measured >= 3


def _beat_launch(spec: str) -> TrialLaunch:
    return TrialLaunch(
        spec=f"{TINY}:{spec}", cwd=ROOT, warmup_steps=3, trial_seconds=PRECISE_WINDOW_S,
        timeout_s=120,
    )  # fmt: skip


PRECISE_WINDOW_S = 2.0


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_search_window_ends_once_its_rate_is_precise(tmp_path, knobs):
    config = TrialConfig(batch_size=16, **knobs)
    launch = _beat_launch("on_the_beat")  # a step every 20 ms, however busy the machine

    precise = run_trial(launch, config, tmp_path / "precise.log", precise_window=True)
    whole = run_trial(launch, config, tmp_path / "whole.log")

    assert precise.status == "ok" and whole.status == "ok", (precise.reason, whole.reason)
    assert whole.window_s >= PRECISE_WINDOW_S
    # Not before an eighth of the window; soon after, as the beat's rate is known within 5 %.
    assert PRECISE_WINDOW_S / 8 <= precise.window_s < PRECISE_WINDOW_S / 2
    assert precise.samples_per_s == pytest.approx(whole.samples_per_s, rel=0.1)


def test_a_window_whose_rate_drifts_runs_its_whole_time(tmp_path):
    launch = _beat_launch("drifting")  # each step 1 ms slower than the last

    result = run_trial(launch, TrialConfig(batch_size=16), tmp_path / "t.log", precise_window=True)

    assert result.status == "ok", result.reason
    # Never precise: it runs its time, to the step nearest it (half a step short, at most).
    mean_step_s = result.window_s / result.steps_measured
    assert result.window_s >= PRECISE_WINDOW_S - mean_step_s / 2


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_search_window_ends_once_clearly_slower_than_the_best(tmp_path, knobs):
    config = TrialConfig(batch_size=16, **knobs)
    launch = _beat_launch("scattered")  # steps of 0-60 ms: 5 % precision takes a second or more
    rate = config.global_batch_size / SCATTERED_MEAN_S

    below = run_trial(
        launch, config, tmp_path / "below.log", precise_window=True, beat_samples_per_s=3 * rate
    )
    best = run_trial(
        launch, config, tmp_path / "best.log", precise_window=True, beat_samples_per_s=rate / 3
    )

    assert below.status == "ok" and best.status == "ok", (below.reason, best.reason)
    # Three times slower than the best: clear within a quarter of the window, whose rate it
    # keeps, and says so. Faster than the best, its rate must be precise.
    assert below.below_best and below.window_s < PRECISE_WINDOW_S / 4
    assert not best.below_best and best.window_s > PRECISE_WINDOW_S / 2
    # (two DDP ranks step at the slower one's pace: below 1 / SCATTERED_MEAN_S steps a second)
    assert best.samples_per_s == pytest.approx(rate, rel=0.35)
    # A short window of steps scattered by ±100 %: its mean carries a standard error near 20 %.
    assert below.samples_per_s == pytest.approx(best.samples_per_s, rel=0.5)


def test_an_estimate_is_below_the_best_only_where_its_siblings_are_too(tmp_path):
    # Micro-steps of 10 ms, optimizer steps 20-60 ms more: 320 samples/s without accumulation,
    # a rate that its window pins down only slowly; 1,422 with 32 micro-steps a cycle, whose
    # 0.36-s cycle is too long for a third of the window: the trial times its parts.
    launch = TrialLaunch(
        spec=f"{TINY}:scattered_optimizer_steps", cwd=ROOT, warmup_steps=3, trial_seconds=0.9,
        timeout_s=120,
    )  # fmt: skip
    low, high = SCATTERED_OPTIMIZER_STEP_S
    own = {a: 16 * a / (a * SHORT_MICRO_STEP_S + (low + high) / 2) for a in (1, 32)}

    def trial(name: str, best: float) -> TrialResult:
        config = TrialConfig(batch_size=16)
        return run_trial(launch, config, tmp_path / f"{name}.log", precise_window=True,
                         beat_samples_per_s=best, sibling_accumulation=(32,))  # fmt: skip

    sibling_faster = trial("sibling_faster", best=3 * own[1])
    both_slower = trial("both_slower", best=3 * own[32])

    assert sibling_faster.status == "ok" and both_slower.status == "ok"
    assert sibling_faster.estimated and both_slower.estimated
    # Three times slower than the best, but its sibling is faster: the window goes on.
    assert not sibling_faster.below_best and sibling_faster.window_s > launch.trial_seconds / 2
    assert sibling_faster.sibling_rates[32] > 3 * own[1]
    # Both three times slower: clear soon, and said.
    assert both_slower.below_best and both_slower.window_s < launch.trial_seconds / 2


def test_an_estimate_agrees_with_whole_cycles_where_workers_deliver_batches_in_rounds(tmp_path):
    # Two workers take 0.48 s a batch each: rounds of two batches, the first waited for, the
    # second ready. The estimate's (plain, stepped) pairs align with the rounds; read as alike,
    # they had put a cycle at 7 waits instead of 4 (0.57x the rate).
    config = TrialConfig(batch_size=16, accumulation_steps=4, num_workers=2)
    launch = TrialLaunch(
        spec=f"{TINY}:slow_samples", cwd=ROOT, warmup_steps=1, trial_seconds=1.5, timeout_s=120
    )

    search = run_trial(launch, config, tmp_path / "search.log", precise_window=True)
    whole = run_trial(launch, config, tmp_path / "whole.log", whole_cycles=True)

    assert search.status == "ok" and whole.status == "ok", (search.reason, whole.reason)
    assert search.estimated and not whole.estimated
    assert search.samples_per_s == pytest.approx(whole.samples_per_s, rel=0.15)


@pytest.mark.parametrize("precise", [True, False])
def test_ddp_ranks_end_an_estimate_within_its_budget_whatever_the_first_steps_pace(
    tmp_path, precise
):
    # The warm-up's micro-steps read batches the workers queued meanwhile: fast. The ranks had
    # scheduled their first check from that pace, and a 2-s window of 0.5-s micro-steps ran a
    # minute (examples/data_bound.py).
    config = TrialConfig(
        batch_size=16, accumulation_steps=4, num_workers=2, parallel_mode="ddp", world_size=2
    )
    launch = TrialLaunch(
        spec=f"{TINY}:slow_samples", cwd=ROOT, warmup_steps=1, trial_seconds=1.5, timeout_s=120
    )

    result = run_trial(launch, config, tmp_path / "t.log", precise_window=precise)

    assert result.status == "ok" and result.estimated, result.reason
    assert result.window_s < 2 * launch.trial_seconds


@pytest.mark.parametrize("knobs", [{}, {"parallel_mode": "ddp", "world_size": 2}])
def test_a_search_trial_times_parts_where_a_siblings_cycle_is_too_long_and_gives_its_rate(
    tmp_path, knobs
):
    # Micro-steps of 0.1 s, optimizer steps 0.3 s more: a cycle of 0.4 s without accumulation,
    # within the third of a 1.5-s window that a search trial times whole; 0.7 s with 4.
    launch = TrialLaunch(
        spec=f"{TINY}:slow_optimizer_steps", cwd=ROOT, warmup_steps=3, trial_seconds=1.5,
        timeout_s=120,
    )  # fmt: skip
    one = TrialConfig(batch_size=16, **knobs)
    four = one.model_copy(update={"accumulation_steps": 4})

    alone = run_trial(launch, one, tmp_path / "alone.log", precise_window=True)
    both = run_trial(launch, one, tmp_path / "both.log", precise_window=True,
                     sibling_accumulation=(4,))  # fmt: skip
    other = run_trial(launch, four, tmp_path / "other.log", precise_window=True,
                      sibling_accumulation=(1,))  # fmt: skip

    assert all(r.status == "ok" for r in (alone, both, other)), (both.reason, other.reason)
    assert not alone.estimated and not alone.sibling_rates  # whole steps: they fit
    assert both.estimated and set(both.sibling_rates) == {4}
    assert other.estimated and set(other.sibling_rates) == {1}
    # Each rate, whichever trial gives it and whether timed whole or in parts, is the workload's.
    ranks = knobs.get("world_size", 1)
    own = {a: a * 16 * ranks / (a * MICRO_STEP_S + OPTIMIZER_STEP_S) for a in (1, 4)}
    rates = {1: (alone.samples_per_s, both.samples_per_s, other.sibling_rates[1]),
             4: (both.sibling_rates[4], other.samples_per_s)}  # fmt: skip
    for accumulation, measured in rates.items():
        assert all(_near_own(rate, own[accumulation]) for rate in measured), (accumulation, rates)
    # In either trial, the derived rate and its own show what accumulation amortises: 1.75x.
    assert both.sibling_rates[4] > 1.4 * both.samples_per_s
    assert other.samples_per_s > 1.4 * other.sibling_rates[1]
