"""The race's verdict: which configuration reaches your loss soonest, with its interval, or a
close call (docs/method.md, "The race and its verdict").

Each replicate's target is where its baseline's settled (non-increasing) curve ends; where the
baseline's loss did not fall
(`RaceCurve.fell`), nothing can be timed to it and your global batch is kept. Otherwise every
racer is timed to the target in samples (`advisor.decide.race.estimate`), and:

1. at your global batch, a configuration stands against yours only where its interval says it
   reaches the loss sooner by more than `MARGIN`, and the fastest there against the one that
   computes your steps (loader knobs alone) where both raced; else the one with fewer changes
   stands (a precision change that costs more in samples than it gains in speed loses here);
2. another global batch wins only where its interval says it reaches the loss sooner than what
   stands at your batch by more than `MARGIN`; of several that do, the nearest your global
   batch, unless a farther one wins against it by the margin in turn;
3. where an interval holds both a win by the margin and none, the verdict is a **close call**:
   the configuration with fewer changes from yours stands, and the race adds replicates while
   it can (`needs_replicates`).

Pure functions of the racers and the re-runs, so the race (`advisor.decide.race.run`) can also
ask, while it runs, how long a racer may still train before it can no longer win.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from advisor.decide.race.estimate import RateBook, estimate, target_of, timed, unnarrowed
from advisor.decide.reruns import knob_changes
from advisor.knobs import TrialConfig
from advisor.results import (
    Racer,
    RaceSummary,
    RaceVerdict,
    TimeToLoss,
    did_not_fall,
    reference_racer,
)

__all__ = [
    "INFORMATIVE",
    "LIFT",
    "MARGIN",
    "NARROW_TO",
    "best_candidate",
    "decide_race",
    "may_win_later",
    "narrows_to",
    "needs_replicates",
    "redecided",
    "stand_at_batch0",
    "too_wide",
]

# How much sooner a change must reach your loss, at the low end of its interval, to be made:
# the interval carries the measurement's noise; the margin is what a change must be worth.
MARGIN = 0.05
# The widest claim (high end over low end) that still informs: three replicates of a 10-s race
# of examples/mlp.py claimed 3.29x-6.51x and 2.08x-5.13x, a claim a user cannot plan with.
INFORMATIVE = 1.6
# How narrow the race makes a win's claim where replicates are cheap, below `INFORMATIVE`:
# after the race the claim's samples/s part gains the rounds that confirm it
# (`advisor.decide.claims`), which move its ends. On examples/mlp.py (724386d) a race stopped
# with its claim within 1.6, and a fourth round made it 3.68x-5.98x (1.62).
NARROW_TO = 1.5
# How far above its first reading a candidate's later replicates may read, on the log scale,
# where it did not win the first (`may_win_later`): over 13 such entrants of 11 tunes of
# examples/mlp.py, data_bound.py and hf_gpt2.py, the geometric mean of the later readings was
# 0.10 above the first at most (0.06 on data_bound.py, 0.08 on mlp.py); half that again is room
# for the entrants not seen.
LIFT = 0.15


def decide_race(
    racers: Sequence[Racer], seconds: float, rates: RateBook | None = None
) -> RaceSummary:
    """Time each racer to its replicate's target loss and choose (see the module's doc)."""
    reference = reference_racer(racers)
    if reference is None or reference.curve is None:
        failed = next((r for r in racers if r.role in ("baseline", "your batch")), None)
        why = (failed.result.reason or failed.result.status) if failed else "no racer ran"
        return _summary(racers, seconds, RaceVerdict(kind="failed", margin=MARGIN, reason=why))
    if did_not_fall([r for r in racers if r.replicate == 0]):
        return _summary(racers, seconds, RaceVerdict(kind="no-fall", margin=MARGIN))
    racers = timed(racers)
    verdict = _verdict(racers, rates or RateBook(), seconds)
    winner = verdict.kept if verdict.kind != "won" else verdict.best
    claim = verdict.best_claim if verdict.kind == "won" else verdict.kept_claim
    return _summary(racers, seconds, verdict).model_copy(
        update={
            "target_loss": claim.target_loss if claim else target_of(reference.curve),
            "winner": winner,
            "time_to_loss": claim if winner != _baseline(racers) else None,
        }
    )


def _summary(racers: Sequence[Racer], seconds: float, verdict: RaceVerdict) -> RaceSummary:
    """A race that set no target (yet): nothing won."""
    reference = reference_racer(racers)
    curve = reference.curve if reference is not None else None
    return RaceSummary(
        seconds=seconds,
        loss_kind=curve.loss_kind if curve is not None else "train",
        target_loss=None,
        racers=tuple(racers),
        winner=None,
        verdict=verdict,
        replicates=len({r.replicate for r in racers}) or 1,
    )


def _verdict(racers: Sequence[Racer], rates: RateBook, seconds: float) -> RaceVerdict:
    """Replicate 0's racers stand for their entrants; indices are into `racers`."""
    baseline = _baseline(racers)
    stand, pick, close = stand_at_batch0(racers, rates, seconds)
    best = best_candidate(racers, stand, rates, seconds)
    versus = _against(racers, baseline, rates, seconds)
    decided = RaceVerdict(
        kind="kept", kept=stand, best=best, margin=MARGIN, kept_claim=versus(stand)
    )
    if best is not None:
        against_stand = estimate(racers, racers[best], racers[stand], rates, seconds)
        decided = decided.model_copy(update={"best_claim": versus(best)})
        if against_stand is not None and against_stand.low >= 1 + MARGIN:
            return decided.model_copy(update={"kind": "won"})
        if _close(against_stand) and _may_win_later(racers, stand, rates, seconds):
            return decided.model_copy(update={"kind": "close-call"})
    if pick is not None and pick != stand and close is not None:
        return decided.model_copy(update={"kind": "close-call", "best": pick, "best_claim": close})
    return decided


