"""Knob values the search stops proposing: every trial with them ran far below the best.

A value is rejected once at least `MIN_TRIALS` trials had it, every one of them ran (or was
projected, when stopped before its window) below `REJECT_BELOW` x the best trial's goodput
(what the search ranks by: samples/s, over the samples ratio of the global batch under the
time-to-loss objective, `advisor.search.ranking`),
and, for a knob other than the batch size, one of them ran at a micro-batch at least half the
best's: knob effects flip with the batch (docs/method.md, "The search": bf16 on CPU loses at
batch 16 and wins at 256 and above), so evidence from small batches alone says nothing about
the best's region. The search prunes a proposal with a rejected value without running it, and
the report lists the value with the trials that rejected it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from advisor.results import Rejected, TrialRecord

__all__ = ["MIN_TRIALS", "REJECT_BELOW", "rejected_in_search", "rejected_values"]

MIN_TRIALS = 2
REJECT_BELOW = 0.25  # 4x slower than the best: beyond a window's noise (about 12 %) many times


def rejected_in_search(
    records: Iterable[TrialRecord], knobs: Iterable[str], early_stop: float
) -> list[Rejected]:
    """The values the search stops proposing: `rejected_values`, or none under `--early-stop 0`,
    which asks for every proposal to be measured whole."""
    return rejected_values(records, knobs) if early_stop > 0 else []


def rejected_values(records: Iterable[TrialRecord], knobs: Iterable[str]) -> list[Rejected]:
    """The values of `knobs` (searched knob names) that the measured trials rule out."""
    rated = [(record, rate) for record in records if (rate := _rate(record)) is not None]
    best = max(
        ((record, rate) for record, rate in rated if record.eligible),
        key=lambda pair: pair[1],
        default=None,
    )
    if best is None:
        return []
    best_record, best_rate = best
    found = []
    for knob in knobs:
        by_value: dict[Any, list[tuple[TrialRecord, float]]] = defaultdict(list)
        for record, rate in rated:
            by_value[getattr(record.result.config, knob)].append((record, rate))
        for value, trials in by_value.items():
            if _rules_out(knob, trials, best_record, best_rate):
                fraction = max(rate for _, rate in trials) / best_rate
                numbers = tuple(sorted(record.number for record, _ in trials))
                found.append(
                    Rejected(
                        knob=knob,
                        value=value,
                        trials=numbers,
                        fraction=fraction,
                        best_trial=best_record.number,
                    )
                )
    return found


def _rules_out(
    knob: str, trials: list[tuple[TrialRecord, float]], best: TrialRecord, best_rate: float
) -> bool:
    if len(trials) < MIN_TRIALS or any(rate >= REJECT_BELOW * best_rate for _, rate in trials):
        return False
    best_batch = best.result.config.batch_size
    return knob == "batch_size" or any(
        2 * record.result.config.batch_size >= best_batch for record, _ in trials
    )


def _rate(record: TrialRecord) -> float | None:
    """A search trial's samples/s: measured, or projected where it was stopped before its
    window; None for a failure, a repeat, a re-run or a configuration derived from another
    trial (`advisor.search.siblings`: the same measurement, no evidence of its own)."""
    if record.role not in ("baseline", "search") or record.derived_from is not None:
        return None
    if record.eligible or record.result.status == "stopped":
        return record.goodput  # samples/s where the search ranks by samples/s
    return None
