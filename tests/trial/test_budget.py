"""Every trial keeps to its time budget, whatever its batch: a cycle too long for the window is
timed in parts, and the estimate agrees with timing whole cycles.

The warm-up and the window run on a fake clock, their micro-steps scripted
(tests/trial/scripted.py), in the order a trial runs them; DDP ranks agree through a process
group of one. A few real trials check the same decisions in child processes, by what they
decided, never by their seconds.
"""

from __future__ import annotations

import pytest

from advisor.knobs import TrialConfig
from advisor.trial.orders import WindowOrder
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch
from tests.conftest import ROOT, TINY, survivors
from tests.trial.scripted import scripted_trial

DDP = {"parallel_mode": "ddp", "world_size": 2}
LAYOUTS = pytest.mark.parametrize("knobs", [{}, DDP], ids=["one-process", "ddp"])

WINDOW_S = 0.5
ACCUMULATION = 8
MICRO_STEP_S = 0.1
CYCLE_S = ACCUMULATION * MICRO_STEP_S  # 0.8 s: longer than the window


# --- real trials: what they decide, in child processes ---------------------------------------


def _launch() -> TrialLaunch:
    return TrialLaunch(
        spec=f"{TINY}:slow_micro_steps", cwd=ROOT, warmup_steps=3, trial_seconds=0.3,
        timeout_s=120,
    )  # fmt: skip


# Micro-steps that sleep 0.1 s, 4 a cycle: 0.4 s, longer than the 0.3-s window.
LONG_CYCLE = {"batch_size": 16, "accumulation_steps": 4}


@LAYOUTS
def test_a_trial_whose_cycle_is_longer_than_its_window_times_the_parts(tmp_path, marked, knobs):
    config = TrialConfig(**LONG_CYCLE, **knobs)
    result = ProcessRunner(_launch()).run(
        WindowOrder(config=config, sibling_accumulation=(8,)), tmp_path / "t.log"
    )

    assert result.status == "ok", result.reason
    assert result.estimated and result.steps_measured >= 1
    # The same parts give the rate at the other accumulation the search may try (how much,
    # on a fake clock: ...gives_its_rate below).
    assert set(result.sibling_rates) == {8} and result.sibling_rates[8] > 0
    assert survivors(marked) == []


def test_a_re_run_times_whole_cycles_however_long(tmp_path):
    result = ProcessRunner(_launch()).run(
        WindowOrder(config=TrialConfig(**LONG_CYCLE), whole_cycles=True), tmp_path / "t.log"
    )

    assert result.status == "ok", result.reason
    assert not result.estimated and result.steps_measured >= 2


# --- the warm-up and the window on a fake clock -----------------------------------------------


@LAYOUTS
def test_a_cycle_longer_than_the_window_is_estimated_within_the_budget(knobs):
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION, **knobs)

    estimated = scripted_trial(config, WINDOW_S, micro_s=MICRO_STEP_S)
    whole = scripted_trial(config, WINDOW_S, micro_s=MICRO_STEP_S, whole_cycles=True)

    assert estimated.estimate and not whole.estimate
    assert estimated.window is not None and whole.window is not None
    # Whole cycles take 0.8 s, past the 0.5-s budget: the re-run warms up for one, its first
    # micro-step and seven more, and times two (not three of each).
    assert (whole.warmup.micro_batches, whole.warmup.steps) == (ACCUMULATION - 1, 1)
    assert whole.window.steps == 2 and whole.window.elapsed_s == pytest.approx(2 * CYCLE_S)
    # The estimate keeps to the budget: less than two cycles in its warm-up, and in its window.
    assert estimated.warmup.elapsed_s < 2 * CYCLE_S and estimated.window.elapsed_s < 2 * CYCLE_S
    # The parts add up to what whole cycles measure: the workload's own cycle.
    assert estimated.cycle_s(ACCUMULATION) == pytest.approx(CYCLE_S)
    assert whole.cycle_s(ACCUMULATION) == pytest.approx(CYCLE_S)


