"""What the trials show about single knobs, computed from the stored records alone."""

from __future__ import annotations

import statistics
from collections import defaultdict

from advisor.results import LayoutBest, TrialRecord

__all__ = ["best_by_layout"]

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
