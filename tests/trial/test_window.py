"""How precise a window's rate is, from the step times it timed."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from advisor.trial.child.budget import estimated_cycle_s
from advisor.trial.child.early_end import PRECISE_MIN_BATCHES, EarlyEnd, clearly_longer
from advisor.trial.child.window import Bounds, Window, _window_done


def _window(step_times: list[float]) -> Window:
    return Window(steps=len(step_times), step_times_s=step_times)


def test_steady_steps_are_precise():
    assert _window([0.01] * 40).relative_error() == pytest.approx(0.0, abs=1e-12)


def test_too_few_steps_are_never_precise():
    assert _window([0.01] * (PRECISE_MIN_BATCHES - 1)).relative_error() == math.inf
    assert _window([0.01, 0.03] * 3).relative_error(batch_steps=3) == math.inf


def test_fewer_steps_than_batches_need_a_smaller_error_for_the_same_confidence():
    # Three long steps, one batch each: their standard error, widened by Student's t with 2
    # degrees of freedom instead of 7.
    times = [0.98, 1.0, 1.02]
    standard_error = math.sqrt(0.0004 / 3)
    eight = _window([0.98, 1.0, 1.02, 1.0] * 2).relative_error()

    assert _window(times).relative_error() == pytest.approx(standard_error * 4.303 / 2.365)
    assert _window(times).relative_error() > eight


def test_the_error_comes_from_batch_means_of_the_latest_steps():
    # Two levels, half the batches each: means 1,1,1,1,3,3,3,3 around 2; the oldest step
    # (17 steps into 8 batches of 2) is left out.
    times = [100.0] + [1.0] * 8 + [3.0] * 8
    expected = math.sqrt(8 / 7 / 8) / 2

    assert _window(times).relative_error() == pytest.approx(expected)


def test_alternating_steps_average_out_within_a_batch():
    # A loader burst every other step: each batch of 4 steps holds two of each.
    assert _window([0.001, 0.003] * 16).relative_error() == pytest.approx(0.0, abs=1e-12)


def test_a_batch_spans_a_round_of_the_workers():
    # Two workers, one long step each: a batched worker arrives at once, the other is waited for.
    times = [0.03, 0.37] * 3

    assert _window(times).relative_error() > 0.3
    assert _window(times).relative_error(batch_steps=2) == pytest.approx(0.0, abs=1e-12)


def test_an_estimate_is_as_precise_as_the_cycles_its_pairs_of_micro_steps_estimate():
    # Timing a cycle of 4 in parts: plain micro-steps of 0.1 s, and 0.3 s with the optimizer
    # step (a window may start with the stepped one). Each pair estimates 3 x 0.1 + 0.3 s.
    window = _micro([(0.3, True)] + [(0.1, False), (0.3, True)] * 3)

    assert window.estimated_cycles_s(4) == pytest.approx([0.6] * 3)
    assert window.relative_error(accumulation=4) == pytest.approx(0.0, abs=1e-12)
    assert _micro(window.micro_times_s[:5]).relative_error(accumulation=4) == math.inf


def test_micro_steps_alike_make_an_estimate_precise_before_three_pairs():
    # Where the optimizer step adds nothing, the estimated cycle is as precise as its micro-steps.
    window = _micro([(0.1, False), (0.1, True), (0.1, False)])

    assert window.relative_error(accumulation=4) == math.inf  # one pair
    assert window.micro_error() == pytest.approx(0.0, abs=1e-12)


def test_clearly_slower_than_the_best_only_if_the_reported_rate_is_too():
    # The latest eight steps (the batch means) take 30 ms; with the three fast ones before them,
    # the rate the window reports is 24.5 ms a step: not slower than a best of 25 ms.
    window = _window([0.01] * 3 + [0.03] * 8)
    mean, error = window.mean_step()

    assert mean == pytest.approx(0.03) and error == pytest.approx(0.0, abs=1e-12)
    assert clearly_longer(window, mean, 0.0, 0.02, estimate=False)
    assert not clearly_longer(window, mean, 0.0, 0.025, estimate=False)


def _micro(times: list[tuple[float, bool]], waits: list[float] | None = None, workers: int = 0):
    waits = waits if waits is not None else [0.0] * len(times)
    return Window(micro_times_s=list(times), micro_waits_s=waits, loader_workers=workers)


def test_an_estimate_is_not_fooled_by_two_workers_delivering_batches_in_rounds():
    # Two workers deliver a round of two batches every 0.8 s; computing takes 0.05 s, 0.06 s
    # with the optimizer step. Pairs of (plain, stepped) micro-steps align with the rounds:
    # every plain one waits 0.69 s for a round, every stepped one finds its batch ready. A
    # cycle of 4 micro-steps is two rounds, 1.6 s; 3 x 0.74 + 0.06 s had read 2.28 s.
    pair = [(0.74, False), (0.06, True)]
    window = _micro(pair * 4, [0.69, 0.0] * 4, workers=2)

    assert window.estimated_cycles_s(4) == pytest.approx([1.6] * 4)
    assert estimated_cycle_s(window, 4) == pytest.approx(1.6)


def test_an_estimate_without_waits_adds_the_parts_and_one_optimizer_step():
    # Compute alone limits: three plain micro-steps and a stepped one, whatever the workers.
    for workers in (0, 2):
        window = _micro([(0.1, False), (0.3, True)] * 3, workers=workers)
        assert estimated_cycle_s(window, 4) == pytest.approx(0.6)
    # Without workers, waits are the training process building its batches: they add up too.
    window = _micro([(0.3, False), (0.5, True)] * 3, [0.2, 0.2] * 3)
    assert estimated_cycle_s(window, 4) == pytest.approx(4 * 0.2 + 0.6)


def test_an_estimate_leaves_out_the_stepped_micro_step_that_ends_the_warm_ups_cycle():
    # Rounds of two batches every 1.05 s, as above; the warm-up took the first batch of a round,
    # and the window starts with the second, ready at once, ending that cycle. Counted, its
    # missing wait had read the cycle at 1.72 s instead of two rounds, 2.1 s.
    times = [(0.01, True)] + [(1.0, False), (0.05, True)] * 2
    window = _micro(times, [0.0] + [0.95, 0.0] * 2, workers=2)

    assert estimated_cycle_s(window, 4) == pytest.approx(2.1)
    assert window.estimated_cycles_s(4) == pytest.approx([2.1] * 2)


def test_an_estimate_ends_after_two_pairs_not_two_optimizer_steps():
    # The stepped micro-step that starts the window ends the warm-up's cycle and pairs with
    # nothing: counted, two optimizer steps had ended the window on a single pair, its cycle
    # resting on one plain micro-step's wait for the workers.
    bounds = Bounds(min_steps=2, min_seconds=2.0, estimate_accumulation=4)
    one_pair = [(0.01, True), (1.9, False), (0.05, True)]
    window = _micro(one_pair, [0.0, 1.85, 0.0], workers=2)
    window.steps = 2

    assert not _window_done(window, bounds, 0, False, False, 2.5, True)
    window = _micro([*one_pair, (0.9, False), (0.05, True)], [0.0, 1.85, 0.0, 0.85, 0.0], 2)
    window.steps = 3
    assert _window_done(window, bounds, 0, False, False, 3.5, True)
    # Whole cycles count their optimizer steps.
    assert _window_done(_window([0.5, 0.5]), Bounds(min_steps=2), 0, False, False, 1.0, True)


def test_a_precise_estimate_may_end_after_one_pair():
    # One pair after the stepped micro-step that ends the warm-up's cycle: precise (its
    # micro-steps alike), it ends a search window; imprecise, the window waits for a second.
    bounds = Bounds(min_steps=2, min_seconds=2.0, estimate_accumulation=4, precise_min_steps=1)
    window = _micro([(0.6, True), (0.6, False), (0.6, True)])

    assert _window_done(window, bounds, 0, False, True, 1.8, True)
    assert not _window_done(window, bounds, 0, False, False, 2.5, True)
    # Without `precise_min_steps` (a finalist's re-run never estimates; a test harness may),
    # even a precise estimate times two pairs.
    assert not _window_done(
        window, replace(bounds, precise_min_steps=None), 0, False, True, 1.8, True
    )


def test_a_search_window_of_long_steps_ends_at_the_step_nearest_its_time():
    # Steps of 0.6 s in a 2-s window: the third ends 0.2 s short of it, the fourth 0.4 s past.
    window = _window([0.6] * 3)
    nearest = Bounds(min_steps=3, min_seconds=2.0, nearest_step=True)

    assert _window_done(window, nearest, 0, False, False, 1.8, True)
    assert not _window_done(
        window, replace(nearest, nearest_step=False), 0, False, False, 1.8, True
    )
    # Shorter steps: the window ends past its time as before, at most half a step short.
    assert not _window_done(_window([0.4] * 4), nearest, 0, False, False, 1.6, True)
    assert _window_done(_window([0.4] * 5), nearest, 0, False, False, 2.0, True)
    # An estimate's unit is its pair: half of one is a micro-step.
    estimate = replace(nearest, min_steps=2, estimate_accumulation=4)
    pairs = _micro([(0.6, True)] + [(0.45, False), (0.45, True)] * 2)
    assert _window_done(pairs, replace(estimate, min_seconds=2.6), 0, False, False, 2.4, True)
    assert not _window_done(pairs, replace(estimate, min_seconds=3.0), 0, False, False, 2.4, True)


def test_an_estimate_whose_pair_takes_the_window_ends_after_one():
    # Micro-steps of 1.2 s in a 2-s search window: one pair takes 2.4 s, a second would take
    # as long again, and the trial's bound (3 x window and start-up) with it.
    bounds = Bounds(min_steps=2, min_seconds=2.0, estimate_accumulation=4, one_long_pair=True)
    one_pair = _micro([(1.2, True), (1.2, False), (1.2, True)])

    assert _window_done(one_pair, bounds, 0, False, False, 3.6, True)
    assert not _window_done(
        one_pair, replace(bounds, one_long_pair=False), 0, False, False, 3.6, True
    )
    # Pairs shorter than the window: two of them, as before.
    short = _micro([(0.6, True), (0.6, False), (0.6, True)])
    assert not _window_done(short, bounds, 0, False, False, 1.8, True)


@pytest.mark.parametrize(
    ("first_s", "precise"), [(0.61, True), (0.9, False)], ids=["alike", "one-off costs"]
)
def test_a_first_step_alike_to_the_next_two_shows_their_rate_precise(first_s, precise):
    # A search window of 0.6-s steps right after a first step: two steps cannot be precise
    # alone, but with the first step alike to them they are, and the window ends after two.
    bounds = Bounds(
        min_steps=3, min_seconds=2.0, precise_after_s=0.25, earlier_steps_s=(first_s,),
        precise_min_steps=2,
    )  # fmt: skip
    window = _window([0.6, 0.6])

    ended = EarlyEnd(bounds, workers=0, cycle=1)(window, 1.2)

    assert ended is precise
    assert _window_done(window, bounds, 0, False, ended, 1.2, True) is precise
    assert not EarlyEnd(replace(bounds, earlier_steps_s=()), workers=0, cycle=1)(window, 1.2)


@pytest.mark.parametrize(
    ("first_s", "precise"), [(0.46, True), (0.9, False)], ids=["alike", "one-off costs"]
)
def test_a_first_micro_step_alike_to_an_estimates_pair_shows_it_precise(first_s, precise):
    # An estimate's window of 0.45-s micro-steps right after the first micro-step: one (plain,
    # stepped) pair cannot be precise alone, but with the first micro-step alike to them it is.
    bounds = Bounds(
        min_steps=2, min_seconds=2.0, precise_after_s=0.25, earlier_steps_s=(first_s,),
        precise_min_steps=1, estimate_accumulation=4,
    )  # fmt: skip
    window = _micro([(0.45, False), (0.45, True)])

    ended = EarlyEnd(bounds, workers=0, cycle=2)(window, 0.9)

    assert ended is precise
    assert _window_done(window, bounds, 0, False, ended, 0.9, True) is precise
    assert not EarlyEnd(replace(bounds, earlier_steps_s=()), workers=0, cycle=2)(window, 0.9)


def test_an_estimate_too_short_for_its_pairs_own_interval_ends_once_clearly_below_the_best():
    # One (plain, stepped) pair and the micro-step after it, of 0.45-0.5 s each, spread too
    # much to be precise; its cycle of four (about 1.9 s) is still clearly longer than the
    # best's 1-s cycle, as its micro-steps' interval says.
    bounds = Bounds(
        min_steps=2, min_seconds=2.0, precise_after_s=0.25, precise_min_steps=1,
        estimate_accumulation=4, beat_step_s=1.0,
    )  # fmt: skip
    window = _micro([(0.45, False), (0.5, True), (0.42, False)])

    early = EarlyEnd(bounds, workers=0, cycle=2)

    assert early(window, 1.4) and early.below_best
    assert not EarlyEnd(replace(bounds, beat_step_s=1.8), workers=0, cycle=2)(window, 1.4)
