"""What speed-up the re-runs support: a claim that holds when the user re-measures it on the
same machine, or an honest "unconfirmed".

Each round of re-runs measures the recommendation and the baseline one after the other, so one
round's ratio of the two sees nearly the same machine: a machine that drifts between rounds
(on the project's VM, both configurations' samples/s fell by a quarter within minutes, nothing
else running) moves both runs of a round alike. The claim is the typical paired ratio
(`paired_ratio`: the Hodges-Lehmann estimate on their logs), and it stands where the interval
around it, of `COVERAGE` (`BUSY_COVERAGE` on a busy machine), lies within `CLAIM_TOLERANCE`
of it.

While it does not, the recommendation and the baseline are re-run again, interleaved (their
order alternating by round), up to `--confirm-max-repeats` rounds. A claim needs
`MIN_ROUNDS` agreeing rounds, and a machine that other programs kept busy (`busy`: the trials'
`MachineLoad`) `BUSY_ROUNDS`: two may agree by chance. A claim the rounds never support is
**unconfirmed**: the speed-up stated is the lowest paired ratio, never more, and the reports
say why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal

from advisor.decide.paired_ratio import paired_ratio
from advisor.decide.reruns import Selection, rerun_pairs, run_round
from advisor.results import BUSY_CORES, BUSY_STEAL, Confirmation, MachineLoad, TrialRecord
from advisor.search.context import SearchContext

__all__ = [
    "BUSY_CORES",
    "BUSY_COVERAGE",
    "BUSY_ROUNDS",
    "BUSY_STEAL",
    "CLAIM_TOLERANCE",
    "COVERAGE",
    "MIN_ROUNDS",
    "busy",
    "confirm_claim",
    "judge",
]

# The interval around a claimed speed-up must lie within this share of it: the agreement
# the project promises between a claim and the user's own re-measurement.
CLAIM_TOLERANCE = 0.15
COVERAGE = 0.75  # of the interval around the claim
# On a busy machine the other programs' load moves between the tune and the user's
# re-measurement, so the interval must hold the typical ratio with more confidence. With 75 %
# from 4 rounds, examples/mlp.py with one of two cores taken confirmed 74.7x, and 8 pairs
# re-measured under the same load read 89.9x (-17 %).
BUSY_COVERAGE = 0.9
# Rounds a claim needs at least: two agree by chance too often (examples/data_bound.py on a
# quiet 2-core VM: two rounds confirmed 2.04x; four more pairs read 1.42x to 2.07x, median
# 1.45x, and benchmarks/remeasure.py 1.28x); a machine other programs kept busy needs five, the
# fewest whose interval can reach `BUSY_COVERAGE` (four rounds' widest is 87.5 %).
MIN_ROUNDS = 3
BUSY_ROUNDS = 5


def busy(loads: Iterable[MachineLoad | None]) -> MachineLoad | None:
    """The busiest of `loads` if any is busy enough to make runs disagree (`MachineLoad.busy`),
    else None."""
    heavy = [load for load in loads if load is not None and load.busy]
    return max(heavy, key=lambda load: (load.outside_cores, load.steal_share), default=None)


def judge(ratios: Sequence[float], loads: Sequence[MachineLoad | None]) -> Confirmation:
    """Whether paired speed-up `ratios` (one per round) support their median, given the
    machine's load during their runs (`Confirmation` words why not)."""
    load = busy(loads)
    estimate = paired_ratio(ratios, BUSY_COVERAGE if load is not None else COVERAGE)
    claim, low, high = estimate.typical, estimate.low, estimate.high
    agree = low >= claim / (1 + CLAIM_TOLERANCE) and high <= claim * (1 + CLAIM_TOLERANCE)
    enough = len(ratios) >= (BUSY_ROUNDS if load is not None else MIN_ROUNDS)
    unconfirmed: Literal["spread", "few-rounds"] | None = None
    if not agree:
        unconfirmed = "spread"
    elif not enough:
        unconfirmed = "few-rounds"
    return Confirmation(
        confirmed=unconfirmed is None,
        ratios=tuple(ratios),
        low=low,
        high=high,
        claimed_speedup=claim if unconfirmed is None else min(min(ratios), claim),
        outside_cores=load.outside_cores if load is not None else _most_outside(loads),
        cores=next((load.cores for load in loads if load is not None), None),
        steal_share=max((x.steal_share for x in loads if x is not None), default=None),
        gpu_processes=load.gpu_processes if load is not None else None,
        unconfirmed=unconfirmed,
        tolerance=CLAIM_TOLERANCE,
        busy_load=load,
    )


def confirm_claim(
    selection: Selection,
    winner: TrialRecord,
    context: SearchContext,
    other_loads: Iterable[MachineLoad | None] = (),
) -> tuple[Selection, Confirmation | None]:
    """Re-run `winner` and the baseline, interleaved, until their paired speed-ups support a
    claim or `--confirm-max-repeats` rounds are spent; None where there is no speed-up to
    claim (the winner is the baseline, or the baseline failed). `other_loads` (the race's)
    count towards whether the machine was busy."""
    baseline = next((r for r in selection.finalists if r.role == "baseline"), None)
    if baseline is None or winner.number == baseline.number:
        return selection, None
    limit = context.settings.confirm_max_repeats
    while True:
        pairs = rerun_pairs(selection.confirmations, winner.number, baseline.number)
        if not pairs:
            return selection, None
        ratios = [w / b for w, b, _ in pairs]
        loads = [x for *_, pair in pairs for x in pair] + list(other_loads)
        verdict = judge(ratios, loads)
        if verdict.confirmed or len(pairs) >= limit:
            return selection, verdict
        order = [winner, baseline] if len(pairs) % 2 == 0 else [baseline, winner]
        done = max(run.round or 0 for run in selection.confirmations)
        label = f"confirming re-run, round {len(pairs) + 1} of at most {limit},"
        context.progress.stage(f"re-measuring: {verdict.why}")
        runs = run_round(order, context, done, label)
        if not all(run.eligible for run in runs):
            return selection, verdict  # a re-run failed: the rounds so far are all there is
        selection = selection.with_confirmations(runs)


def _most_outside(loads: Sequence[MachineLoad | None]) -> float | None:
    return max((load.outside_cores for load in loads if load is not None), default=None)