def test_a_re_run_counts_its_first_micro_step_towards_its_warm_up():
    """DDP ranks end a warm-up only after an optimizer step. A finalist's re-run whose first
    cycle outlasts the window's time only with its first micro-step (the rest, 3 micro-steps,
    0.3 s; the window 0.38 s) warms up for that cycle alone. Counted apart, a second cycle
    followed: on examples/data_bound.py, a quarter of a DDP re-run's wall."""
    config = TrialConfig(batch_size=16, accumulation_steps=4, **DDP)

    rerun = scripted_trial(config, 0.38, micro_s=MICRO_STEP_S, whole_cycles=True)

    assert not rerun.estimate and rerun.window is not None
    assert (rerun.warmup.micro_batches, rerun.warmup.steps) == (3, 1)  # the first cycle's rest
    assert rerun.window.steps == 2


def test_a_search_trial_ends_its_warm_up_once_a_cycle_is_known_too_long():
    # The first micro-step, 0.1 s and past an eighth of the window, predicts a cycle of 0.8 s,
    # more than a third of the window: no warm-up micro-step follows it, let alone a cycle.
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION)

    search = scripted_trial(config, WINDOW_S, micro_s=MICRO_STEP_S, precise_window=True)

    assert search.warmup.micro_batches == 0 and search.estimate
    assert search.window is not None and search.window.elapsed_s < 1.5 * WINDOW_S


@pytest.mark.parametrize(
    ("knobs", "warmup_micro"),
    [({}, 0), (DDP, 0), ({"num_workers": 2}, 2)],
    ids=["one-process", "ddp", "workers"],
)
def test_a_search_trial_of_long_steps_is_settled_by_its_first_step(knobs, warmup_micro):
    config = TrialConfig(batch_size=16, **knobs)
    launch = {"warmup_steps": max(1, config.num_workers)}

    search = scripted_trial(config, 0.6, micro_s=MICRO_STEP_S, precise_window=True, **launch)
    whole = scripted_trial(config, 0.6, micro_s=MICRO_STEP_S, **launch)

    assert search.window is not None and whole.window is not None
    # The first step outlasted an eighth of the window: the warm-up has settled. With loader
    # workers it has not: the batches they queued meanwhile must drain first (a round of them).
    assert search.warmup.micro_batches == warmup_micro
    assert whole.warmup.steps >= 3
    # Without workers, the first step joins the test of precision: alike, it and two more show
    # the rate precise. With two, the batch means of that test span a round each: three rounds.
    assert search.window.steps == (3 * config.num_workers if config.num_workers else 2)
    assert whole.window.steps >= 3
    assert search.cycle_s(1) == pytest.approx(MICRO_STEP_S) == whole.cycle_s(1)


def test_a_first_step_that_waited_for_the_workers_settles_a_search_trials_warm_up():
    # Two workers take 0.48 s a batch each: the first step waits for their first round, with
    # no time to queue batches beyond it, so the window may follow at once (a step that was
    # long for another reason does not: test above). Its rate is still that of whole windows.
    config = TrialConfig(batch_size=16, num_workers=2)

    search = scripted_trial(config, 1.5, micro_s=0.001, batch_s=0.48, precise_window=True)
    whole = scripted_trial(config, 1.5, micro_s=0.001, batch_s=0.48)

    assert search.first.data_bound
    assert search.warmup.micro_batches == 0 and whole.warmup.micro_batches > 0
    assert search.cycle_s(1) == pytest.approx(0.24, rel=0.01)  # two batches a round
    assert whole.cycle_s(1) == pytest.approx(0.24, rel=0.01)


def test_a_search_trial_estimates_a_cycle_when_three_do_not_fit_its_window():
    config = TrialConfig(batch_size=16, accumulation_steps=4)  # a cycle of 0.4 s in a 1-s window

    whole = scripted_trial(config, 1.0, micro_s=MICRO_STEP_S)
    search = scripted_trial(config, 1.0, micro_s=MICRO_STEP_S, precise_window=True)

    # A search window needs three cycles to be precise: it times the parts instead, in less
    # time than three cycles take. Two fit the window: any other window times them whole.
    assert search.estimate and not whole.estimate
    assert search.window is not None and search.window.elapsed_s < 3 * 0.4
    assert search.cycle_s(4) == pytest.approx(0.4) == whole.cycle_s(4)


