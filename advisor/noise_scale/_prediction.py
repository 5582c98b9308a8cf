"""What the gradient noise scale predicts, as samples and as time (docs/method.md, "The noise
scale"): reaching a given loss takes about E_min (1 + B/B_simple) samples, so relative to the
user's batch B0 a batch B needs (B_simple + B)/(B_simple + B0) times the samples. The search
(which batches to probe and measure) and the decision (which batches race) both read it; it
explains, it never decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from advisor.knobs import TrialConfig
from advisor.noise_scale._estimate import estimate_noise_scale
from advisor.results import (
    BatchPrediction,
    NoisePoint,
    NoiseScale,
    NoiseTrack,
    RaceCurve,
    TrialRecord,
)

__all__ = [
    "MAX_RACE_BATCHES",
    "noise_track",
    "optimistic_ratio",
    "predict_batches",
    "race_finalists",
    "samples_ratio",
]

# Other global batches raced, besides the user's. Two let the raced pair change from tune to tune
# where three batches are predicted within the noise of each other (examples/mlp.py: 128, 256
# and 512 at 2.1x-2.3x), and the verdict with them (stability.py: 256 in 3 of 5 tunes, 128 and
# 512 once each); with all three raced, the verdict's nearest-batch rule decides the same way.
MAX_RACE_BATCHES = 3


def samples_ratio(noise_scale: float, baseline_batch: int, batch: int) -> float:
    """How many times the samples of batch `baseline_batch` a batch of `batch` needs to reach
    the same loss: (B_simple + B) / (B_simple + B0); its inverse is the statistical efficiency."""
    return (noise_scale + batch) / (noise_scale + baseline_batch)


def optimistic_ratio(noise: NoiseScale | None, baseline_batch: int, batch: int) -> float:
    """`samples_ratio` at the end of phi's 95 % interval that favours `batch`: the high end for
    a larger batch, the low end for a smaller one (phi grows as training goes on, so the
    interval's high end is the nearer guess for later training). 1 without a phi."""
    if noise is None or noise.value is None:
        return 1.0
    phi = noise.high if batch > baseline_batch else noise.low
    return samples_ratio(phi if phi is not None else noise.value, baseline_batch, batch)


def predict_batches(
    noise: NoiseScale | None, records: Sequence[TrialRecord], baseline: TrialConfig
) -> tuple[BatchPrediction, ...]:
    """For each global batch the search measured: its best samples/s, the samples it needs to
    reach a loss relative to the user's batch, and so the time it needs, relative to the best
    configuration at the user's batch. Without phi, the samples count as equal."""
    best = _best_by_global_batch(records)
    batch0 = baseline.global_batch_size
    if batch0 not in best:
        return ()
    rate0 = best[batch0].result.samples_per_s or 0.0
    predictions = []
    for batch, record in sorted(best.items()):
        rate = record.result.samples_per_s or 0.0
        ratio = samples_ratio(noise.value, batch0, batch) if noise and noise.value else 1.0
        predictions.append(
            BatchPrediction(
                global_batch=batch,
                samples_per_s=rate,
                samples_ratio=ratio,
                predicted_speedup=rate / rate0 / ratio,
            )
        )
    return tuple(predictions)


def race_finalists(
    predictions: Sequence[BatchPrediction],
    noise: NoiseScale | None,
    records: Sequence[TrialRecord],
    baseline: TrialConfig,
    probe_amp: str | None = None,
) -> tuple[tuple[BatchPrediction, ...], list[TrialRecord]]:
    """The predictions marked with the global batches that race, and the search records that
    must be re-measured for it: the best at each raced batch and at the user's, and at a raced
    batch whose best is not in `probe_amp` (the autocast whose matmuls ran fastest here,
    `advisor.search.space.SearchSpace`), its best in `probe_amp` too: which of the two races is
    then read from re-runs (`fastest_at`), not from one search window against the machine's
    own measurement. On examples/mlp.py batch 512 in bf16 read 57,538 samples/s in one tune's
    search (108,000-114,000 in five others) and raced in fp32 (74,465), which lost; re-running
    every precision at every raced batch instead cost 8 s of a 78-s tune.

    A batch races when its predicted time to the loss beats the user's batch at the optimistic
    end of phi's 95 % interval; the `MAX_RACE_BATCHES` best predictions race. When none is
    predicted to, the best-predicted batch with more samples/s than the user's races all the
    same: phi is measured early and grows as training goes on, so the measurement decides.
    """
    batch0 = baseline.global_batch_size
    best = _best_by_global_batch(records)
    hopeful = [
        (_optimistic_speedup(p, noise, batch0), p) for p in predictions if p.global_batch != batch0
    ]
    hopeful.sort(key=lambda h: -h[0])
    predicted = [p for speedup, p in hopeful if speedup > 1.0]
    faster = [p for _, p in hopeful if p.samples_per_s > _rate(predictions, batch0)]
    raced = {p.global_batch for p in (predicted or faster[:1])[:MAX_RACE_BATCHES]}
    marked = tuple(p.model_copy(update={"raced": p.global_batch in raced}) for p in predictions)
    by_precision = _best_by_precision(records)
    finalists = [best[b] for b in sorted(raced | ({batch0} if batch0 in best else set()))]
    for batch in sorted(raced):
        other = by_precision.get((batch, probe_amp)) if probe_amp is not None else None
        if other is not None and other is not best[batch]:
            finalists.append(other)
    return marked, finalists


def _rate(predictions: Sequence[BatchPrediction], batch: int) -> float:
    return next((p.samples_per_s for p in predictions if p.global_batch == batch), 0.0)


def _optimistic_speedup(
    prediction: BatchPrediction, noise: NoiseScale | None, batch0: int
) -> float:
    if noise is None or noise.value is None:
        return prediction.predicted_speedup
    throughput = prediction.predicted_speedup * prediction.samples_ratio
    return throughput / optimistic_ratio(noise, batch0, prediction.global_batch)


def _best_by_global_batch(records: Sequence[TrialRecord]) -> dict[int, TrialRecord]:
    best: dict[int, TrialRecord] = {}
    for (batch, _), record in _best_by_precision(records).items():
        if batch not in best or _rate_of(record) > _rate_of(best[batch]):
            best[batch] = record
    return best


def _best_by_precision(records: Sequence[TrialRecord]) -> dict[tuple[int, str], TrialRecord]:
    """The eligible search record (or the baseline) with the most samples/s for each global
    batch and precision."""
    best: dict[tuple[int, str], TrialRecord] = {}
    for record in records:
        if record.role not in ("baseline", "search") or not record.eligible:
            continue
        config = record.result.config
        key = (config.global_batch_size, config.amp)
        if key not in best or _rate_of(record) > _rate_of(best[key]):
            best[key] = record
    return best


def _rate_of(record: TrialRecord) -> float:
    return record.result.samples_per_s or 0.0


def noise_track(curve: RaceCurve) -> NoiseTrack | None:
    """phi with its interval at each point where a tracked race measured gradient norms;
    None for a race that was not tracked."""
    if not curve.noise_probes:
        return None
    points = []
    for probe in curve.noise_probes:
        norms = probe.norms
        estimate = (
            estimate_noise_scale(norms.small_sq, norms.big_sq, norms.small_batch, norms.big_batch)
            if len(norms.small_sq) >= 2
            else None
        )
        points.append(
            NoisePoint(
                seconds=probe.seconds,
                samples=probe.samples,
                loss=probe.loss,
                value=estimate.value if estimate else None,
                low=estimate.low if estimate else None,
                high=estimate.high if estimate else None,
            )
        )
    return NoiseTrack(points=tuple(points))
