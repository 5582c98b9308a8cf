"""A search trial timed in parts also measures its configuration at the other accumulation steps
of the space: the search records each as a trial of its own, derived from it, at no cost.

The first tune runs real trial processes, end to end: a real window timed in parts gives the
rates the search derives its siblings from. The second scripts its trials
(tests/scripted_runner.py): what it asserts is how the search counts them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.knobs import TrialConfig
from advisor.results import TrialResult
from advisor.settings import TuneSettings
from advisor.trial.child.early_end import PRECISE_MIN_BATCHES
from advisor.trial.orders import TrialOrder, WindowOrder
from tests.conftest import TINY
from tests.scripted_runner import ScriptedRunner, scripted_tune

# One process at batch 16, in 1.5-s windows, ranked by samples/s.
SETTINGS = {"batch_sizes": "16", "max_world_size": 1, "trial_seconds": 1.5, "warmup_steps": 1,
            "confirm_top": 1, "objective": "throughput"}  # fmt: skip


def test_a_trial_timed_in_parts_records_its_other_accumulation_as_a_derived_trial(tmp_path):
    # Micro-steps of 0.1 s, optimizer steps 0.3 s more: without accumulation a cycle takes
    # 0.4 s, within the third of the 1.5-s window that a search trial times whole; with 4
    # micro-steps 0.7 s, beyond it. A trial without accumulation is timed in parts all the same
    # (a real one: tests/trial/test_budget.py, test_a_trial_whose_cycle_is_longer_than_its_
    # window_times_the_parts).
    settings = TuneSettings(
        spec=f"{TINY}:factory", out=tmp_path, trials=3, accumulation_steps="1,4", **SETTINGS
    )
    runner = _TimedInParts(rate=_slow_optimizer_steps, window_s=settings.trial_seconds)
    result = scripted_tune(settings, runner)

    by_number = {t.number: t for t in result.trials}
    derived = [t for t in result.trials if t.derived_from is not None]
    assert derived, [t.result.config.label() for t in result.trials]
    for sibling in derived:
        source = by_number[sibling.derived_from]
        assert source.role == "search" and source.result.estimated
        assert source.result.config.accumulation_steps == 1
        same = sibling.result.config.model_copy(update={"accumulation_steps": 1})
        assert same == source.result.config and sibling.result.config.accumulation_steps == 4
        assert sibling.result.estimated and sibling.result.wall_s is None  # it cost nothing
        # (its rate from the source's timed parts: on a fake clock in tests/trial/test_budget.py)
        assert sibling.result.samples_per_s and source.result.samples_per_s
        assert f"derived from trial {source.number}" in sibling.note
    # --trials counts it: three configurations, one of them derived.
    measured = [t for t in result.trials if t.role in ("baseline", "search")]
    assert len({t.result.config for t in measured}) == len(measured) == 3
    # The fastest, a derived one, is re-measured in whole cycles and recommended.
    best = max(measured, key=lambda t: t.result.samples_per_s or 0.0)
    assert best.derived_from is not None
    assert result.recommendation.config == best.result.config
    rerun = [c for c in result.confirmations if c.result.config == best.result.config]
    assert rerun and all(not c.result.estimated for c in rerun)
    assert f"derived from trial {best.derived_from}" in (tmp_path / "report.md").read_text()


# slow_optimizer_steps: micro-steps of 0.1 s, optimizer steps 0.3 s more.
MICRO_STEP_S, OPTIMIZER_STEP_S = 0.1, 0.3


def _cycle_s(accumulation: int) -> float:
    return accumulation * MICRO_STEP_S + OPTIMIZER_STEP_S


def _slow_optimizer_steps(config: TrialConfig) -> float:
    """Samples/s in whole cycles: accumulation amortises the optimizer step."""
    return config.global_batch_size / _cycle_s(config.accumulation_steps)


@dataclass
class _TimedInParts(ScriptedRunner):
    """slow_optimizer_steps, timed as a trial child times it: a search trial whose own cycle,
    or one of its `sibling_accumulation`'s, is too long for PRECISE_MIN_BATCHES cycles in its
    window times the parts, and gives its rate and its siblings' as estimates; a re-run times
    whole cycles."""

    window_s: float = 1.5

    def answered(self, order: TrialOrder, result: TrialResult, on_progress: Any) -> TrialResult:
        if not isinstance(order, WindowOrder) or order.whole_cycles:
            return result
        config = order.config
        longest = max((config.accumulation_steps, *order.sibling_accumulation))
        if longest == 1 or _cycle_s(longest) <= self.window_s / PRECISE_MIN_BATCHES:
            return result
        siblings = {
            steps: _slow_optimizer_steps(config.model_copy(update={"accumulation_steps": steps}))
            for steps in order.sibling_accumulation
        }
        return result.model_copy(update={"estimated": True, "sibling_rates": siblings})


def test_one_trials_siblings_count_together_as_one_configuration(tmp_path):
    # Accumulation 1, 2 or 4: a trial timed in parts derives two siblings, which --trials
    # counts as one, so that they do not crowd out the other knobs' trials: of four, the
    # baseline, a trial timed in parts and its two siblings leave room for one more trial.
    settings = TuneSettings(
        spec=f"{TINY}:factory", out=tmp_path, trials=4, accumulation_steps="1,2,4", **SETTINGS
    )
    runner = _TimedInParts(rate=_slow_optimizer_steps, window_s=settings.trial_seconds)

    result = scripted_tune(settings, runner)

    measured = [t for t in result.trials if t.role in ("baseline", "search")]
    ran = [t for t in measured if t.derived_from is None]
    derived = [t for t in measured if t.derived_from is not None]
    assert len(ran) == 3 and len(derived) == 2, [t.result.config.label() for t in measured]
    assert {t.derived_from for t in derived} == {ran[1].number}
    assert {t.result.config.accumulation_steps for t in derived} == {2, 4}
    windows = [o for o in runner.orders if isinstance(o, WindowOrder) and not o.whole_cycles]
    assert len(windows) == len(ran)  # the siblings cost no trial
