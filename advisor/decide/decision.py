"""The decision: turn a study's measurements into a `Recommendation` and a `TuneResult`.

After the search, `conclude` re-measures the finalists and, for the time-to-loss objective,
measures the noise scale and races them (`advisor.decide.race`); the confirmed recommendation is
the race's winner (or the re-runs' winner, under `--objective throughput`). A tune that was
interrupted gets a provisional recommendation from its search trials alone (`stored_result`).
The reports render what is decided here and decide nothing themselves."""

from __future__ import annotations

import statistics
from pathlib import Path

import optuna

from advisor.decide.analysis import (
    param_importances,
    search_effort,
)
from advisor.decide.claims import confirm_claim
from advisor.decide.race.estimate import RateBook
from advisor.decide.race.extend import race_to_loss
from advisor.decide.race.plan import plan_racers
from advisor.decide.race.schedule import schedule_bound, tune_schedule
from advisor.decide.race.verdict import redecided
from advisor.decide.recommendation import (
    Rates,
    assemble,
    time_to_loss_speedup,
    warnings,
)
from advisor.decide.reruns import Selection, failure_summary, select_winner
from advisor.errors import NoFeasibleConfigError, StorageError
from advisor.knobs import KNOBS, TrialConfig
from advisor.noise_scale import predict_batches, race_finalists
from advisor.progress import Stage
from advisor.results import (
    BatchPrediction,
    Confirmation,
    LrPlan,
    NoiseScale,
    PrunedProposal,
    RaceSummary,
    Recommendation,
    ScheduleSummary,
    ScheduleVerdict,
    StudySetup,
    ThroughputPick,
    TrialRecord,
    TuneResult,
)
from advisor.search.context import SearchContext
from advisor.search.dominance import rejected_in_search
from advisor.search.noise import measure_noise_scale
from advisor.search.records import read_study, records_of
from advisor.search.storage import load_study
from advisor.settings import TuneSettings

__all__ = [
    "conclude",
    "confirmed_recommendation",
    "provisional_recommendation",
    "race_choice",
    "rerun_rates",
    "stored_result",
    "tune_result",
]


def conclude(
    study: optuna.Study, search: SearchContext, context: StudySetup, records: list[TrialRecord]
) -> tuple[Recommendation, Selection]:
    """Re-measure the finalists and, for the time-to-loss objective, race them: the
    recommendation, and the re-runs it rests on."""
    settings, progress = search.settings, search.progress
    racing = settings.objective == "time-to-loss" and settings.race_seconds > 0
    racing = racing and any(record.eligible for record in records)  # else nothing can win
    noise, predictions, extra = _race_entrants(study, search, records) if racing else (None, (), [])
    progress.stage("re-measuring the finalists and the baseline")
    selection = select_winner(records, search, extra, racing=racing)
    race = None
    if racing:
        plans = plan_racers(
            selection, predictions, search.space.baseline, context.task.optimizer_class
        )
        progress.stage(Stage(kind="racing", count=len(plans), seconds=settings.race_seconds))
        race = race_to_loss(study, search, plans, RateBook(selection.confirmations))
    selection, confirmation, race = _confirmed(selection, race, search, context.baseline_config)
    recommendation = confirmed_recommendation(
        settings, context, selection, records_of(study), race=race, noise=noise
    )
    recommendation = _with_confirmation(recommendation, confirmation)
    if settings.schedule == "auto":
        schedule = _schedule(study, search, context, records, recommendation)
        recommendation = recommendation.model_copy(update={"schedule": schedule})
    return recommendation, selection


# A bound on deciding the race again after re-runs: each new decision follows new rounds, and
# a winner's rounds against the baseline are bounded, so it settles within a few (see below).
REDECISIONS = 8


def _confirmed(
    selection: Selection, race: RaceSummary | None, search: SearchContext, baseline: TrialConfig
) -> tuple[Selection, Confirmation | None, RaceSummary | None]:
    """Confirm the recommendation's samples/s against the baseline in paired re-runs and,
    after a race, decide it again with those rounds (`redecided`): the claim carries them, and
    a win they no longer support gives way to what then wins, confirmed in turn. With no new
    rounds the decision cannot change, so this ends once a winner's rounds are all run."""
    loads = [racer.result.load for racer in race.racers] if race is not None else []
    time_to_loss = search.settings.objective == "time-to-loss"
    for _ in range(REDECISIONS):
        winner = race_choice(selection, race, baseline)[0] if time_to_loss else selection.winner
        selection, confirmation = confirm_claim(selection, winner, search, loads)
        if race is None:
            return selection, confirmation, None
        again = redecided(race, RateBook(selection.confirmations))
        if again.winner == race.winner:
            return selection, confirmation, again
        race = again
    return selection, None, race  # never seen: unsettled, so no samples/s ratio is confirmed