@LAYOUTS
def test_a_search_trial_of_alike_micro_steps_estimates_its_cycle_from_one_pair(knobs):
    # Micro-steps of 0.1 s, with or without the optimizer step: the first micro-step settles
    # the warm-up, and one (plain, stepped) pair alike to it is precise, short of the 0.5-s
    # window that two pairs would fill.
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION, **knobs)

    search = scripted_trial(config, WINDOW_S, micro_s=MICRO_STEP_S, precise_window=True)

    assert search.estimate and search.warmup.micro_batches == 0
    assert search.window is not None and search.window.micro_batches == 2
    assert search.cycle_s(ACCUMULATION) == pytest.approx(CYCLE_S)


@LAYOUTS
def test_an_estimate_ends_at_the_micro_step_that_shows_its_pair_precise(knobs):
    # A first micro-step unlike the rest (0.3 s, then 0.1 s each): one pair cannot be shown
    # precise with it, but a pair and the micro-step after it are, alone. DDP ranks too decide
    # after that plain micro-step, not only after the next pair's optimizer step.
    config = TrialConfig(batch_size=16, accumulation_steps=ACCUMULATION, **knobs)

    search = scripted_trial(config, WINDOW_S, micro_s=[0.3, 0.1], precise_window=True)

    assert search.estimate and search.warmup.micro_batches == 0
    assert search.window is not None and search.window.micro_batches == 3  # not two pairs
    assert search.cycle_s(ACCUMULATION) == pytest.approx(CYCLE_S)


def test_a_search_trial_whose_first_step_is_long_times_two_steps_not_three():
    # Steps of 0.1 s against a 0.15-s window: the first step settles the warm-up, which then
    # times none, and it already says that a step takes more than half the window.
    search = scripted_trial(TrialConfig(batch_size=16), 0.15, precise_window=True)

    assert search.warmup.micro_batches == 0
    assert search.window is not None and search.window.steps == 2


def test_a_search_window_of_long_steps_spans_one_round_of_the_workers():
    # Steps of 0.1 s against a 0.15-s window, two loader workers: one round of their batches is
    # two steps, which the window times, where two rounds had taken four.
    config = TrialConfig(batch_size=16, num_workers=2)

    search = scripted_trial(config, 0.15, precise_window=True)
    whole = scripted_trial(config, 0.15, whole_cycles=True)

    assert search.window is not None and search.window.steps == 2
    # A re-run still spans two rounds, each as long as the batches the workers prefetch.
    assert whole.window is not None and whole.window.steps == 2 * 2 * config.prefetch_factor


@LAYOUTS
def test_a_cycle_that_fits_the_window_is_timed_whole_for_at_least_the_window(knobs):
    config = TrialConfig(batch_size=16, accumulation_steps=2, **knobs)  # cycles of 0.2 s

    result = scripted_trial(config, 1.0, micro_s=MICRO_STEP_S)

    assert not result.estimate and result.warmup.steps >= 3
    # On every rank: three cycles at least, and the window's seconds.
    assert result.window is not None and result.window.steps >= 3
    assert result.window.elapsed_s >= 1.0


PRECISE_WINDOW_S = 2.0
BEAT_S = 0.02


@LAYOUTS
def test_a_search_window_ends_once_its_rate_is_precise(knobs):
    config = TrialConfig(batch_size=16, **knobs)
    steps = [BEAT_S * (1 + 0.05 * ((i * 7) % 3 - 1)) for i in range(400)]  # 20 ms, ±5 %

    precise = scripted_trial(config, PRECISE_WINDOW_S, micro_s=steps, precise_window=True)
    whole = scripted_trial(config, PRECISE_WINDOW_S, micro_s=steps)

    assert precise.window is not None and whole.window is not None
    assert whole.window.elapsed_s >= PRECISE_WINDOW_S and not whole.window.stopped_early
    # Not before an eighth of the window; soon after, as the beat's rate is known within 5 %.
    assert PRECISE_WINDOW_S / 8 <= precise.window.elapsed_s < PRECISE_WINDOW_S / 2
    assert not precise.window.below_best
    assert precise.cycle_s(1) == pytest.approx(whole.cycle_s(1), rel=0.02)