def stand_at_batch0(
    racers: Sequence[Racer], rates: RateBook, seconds: float
) -> tuple[int, int | None, TimeToLoss | None]:
    """What stands at your global batch (an index into `racers`): yours, replaced by each
    configuration raced there, in order of fewer changes from yours (one computing your steps
    before the fastest, `advisor.decide.race.plan`), whose interval reaches your loss sooner
    than what stands by more than `MARGIN`; with the one that did not (the pick) and, where its
    interval holds both a win by the margin and none, its claim against yours (a close call)."""
    first = [i for i, r in enumerate(racers) if r.replicate == 0]
    baseline = next((i for i in first if racers[i].role == "baseline"), None)
    raced = [i for i in first if racers[i].role == "your batch"]
    if baseline is None or racers[baseline].curve is None:
        return (raced[-1] if raced else first[0]), (raced[-1] if raced else None), None
    mine = racers[baseline].config
    stand, pick, close = baseline, None, None
    for index in sorted(raced, key=lambda i: knob_changes(racers[i].config, mine)):
        if racers[index].curve is None:
            continue
        claim = estimate(racers, racers[index], racers[stand], rates, seconds)
        if claim is not None and claim.low >= 1 + MARGIN:
            stand, pick, close = index, index, None
            continue
        pick = index
        close = (
            estimate(racers, racers[index], racers[baseline], rates, seconds)
            if _close(claim)
            else None
        )
    return stand, pick, close


def best_candidate(
    racers: Sequence[Racer], stand: int, rates: RateBook, seconds: float
) -> int | None:
    """Among the other global batches, each with its learning rate that reaches the loss
    soonest against `stand` over the replicates (`_by_batch`): of those whose interval wins
    against `stand`, the one with the fewest changes from yours, unless a larger change wins
    against it by the margin in turn (`_fewest_changes`); where none wins, the one whose time
    to the loss is the shortest against `stand`'s."""
    scored = _by_batch(racers, stand, rates, seconds)
    winners = [index for index, claim in scored.items() if claim.low >= 1 + MARGIN]
    if winners:
        return _fewest_changes(racers, winners, stand, rates, seconds)
    return max(scored, key=lambda index: scored[index].speedup, default=None)


def _by_batch(
    racers: Sequence[Racer], stand: int, rates: RateBook, seconds: float
) -> dict[int, TimeToLoss]:
    """Each other global batch's racer (of replicate 0) with the learning rate whose claim
    against `stand` is the strongest: one with a low end (it reached the target in every
    replicate, and raced in more than one) before one without, then one that reached it (one
    that did not is timed by the samples it trained on: a bound, not a measurement), then the
    one measured in more replicates (a bound from one replicate is not a measurement of
    three), then the higher speed-up; where none of a batch's learning rates has a claim,
    none."""
    best: dict[TrialConfig, tuple[int, TimeToLoss]] = {}
    for index, racer in enumerate(racers):
        if racer.role != "candidate" or racer.replicate != 0 or racer.curve is None:
            continue
        claim = estimate(racers, racer, racers[stand], rates, seconds)
        other = best.get(racer.config)
        if claim is not None and (other is None or _strength(claim) > _strength(other[1])):
            best[racer.config] = (index, claim)
    return dict(best.values())


def _strength(claim: TimeToLoss) -> tuple[bool, bool, int, float]:
    return (claim.low > 0, claim.reached == claim.replicates, claim.replicates, claim.speedup)


def _fewest_changes(
    racers: Sequence[Racer], winners: Sequence[int], stand: int, rates: RateBook, seconds: float
) -> int:
    """Of candidates that each win against `stand`: the global batch nearest yours, replaced by
    a farther one only where that one reaches the loss sooner than it by the margin at the low
    end of its interval. Two winners within each other's noise give the same answer whichever
    measured a little faster."""
    batch0 = racers[stand].config.global_batch_size

    def distance(index: int) -> tuple[float, float]:
        ratio = racers[index].config.global_batch_size / batch0
        return (abs(math.log(ratio)), -racers[index].config.global_batch_size)

    ordered = sorted(winners, key=distance)
    current = ordered[0]
    for other in ordered[1:]:
        against = estimate(racers, racers[other], racers[current], rates, seconds)
        if against is not None and against.low >= 1 + MARGIN:
            current = other
    return current


