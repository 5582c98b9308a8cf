"""What a trial reports: its result from a timed window (samples/s measured, or estimated from a
cycle's timed parts, with the rates of its sibling accumulations), and the summary of the task
it built, which shapes the generated script."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from advisor.knobs import TrialConfig
from advisor.results import TaskSummary, TrialResult
from advisor.task import TrainingTask, user_batch_size
from advisor.trial.child.blocks import repeated_block
from advisor.trial.child.budget import WindowTerms, estimated_cycle_s
from advisor.trial.child.loop import Trainer
from advisor.trial.child.window import Window

__all__ = ["flops_per_sample", "summarise", "window_result"]


def window_result(
    terms: WindowTerms,
    window: Window,
    peak_memory: int,
    summary: TaskSummary,
    startup_s: float,
    warmup_s: float,
) -> TrialResult:
    """This process's result from a timed `window`: samples/s measured, or estimated from a
    cycle's timed parts (with its siblings' rates), step times, data wait and peak memory."""
    config = terms.config
    samples = window.micro_batches * config.batch_size  # this process's; ranks are summed later
    cycle_s = estimated_cycle_s(window, config.accumulation_steps)
    step_times = (
        (cycle_s, cycle_s, cycle_s)
        if cycle_s is not None
        else (window.median_step_s, window.percentile(0.1), window.percentile(0.9))
    )
    rate = samples / window.elapsed_s if cycle_s is None else _rate(config, cycle_s)
    return TrialResult(
        sibling_rates=_sibling_rates(terms, window) if cycle_s is not None else {},
        config=config,
        status="ok",
        samples_per_s=rate,
        estimated=cycle_s is not None,
        step_time_median_s=step_times[0],
        step_time_p10_s=step_times[1],
        step_time_p90_s=step_times[2],
        data_wait_fraction=min(1.0, window.data_wait_s / window.elapsed_s),
        peak_memory_bytes=peak_memory,
        startup_s=startup_s,
        warmup_s=warmup_s,
        window_s=window.elapsed_s,
        steps_measured=window.steps,
        samples_measured=samples,
        losses=tuple(window.losses[:200]),
        stopped_early=window.stopped_early,
        below_best=window.below_best,
        task=summary,
    )


def _rate(config: TrialConfig, cycle_s: float) -> float:
    """This process's samples/s at one optimizer cycle per `cycle_s`."""
    return config.accumulation_steps * config.batch_size / cycle_s


def _sibling_rates(terms: WindowTerms, window: Window) -> dict[int, float]:
    """This process's samples/s at each of the request's `sibling_accumulation`, from the
    window's timed parts: the same micro-steps, in cycles of another length."""
    rates = {}
    for accumulation in terms.sibling_accumulation:
        cycle_s = estimated_cycle_s(window, accumulation)
        if cycle_s is not None:
            sibling = terms.config.model_copy(update={"accumulation_steps": accumulation})
            rates[accumulation] = _rate(sibling, cycle_s)
    return rates


def summarise(task: TrainingTask, kind: str, trainer: Trainer) -> TaskSummary:
    """What the factory built, as this trial saw it: model, dataset, batches, optimizer."""
    dataset = task.dataset
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    size = None if iterable and not hasattr(dataset, "__len__") else len(dataset)
    return TaskSummary(
        return_kind=kind,  # type: ignore[arg-type]
        model_class=type(task.model).__name__,
        num_parameters=sum(p.numel() for p in task.model.parameters()),
        dataset_class=type(dataset).__name__,
        dataset_size=size,
        iterable=iterable,
        batch_kind=trainer.first_batch_kind or "tensor",
        batch_description=trainer.first_batch or "?",
        loss_from_model=task.loss_fn is None,
        custom_optimizer=task.optimizer is not None,
        custom_collate=task.collate_fn is not None,
        user_batch_size=user_batch_size(task),
        conv2d=any(isinstance(module, torch.nn.Conv2d) for module in task.model.modules()),
        repeated_block=repeated_block(task.model),
        optimizer_class=type(trainer.optimizer).__name__,
    )


def flops_per_sample(trainer: Trainer) -> float | None:
    """Forward and backward FLOPs of one training step per sample, as torch counts them
    (matmuls, convolutions, attention; elementwise work is not counted)."""
    with FlopCounterMode(display=False) as counter:
        trainer.step()
    total = counter.get_total_flops()
    samples = trainer.config.batch_size * trainer.config.accumulation_steps
    return total / samples if total else None
