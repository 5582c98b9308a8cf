"""The race's verdict: time each racer to the loss the baseline reached, and choose.

The target is the baseline's lowest loss in the race (the best at the user's batch's, if the
baseline failed). Where that loss did not fall in the race (`RaceCurve.fell`), time to it
cannot compare global batches: nothing wins, and the user's global batch is kept. Otherwise the
winner reaches it soonest, by more than `RACE_MARGIN`; otherwise the
fastest configuration at the user's global batch B0 is kept, unless it reached the loss
clearly later than the baseline (its numerics cost more than its speed gains). Where the
baseline's evaluations are noisy, the verdict must also hold at that loss plus twice their
noise (`RaceCurve.target_losses`), and the smaller claim is the one made, unless the winner at
the lowest loss ended the race settled below it by more than that band. A race that went on
(`advisor.decide.race.extend`) breaks a tie the other way: a larger global batch that reached
every target no later than the pick at B0 wins (`levels`), since the horizon is still shorter
than the user's run and a larger batch gains as training goes on. Pure functions
of the racers, so the race (`advisor.decide.race.run`) can also ask, while it runs, how long a
racer may still train before it can no longer win.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from advisor.knobs import TrialConfig
from advisor.results import (
    RaceCurve,
    Racer,
    RaceSummary,
    RaceVerdict,
    did_not_fall,
    reference_racer,
)

__all__ = [
    "RACE_MARGIN",
    "beats",
    "decide_race",
    "levels",
    "pick_at_batch0",
    "time_to_loss",
    "timed_to",
    "unearned_precision",
]

# A racer must reach the loss this much sooner than the best at the user's batch to win:
# benchmarks/machine_drift.py measured 12 % between two processes of the same configuration.
RACE_MARGIN = 0.15


def time_to_loss(curve: RaceCurve, target: float) -> float | None:
    """Training time until the curve first reaches `target`, interpolated between its points;
    None if it never does."""
    previous = None
    for point in curve.points:
        if point.loss <= target:
            if previous is None or previous.loss == point.loss:
                return point.seconds
            fraction = (previous.loss - target) / (previous.loss - point.loss)
            return previous.seconds + fraction * (point.seconds - previous.seconds)
        previous = point
    return None


def decide_race(racers: Sequence[Racer], seconds: float, *, went_on: bool = False) -> RaceSummary:
    """Time each racer to the baseline's target loss and choose (see the module's doc); a race
    that `went_on` gives a tie to the larger global batch (`levels`)."""
    reference = reference_racer(racers)
    if reference is None or reference.curve is None:
        failed = next((r for r in racers if r.role in ("baseline", "your batch")), None)
        why = (failed.result.reason or failed.result.status) if failed else "no racer ran"
        return RaceSummary(
            seconds=seconds,
            loss_kind="train",
            target_loss=None,
            racers=tuple(racers),
            winner=None,
            verdict=RaceVerdict(kind="failed", margin=RACE_MARGIN, reason=why),
        )
    if did_not_fall(racers):
        return RaceSummary(
            seconds=seconds,
            loss_kind=reference.curve.loss_kind,
            target_loss=None,
            racers=tuple(racers),
            winner=None,
            verdict=RaceVerdict(kind="no-fall", margin=RACE_MARGIN),
        )
    verdicts = [_verdict_at(racers, target, went_on) for target in reference.curve.target_losses]
    # It must hold at every target: kept if kept at one, else the smallest claim; unless the
    # winner at the lowest loss settled below the band (`_settled_win`).
    chosen = _settled_win(verdicts)
    chosen = chosen or next((v for v in verdicts if v.winner == v.at_batch0), None)
    chosen = chosen or min(verdicts, key=_speedup)
    return RaceSummary(
        seconds=seconds,
        loss_kind=reference.curve.loss_kind,
        target_loss=chosen.target,
        racers=chosen.racers,
        winner=chosen.winner,
        verdict=chosen.verdict,
    )


class _Verdict(NamedTuple):
    target: float
    racers: tuple[Racer, ...]  # timed to `target`
    winner: int
    at_batch0: int
    verdict: RaceVerdict


def _verdict_at(racers: Sequence[Racer], target: float, went_on: bool = False) -> _Verdict:
    """Time each racer to `target` and choose: the candidate that reached it soonest, if it beat
    the pick at the user's batch by the margin (or, in a race that `went_on`, `levels` it);
    else that pick."""
    timed = timed_to(racers, target)
    at_batch0 = pick_at_batch0(timed)
    best = _best_candidate(timed)
    decided = RaceVerdict(kind="kept", kept=at_batch0, best=best, margin=RACE_MARGIN)
    if best is not None and beats(timed[best], timed[at_batch0]):
        won = decided.model_copy(update={"kind": "won"})
        return _Verdict(target, timed, best, at_batch0, won)
    if best is not None and went_on and levels(timed[best], timed[at_batch0]):
        level = decided.model_copy(update={"kind": "won-level"})
        return _Verdict(target, timed, best, at_batch0, level)
    kept = decided.model_copy(update={"precision_kept": _precision_kept(timed, at_batch0)})
    return _Verdict(target, timed, at_batch0, at_batch0, kept)


def _settled_win(verdicts: Sequence[_Verdict]) -> _Verdict | None:
    """The verdict at the lowest loss where its winner, another global batch, ended the race
    settled below that loss by more than the band (the median of its last three evaluations):
    the band keeps a chance dip from deciding, and a racer that stays that far below the dip
    matched no chance. On teacher.py, a noise of 0.041 put the band target (0.294) where every
    racer was within its first second, while batch 128 ended at 0.125 against the baseline's
    lowest, 0.212. None where the band decides."""
    if len(verdicts) < 2:
        return None
    lowest, band = verdicts[0], verdicts[-1]
    if lowest.winner == lowest.at_batch0:
        return None
    curve = lowest.racers[lowest.winner].curve
    if curve is None or len(curve.points) < 3:
        return None
    settled = statistics.median(point.loss for point in curve.points[-3:])
    return lowest if settled < lowest.target - (band.target - lowest.target) else None


def _speedup(verdict: _Verdict) -> float:
    """How much sooner the winner reached the target than the pick at the user's batch."""
    won = verdict.racers[verdict.winner].time_to_target_s
    kept = verdict.racers[verdict.at_batch0].time_to_target_s
    return kept / won if won and kept else math.inf


