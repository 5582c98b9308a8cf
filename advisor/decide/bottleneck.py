"""What bounds the recommended configuration: its input (it waited for data), per-step overhead
(a larger batch alone still paid off) or compute; each claim cites the trials it rests on."""

from __future__ import annotations

from typing import Literal

from advisor.results import Bottleneck, KnobEffect, TrialRecord

__all__ = ["INPUT_BOUND_WAIT", "OVERHEAD_GAIN", "diagnose"]

INPUT_BOUND_WAIT = 0.3  # the loop waited for data this fraction of the window or more
OVERHEAD_GAIN = 1.3  # a larger batch alone raised throughput at least this much


def diagnose(winner: TrialRecord, effects: tuple[KnobEffect, ...]) -> Bottleneck | None:
    """Input-bound when the winner waited for data; overhead-bound when a larger batch alone
    still paid off; compute-bound otherwise. Each finding cites the trials it rests on."""
    result = winner.result
    wait = result.data_wait_fraction
    if wait is None or result.samples_per_s is None:
        return None
    number = winner.number
    if wait >= INPUT_BOUND_WAIT:
        workers = [e for e in effects if e.knob == "num_workers"]
        cited = tuple(sorted({number, *(n for e in workers for pair in e.pairs for n in pair)}))
        return Bottleneck(kind="input", trials=cited, trial=number, wait=wait)
    larger = [
        (e, pair)
        for e in effects
        if e.knob == "batch_size"
        for pair in e.pairs
        if pair[0] == number
    ]
    if not larger:
        return Bottleneck(kind="compute", trials=(number,), trial=number, wait=wait)
    effect, (before, after) = max(larger, key=lambda item: _pair_ratio(*item))
    ratio = _pair_ratio(effect, (before, after))
    kind: Literal["overhead", "compute"] = "overhead" if ratio >= OVERHEAD_GAIN else "compute"
    return Bottleneck(
        kind=kind,
        trials=(before, after),
        trial=number,
        wait=wait,
        batch_from=effect.from_value,
        batch_to=effect.to_value,
        ratio=ratio,
    )


def _pair_ratio(effect: KnobEffect, pair: tuple[int, int]) -> float:
    return effect.pair_ratios[effect.pairs.index(pair)]
