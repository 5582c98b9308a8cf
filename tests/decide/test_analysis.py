"""Knob effects and the bottleneck come only from pairs of stored trials; no advice without them."""

import pytest

from advisor.decide.analysis import best_by_layout, knob_effects, rejected_values
from advisor.decide.bottleneck import diagnose
from advisor.knobs import TrialConfig
from advisor.report.verdicts import bottleneck_text, rejection_text
from advisor.results import TrialRecord, TrialResult


def _trial(number, rate, wait=0.05, role="search", status="ok", **knobs):
    config = TrialConfig(**{"batch_size": 32, **knobs})
    result = TrialResult(
        config=config,
        status=status,
        samples_per_s=rate if status == "ok" else None,
        data_wait_fraction=wait if status == "ok" else None,
    )
    return TrialRecord(number=number, role=role, result=result)


TRIALS = [
    _trial(0, 1000, role="baseline"),
    _trial(1, 1500, amp="bf16"),  # amp alone vs 0
    _trial(2, 2000, wait=0.61, batch_size=256),  # batch alone vs 0
    _trial(3, 4200, wait=0.04, batch_size=256, num_workers=2),  # workers alone vs 2
    _trial(4, 2400, batch_size=256, amp="bf16"),  # amp alone vs 2; batch alone vs 1
    _trial(5, 9999, batch_size=64, amp="bf16", num_workers=1),  # differs from all in >1 knob
    _trial(6, 0, status="oom", batch_size=512),  # failed: never part of a pair
    _trial(7, 3000, role="duplicate", amp="bf16"),  # a repeat answer, not a measurement
]


def test_effects_pair_trials_that_differ_in_one_knob_only():
    effects = {(e.knob, e.from_value, e.to_value): e for e in knob_effects(TRIALS)}
    assert set(effects) == {
        ("batch_size", "32", "256"),
        ("amp", "off", "bf16"),
        ("num_workers", "0", "2"),
    }
    amp = effects[("amp", "off", "bf16")]
    assert amp.pairs == ((0, 1), (2, 4)) and amp.pair_ratios == (1.5, 1.2)
    assert amp.ratio == pytest.approx(1.35)
    workers = effects[("num_workers", "0", "2")]
    assert workers.pairs == ((2, 3),) and workers.ratio == pytest.approx(2.1)
    assert (workers.data_wait_before, workers.data_wait_after) == (0.61, 0.04)


def test_no_pairs_no_effects():
    assert knob_effects([TRIALS[0], TRIALS[5]]) == ()


def _said(bottleneck, effects) -> str:
    """The bottleneck as the reports word it."""
    return bottleneck_text(bottleneck, effects)


def test_input_bound_when_the_winner_waited_for_data():
    effects = knob_effects(TRIALS)
    bottleneck = diagnose(TRIALS[2], effects)
    assert bottleneck.kind == "input" and bottleneck.trials == (2, 3)
    assert _said(bottleneck, effects) == (
        "input-bound: trial 2 waited for data 61% of its window; "
        "num_workers 0 → 2 alone gave 2.10x (trials 2 vs 3)"
    )


def test_overhead_bound_when_a_larger_batch_alone_still_paid_off():
    effects = knob_effects(TRIALS)
    bottleneck = diagnose(TRIALS[0], effects)
    assert bottleneck.kind == "overhead" and bottleneck.trials == (0, 2)
    assert "batch 32 → 256 alone gave 2.00x (trials 0 vs 2)" in _said(bottleneck, effects)


def test_compute_bound_when_a_larger_batch_gained_little_or_was_not_tried():
    trials = [_trial(0, 1000), _trial(1, 1100, batch_size=64)]
    effects = knob_effects(trials)
    bottleneck = diagnose(trials[0], effects)
    assert bottleneck.kind == "compute" and "gave 1.10x (trials 0 vs 1)" in _said(
        bottleneck, effects
    )
    lonely = diagnose(TRIALS[5], knob_effects(TRIALS))
    said = _said(lonely, knob_effects(TRIALS))
    assert lonely.kind == "compute" and "per-step overhead was not checked" in said


