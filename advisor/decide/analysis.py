"""What the trials show about single knobs, computed from the stored records alone."""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from advisor.knobs import KNOB, KNOBS
from advisor.results import (
    BatchEffort,
    KnobEffect,
    LayoutBest,
    Recommendation,
    RejectedValue,
    SearchEffort,
    TrialRecord,
)

__all__ = [
    "best_by_layout",
    "knob_effects",
    "param_importances",
    "rejected_values",
    "search_effort",
]

# The knobs in table order: reports list effects and rejected values in this order.
KNOB_NAMES = tuple(row.name for row in KNOBS)


def best_by_layout(
    records: list[TrialRecord],
    confirmations: tuple[TrialRecord, ...] = (),
    global_batch: int | None = None,
) -> tuple[LayoutBest, ...]:
    """The best eligible search measurement of each parallel layout, all at one global batch
    (not DDP at 32 against one process at 512): the one at which the most layouts ran, the
    nearest `global_batch` (all batches where None); with the median of its re-runs where it
    was re-run.

    Baseline and search trials count (each a single window); duplicates do not.
    """
    measured = [r for r in records if r.role in ("baseline", "search")]
    batch = _comparison_batch(measured, global_batch) if global_batch is not None else None
    by_layout: dict[str, list[TrialRecord]] = defaultdict(list)
    for record in measured:
        config = record.result.config
        if batch is None or config.global_batch_size == batch:
            by_layout[config.parallel].append(record)
    summaries = []
    for layout, tried in sorted(
        by_layout.items(), key=lambda item: KNOB["parallel"].order_key(item[0])
    ):
        eligible = [r for r in tried if r.eligible and r.result.samples_per_s]
        best = max(eligible, key=lambda r: r.result.samples_per_s or 0.0, default=None)
        summaries.append(
            LayoutBest(
                parallel=layout,
                global_batch=batch,
                trials=len(tried),
                feasible=len(eligible),
                best_trial=best.number if best else None,
                samples_per_s=best.result.samples_per_s if best else None,
                rerun_samples_per_s=_rerun_median(best, confirmations) if best else None,
                config_label=best.result.config.label() if best else None,
            )
        )
    return tuple(summaries)


def _comparison_batch(records: list[TrialRecord], preferred: int) -> int | None:
    """The global batch at which the most parallel layouts ran usable trials: `preferred` (the
    user's) where it is one of those, else the one nearest it; None where no two layouts ran
    at one global batch (each is then shown at its own)."""
    layouts: dict[int, set[str]] = defaultdict(set)
    for record in records:
        if record.eligible and record.result.samples_per_s:
            layouts[record.result.config.global_batch_size].add(record.result.config.parallel)
    most = max((len(found) for found in layouts.values()), default=0)
    if most < 2:
        return None
    tied = [batch for batch, found in layouts.items() if len(found) == most]
    return min(tied, key=lambda batch: (abs(math.log(batch / preferred)), batch))


def _rerun_median(best: TrialRecord, confirmations: tuple[TrialRecord, ...]) -> float | None:
    rates = [
        c.result.samples_per_s
        for c in confirmations
        if c.number == best.number and c.eligible and c.result.samples_per_s
    ]
    return statistics.median(rates) if rates else None


MIN_TRIALS_FOR_IMPORTANCE = 4


def _one_measurement(first: TrialRecord, second: TrialRecord) -> bool:
    """Whether one of the two was derived from the other's timed parts: their difference is
    what `advisor.trial.child.window.cycle_s` computes, not a second measurement."""
    return first.derived_from == second.number or second.derived_from == first.number


def knob_effects(records: list[TrialRecord]) -> tuple[KnobEffect, ...]:
    """Each knob change measured in isolation: every pair of feasible search trials whose
    configurations differ in that knob alone, grouped by the change (e.g. amp off -> bf16)."""
    measured = [
        r
        for r in records
        if r.role in ("baseline", "search") and r.eligible and r.result.samples_per_s
    ]
    groups: dict[tuple[str, str, str], list[tuple[TrialRecord, TrialRecord]]] = defaultdict(list)
    for index, first in enumerate(measured):
        for second in measured[index + 1 :]:
            knob = _only_difference(first, second)
            if knob is None or _one_measurement(first, second):
                continue
            before, after = sorted((first, second), key=lambda r: _value_key(knob, r))
            key = (knob, _value(knob, before), _value(knob, after))
            groups[key].append((before, after))
    ordered = sorted(
        groups.items(),
        key=lambda item: (
            KNOB_NAMES.index(item[0][0]),
            _value_key(item[0][0], item[1][0][0]),
            _value_key(item[0][0], item[1][0][1]),
        ),
    )
    return tuple(_effect(knob, old, new, pairs) for (knob, old, new), pairs in ordered)


