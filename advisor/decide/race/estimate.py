"""How much sooner one racer reaches your loss than another, with its interval (docs/method.md,
"Time to your loss").

Time to your loss = samples to your loss ÷ samples per second, each part measured where it is
measured well:

- **samples to the loss** from the race: in each replicate, every racer is evaluated at the same
  sample counts (`advisor.decide.race.grid`), and its crossing of that replicate's target is read
  in samples from its curve made non-increasing (`settled`: an isotonic fit, which pools a
  plateau's wobble into its mean); the target is where the baseline's fitted curve ends (the
  median of its last three points), so a chance dip of one evaluation neither sets the target
  nor reaches it. The racers of a
  replicate share its seed, so the ratio of two racers' samples is paired;
- **samples per second** from the paired re-runs (`advisor.decide.reruns`): each round runs the
  two one after the other, and their ratios give the Hodges-Lehmann estimate and its interval
  (`advisor.decide.paired_ratio`). The race's own clock only bounds how long a racer trains.

The speed-up is the geometric mean of the replicates' samples ratios times the typical
samples/s ratio. Its interval is where a re-measurement as thorough as the race (as many
replicates, its own seeds, its own rounds) falls with probability `COVERAGE`, on the log scale:

- the samples ratios' part is Student's prediction interval, t(n-1) x s x sqrt(2/n) for n
  replicates of spread s: with two replicates t is 2.41, with three 1.60, so a claim from few
  replicates is as wide as it is uncertain (docs/benchmarks.md, convergence.py: two replicates'
  range missed re-measurements that spread 3.7x-8.9x);
- the samples/s part is the paired rounds' interval, widened by the drift of a samples/s ratio
  between tunes that one tune's rounds cannot see (`rate_drift`: larger where the two run
  different numbers of processes);
- the three are independent, so their half-widths add in quadrature.

A candidate's first replicate chose it: it races on where it read among the soonest there
(`later_plans`), so that reading is a selected one. Over 11 tunes of examples/mlp.py the
winner's samples ratio in the first replicate was 19 % above its later replicates' on average
(higher in 10 of 11), the other candidates' 7 % below (docs/method.md). A claim that involves a
candidate counts the replicates after the first, where it has two or more of them.

A racer that never reached the target in a replicate counts with the samples it had trained on
by then: a bound in its favour (its speed-up and high end are at most that), and its low end is
unknown, so 0: it cannot win; nor can a racer of one replicate, whose spread is unknown, unless
it computes the other's steps.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from advisor.decide.claims import COVERAGE
from advisor.decide.paired_ratio import PairedRatio, paired_ratio
from advisor.decide.reruns import rerun_pairs
from advisor.decide.student_t import t_quantile
from advisor.knobs import TrialConfig
from advisor.results import (
    RaceCurve,
    Racer,
    RacerRole,
    TimeToLoss,
    TrialRecord,
    reference_racer,
    stop_index,
)

# The last evaluations of the baseline's settled curve whose median is a replicate's target.
SETTLED_POINTS = 3
# A baseline that reached its target within this share of the samples it trained on levelled
# off (`shared_target`): examples/mlp.py's reached it at a tenth of the race, teacher.py's at
# its end.
LEVELLED = 0.5
# The standard deviation, on the log scale, of a samples/s ratio between tunes run one after
# the other on a quiet machine (docs/benchmarks.md, stability.py). Where the two configurations
# run as many processes: mlp.py's batch 512 with bf16 over yours read 3.55x-4.67x in 4 tunes and
# 3.59x-4.50x in 4 others (0.114 and 0.106); beside the replicates' part, the intervals of 5
# tunes then shared a point.
RATE_DRIFT_SD = 0.11
# Where they run different numbers of processes on a machine (loader workers, ranks), which
# share its cores differently from tune to tune: data_bound.py's 2 loader workers over none read
# 1.42x-2.03x in 7 tunes (0.146), each confirmed by its own rounds, and intervals with
# `RATE_DRIFT_SD` missed each other (its claim is this ratio alone: no replicates' part). One
# tune's reading and another's differ by 0.146 x sqrt(2).
PROCESS_DRIFT_SD = 0.21

__all__ = [
    "PROCESS_DRIFT_SD",
    "RATE_DRIFT_SD",
    "RateBook",
    "as_stopped",
    "estimate",
    "first_crossing",
    "rate_drift",
    "replicate_targets",
    "samples_to_loss",
    "seconds_to_loss",
    "settled",
    "shared_target",
    "target_in",
    "target_of",
    "timed",
    "unnarrowed",
]


def settled(curve: RaceCurve) -> list[tuple[int, float]]:
    """The curve's (samples, loss) made non-increasing by the isotonic fit of least squares
    (pool adjacent violators): a rise pools with what came before into their mean."""
    blocks: list[list[float]] = []  # [sum, count] per pooled block
    for point in curve.points:
        blocks.append([point.loss, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    fitted = [total / count for total, count in blocks for _ in range(int(count))]
    return [(p.samples, loss) for p, loss in zip(curve.points, fitted, strict=True)]


def target_of(curve: RaceCurve) -> float:
    """The loss a replicate's racers are timed to: where the baseline's settled curve ends,
    the median of its last `SETTLED_POINTS` (a last evaluation that dips is not the end)."""
    return statistics.median(loss for _, loss in settled(curve)[-SETTLED_POINTS:])


def first_crossing(
    positions: Sequence[float], losses: Sequence[float], target: float
) -> float | None:
    """Where the losses first reach `target` (a sample count or a time, as `positions` are),
    interpolated linearly between the points either side; None if they never do."""
    previous: tuple[float, float] | None = None
    for position, loss in zip(positions, losses, strict=True):
        if loss <= target:
            if previous is None or previous[1] == loss:
                return float(position)
            fraction = (previous[1] - target) / (previous[1] - loss)
            return previous[0] + fraction * (position - previous[0])
        previous = (position, loss)
    return None


def as_stopped(curve: RaceCurve, target: float | None) -> list[tuple[int, float]]:
    """The curve's settled (samples, loss) up to where a racer timed to `target` stops
    (`stop_index`), as one that stopped there shows it: every racer is read alike, a baseline
    that trained on included; the whole curve where it never got there."""
    points = curve.points
    end = stop_index([p.loss for p in points], target) if target is not None else None
    if end is not None:
        curve = curve.model_copy(update={"points": points[: end + 1]})
    return settled(curve)


def samples_to_loss(curve: RaceCurve, target: float) -> float | None:
    """Samples trained on until the settled curve, read as stopped at `target`, first reaches
    it; None if never."""
    fitted = as_stopped(curve, target)
    return first_crossing([float(s) for s, _ in fitted], [loss for _, loss in fitted], target)


def seconds_to_loss(curve: RaceCurve, target: float) -> float | None:
    """Training time until the settled curve, read as stopped at `target`, first reaches it
    (for the reports, and for re-measurements on their own clock); None if never."""
    fitted = [loss for _, loss in as_stopped(curve, target)]
    seconds = [p.seconds for p in curve.points][: len(fitted)]
    return first_crossing(seconds, fitted, target)


def target_in(curve: RaceCurve, shared: float | None) -> float:
    """A replicate's target, from its baseline's `curve`: the race's `shared` target where
    there is one (`shared_target`) and that curve reaches it, so that the replicate's baseline
    stops there too; else where the curve ends, as in the first replicate."""
    if shared is not None and samples_to_loss(curve, shared) is not None:
        return shared
    return target_of(curve)


def shared_target(racers: Sequence[Racer]) -> float | None:
    """The target every replicate is timed to, where the first replicate's baseline levelled
    off: it reached its target (where its settled curve ends) within `LEVELLED` of the samples
    it trained on, so another seed's baseline reaches that loss at the same stage of its
    training and can stop there. None where that baseline was still falling at its end, or
    before it raced: each replicate is then timed to where its own baseline ends (on
    examples/teacher.py a shared target, reached at a third of the race by some seeds and at
    its end by others, spread six replicates' claim to 2.11x-7.41x)."""
    curve = next(iter(_reference_curves(racers).values()), None)
    if curve is None or not curve.points:
        return None
    target = target_of(curve)
    reached = samples_to_loss(curve, target)
    levelled = reached is not None and reached <= LEVELLED * curve.points[-1].samples
    return target if levelled else None


def replicate_targets(racers: Sequence[Racer]) -> dict[int, float]:
    """Each replicate's target (`target_in`) from its reference racer (the baseline)."""
    shared = shared_target(racers)
    return {i: target_in(curve, shared) for i, curve in _reference_curves(racers).items()}


def _reference_curves(racers: Sequence[Racer]) -> dict[int, RaceCurve]:
    """Each replicate's reference racer's (the baseline's) curve, by replicate, in order."""
    curves = {}
    for replicate in sorted({r.replicate for r in racers}):
        reference = reference_racer([r for r in racers if r.replicate == replicate])
        if reference is not None and reference.curve is not None:
            curves[replicate] = reference.curve
    return curves


def timed(racers: Sequence[Racer]) -> tuple[Racer, ...]:
    """The racers with the samples and the training time each took to its replicate's target
    (None: it never reached it), each curve read as stopped there."""
    targets = replicate_targets(racers)
    out = []
    for racer in racers:
        target = targets.get(racer.replicate)
        curve = racer.curve
        if target is None or curve is None:
            out.append(racer)
            continue
        update = {
            "samples_to_target": samples_to_loss(curve, target),
            "time_to_target_s": seconds_to_loss(curve, target),
        }
        out.append(racer.model_copy(update=update))
    return tuple(out)


@dataclass(frozen=True)
class RateBook:
    """The paired re-runs the samples/s ratios come from: every re-run, by search trial."""

    confirmations: tuple[TrialRecord, ...] = ()

    def ratios(self, racer: Racer, rival: Racer) -> list[float]:
        """`racer`'s samples/s over `rival`'s in each round that re-ran both; one ratio of the
        two racers' own rates where no round did; none where either is unknown."""
        if racer.trial is not None and racer.trial == rival.trial:
            return [1.0]
        if racer.trial is not None and rival.trial is not None:
            pairs = rerun_pairs(self.confirmations, racer.trial, rival.trial)
            if pairs:
                return [mine / theirs for mine, theirs, _ in pairs]
        if racer.samples_per_s and rival.samples_per_s:
            return [racer.samples_per_s / rival.samples_per_s]
        return []


def estimate(
    racers: Sequence[Racer], racer: Racer, rival: Racer, rates: RateBook, seconds: float
) -> TimeToLoss | None:
    """How much sooner `racer` reaches the loss than `rival` (both replicate 0's, `racers`
    timed by `timed`), over the replicates in which both raced (after the first, which chose
    a candidate, `_chosen_by_the_first`); None where `rival` never reached it or no samples/s
    ratio is known."""
    targets = replicate_targets(racers)
    readings = _readings(racers, racer, rival, targets)
    if _chosen_by_the_first(racer, rival) and len(readings) > 2 and readings[0][0] == 0:
        readings = readings[1:]
    samples = [ratio for _, ratio, _ in readings]
    reached = sum(hit for _, _, hit in readings)
    speeds = rates.ratios(racer, rival)
    if not samples or not speeds:
        return None
    speed = paired_ratio(speeds, COVERAGE)
    drift = rate_drift(racer.config, rival.config)
    low, high = _interval(samples, speed, drift)
    return TimeToLoss(
        speedup=_geometric_mean(samples) * speed.typical,
        low=low if reached == len(samples) and (len(samples) > 1 or _twins(racer, rival)) else 0.0,
        high=high,
        replicates=len(samples),
        reached=reached,
        rounds=len(speeds),
        seconds=seconds,
        target_loss=statistics.median(targets.values()) if targets else None,
    )


def _readings(
    racers: Sequence[Racer], racer: Racer, rival: Racer, targets: dict[int, float]
) -> list[tuple[int, float, bool]]:
    """Per replicate in which both raced and `rival` reached the target: `rival`'s samples to
    it over `racer`'s (or those `racer` trained on, where it never got there), and whether
    `racer` reached it."""
    readings = []
    for replicate in targets:
        mine = _in_replicate(racers, racer, replicate)
        theirs = _in_replicate(racers, rival, replicate)
        if mine is None or theirs is None or not theirs.samples_to_target:
            continue
        needed = mine.samples_to_target or _trained(mine)
        if needed:
            ratio = theirs.samples_to_target / needed
            readings.append((replicate, ratio, mine.samples_to_target is not None))
    return readings


def _chosen_by_the_first(racer: Racer, rival: Racer) -> bool:
    """Whether the first replicate chose one of the two: a candidate races on because it read
    among the soonest there (`later_plans`), so its reading there is a selected one."""
    return RacerRole.CANDIDATE in (racer.role, rival.role)


def _twins(racer: Racer, rival: Racer) -> bool:
    """Whether one is the baseline and the other computes its steps (`steps_of_baseline`):
    their samples ratio is 1 in every replicate, so one replicate knows its spread."""
    pair = (racer, rival), (rival, racer)
    return any(a.steps_of_baseline and b.role == RacerRole.BASELINE for a, b in pair)


def rate_drift(config: TrialConfig, other: TrialConfig) -> float:
    """How far the samples/s ratio of `config` over `other` may drift between tunes (a standard
    deviation on the log scale): none for one configuration against itself, `PROCESS_DRIFT_SD`
    where the two run different numbers of processes on a machine, else `RATE_DRIFT_SD`."""
    if config == other:
        return 0.0
    if _processes(config) != _processes(other):
        return PROCESS_DRIFT_SD
    return RATE_DRIFT_SD


def _processes(config: TrialConfig) -> int:
    """The processes a configuration runs on each machine: its ranks and their loader workers."""
    return config.per_node * (1 + config.num_workers)


def _interval(samples: Sequence[float], speed: PairedRatio, drift: float) -> tuple[float, float]:
    """The low and high ends of the speed-up from the replicates' samples ratios, the paired
    samples/s ratio and the between-tune drift (see the module's doc); with one replicate the
    samples ratios' part is unknown and left out (such a claim cannot win)."""
    logs = [math.log(ratio) for ratio in samples]
    centre = statistics.fmean(logs) + math.log(speed.typical)
    n = len(logs)
    spread = 0.0
    if n > 1:
        t = t_quantile((1 + COVERAGE) / 2, n - 1)
        spread = t * statistics.stdev(logs) * math.sqrt(2 / n)
    below, above = _rate_part(speed, drift)
    low, high = centre - math.hypot(spread, below), centre + math.hypot(spread, above)
    return math.exp(low), math.exp(high)


def _rate_part(speed: PairedRatio, drift: float) -> tuple[float, float]:
    """The half-widths below and above (log scale) of a claim's samples/s part: the paired
    rounds' interval and the drift between tunes, in quadrature."""
    z = statistics.NormalDist().inv_cdf((1 + COVERAGE) / 2)
    below = math.hypot(math.log(speed.typical / speed.low), z * drift)
    above = math.hypot(math.log(speed.high / speed.typical), z * drift)
    return below, above


def unnarrowed(racer: Racer, rival: Racer, rates: RateBook) -> tuple[float, float] | None:
    """The half-widths below and above (log scale) of `racer`'s claim against `rival` that no
    replicate narrows: its samples/s part (the paired rounds, and the drift between tunes that
    they cannot see). Around any estimate the interval is at least this wide, however many
    replicates race; None where no samples/s ratio is known."""
    speeds = rates.ratios(racer, rival)
    if not speeds:
        return None
    return _rate_part(paired_ratio(speeds, COVERAGE), rate_drift(racer.config, rival.config))


def _in_replicate(racers: Sequence[Racer], racer: Racer, replicate: int) -> Racer | None:
    return next(
        (r for r in racers if r.replicate == replicate and r.entrant == racer.entrant), None
    )


def _trained(racer: Racer) -> float | None:
    """The samples a racer that never reached the target had trained on by its end."""
    curve = racer.curve
    return float(curve.points[-1].samples) if curve is not None and curve.points else None


def _geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(value) for value in values))
