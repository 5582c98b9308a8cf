"""The `Recommendation`, assembled from what was measured and decided: its rates, what the
trials show about it (knob effects, rejected values, the bottleneck, efficiency against the
machine's peak, the memory budget) and the warnings a reader needs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

from advisor.decide.analysis import best_by_layout, knob_effects, rejected_values
from advisor.decide.bottleneck import diagnose
from advisor.knobs import TrialConfig
from advisor.results import (
    Efficiency,
    HardwareProfile,
    Notice,
    RaceSummary,
    Recommendation,
    StudySetup,
    TaskSummary,
    TrialRecord,
)
from advisor.search.memory import budget_summary
from advisor.settings import TuneSettings, mask_url

__all__ = ["Rates", "assemble", "efficiency", "time_to_loss_speedup", "warnings"]


@dataclass(frozen=True)
class Rates:
    """The samples/s a recommendation states: its own and the baseline's (medians of their
    re-runs, or of the search windows of a provisional one), and the re-runs themselves."""

    samples_per_s: float
    baseline_samples_per_s: float | None
    confirm_runs: tuple[float, ...] = ()
    baseline_runs: tuple[float, ...] = ()
    provisional: bool = False


def assemble(
    settings: TuneSettings,
    context: StudySetup,
    trials: list[TrialRecord],
    confirmations: tuple[TrialRecord, ...],
    winner: TrialRecord,
    rates: Rates,
) -> Recommendation:
    """The recommendation of `winner` at `rates`, with what the trials show about it: the knob
    effects, rejected values, bottleneck, efficiency, memory budget and warnings."""
    config, baseline = winner.result.config, context.baseline_config
    samples_per_s, baseline_samples_per_s = rates.samples_per_s, rates.baseline_samples_per_s
    effects = knob_effects(trials)
    memory = budget_summary(
        settings.memory_budget,
        settings.memory_headroom,
        trials,
        context.hardware,
        config.global_batch_size,
    )
    return Recommendation(
        provisional=rates.provisional,
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
        confirm_runs=rates.confirm_runs,
        baseline_runs=rates.baseline_runs,
        global_batch_changed=config.global_batch_size != baseline.global_batch_size,
        warnings=warnings(
            config.global_batch_size,
            baseline.global_batch_size,
            baseline_samples_per_s,
            settings,
            baseline_over=memory is not None and memory.baseline_over,
        ),
        fixed_knobs=context.fixed_knobs,
        parallel_best=best_by_layout(trials, confirmations, baseline.global_batch_size),
        knob_effects=effects,
        rejected_values=rejected_values(trials),
        bottleneck=diagnose(winner, effects),
        efficiency=efficiency(config, samples_per_s, context.task, context.hardware),
        memory_budget=memory,
        hardware=context.hardware,
        task=context.task,
        storage=mask_url(settings.storage_url),
        study_name=settings.resolved_study_name,
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def warnings(
    batch: int,
    baseline_batch: int,
    baseline_rate: float | None,
    settings: TuneSettings,
    race: RaceSummary | None = None,
    baseline_over: bool = False,
) -> tuple[Notice, ...]:
    """What a reader must know beside the recommendation: an unchecked change of global batch,
    a race shorter than a run, a baseline with no speed-up to state."""
    found = []
    if batch != baseline_batch and race is None:
        throughput = settings.objective != "time-to-loss"
        found.append(
            Notice(
                kind="batch-unchecked",
                batch=batch,
                baseline_batch=baseline_batch,
                throughput=throughput,
            )
        )
    if race is not None and race.target_loss is not None and settings.schedule == "off":
        found.append(Notice(kind="race-short", race_seconds=race.seconds))
    if baseline_rate is None:
        found.append(Notice(kind="baseline-over-budget" if baseline_over else "baseline-failed"))
    return tuple(found)


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


def time_to_loss_speedup(race: RaceSummary | None) -> float | None:
    """How much sooner the race's winner reaches your loss than yours (`TimeToLoss`)."""
    return race.time_to_loss.speedup if race is not None and race.time_to_loss else None