def test_a_window_whose_rate_drifts_runs_its_whole_time():
    # Each step 1 ms slower than the last: never precise, it runs its time, to the step nearest
    # it (half a step short, at most).
    config = TrialConfig(batch_size=16)

    drifting = scripted_trial(
        config, PRECISE_WINDOW_S, micro_s=lambda i: 0.001 * (2 + i), precise_window=True
    )

    window = drifting.window
    assert window is not None and not window.below_best
    assert window.elapsed_s >= PRECISE_WINDOW_S - window.elapsed_s / window.steps / 2


def _scattered(index: int) -> float:
    """Steps of 5 to 60 ms in a scrambled order (32.5 ms on average): a rate that a window pins
    down only slowly."""
    return 0.005 * (1 + (index * 7) % 12)


SCATTERED_MEAN_S = 0.0325


@LAYOUTS
def test_a_search_window_ends_once_clearly_slower_than_the_best(knobs):
    config = TrialConfig(batch_size=16, **knobs)
    rate = 16 / SCATTERED_MEAN_S

    def trial(beat: float):
        return scripted_trial(config, PRECISE_WINDOW_S, micro_s=_scattered, precise_window=True,
                              beat_samples_per_s=beat * config.world_size)  # fmt: skip

    below, best = trial(3 * rate), trial(rate / 3)

    assert below.window is not None and best.window is not None
    # Three times slower than the best: clear within a quarter of the window, and says so.
    # Faster than the best, its rate must be precise.
    assert below.window.below_best and below.window.elapsed_s < PRECISE_WINDOW_S / 4
    assert not best.window.below_best and best.window.elapsed_s > PRECISE_WINDOW_S / 2
    assert best.cycle_s(1) == pytest.approx(SCATTERED_MEAN_S, rel=0.1)


def test_an_estimate_is_below_the_best_only_where_its_siblings_are_too():
    # Micro-steps of 10 ms, optimizer steps 20-60 ms more: 400 samples/s without accumulation,
    # a rate that its window pins down only slowly; 1,422 with 32 micro-steps a cycle, whose
    # 0.36-s cycle is too long for a third of the window: the trial times its parts.
    def optimizer_s(step: int) -> float:
        return 0.02 + 0.04 * ((step + 1) * 7 % 13) / 12

    own = {a: 16 * a / (a * 0.01 + 0.04) for a in (1, 32)}
    config = TrialConfig(batch_size=16)

    def trial(best: float):
        return scripted_trial(config, 0.9, micro_s=0.01, optimizer_s=optimizer_s,
                              precise_window=True, beat_samples_per_s=best,
                              sibling_accumulation=(32,))  # fmt: skip

    sibling_faster, both_slower = trial(3 * own[1]), trial(3 * own[32])

    assert sibling_faster.estimate and both_slower.estimate
    assert sibling_faster.window is not None and both_slower.window is not None
    # Three times slower than the best, but its sibling is faster: the window goes on.
    assert not sibling_faster.window.below_best and sibling_faster.window.elapsed_s > 0.45
    sibling_cycle_s = sibling_faster.cycle_s(32)
    assert sibling_cycle_s is not None and 16 * 32 / sibling_cycle_s > 3 * own[1]
    # Both three times slower: clear soon, and said.
    assert both_slower.window.below_best and both_slower.window.elapsed_s < 0.45


