"""Re-measure the best candidates and the baseline, then choose the winner.

A configuration is recommended only if it was feasible again in its confirmation run, with finite
losses and the memory headroom the settings ask for. The baseline is always re-measured too, so
the speed-up compares measurements taken the same way, and the winner is never slower than it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from advisor.errors import NoFeasibleConfigError
from advisor.knobs import KNOBS, TrialConfig
from advisor.results import (
    MachineLoad,
    Tie,
    TrialRecord,
    TrialResult,
    TrialRole,
    relative_spread,
)
from advisor.search.checks import memory_problem
from advisor.search.context import SearchContext
from advisor.trial.orders import WindowOrder

__all__ = [
    "Selection",
    "failure_summary",
    "knob_changes",
    "rerun_pairs",
    "run_round",
    "select_winner",
]

# Re-runs closer than this are treated as equal even when their own spread is smaller: two
# re-runs are too few to estimate the noise, and benchmarks/measurement_noise.py measured a
# coefficient of variation of several percent for one window on this project's VM.
NOISE_FLOOR = 0.03
# A finalist whose first re-run is this far behind the leader's is not re-run again: twice the
# 12 % between-process variation of one window measured on this project's VM
# (benchmarks/machine_drift.py), so noise alone is unlikely to put it ahead.
CLEARLY_BEHIND = 0.25


@dataclass(frozen=True)
class Selection:
    """The winner of the re-runs, its and the baseline's re-run figures, how a tie went."""

    winner: TrialRecord
    winner_runs: tuple[float, ...]
    baseline_runs: tuple[float, ...]
    confirmations: tuple[TrialRecord, ...]
    close_call: Tie | None = None
    finalists: tuple[TrialRecord, ...] = ()
    confirmed_rates: dict[int, float] = field(default_factory=dict)  # median re-run, by trial

    @property
    def samples_per_s(self) -> float:
        return statistics.median(self.winner_runs)

    @property
    def baseline_samples_per_s(self) -> float | None:
        return statistics.median(self.baseline_runs) if self.baseline_runs else None

    def with_confirmations(self, runs: Sequence[TrialRecord]) -> Selection:
        """The same selection with more re-runs (`advisor.decide.claims`' rounds) counted."""
        confirmations = (*self.confirmations, *runs)
        baseline = next((r.number for r in self.finalists if r.role == "baseline"), None)

        def rates(number: int | None) -> tuple[float, ...]:
            return _rates([c for c in confirmations if c.number == number])

        rerun = {run.number for run in runs}
        return replace(
            self,
            winner_runs=rates(self.winner.number),
            baseline_runs=rates(baseline) if baseline is not None else self.baseline_runs,
            confirmations=confirmations,
            confirmed_rates={
                number: statistics.median(rates(number)) if number in rerun else rate
                for number, rate in self.confirmed_rates.items()
            },
        )


