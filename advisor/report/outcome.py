"""Turn a study's measurements into a `Recommendation`: the confirmed one a finished tune makes,
or a provisional one from the search trials of a tune that was interrupted; with how far it is
from the hardware limit (its FLOP rate against the measured matmul peak)."""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path

from advisor.convergence import LrPlan, NoiseScale
from advisor.errors import NoFeasibleConfigError, StorageError
from advisor.knobs import TrialConfig
from advisor.report.analysis import best_by_layout, diagnose, knob_effects, rejected_values
from advisor.results import (
    Efficiency,
    HardwareProfile,
    RaceSummary,
    Recommendation,
    StudyContext,
    TaskSummary,
    ThroughputPick,
    TrialRecord,
    TuneResult,
)
from advisor.search.race import race_choice, rerun_rates
from advisor.search.records import read_study
from advisor.search.selection import Selection, failure_summary
from advisor.search.storage import load_study, mask_url
from advisor.settings import TuneSettings

__all__ = [
    "confirmed_recommendation",
    "efficiency",
    "provisional_recommendation",
    "stored_result",
]


def confirmed_recommendation(
    settings: TuneSettings,
    context: StudyContext,
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
    rec = _recommendation(
        settings,
        context,
        trials,
        selection.confirmations,
        winner,
        samples_per_s=statistics.median(runs) if runs else selection.samples_per_s,
        baseline_samples_per_s=base,
        confirm_runs=runs,
        baseline_runs=selection.baseline_runs,
        provisional=False,
    )
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
            "time_to_loss_speedup": _time_to_loss_speedup(race),
            "warnings": _warnings(
                rec.config.global_batch_size,
                rec.baseline_config.global_batch_size,
                rec.baseline_samples_per_s,
                settings,
                race,
            ),
        }
    )


def _time_to_loss_speedup(race: RaceSummary | None) -> float | None:
    """The baseline's time to its own race target over the winner's."""
    if race is None or race.winner is None:
        return None
    baseline = next((r for r in race.racers if r.role == "baseline"), None)
    winner = race.racers[race.winner]
    if baseline is None or not baseline.time_to_target_s or not winner.time_to_target_s:
        return None
    return baseline.time_to_target_s / winner.time_to_target_s


def provisional_recommendation(
    settings: TuneSettings, context: StudyContext, trials: list[TrialRecord]
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
    return _recommendation(
        settings,
        context,
        trials,
        (),
        winner,
        samples_per_s=winner.result.samples_per_s or 0.0,
        baseline_samples_per_s=baseline.result.samples_per_s if baseline else None,
        confirm_runs=(),
        baseline_runs=(),
        provisional=True,
    )


def _recommendation(
    settings: TuneSettings,
    context: StudyContext,
    trials: list[TrialRecord],
    confirmations: tuple[TrialRecord, ...],
    winner: TrialRecord,
    *,
    samples_per_s: float,
    baseline_samples_per_s: float | None,
    confirm_runs: tuple[float, ...],
    baseline_runs: tuple[float, ...],
    provisional: bool,
) -> Recommendation:
    config, baseline = winner.result.config, context.baseline_config
    effects = knob_effects(trials)
    return Recommendation(
        provisional=provisional,
        advisor_version=context.advisor_version,
        spec=settings.spec,
        workdir=context.workdir,
        config=config,
        samples_per_s=samples_per_s,
        peak_memory_bytes=winner.result.peak_memory_bytes,
        baseline_config=baseline,
        baseline_samples_per_s=baseline_samples_per_s,
        speedup=samples_per_s / baseline_samples_per_s if baseline_samples_per_s else None,
        chosen_from_trial=winner.number,
        confirm_runs=confirm_runs,
        baseline_runs=baseline_runs,
        global_batch_changed=config.global_batch_size != baseline.global_batch_size,
        warnings=_warnings(
            config.global_batch_size, baseline.global_batch_size, baseline_samples_per_s, settings
        ),
        fixed_knobs=context.fixed_knobs,
        parallel_best=best_by_layout(trials, confirmations),
        knob_effects=effects,
        rejected_values=rejected_values(trials),
        bottleneck=diagnose(winner, effects),
        efficiency=efficiency(config, samples_per_s, context.task, context.hardware),
        hardware=context.hardware,
        task=context.task,
        storage=mask_url(settings.storage_url),
        study_name=settings.resolved_study_name,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _warnings(
    batch: int,
    baseline_batch: int,
    baseline_rate: float | None,
    settings: TuneSettings,
    race: RaceSummary | None = None,
) -> tuple[str, ...]:
    warnings = []
    if batch != baseline_batch and race is None:
        unchecked = (
            "the tune stopped before its race; run the same command again to race it"
            if settings.objective == "time-to-loss"
            else "--objective throughput does not race; re-run with --objective time-to-loss "
            "to race it"
        )
        warnings.append(
            f"the global batch changes from {baseline_batch} to {batch} "
            f"({batch / baseline_batch:g}x), and nothing checked how soon it reaches your loss: "
            f"{unchecked}, or with --global-batch-size {baseline_batch} to keep it"
        )
    if race is not None and batch != baseline_batch:
        warnings.append(
            f"the race covered the first {race.seconds:g} s of training from your initial "
            "weights; the best global batch often grows later in training (the gradient noise "
            "scale grows as the loss falls), so a longer run may favour a larger one still"
        )
    if baseline_rate is None:
        warnings.append("the baseline configuration failed: no speed-up can be stated")
    return tuple(warnings)


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
    return TuneResult(
        settings=stored.settings,
        recommendation=recommendation,
        trials=tuple(stored.trials),
        confirmations=stored.confirmations,
        pruned=stored.pruned,
        out_dir=out_dir or Path("reports") / stored.name,
    )


def efficiency(
    config: TrialConfig, samples_per_s: float, task: TaskSummary, hardware: HardwareProfile
) -> Efficiency | None:
    """None when the model's FLOPs were not counted or no peak was measured for its dtype."""
    if task.flops_per_sample is None:
        return None
    dtype = "fp32" if config.amp == "off" else config.amp
    if config.device == "cuda" and hardware.gpus:
        devices = len(hardware.gpus) if config.parallel_mode == "dp" else config.world_size
        per_device = hardware.gpus[0].peak_flops.get(dtype)
        peak = per_device * devices if per_device else None
        where = f"{devices} x {hardware.gpus[0].name}"
    else:  # every rank shares the same cores, so the machine's peak is the limit
        peak = hardware.cpu_peak_flops.get(dtype)
        where = f"{hardware.cores} CPU cores"
    if not peak:
        return None
    achieved = task.flops_per_sample * samples_per_s
    return Efficiency(
        flops_per_sample=task.flops_per_sample,
        achieved_flops=achieved,
        peak_flops=peak,
        dtype=dtype,
        devices=where,
        fraction_of_peak=achieved / peak,
    )
