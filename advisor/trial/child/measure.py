"""One training process's measurement: build the task, take the first step, warm up, time a window.

A single-process trial is exactly this; under DDP every rank runs it in its own process and
`advisor.trial.child.distributed` combines the ranks' results. Failures are data (`status`),
never an exception escaping to the caller.

Warm-up and window each keep to `trial_seconds` (`advisor.trial.child.budget`). From the warm-up
on, a search trial tells the parent how far it got, and the parent may stop it
(`advisor.trial.parent.runner`).
"""

from __future__ import annotations

import math
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from advisor.errors import AdvisorError, BadInputError
from advisor.knobs import TrialConfig
from advisor.results import FailurePhase, LrPlan, TaskSummary, TrialResult
from advisor.task import TrainingTask, build_task, user_batch_size
from advisor.trial.child.agreement import ParentWatch
from advisor.trial.child.budget import (
    TrialSteps,
    WindowTerms,
    estimated_cycle_s,
    timed_window,
    too_long_for_window,
    warm_up_trial,
)
from advisor.trial.child.gradient_noise import measure_gradient_norms
from advisor.trial.child.loop import DivergedError, Trainer
from advisor.trial.child.memory import PeakMemory
from advisor.trial.child.outcome import flops_per_sample, summarise, window_result
from advisor.trial.child.racer_state import load_racer, save_racer
from advisor.trial.child.racing import held_out_split, time_evaluation, train_racer
from advisor.trial.child.steps import Clock
from advisor.trial.child.warmup import FirstStep
from advisor.trial.child.window import Bounds, run_window
from advisor.trial.orders import (
    NoiseOrder,
    RaceOrder,
    ReferenceOrder,
    ValidateOrder,
    WindowOrder,
)
from advisor.trial.protocol import EARLY_STEPS, TrialRequest

__all__ = ["EARLY_STEPS", "first_micro_step", "measure_request"]


class _Phase:
    """The trial's current phase, mirrored to a file the parent polls for live progress."""

    def __init__(self, path: str | None) -> None:
        self._path = Path(path) if path else None
        self.name: FailurePhase = "build"

    def enter(self, name: FailurePhase) -> None:
        self.name = name
        if self._path is not None:
            with self._path.open("a") as phases:  # appended, so the parent misses none
                phases.write(name + "\n")


def measure_request(request: TrialRequest, rank: int = 0) -> TrialResult:
    """Measure this process's part of a trial; user-code failures become a status.

    Under DDP (`rank` is this process's rank) the process group is already initialised, and only
    rank 0 reports the phase to the parent.
    """
    phase = _Phase(request.channel.phase_path if rank == 0 else None)
    state = _SoFar(config=request.config)
    try:
        return _measure(request, rank, phase, state)
    except torch.OutOfMemoryError as exc:
        return _failed("oom", f"out of memory: {_first_line(exc)}", phase, state)
    except DivergedError as exc:
        return _failed("diverged", str(exc), phase, state)
    except AdvisorError as exc:  # advisor's own checks; the log keeps where they failed
        traceback.print_exc()
        state.error_type = type(exc).__name__
        state.input_error = exc.kind if isinstance(exc, BadInputError) else None
        reason = (
            f"the first training step failed: {exc}" if phase.name == "first_step" else str(exc)
        )
        return _failed("error", reason, phase, state)
    except Exception as exc:
        traceback.print_exc()
        state.error_type = type(exc).__name__
        reason = f"{type(exc).__name__}: {_first_line(exc)}"
        if phase.name == "first_step":
            reason = f"the first training step failed with {reason}"
        return _failed("error", reason, phase, state)


@dataclass
class _SoFar:
    """What a trial knew when it failed, for its result."""

    config: TrialConfig
    summary: TaskSummary | None = None
    startup_s: float | None = None
    error_type: str | None = None
    input_error: str | None = None


@dataclass
class _Built:
    """What every kind of trial starts from: the built task, its trainer, the memory meter."""

    request: TrialRequest
    task: TrainingTask
    kind: str
    trainer: Trainer
    memory: PeakMemory
    phase: _Phase
    state: _SoFar
    rank: int
    held_out: Dataset[Any] | None = None