def select_winner(
    records: list[TrialRecord],
    context: SearchContext,
    extra_finalists: list[TrialRecord] | None = None,
    racing: bool = False,
) -> Selection:
    """Re-measure the finalists (and `extra_finalists`, e.g. those a race needs) and choose the
    fastest by the re-runs alone.

    The search measurement that made a finalist is biased upwards (the best of many noisy
    values), so it takes no part in the ranking or in the figures reported.
    """
    measured = [r for r in records if r.role != "duplicate"]
    baseline = next((r for r in measured if r.role == "baseline"), None)
    finalists = _finalists(measured, baseline, extra_finalists or [], context.settings.confirm_top)
    # A race may recommend the best re-run at each of its global batches (and at yours): a
    # finalist there keeps every round of re-runs while it can still be the best at its batch.
    raced = {r.result.config.global_batch_size for r in extra_finalists or []}
    if baseline is not None:
        raced.add(baseline.result.config.global_batch_size)
    reruns = _confirm_adaptively(finalists, baseline, context, frozenset(raced if racing else ()))
    confirmed = [r for r in finalists if all(c.eligible for c in reruns[r.number])]
    if not confirmed:
        failed = [c for runs in reruns.values() for c in runs if not c.eligible]
        raise NoFeasibleConfigError(
            "no finalist was feasible when re-measured: " + failure_summary(failed)
        )
    # Only finalists re-run in every round compete: one dropped after its first re-run stays
    # out, even if the others' later re-runs came in lower.
    rounds = max(len(reruns[r.number]) for r in confirmed)
    contenders = [r for r in confirmed if len(reruns[r.number]) == rounds]
    winner, close_call = _decide(contenders, reruns, baseline, context, tie_break=not racing)
    baseline_runs: tuple[float, ...] = ()
    if baseline is not None and baseline in confirmed:
        baseline_runs = _rates(reruns[baseline.number])
    confirmations = tuple(c for runs in reruns.values() for c in runs)
    return Selection(
        winner,
        _rates(reruns[winner.number]),
        baseline_runs,
        confirmations,
        close_call,
        finalists=tuple(confirmed),
        confirmed_rates={r.number: _median(reruns[r.number]) for r in confirmed},
    )


def _finalists(
    measured: list[TrialRecord],
    baseline: TrialRecord | None,
    extra: list[TrialRecord],
    top: int,
) -> list[TrialRecord]:
    """The `top` eligible trials by goodput, the best of every parallel layout, the baseline and
    the `extra` ones a race needs."""
    # By goodput: under the time-to-loss objective the finalists are those nearest the user's
    # loss by the noise scale, not the largest batches (samples/s where nothing else ranks).
    eligible = sorted(
        (r for r in measured if r.eligible), key=lambda r: r.goodput or 0, reverse=True
    )
    if not eligible:
        raise NoFeasibleConfigError(failure_summary(measured))
    finalists = eligible[:top]
    # The best of every parallel layout too, and of every precision at your global batch: the
    # choice between one process and DDP (or DataParallel), and that of the precision your batch
    # trains in, are then made on re-runs, never on single search windows (on data_bound.py
    # bf16 and fp32 with loader workers measured within a window's noise, and 3 of 5 tunes
    # re-ran only fp32, 2 only bf16).
    batch0 = baseline.result.config.global_batch_size if baseline is not None else None
    layouts = _best_per(eligible, lambda config: config.parallel)
    precisions = _best_per(
        eligible, lambda config: config.amp if config.global_batch_size == batch0 else None
    )
    wanted = [*layouts, *precisions, baseline, *extra]
    for record in wanted:
        if record is not None and record.eligible and record not in finalists:
            finalists.append(record)
    return finalists


def _confirm_adaptively(
    finalists: list[TrialRecord],
    baseline: TrialRecord | None,
    context: SearchContext,
    raced: frozenset[int] = frozenset(),
) -> dict[int, list[TrialRecord]]:
    """Re-run every finalist once, then for the remaining `confirm_repeats - 1` rounds only
    the baseline (the reference for the speed-up) and those that can still win, overall or
    among the finalists at their global batch where it is one of those that race (`raced`: the
    race's pick there, `advisor.decide.race.plan.fastest_at`)."""
    repeats = context.settings.confirm_repeats
    reruns = _confirm(finalists, context, 1, label=f"re-run round 1/{repeats},")
    for round_index in range(1, repeats):
        usable = [r for r in finalists if all(c.eligible for c in reruns[r.number])]
        leader = _leader(usable, reruns)
        leaders = {
            batch: _leader([r for r in usable if _batch(r) == batch], reruns) for batch in raced
        }
        contenders = [
            r
            for r in finalists
            if r is baseline
            or _can_win(reruns[r.number], leader)
            or _can_win(reruns[r.number], leaders.get(_batch(r), math.inf))
        ]
        label = f"re-run round {round_index + 1}/{repeats},"
        for number, runs in _confirm(contenders, context, 1, round_index, label).items():
            reruns[number].extend(runs)
    return reruns


