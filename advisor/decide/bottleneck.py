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
    still paid off; compute-bound otherwise. Each claim cites the trials it rests on."""
    result = winner.result
    wait = result.data_wait_fraction
    if wait is None or result.samples_per_s is None:
        return None
    number = winner.number
    if wait >= INPUT_BOUND_WAIT:
        workers = [e for e in effects if e.knob == "num_workers"]
        measured = "".join(
            f"; num_workers {e.from_value} → {e.to_value} alone gave {e.ratio:.2f}x "
            f"(trials {', '.join(f'{a} vs {b}' for a, b in e.pairs)})"
            for e in workers
        )
        cited = tuple(sorted({number, *(n for e in workers for pair in e.pairs for n in pair)}))
        return Bottleneck(
            kind="input",
            explanation=f"input-bound: trial {number} waited for data {wait:.0%} of its window"
            f"{measured}",
            trials=cited,
        )
    larger = [
        (e, pair)
        for e in effects
        if e.knob == "batch_size"
        for pair in e.pairs
        if pair[0] == number
    ]
    if larger:
        effect, (before, after) = max(larger, key=lambda item: _pair_ratio(*item))
        pair_ratio = _pair_ratio(effect, (before, after))
        overhead = pair_ratio >= OVERHEAD_GAIN
        kind: Literal["overhead", "compute"] = "overhead" if overhead else "compute"
        verdict = (
            "per-step overhead still dominates, so larger batches pay while memory and the "
            "optimisation allow"
            if overhead
            else "the device is busy computing"
        )
        return Bottleneck(
            kind=kind,
            explanation=f"{kind}-bound: batch {effect.from_value} → {effect.to_value} alone "
            f"gave {pair_ratio:.2f}x (trials {before} vs {after}) with {wait:.0%} data wait: "
            f"{verdict}",
            trials=(before, after),
        )
    return Bottleneck(
        kind="compute",
        explanation=f"compute-bound as far as measured: trial {number} waited for data only "
        f"{wait:.0%} of its window; no trial differed from it in batch size alone, so "
        "per-step overhead was not checked",
        trials=(number,),
    )


def _pair_ratio(effect: KnobEffect, pair: tuple[int, int]) -> float:
    return effect.pair_ratios[effect.pairs.index(pair)]
