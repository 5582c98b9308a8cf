"""A search trial timed in parts also measures its configuration at the other accumulation steps
of the space: the search records each as a trial of its own, derived from it, at no cost."""

from __future__ import annotations

import advisor
from tests.conftest import TINY, survivors


def _tune(tmp_path, accumulation_steps: str) -> advisor.TuneResult:
    """Three configurations of one process at batch 16, in 1.5-s windows."""
    return advisor.tune(
        f"{TINY}:slow_optimizer_steps",
        trials=3,
        batch_sizes="16",
        accumulation_steps=accumulation_steps,
        max_world_size=1,
        trial_seconds=1.5,
        warmup_steps=1,
        confirm_top=1,
        objective="throughput",
        out=tmp_path,
    )


def test_a_trial_timed_in_parts_records_its_other_accumulation_as_a_derived_trial(tmp_path, marked):
    # Micro-steps of 0.1 s, optimizer steps 0.3 s more: without accumulation a cycle takes
    # 0.4 s, within the third of the 1.5-s window that a search trial times whole; with 4
    # micro-steps 0.7 s, beyond it. A trial without accumulation is timed in parts all the same.
    result = _tune(tmp_path, accumulation_steps="1,4")

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
        # (its rate from the source's timed parts, 1.75x the source's here: on a fake clock in
        # tests/trial/test_budget.py)
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
    assert survivors(marked) == []


def test_one_trials_siblings_count_together_as_one_configuration(tmp_path):
    # Accumulation 1, 2 or 4: a trial timed in parts derives two siblings, which --trials
    # counts as one, so that they do not crowd out the other knobs' trials.
    result = _tune(tmp_path, accumulation_steps="1,2,4")

    measured = [t for t in result.trials if t.role in ("baseline", "search")]
    ran = [t for t in measured if t.derived_from is None]
    derived = [t for t in measured if t.derived_from is not None]
    assert len(ran) == 2 and len(derived) == 2, [t.result.config.label() for t in measured]
    assert {t.derived_from for t in derived} == {ran[1].number}
    assert {t.result.config.accumulation_steps for t in derived} == {2, 4}