def _batch(record: TrialRecord) -> int:
    return record.result.config.global_batch_size


def _leader(finalists: list[TrialRecord], reruns: dict[int, list[TrialRecord]]) -> float:
    return max((_median(reruns[r.number]) for r in finalists), default=0.0)


def _can_win(runs: list[TrialRecord], leader: float) -> bool:
    return all(c.eligible for c in runs) and _median(runs) * (1 + CLEARLY_BEHIND) >= leader


def _decide(
    confirmed: list[TrialRecord],
    reruns: dict[int, list[TrialRecord]],
    baseline: TrialRecord | None,
    context: SearchContext,
    tie_break: bool = True,
) -> tuple[TrialRecord, Tie | None]:
    """The fastest finalist by the median of its re-runs. When the runner-up is within the
    noise, both are re-run again (unless not `tie_break`: under a race, which decides, the
    fastest is only reported, and on examples/mlp.py the tie-break of batch 512 against 1024
    cost four re-runs, 9 s of a 70-s tune); if they are still within it, the one that changes
    fewer knobs from the baseline wins, and the returned `Tie` says so."""
    ranked = sorted(confirmed, key=lambda r: _median(reruns[r.number]), reverse=True)
    if len(ranked) < 2 or not tie_break or not _within_noise(ranked[0], ranked[1], reruns):
        return ranked[0], None
    first, second = ranked[0], ranked[1]
    rounds = context.settings.confirm_repeats
    for number, runs in _confirm(
        [first, second],
        context,
        rounds,
        len(reruns[first.number]),
        "tie-break re-run",
        paired=False,
    ).items():
        reruns[number].extend(runs)
    feasible = [r for r in ranked if all(c.eligible for c in reruns[r.number])]
    if first not in feasible or second not in feasible:  # a re-run failed: never recommended
        if not feasible:
            failed = [c for r in (first, second) for c in reruns[r.number] if not c.eligible]
            raise NoFeasibleConfigError(
                "no finalist stayed feasible when re-measured: " + failure_summary(failed)
            )
        return max(feasible, key=lambda r: _median(reruns[r.number])), None
    fast, slow = sorted((first, second), key=lambda r: _median(reruns[r.number]), reverse=True)
    if not _within_noise(fast, slow, reruns):
        return fast, None
    reference = baseline.result.config if baseline is not None else None
    simpler = min(
        (fast, slow),
        key=lambda r: (knob_changes(r.result.config, reference), -_median(reruns[r.number])),
    )
    return simpler, Tie(
        fast=fast.number,
        slow=slow.number,
        runs=len(reruns[fast.number]),
        gap=_median(reruns[fast.number]) / _median(reruns[slow.number]) - 1,
        fast_spread=_spread(reruns[fast.number]),
        slow_spread=_spread(reruns[slow.number]),
        kept=simpler.number,
    )


def _within_noise(
    first: TrialRecord, second: TrialRecord, reruns: dict[int, list[TrialRecord]]
) -> bool:
    noise = max(NOISE_FLOOR, _spread(reruns[first.number]), _spread(reruns[second.number]))
    return _median(reruns[first.number]) <= _median(reruns[second.number]) * (1 + noise)


def _median(runs: list[TrialRecord]) -> float:
    rates = _rates(runs)
    return statistics.median(rates) if rates else 0.0


def _spread(runs: list[TrialRecord]) -> float:
    return relative_spread(_rates(runs))


def knob_changes(config: TrialConfig, baseline: TrialConfig | None) -> int:
    """How many knobs `config` changes from `baseline`."""
    if baseline is None:
        return 0
    return sum(getattr(config, row.name) != getattr(baseline, row.name) for row in KNOBS)


def _best_per(
    eligible: list[TrialRecord], key: Callable[[TrialConfig], object]
) -> list[TrialRecord]:
    """The first (fastest) record of each value of `key` in a list sorted fastest first; a
    record whose `key` is None is left out."""
    best: dict[object, TrialRecord] = {}
    for record in eligible:
        value = key(record.result.config)
        if value is not None:
            best.setdefault(value, record)
    return list(best.values())