def test_best_by_layout_uses_rerun_medians_of_each_layouts_best():
    trials = [
        _trial(0, 1000, role="baseline"),
        _trial(1, 3000, parallel_mode="ddp", world_size=2),
        _trial(2, 2000, parallel_mode="ddp", world_size=2, amp="bf16"),
    ]
    reruns = (
        trials[1].model_copy(update={"role": "confirm"}),
        trials[1].model_copy(update={"role": "confirm", "result": trials[2].result}),
    )
    layouts = best_by_layout(trials, reruns)
    assert [(b.parallel, b.trials, b.best_trial) for b in layouts] == [
        ("none", 1, 0),
        ("ddp-2", 2, 1),
    ]
    assert layouts[0].rerun_samples_per_s is None
    assert layouts[1].rerun_samples_per_s == 2500
    # Where both ran at one global batch (64), they are compared there, not DDP-2 at 64 against
    # one process at 32, though you trained at 32.
    apart = best_by_layout(trials, reruns, 32)  # no two layouts at one batch: each at its own
    assert [(b.parallel, b.global_batch) for b in apart] == [("none", None), ("ddp-2", None)]
    both = [*trials, _trial(3, 1500, batch_size=64)]
    at_64 = best_by_layout(both, reruns, 32)
    assert [(b.parallel, b.best_trial, b.global_batch) for b in at_64] == [
        ("none", 3, 64), ("ddp-2", 1, 64)
    ]  # fmt: skip


def _diverged(number, **knobs):
    record = _trial(number, 0, status="diverged", **knobs)
    result = record.result.model_copy(update={"reason": "loss became nan at step 4"})
    return record.model_copy(update={"result": result})


def test_a_value_that_only_ever_failed_is_rejected_with_its_evidence():
    trials = [
        _trial(0, 1000, role="baseline"),
        _diverged(1, amp="bf16"),  # amp alone differs from trial 0, which trained
        _trial(2, 1800, batch_size=64),
        _diverged(3, batch_size=128, amp="bf16", num_workers=1),
    ]
    [amp] = rejected_values(trials)
    assert (amp.knob, amp.value, amp.trials, amp.failures) == ("amp", "bf16", (1, 3), "2 diverged")
    assert amp.counterparts == ((0, 1),)
    assert rejection_text(amp) == (
        "amp=bf16 rejected: trial 1 diverged (loss became nan at step 4) where trial 0, "
        "differing in amp alone, trained; every trial with it failed (2 diverged: trials 1, 3)"
    )


def test_one_failure_that_other_knobs_explain_as_well_is_not_blamed_on_a_value():
    trials = [
        _trial(0, 1000, role="baseline"),
        _trial(1, 0, status="oom", batch_size=512, num_workers=2),  # batch or workers?
        _trial(2, 1500, batch_size=64, amp="bf16"),
    ]
    assert rejected_values(trials) == ()  # one failure, no pair isolating either knob
    trials.append(_trial(3, 0, status="oom", batch_size=512, num_workers=1))
    [batch] = rejected_values(trials)  # two of a kind: stated, without a pair
    assert rejection_text(batch) == (
        "batch_size=512 rejected: every trial with it failed (2 oom: trials 1, 3); trial 1: oom; "
        "no usable trial differs from these in this knob alone"
    )
    assert rejected_values([_diverged(0, amp="bf16"), _diverged(1, amp="bf16")]) == ()  # no usable


def test_a_change_reads_from_the_default_outwards_in_the_tables_order():
    trials = [
        _trial(0, 1000, num_workers=2, persistent_workers=False),
        _trial(1, 1250, num_workers=2),  # persistent workers: the default
        _trial(2, 1100, num_workers=2, prefetch_factor=4),
        _trial(3, 1050, num_workers=2, prefetch_factor=3),  # a value the table does not list
    ]
    changes = [(e.knob, e.from_value, e.to_value, e.ratio) for e in knob_effects(trials)]
    assert ("persistent_workers", "True", "False", 0.8) in changes
    assert [c[:3] for c in changes if c[0] == "prefetch_factor"] == [
        ("prefetch_factor", "2", "4"),
        ("prefetch_factor", "2", "3"),  # after the listed values, however numbers sort
        ("prefetch_factor", "4", "3"),
    ]