def redecided(race: RaceSummary, rates: RateBook) -> RaceSummary:
    """The race decided again with `rates`, the re-runs that confirmed its winner's samples/s
    since it ended: its claims carry those rounds, and a win whose interval no longer clears
    the margin is no longer made (a close call, or what stands at your batch)."""
    if race.verdict.kind not in ("kept", "won", "close-call"):
        return race  # it set no target: nothing to time again
    decided = decide_race(race.racers, race.seconds, rates)
    return decided.model_copy(
        update={"went_on_from": race.went_on_from, "first_race": race.first_race}
    )


def needs_replicates(race: RaceSummary, rates: RateBook) -> bool:
    """Whether another replicate could settle the verdict: it is a close call, and its estimate
    lies so far from the margin that the part of its interval no replicate narrows
    (`unnarrowed`) would not hold both a win by the margin and none. On examples/hf_gpt2.py
    batch 32 claimed 0.97x (0.85x-1.11x) against yours after four replicates, 8 % below the
    1.05x margin, with a samples/s part (2 paired rounds, and 11 % drift between tunes) at
    least 13 % either side; the fourth, raced for the claim's third reading, changed nothing
    and cost 85 s of a 407-s tune."""
    verdict = race.verdict
    if verdict.kind != "close-call":
        return False
    if verdict.best is None or verdict.kept is None:
        return True
    racer, rival = race.racers[verdict.best], race.racers[verdict.kept]
    claim = estimate(race.racers, racer, rival, rates, race.seconds)
    part = unnarrowed(racer, rival, rates)
    if claim is None or part is None:
        return True
    below, above = part
    bar = math.log(1 + MARGIN)
    centre = math.log(claim.speedup)
    return centre - below >= bar or centre + above < bar


def may_win_later(race: RaceSummary, rates: RateBook) -> bool:
    """Whether, after one replicate, another global batch could still win against what stands
    at your batch: one of them reached the target, and its first reading raised by `LIFT`, with
    the part of its interval no replicate narrows (`unnarrowed`), would clear the margin. Where
    none could, later replicates would only confirm that none wins: on examples/data_bound.py
    batch 128 read 0.87x against 2 loader workers at your batch in the first, and 0.88x over two
    more that cost 78 s of a 244-s tune."""
    if race.verdict.kept is None:
        return True
    return _may_win_later(race.racers, race.verdict.kept, rates, race.seconds)


def _may_win_later(racers: Sequence[Racer], stand: int, rates: RateBook, seconds: float) -> bool:
    """`may_win_later` against `racers[stand]`; where later replicates raced, any candidate
    still may (their readings decide)."""
    if any(r.replicate for r in racers):
        return True
    rival = racers[stand]
    bar = math.log(1 + MARGIN)
    for racer in racers:
        if racer.role != "candidate" or racer.samples_to_target is None:
            continue
        claim = estimate(racers, racer, rival, rates, seconds)
        part = unnarrowed(racer, rival, rates)
        if claim is None or part is None or math.log(claim.speedup) + LIFT - part[0] >= bar:
            return True
    return False


def too_wide(race: RaceSummary, limit: float = INFORMATIVE) -> bool:
    """Whether the winner's claim is too wide to tell a user much: its high end more than
    `limit` times its low end (another replicate narrows it)."""
    claim = race.time_to_loss
    return claim is not None and claim.low > 0 and claim.high > limit * claim.low


def narrows_to(race: RaceSummary, rates: RateBook, limit: float) -> bool:
    """Whether replicates could narrow the winner's claim to `limit` high over low: its part
    that no replicate narrows (`unnarrowed`) is narrower. A pick computing your steps has no
    other part; nor can a claim between different numbers of processes reach 1.5 (its drift
    alone spans 1.62)."""
    baseline = _baseline(race.racers)
    if race.winner is None or race.time_to_loss is None or baseline is None:
        return False
    part = unnarrowed(race.racers[race.winner], race.racers[baseline], rates)
    return part is not None and math.exp(sum(part)) < limit


def _against(
    racers: Sequence[Racer], baseline: int | None, rates: RateBook, seconds: float
) -> Callable[[int | None], TimeToLoss | None]:
    """A racer's claim against your configuration (None for yours, or without it)."""

    def versus(index: int | None) -> TimeToLoss | None:
        if index is None or baseline is None or index == baseline:
            return None
        return estimate(racers, racers[index], racers[baseline], rates, seconds)

    return versus


def _close(claim: TimeToLoss | None) -> bool:
    """Whether an interval holds both a win by the margin and none (a racer that reached the
    loss in no replicate holds no win)."""
    return claim is not None and bool(claim.reached) and claim.low < 1 + MARGIN <= claim.high


def _baseline(racers: Sequence[Racer]) -> int | None:
    return next(
        (i for i, r in enumerate(racers) if r.replicate == 0 and r.role == "baseline"), None
    )