def rejected_values(records: list[TrialRecord]) -> tuple[RejectedValue, ...]:
    """Knob values that never gave a usable trial while another value of the knob did (e.g.
    every amp=bf16 trial diverged). Stated only with evidence: a usable trial that differs
    from a failed one in that knob alone, or at least two failures of the same kind."""
    measured = [r for r in records if r.role in ("baseline", "search")]
    rejected = []
    for knob in KNOB_NAMES:
        by_value: dict[str, list[TrialRecord]] = defaultdict(list)
        for record in measured:
            by_value[_value(knob, record)].append(record)
        usable = [r for r in measured if r.eligible]
        for value, tried in by_value.items():
            others = [r for r in usable if _value(knob, r) != value]
            if any(r.eligible for r in tried) or not others:
                continue
            kinds = Counter(_failure_kind(r) for r in tried)
            counterparts = tuple(
                (ok.number, bad.number)
                for bad in tried
                for ok in others
                if _only_difference(ok, bad) == knob
            )
            if counterparts or kinds.most_common(1)[0][1] >= 2:
                rejected.append(_rejection(knob, value, tried, kinds, counterparts))
    return tuple(rejected)


def _failure_kind(record: TrialRecord) -> str:
    return "over the memory headroom" if record.infeasible_reason else record.result.status


def _rejection(
    knob: str,
    value: str,
    tried: list[TrialRecord],
    kinds: Counter[str],
    counterparts: tuple[tuple[int, int], ...],
) -> RejectedValue:
    """The value's evidence: its failed trials and, first, the failure the knob alone explains
    (a pair's), else one of the commonest kind (`advisor.report.verdicts` words it)."""
    if counterparts:
        cited = next(r for r in tried if r.number == counterparts[0][1])
    else:
        cited = next(r for r in tried if _failure_kind(r) == kinds.most_common(1)[0][0])
    return RejectedValue(
        knob=knob,
        value=value,
        trials=tuple(r.number for r in tried),
        failures=", ".join(f"{n} {kind}" for kind, n in kinds.most_common()),
        counterparts=counterparts,
        cited=cited.number,
        cited_kind=_failure_kind(cited),
        cited_reason=_why(cited),
    )


def _why(record: TrialRecord) -> str:
    return record.infeasible_reason or record.result.reason or record.result.status


def _effect(
    knob: str, old: str, new: str, pairs: list[tuple[TrialRecord, TrialRecord]]
) -> KnobEffect:
    ordered = sorted(pairs, key=lambda pair: (pair[0].number, pair[1].number))
    ratios = [(a.result.samples_per_s or 0.0) / (b.result.samples_per_s or 1.0) for b, a in ordered]
    extra, saved = _compile_payoff(ordered) if knob == "compile" and old == "off" else (None, None)
    return KnobEffect(
        knob=knob,
        from_value=old,
        to_value=new,
        ratio=statistics.median(ratios),
        pairs=tuple((b.number, a.number) for b, a in ordered),
        pair_ratios=tuple(ratios),
        data_wait_before=_median([b.result.data_wait_fraction for b, _ in ordered]),
        data_wait_after=_median([a.result.data_wait_fraction for _, a in ordered]),
        compile_extra_s=extra,
        compile_saved_s=saved,
    )


def _compile_payoff(
    pairs: list[tuple[TrialRecord, TrialRecord]],
) -> tuple[float | None, float | None]:
    """Compilation's one-off cost (the compiled first step less the eager one) and the time it
    saves per step, over the same pairs (medians); both or neither
    (`advisor.report.verdicts` weighs one against the other)."""
    extra = _median([_first_step_extra(eager, compiled) for eager, compiled in pairs])
    saved = _median([_step_saving(eager, compiled) for eager, compiled in pairs])
    return (extra, saved) if extra is not None and saved is not None else (None, None)


def _first_step_extra(eager: TrialRecord, compiled: TrialRecord) -> float | None:
    if eager.result.first_step_s is None or compiled.result.first_step_s is None:
        return None
    return compiled.result.first_step_s - eager.result.first_step_s


def _step_saving(eager: TrialRecord, compiled: TrialRecord) -> float | None:
    if eager.result.step_time_median_s is None or compiled.result.step_time_median_s is None:
        return None
    return eager.result.step_time_median_s - compiled.result.step_time_median_s


def _only_difference(first: TrialRecord, second: TrialRecord) -> str | None:
    differing = [knob for knob in KNOB_NAMES if _value(knob, first) != _value(knob, second)]
    return differing[0] if len(differing) == 1 else None