def _confirm(
    finalists: list[TrialRecord],
    context: SearchContext,
    rounds: int,
    round_offset: int = 0,
    label: str = "re-run",
    *,
    paired: bool = True,
) -> dict[int, list[TrialRecord]]:
    """Re-run every finalist `rounds` times, interleaved so that drift hits all alike; rounds
    (and log files) are numbered from `round_offset`, unless not `paired` (a tie-break's)."""
    reruns: dict[int, list[TrialRecord]] = {record.number: [] for record in finalists}
    total = rounds * len(finalists)
    for round_index in range(rounds):
        for index, record in enumerate(finalists):
            done = round_index * len(finalists) + index + 1
            config: TrialConfig = record.result.config
            context.progress.trial_started(f"{label} {done}/{total}", config)
            kind = "rerun" if paired else "tiebreak"
            log_path = (
                context.logs_dir / f"{kind}-{record.number}-{round_offset + round_index + 1}.log"
            )
            result = context.runner.run(
                WindowOrder(config=config, whole_cycles=True),
                log_path,
                on_phase=context.progress.trial_phase,
            )
            rerun = TrialRecord(
                number=record.number,
                role=TrialRole.CONFIRM,
                result=result,
                infeasible_reason=_problem(result, context),
                round=round_offset + round_index + 1 if paired else None,
            )
            context.progress.trial_finished(rerun, None)
            reruns[record.number].append(rerun)
    return reruns


def run_round(
    order: list[TrialRecord], context: SearchContext, round_offset: int, label: str
) -> list[TrialRecord]:
    """One more paired round of re-runs of `order`'s configurations, in that order."""
    runs = _confirm(order, context, 1, round_offset, label)
    return [run for record in order for run in runs[record.number]]


def rerun_pairs(
    confirmations: Sequence[TrialRecord], winner: int, baseline: int
) -> list[tuple[float, float, tuple[MachineLoad | None, MachineLoad | None]]]:
    """Per round that re-ran both usably: the winner's samples/s, the baseline's, and the
    machine's load during each, in round order."""
    by_round: dict[int, dict[int, TrialRecord]] = {}
    for run in confirmations:
        if run.round is not None and run.eligible and run.result.samples_per_s:
            by_round.setdefault(run.round, {})[run.number] = run
    pairs = []
    for _, runs in sorted(by_round.items()):
        if winner in runs and baseline in runs:
            w, b = runs[winner].result, runs[baseline].result
            pairs.append((w.samples_per_s or 0.0, b.samples_per_s or 0.0, (w.load, b.load)))
    return pairs


def _problem(result: TrialResult, context: SearchContext) -> str | None:
    """Why a re-run cannot stand: too little memory left, or (its early steps now whole, where
    the search trial's may not have been) a knob that changed the maths."""
    problem = memory_problem(result, context.hardware, context.settings)
    if problem is None and context.numerics is not None:
        problem = context.numerics.problem(result, context.progress.trial_phase)
    return problem


def _rates(reruns: list[TrialRecord]) -> tuple[float, ...]:
    return tuple(r.result.samples_per_s for r in reruns if r.result.samples_per_s is not None)


def failure_summary(records: list[TrialRecord]) -> str:
    """E.g. `all 12 trials failed: 8 oom, 4 error (trial 3: ValueError: ...)`."""
    if not records:
        return "no trial was measured: raise --trials or --timeout"
    counts = Counter("memory" if r.infeasible_reason else r.result.status for r in records)
    first = next((r for r in records if not r.eligible), records[0])
    reason = first.infeasible_reason or first.result.reason or first.result.status
    by_count = ", ".join(f"{n} {status}" for status, n in counts.most_common())
    return (
        f"all {len(records)} trials failed: {by_count} (trial {first.number}: {reason}); "
        "see the logs folder for details"
    )