def _measure(request: TrialRequest, rank: int, phase: _Phase, state: _SoFar) -> TrialResult:
    """Build the task and its trainer, then carry out the order (`_MEASURES`, by its type)."""
    _seed_everything(request.seed)
    # Dead ReLU units decay AdamW moments into denormals; without flushing, CPU steps slow down
    # mid-run and longer trials look worse. The generated script does the same.
    torch.set_flush_denormal(True)
    task, kind = build_task(request.spec, Path(request.cwd))
    order = request.order
    if isinstance(order, ValidateOrder):  # the user's own batch size, whatever the order said
        config = order.config.model_copy(update={"batch_size": user_batch_size(task)})
        order = order.model_copy(update={"config": config})
        request = request.model_copy(update={"order": order})
    config = state.config = request.config
    device = torch.device("cuda", rank) if config.device == "cuda" else torch.device("cpu")
    memory = PeakMemory(
        device, has_children=config.num_workers > 0, all_gpus=config.parallel_mode == "dp"
    )
    memory.start()
    held_out = None
    if isinstance(order, (RaceOrder, ReferenceOrder)):  # before the loader: none trains on it
        task, held_out = held_out_split(task, order.held_out)
    lr = order.lr if isinstance(order, (RaceOrder, ReferenceOrder)) else LrPlan()
    trainer = Trainer(task, config, device, rank=rank, seed=request.seed, lr=lr)
    built = _Built(request, task, kind, trainer, memory, phase, state, rank, held_out)
    return _MEASURES[type(order)](built)


def _first_step(built: _Built) -> tuple[FirstStep, list[float], TaskSummary, float]:
    """The first micro-step alone; the task's summary and the start-up time with it."""
    built.phase.enter("first_step")
    try:
        first, first_losses = first_micro_step(built.trainer)
    finally:  # also when the step fails: the batch it saw explains the failure
        built.state.summary = summarise(built.task, built.kind, built.trainer)
    startup_s = time.time() - built.request.channel.launched_at
    built.state.startup_s = startup_s
    return first, first_losses, built.state.summary, startup_s


def _validate(built: _Built) -> TrialResult:
    """One timed step at the user's batch size, then its FLOPs."""
    _, _, summary, startup_s = _first_step(built)
    trainer = built.trainer
    window = run_window(trainer, Bounds(max_steps=1, worker_rounds=0))
    flops = flops_per_sample(trainer)  # after the timed step: counting slows a step down
    trainer.close()
    summary = summary.model_copy(update={"flops_per_sample": flops})
    terms = WindowTerms(config=trainer.config, trial_seconds=built.request.trial_seconds)
    return window_result(terms, window, built.memory.stop(), summary, startup_s, warmup_s=0.0)


def _reference(built: _Built) -> TrialResult:
    """The first optimizer steps' losses from the seeded weights, untimed."""
    first, first_losses, summary, _ = _first_step(built)
    built.phase.enter("warmup")
    warmup = warm_up_trial(built.trainer, WindowTerms.of(built.request), None, first)
    built.trainer.close()
    early_losses = tuple((first_losses + warmup.losses)[:EARLY_STEPS])
    config = built.request.config
    return TrialResult(config=config, status="ok", early_losses=early_losses, task=summary)


def _window(built: _Built) -> TrialResult:
    """Warm up, then time a window (of whole cycles, or of a cycle's parts where one is too
    long for it)."""
    first, first_losses, summary, startup_s = _first_step(built)
    trainer, request, config = built.trainer, built.request, built.request.config
    terms = WindowTerms.of(request)
    built.phase.enter("warmup")
    channel = request.channel
    watch = ParentWatch(channel, config, built.rank) if channel.stop_path else None
    warmup = warm_up_trial(trainer, terms, watch, first)
    early_losses = tuple((first_losses + warmup.losses)[:EARLY_STEPS])
    stopped = TrialResult(  # if the parent stops it before it measured a step
        config=config,
        status="stopped",
        failure_phase="warmup",
        startup_s=startup_s,
        warmup_s=warmup.elapsed_s,
        first_step_s=first.seconds,
        early_losses=early_losses,
        task=summary,
    )
    if warmup.stopped_early:  # the parent stopped it: clearly slower than the best
        trainer.close()
        return stopped
    built.phase.enter("measure")
    estimate = _ranks_agree(trainer, too_long_for_window(warmup, terms, first))
    window = timed_window(trainer, terms, warmup, first, watch, estimate)
    trainer.close()
    cycle_s = estimated_cycle_s(window, config.accumulation_steps) if estimate else None
    if window.stopped_early and (not window.step_times_s or (estimate and cycle_s is None)):
        return stopped.model_copy(update={"failure_phase": "measure"})  # stopped: nothing timed
    if not estimate:  # a short warm-up leaves the first steps' losses to the window
        early_losses = tuple((first_losses + warmup.losses + window.losses)[:EARLY_STEPS])
    result = window_result(terms, window, built.memory.stop(), summary, startup_s, warmup.elapsed_s)
    return result.model_copy(update={"early_losses": early_losses, "first_step_s": first.seconds})


