"""What the trials show about single knobs, computed from the stored records alone."""

from __future__ import annotations

import statistics
from collections import defaultdict

from advisor.results import KnobEffect, LayoutBest, TrialRecord

__all__ = ["best_by_layout", "knob_effects"]

LAYOUT_ORDER = {"none": 0, "dp": 1}


def best_by_layout(
    records: list[TrialRecord], confirmations: tuple[TrialRecord, ...] = ()
) -> tuple[LayoutBest, ...]:
    """The best eligible search measurement of each parallel layout that was tried, with the
    median of its re-runs (each layout's best is a finalist).

    Baseline and search trials count (each a single window); duplicates do not.
    """
    by_layout: dict[str, list[TrialRecord]] = defaultdict(list)
    for record in records:
        if record.role in ("baseline", "search"):
            by_layout[record.result.config.parallel].append(record)
    summaries = []
    for layout, tried in sorted(by_layout.items(), key=lambda item: _layout_key(item[0])):
        eligible = [r for r in tried if r.eligible and r.result.samples_per_s]
        best = max(eligible, key=lambda r: r.result.samples_per_s or 0.0, default=None)
        summaries.append(
            LayoutBest(
                parallel=layout,
                trials=len(tried),
                feasible=len(eligible),
                best_trial=best.number if best else None,
                samples_per_s=best.result.samples_per_s if best else None,
                rerun_samples_per_s=_rerun_median(best, confirmations) if best else None,
                config_label=best.result.config.label() if best else None,
            )
        )
    return tuple(summaries)


def _rerun_median(best: TrialRecord, confirmations: tuple[TrialRecord, ...]) -> float | None:
    rates = [
        c.result.samples_per_s
        for c in confirmations
        if c.number == best.number and c.eligible and c.result.samples_per_s
    ]
    return statistics.median(rates) if rates else None


def _layout_key(layout: str) -> tuple[int, int]:
    if layout in LAYOUT_ORDER:
        return LAYOUT_ORDER[layout], 0
    return 2, int(layout.rpartition("-")[2])


EFFECT_KNOBS = (
    "parallel",
    "batch_size",
    "accumulation_steps",
    "amp",
    "num_workers",
    "pin_memory",
    "cudnn_benchmark",
)
_AMP_ORDER = {"off": 0, "bf16": 1, "fp16": 2}


def knob_effects(records: list[TrialRecord]) -> tuple[KnobEffect, ...]:
    """Each knob change measured in isolation: every pair of feasible search trials whose
    configurations differ in that knob alone, grouped by the change (e.g. amp off -> bf16)."""
    measured = [
        r
        for r in records
        if r.role in ("baseline", "search") and r.eligible and r.result.samples_per_s
    ]
    groups: dict[tuple[str, str, str], list[tuple[TrialRecord, TrialRecord]]] = defaultdict(list)
    for index, first in enumerate(measured):
        for second in measured[index + 1 :]:
            knob = _only_difference(first, second)
            if knob is None:
                continue
            before, after = sorted((first, second), key=lambda r: _value_key(knob, r))
            key = (knob, _value(knob, before), _value(knob, after))
            groups[key].append((before, after))
    effects = [_effect(knob, old, new, pairs) for (knob, old, new), pairs in groups.items()]
    return tuple(sorted(effects, key=lambda e: (EFFECT_KNOBS.index(e.knob), e.pairs[0])))


def _effect(
    knob: str, old: str, new: str, pairs: list[tuple[TrialRecord, TrialRecord]]
) -> KnobEffect:
    ratios = [(a.result.samples_per_s or 0.0) / (b.result.samples_per_s or 1.0) for b, a in pairs]
    waits_before = [b.result.data_wait_fraction for b, _ in pairs]
    waits_after = [a.result.data_wait_fraction for _, a in pairs]
    return KnobEffect(
        knob=knob,
        from_value=old,
        to_value=new,
        ratio=statistics.median(ratios),
        pairs=tuple(sorted((b.number, a.number) for b, a in pairs)),
        data_wait_before=_median(waits_before),
        data_wait_after=_median(waits_after),
    )


def _only_difference(first: TrialRecord, second: TrialRecord) -> str | None:
    differing = [knob for knob in EFFECT_KNOBS if _value(knob, first) != _value(knob, second)]
    return differing[0] if len(differing) == 1 else None


def _value(knob: str, record: TrialRecord) -> str:
    return str(getattr(record.result.config, knob))


def _value_key(knob: str, record: TrialRecord) -> tuple[int, int]:
    value = getattr(record.result.config, knob)
    if knob == "amp":
        return _AMP_ORDER[value], 0
    if knob == "parallel":
        return _layout_key(value)
    return int(value), 0


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None