def _schedule(
    study: optuna.Study,
    search: SearchContext,
    context: StudySetup,
    records: list[TrialRecord],
    rec: Recommendation,
) -> ScheduleSummary:
    """The batch-size schedule's tune, from the best configuration at the user's batch, against
    the fixed recommendation; only after a race that set a target."""
    race, settings = rec.race, search.settings
    bound = schedule_bound(settings.schedule_seconds)
    why: ScheduleVerdict | None = None
    if race is None or race.target_loss is None:
        why = ScheduleVerdict(kind="no-race" if race is None else "race-kept")
    elif settings.timeout is not None and bound > settings.timeout:
        why = ScheduleVerdict(kind="timeout", bound_s=bound, timeout_s=settings.timeout)
    if why is not None or race is None:
        why = why or ScheduleVerdict(kind="no-race")
        return ScheduleSummary(seconds=settings.schedule_seconds, track=None, verdict=why)
    kept = race.verdict.kept
    base = race.racers[kept].config if kept is not None else race.racers[0].config
    return tune_schedule(
        study, search, base, (rec.config, rec.lr), records, context.task.optimizer_class
    )


def _race_entrants(
    study: optuna.Study, search: SearchContext, records: list[TrialRecord]
) -> tuple[NoiseScale | None, tuple[BatchPrediction, ...], list[TrialRecord]]:
    """The noise scale, what it predicts per global batch, and the search trials the race
    needs re-measured with the other finalists."""
    baseline = search.space.baseline
    noise = measure_noise_scale(study, search, baseline)  # the search measured it, as a rule
    predictions, extra = race_finalists(
        predict_batches(noise, records, baseline), noise, records, baseline, search.space.probe_amp
    )
    if noise is not None:
        noise = noise.model_copy(update={"predictions": predictions})
    return noise, predictions, extra


def tune_result(
    settings: TuneSettings,
    recommendation: Recommendation,
    trials: tuple[TrialRecord, ...],
    confirmations: tuple[TrialRecord, ...],
    pruned: tuple[PrunedProposal, ...],
    out_dir: Path,
) -> TuneResult:
    """What a tune returns and the reports render, with what the search concludes from its
    trials besides the recommendation: the knob values it stopped proposing, and Optuna's
    parameter importances."""
    knobs = [row.name for row in KNOBS]
    return TuneResult(
        settings=settings,
        recommendation=recommendation,
        trials=trials,
        confirmations=confirmations,
        pruned=pruned,
        out_dir=out_dir,
        rejected=tuple(rejected_in_search(trials, knobs, settings.early_stop)),
        importances=param_importances(list(trials)),
        effort=search_effort(trials, confirmations, recommendation),
    )


def confirmed_recommendation(
    settings: TuneSettings,
    context: StudySetup,
    selection: Selection,
    trials: list[TrialRecord],
    race: RaceSummary | None = None,
    noise: NoiseScale | None = None,
) -> Recommendation:
    """The winner of the re-runs (objective throughput) or of the race (time-to-loss), its
    figures the medians of its re-runs."""
    winner, lr = selection.winner, LrPlan()
    if settings.objective == "time-to-loss":
        winner, lr = race_choice(selection, race, context.baseline_config)
    runs = rerun_rates(selection, winner.number)
    base = selection.baseline_samples_per_s
    rates = Rates(
        samples_per_s=statistics.median(runs) if runs else selection.samples_per_s,
        baseline_samples_per_s=base,
        confirm_runs=runs,
        baseline_runs=selection.baseline_runs,
    )
    rec = assemble(settings, context, trials, selection.confirmations, winner, rates)
    fastest = selection.winner
    pick = None
    if fastest.number != winner.number:
        pick = ThroughputPick(
            config=fastest.result.config,
            trial=fastest.number,
            samples_per_s=selection.samples_per_s,
        )
    return rec.model_copy(
        update={
            "close_call": selection.close_call if pick is None else None,
            "objective": settings.objective,
            "lr": lr,
            "race": race,
            "noise_scale": noise,
            "throughput_pick": pick,
            "time_to_loss_speedup": time_to_loss_speedup(race),
            "time_to_loss": race.time_to_loss if race is not None else None,
            "warnings": warnings(
                rec.config.global_batch_size,
                rec.baseline_config.global_batch_size,
                rec.baseline_samples_per_s,
                settings,
                race,
                baseline_over=rec.baseline_over_budget,
            ),
        }
    )