def test_an_estimate_agrees_with_whole_cycles_where_workers_deliver_batches_in_rounds():
    # Two workers take 0.48 s a batch each: rounds of two batches, the first waited for, the
    # second ready; a cycle of 4 micro-steps is two rounds. The estimate's (plain, stepped)
    # pairs align with the rounds; read as alike, they had put a cycle at 7 waits instead of 4
    # (0.57x the rate).
    config = TrialConfig(batch_size=16, accumulation_steps=4, num_workers=2)

    def trial(**fields: object):
        return scripted_trial(config, 1.5, micro_s=0.001, batch_s=0.48, warmup_steps=1, **fields)

    search, whole = trial(precise_window=True), trial(whole_cycles=True)

    assert search.estimate and not whole.estimate
    assert search.cycle_s(4) == pytest.approx(2 * 0.48, rel=0.01)
    # Whole cycles from the middle of a round: a batch more than the rounds they wait for.
    assert whole.cycle_s(4) == pytest.approx(2 * 0.48, rel=0.15)


@pytest.mark.parametrize("precise", [True, False], ids=["search", "whole"])
def test_ddp_ranks_end_an_estimate_within_its_budget_whatever_the_first_steps_pace(precise):
    # The window's first micro-steps read batches the workers queued meanwhile (four slow
    # micro-steps of 0.5 s first): fast. Had the ranks scheduled their first check from that
    # pace, a window of 1-s rounds would have run for a thousand micro-steps (a 2-s window of
    # 0.5-s micro-steps ran a minute on examples/data_bound.py).
    config = TrialConfig(batch_size=16, accumulation_steps=4, num_workers=2, **DDP)

    result = scripted_trial(
        config, 1.5, micro_s=lambda i: 0.5 if i < 4 else 0.001, batch_s=1.0, warmup_steps=1,
        precise_window=precise,
    )  # fmt: skip

    assert result.estimate and result.window is not None
    assert result.window.elapsed_s < 2 * 1.5


@LAYOUTS
def test_a_search_trial_times_parts_where_a_siblings_cycle_is_too_long_and_gives_its_rate(knobs):
    # Micro-steps of 0.1 s, optimizer steps 0.3 s more: a cycle of 0.4 s without accumulation,
    # within the third of a 1.5-s window that a search trial times whole; 0.7 s with 4.
    one = TrialConfig(batch_size=16, **knobs)
    four = one.model_copy(update={"accumulation_steps": 4})

    def trial(config: TrialConfig, siblings: tuple[int, ...]):
        return scripted_trial(config, 1.5, optimizer_s=0.3, precise_window=True,
                              sibling_accumulation=siblings)  # fmt: skip

    alone, both, other = trial(one, ()), trial(one, (4,)), trial(four, (1,))

    assert not alone.estimate  # whole steps: they fit
    assert both.estimate and other.estimate
    # Each cycle, whichever trial gives it and whether timed whole or in parts, is the
    # workload's: accumulation amortises the optimizer step, 1.75x the samples/s.
    for result in (alone, both, other):
        assert result.cycle_s(1) == pytest.approx(0.4)
    for result in (both, other):
        assert result.cycle_s(4) == pytest.approx(0.7)


def test_a_search_trial_the_parent_stops_keeps_the_step_it_timed():
    # A bf16 trial of half-second micro-steps, far slower than the best: its first step settled
    # its warm-up, and the parent stops it within its first micro-step after it
    # (tests/search/test_pruning.py runs such a tune). Its window keeps that step.
    config = TrialConfig(batch_size=16)
    calls: list[int] = []

    def parent_stops() -> bool:
        calls.append(1)
        return True

    stopped = scripted_trial(config, 1.0, micro_s=0.5, precise_window=True, watch=parent_stops)

    assert stopped.warmup.micro_batches == 0 and len(calls) == 1
    assert stopped.window is not None and stopped.window.stopped_early
    assert stopped.window.step_times_s == [pytest.approx(0.5)]


@LAYOUTS
def test_a_window_nobody_stops_runs_its_length(knobs):
    config = TrialConfig(batch_size=16, **knobs)
    calls: list[int] = []

    def parent_watches() -> bool:
        calls.append(1)
        return False

    watched = scripted_trial(config, 0.5, micro_s=0.01, watch=parent_watches)

    assert watched.window is not None and not watched.window.stopped_early
    assert watched.window.elapsed_s >= 0.5 and calls