def _value(knob: str, record: TrialRecord) -> str:
    return str(getattr(record.result.config, knob))


def _value_key(knob: str, record: TrialRecord) -> tuple[int, ...]:
    """Where the record's value of `knob` stands from the default outwards (the table's order)."""
    return KNOB[knob].order_key(getattr(record.result.config, knob))


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def param_importances(records: list[TrialRecord]) -> dict[str, float]:
    """Optuna's importance of each knob that varied, over the feasible search trials
    (PED-ANOVA, Optuna's default); empty when too few trials varied."""
    import warnings

    import optuna

    measured = [
        r
        for r in records
        if r.role in ("baseline", "search") and r.eligible and r.result.samples_per_s
    ]
    varying = [k for k in KNOB_NAMES if len({_value(k, r) for r in measured}) > 1]
    if len(measured) < MIN_TRIALS_FOR_IMPORTANCE or not varying:
        return {}
    distributions: dict[str, optuna.distributions.BaseDistribution] = {
        knob: optuna.distributions.CategoricalDistribution(
            sorted({_value(knob, r) for r in measured})
        )
        for knob in varying
    }
    study = optuna.create_study(direction="maximize")
    study.add_trials(
        [
            optuna.trial.create_trial(
                params={knob: _value(knob, r) for knob in varying},
                distributions=distributions,
                value=r.result.samples_per_s,
            )
            for r in measured
        ]
    )
    with warnings.catch_warnings():  # few trials: PED-ANOVA says so; the report shows the count
        warnings.simplefilter("ignore")
        importances = optuna.importance.get_param_importances(study)
    # Rounded and tie-broken by name: Optuna orders ties by hash order, which changes from
    # process to process, and a re-rendered report must not.
    rounded = {name: round(value, 6) for name, value in importances.items()}
    return dict(sorted(rounded.items(), key=lambda item: (-item[1], item[0])))


def search_effort(
    trials: tuple[TrialRecord, ...],
    confirmations: tuple[TrialRecord, ...],
    rec: Recommendation,
) -> SearchEffort:
    """Trials per global batch (run, derived), which batches raced, and the fastest
    configuration at the user's global batch with its speed-up over the baseline: on the
    medians of their re-runs where both were re-run, else on their search windows."""
    batch0 = rec.baseline_config.global_batch_size
    raced = {r.config.global_batch_size for r in rec.race.racers} if rec.race else set()
    searched = [r for r in trials if r.role in ("baseline", "search")]
    by_batch: dict[int, list[TrialRecord]] = defaultdict(list)
    for record in searched:
        by_batch[record.result.config.global_batch_size].append(record)
    batches = tuple(
        BatchEffort(
            global_batch=batch,
            ran=sum(r.derived_from is None for r in records),
            derived=sum(r.derived_from is not None for r in records),
            raced=batch in raced and batch != batch0,
            yours=batch == batch0,
        )
        for batch, records in sorted(by_batch.items())
    )
    at_yours = [r for r in by_batch.get(batch0, []) if r.eligible and r.result.samples_per_s]
    # The re-runs' best where any was re-run (as the race chooses its "best at your batch"): the
    # best search window is biased upwards, the best of many noisy values.
    rerun = [r for r in at_yours if _median_rerun(confirmations, r.number)]
    best = max(
        rerun or at_yours,
        key=lambda r: (
            (_median_rerun(confirmations, r.number) if rerun else None)
            or r.result.samples_per_s
            or 0.0
        ),
        default=None,
    )
    baseline = next((r for r in searched if r.role == "baseline"), None)
    if best is None or baseline is None or not baseline.result.samples_per_s:
        return SearchEffort(batches=batches)
    reruns = {n: _median_rerun(confirmations, n) for n in (best.number, baseline.number)}
    on_re_runs = all(reruns.values())
    mine = reruns[best.number] if on_re_runs else best.result.samples_per_s
    theirs = reruns[baseline.number] if on_re_runs else baseline.result.samples_per_s
    return SearchEffort(
        batches=batches,
        best_at_yours=best.number,
        best_at_yours_label=best.result.config.label(),
        best_at_yours_speedup=(mine or 0.0) / theirs if theirs else None,
        on_re_runs=on_re_runs,
        best_is_yours=best.number == baseline.number,
    )


def _median_rerun(confirmations: tuple[TrialRecord, ...], number: int) -> float | None:
    rates = [
        c.result.samples_per_s
        for c in confirmations
        if c.number == number and c.eligible and c.result.samples_per_s
    ]
    return statistics.median(rates) if rates else None