def pick_at_batch0(racers: Sequence[Racer]) -> int:
    """The fastest configuration at the user's batch, unless it reached the loss clearly later
    than the baseline (its numerics cost more than its speed gains), or it changes the
    precision and earned that by neither margin (`unearned_precision`): then the baseline."""
    baseline = next(i for i, r in enumerate(racers) if r.role in ("baseline", "your batch"))
    faster = next((i for i, r in enumerate(racers) if r.role == "your batch"), None)
    if faster is None or racers[baseline].role != "baseline":
        return faster if faster is not None else baseline
    if beats(racers[baseline], racers[faster]):
        return baseline
    if unearned_precision(racers[faster], racers[baseline]):
        return baseline
    return faster


def unearned_precision(faster: Racer, baseline: Racer) -> bool:
    """Whether `faster` trains in another precision (amp) than the baseline without earning it:
    it ran less than `RACE_MARGIN` more samples/s and did not reach the loss more than the
    margin sooner. Lower precision can leave the loss a little higher late in a run, where the
    race does not look: on examples/hf_gpt2.py bf16 ran within 15 % of fp32 at batch 16, won its
    10-s race by less than the margin, and reached fp32's lowest 60-s loss in none of 3 runs
    against 2 of 3 (docs/benchmarks.md, "convergence"). A change of batch must win the race by
    the margin; a change of precision must win by it too, in the race or in samples/s."""
    if faster.config.amp == baseline.config.amp:
        return False
    rates = (faster.samples_per_s, baseline.samples_per_s)
    if rates[0] and rates[1] and rates[0] >= rates[1] * (1 + RACE_MARGIN):
        return False
    return not beats(faster, baseline)


def _best_candidate(racers: Sequence[Racer]) -> int | None:
    """Among the other global batches: for each configuration the learning rate that ended at
    the lower loss (both trained equally long), then the configuration that reached the target
    soonest."""
    chosen: dict[TrialConfig, int] = {}
    for index, racer in enumerate(racers):
        if racer.role != "candidate" or racer.curve is None:
            continue
        other = chosen.get(racer.config)
        if other is None or racer.curve.final_loss < _final(racers[other]):
            chosen[racer.config] = index
    timed = [i for i in chosen.values() if racers[i].time_to_target_s is not None]
    return min(timed, key=lambda i: racers[i].time_to_target_s or 0.0, default=None)


def _final(racer: Racer) -> float:
    return racer.curve.final_loss if racer.curve else math.inf


def timed_to(racers: Sequence[Racer], target: float) -> tuple[Racer, ...]:
    """The racers with their training time until each first reached `target` (None: never)."""
    return tuple(
        r.model_copy(
            update={"time_to_target_s": time_to_loss(r.curve, target) if r.curve else None}
        )
        for r in racers
    )


def beats(first: Racer, second: Racer) -> bool:
    """Whether `first` reached the target more than the noise sooner than `second`."""
    if first.time_to_target_s is None:
        return False
    if second.time_to_target_s is None:
        return True
    return first.time_to_target_s < second.time_to_target_s * (1 - RACE_MARGIN)


def levels(candidate: Racer, pick: Racer) -> bool:
    """Whether `candidate`, of a larger global batch than `pick`, reached the target no later.
    Judged only where the race went on: the race's horizon is still shorter than the user's
    run, and the gradient noise scale grows as the loss falls (McCandlish et al. 2018), so a
    larger batch that is level at the horizon is ahead after it. A smaller batch is not."""
    if candidate.config.global_batch_size <= pick.config.global_batch_size:
        return False
    if candidate.time_to_target_s is None:
        return False
    return pick.time_to_target_s is None or candidate.time_to_target_s <= pick.time_to_target_s


def _precision_kept(racers: Sequence[Racer], kept: int) -> bool:
    """Whether the baseline stands for the user's batch because a faster racer there changed
    the precision without earning it."""
    faster = next((r for r in racers if r.role == "your batch"), None)
    chosen = racers[kept]
    return faster is not None and chosen.role == "baseline" and unearned_precision(faster, chosen)