def _with_confirmation(rec: Recommendation, confirmation: Confirmation | None) -> Recommendation:
    """The recommendation with the samples/s speed-up its paired re-runs support: their
    typical ratio where they confirm it, else their lowest round. Its time-to-loss claim
    carries the rounds' interval already (`advisor.decide.race.estimate`)."""
    if confirmation is None:
        return rec
    return rec.model_copy(
        update={"confirmation": confirmation, "speedup": confirmation.claimed_speedup}
    )


def provisional_recommendation(
    settings: TuneSettings, context: StudySetup, trials: list[TrialRecord]
) -> Recommendation:
    """The best search window so far against the baseline's, for a tune that did not finish."""
    measured = [t for t in trials if t.role in ("baseline", "search")]
    eligible = [t for t in measured if t.eligible and t.result.samples_per_s]
    if not measured:
        raise StorageError(
            f"study {settings.resolved_study_name!r} has no finished trial to report yet: "
            "run its advisor tune command again to measure some"
        )
    if not eligible:
        raise NoFeasibleConfigError(failure_summary(measured))
    winner = max(eligible, key=lambda t: t.result.samples_per_s or 0.0)
    baseline = next((t for t in eligible if t.role == "baseline"), None)
    rates = Rates(
        samples_per_s=winner.result.samples_per_s or 0.0,
        baseline_samples_per_s=baseline.result.samples_per_s if baseline else None,
        provisional=True,
    )
    return assemble(settings, context, trials, (), winner, rates)


def stored_result(url: str, study_name: str | None, out_dir: Path | None) -> TuneResult:
    """A tune's result rebuilt from its study alone (for `advisor report`): the stored
    recommendation of a finished tune, else a provisional one from the trials so far.

    `out_dir` defaults to reports/<study name>.
    """
    stored = read_study(load_study(url, study_name))
    recommendation = stored.recommendation
    if recommendation is None and stored.context is not None:  # read_study ensures one of them
        recommendation = provisional_recommendation(stored.settings, stored.context, stored.trials)
    if recommendation is None:
        raise StorageError(f"study {stored.name!r} holds no recommendation and no context")
    return tune_result(
        stored.settings,
        recommendation,
        tuple(stored.trials),
        stored.confirmations,
        stored.pruned,
        out_dir or Path("reports") / stored.name,
    )


def race_choice(
    selection: Selection, race: RaceSummary | None, baseline: TrialConfig
) -> tuple[TrialRecord, LrPlan]:
    """The configuration and learning rate a time-to-loss tune recommends: the race's winner;
    without a race, the fastest re-measured configuration at the user's global batch."""
    by_number = {record.number: record for record in selection.finalists}
    if race is not None and race.winner is not None:
        racer = race.racers[race.winner]
        if racer.trial in by_number:
            return by_number[racer.trial], racer.lr
    batch0 = baseline.global_batch_size
    if selection.winner.result.config.global_batch_size == batch0:
        return selection.winner, LrPlan()  # the re-runs' winner, a tie broken as they broke it
    at_batch0 = [r for r in selection.finalists if r.result.config.global_batch_size == batch0]
    if not at_batch0:  # the baseline failed and nothing else ran at its batch
        return selection.winner, LrPlan()
    rates = selection.confirmed_rates
    return max(at_batch0, key=lambda r: rates.get(r.number, 0.0)), LrPlan()


def rerun_rates(selection: Selection, number: int) -> tuple[float, ...]:
    """Samples/s of every re-run of search trial `number`."""
    return tuple(
        c.result.samples_per_s
        for c in selection.confirmations
        if c.number == number and c.result.samples_per_s is not None
    )