def _ranks_agree(trainer: Trainer, estimate: bool) -> bool:
    """Whether to time a cycle's parts: rank 0's decision, so that every DDP rank times the
    same micro-steps."""
    if trainer.config.world_size == 1:
        return estimate
    decision = torch.tensor([int(estimate)], device=trainer.device)
    dist.broadcast(decision, src=0)
    return bool(decision.item())


def first_micro_step(
    trainer: TrialSteps, *, clock: Clock = time.perf_counter
) -> tuple[FirstStep, list[float]]:
    """The first micro-step, alone: its one-off costs (compilation, lazy initialisation, the
    loader's first batch) stay out of every rate. Returns its seconds (read from `clock`), and
    the loss of the optimizer step it completed (without accumulation, the micro-step is the
    whole step)."""
    trainer.synchronize()
    started, waited_before = clock(), trainer.data_wait_s
    stepped = trainer.micro_step()
    trainer.synchronize()
    seconds = clock() - started
    losses = [trainer.last_loss.item()] if stepped else []
    if not all(math.isfinite(loss) for loss in losses):
        raise DivergedError(f"the loss became non-finite ({losses[0]} at the first step)")
    waited = trainer.data_wait_s - waited_before
    on_cuda = trainer.device.type == "cuda"
    return FirstStep(seconds, stepped, waited, predicts_steps=not on_cuda), losses


def _race(built: _Built) -> TrialResult:
    """Train for the order's seconds, the held-out loss recorded along the way."""
    order = built.request.order
    assert isinstance(order, RaceOrder)

    def race() -> dict[str, Any]:
        saved = Path(order.state) if order.state else None
        if saved is not None and order.continues is not None:
            load_racer(built.trainer, saved, built.request.seed)
        curve = train_racer(built.trainer, built.task, built.held_out, order)
        if saved is not None and order.continues is None:
            save_racer(built.trainer, saved)
        return {"race": curve}

    return _converged(built, race)


def _noise(built: _Built) -> TrialResult:
    """Gradient norms for the order's seconds, and what a held-out evaluation costs, so that
    the race's slice is affordable."""
    order, request = built.request.order, built.request
    assert isinstance(order, NoiseOrder)

    def noise() -> dict[str, Any]:
        trainer = built.trainer
        norms = measure_gradient_norms(trainer, order.seconds, max_steps=request.max_measure_steps)
        return {"gradient_norms": norms, "eval_s_per_sample": time_evaluation(trainer, built.task)}

    return _converged(built, noise)


def _converged(built: _Built, run: Callable[[], dict[str, Any]]) -> TrialResult:
    """A race or a noise trial: `run` trains and returns what its result adds."""
    built.phase.enter("measure")
    state = built.state
    state.startup_s = time.time() - built.request.channel.launched_at
    try:
        update = run()
    finally:  # the batch the first step saw explains a failure
        state.summary = summarise(built.task, built.kind, built.trainer)
    built.trainer.close()
    return TrialResult(
        config=built.request.config,
        status="ok",
        startup_s=state.startup_s,
        peak_memory_bytes=built.memory.stop(),
        task=state.summary,
        **update,
    )


# How each kind of order is carried out, once its task and trainer are built.
_MEASURES: dict[type, Callable[[_Built], TrialResult]] = {
    WindowOrder: _window,
    ValidateOrder: _validate,
    ReferenceOrder: _reference,
    RaceOrder: _race,
    NoiseOrder: _noise,
}


def _failed(status: str, reason: str, phase: _Phase, state: _SoFar) -> TrialResult:
    print(f"advisor: trial {status} during {phase.name}: {reason}", file=sys.stderr)
    return TrialResult(
        config=state.config,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        failure_phase=phase.name,
        error_type=state.error_type,
        input_error=state.input_error,
        startup_s=state.startup_s,
        task=state.summary,
    )


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def _first_line(exc: BaseException) -> str:
    """The message's first line; for an error re-raised from a DataLoader worker, where the
    first line only says which worker, that line and the worker's own exception line."""
    lines = str(exc).strip().splitlines()
    if not lines:
        return type(exc).__name__
    if "Original Traceback" in str(exc) and len(lines) > 1:
        return f"{lines[0]} {lines[-1].strip()}"
    return lines[0]
