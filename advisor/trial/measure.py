"""One training process's measurement: build the task, take the first step, warm up, time a window.

A single-process trial is exactly this; under DDP every rank runs it in its own process and
`advisor.trial.distributed` combines the ranks' results. Failures are data (`status`), never an
exception escaping to the caller.
"""

from __future__ import annotations

import math
import random
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import Dataset
from torch.utils.flop_counter import FlopCounterMode

from advisor.errors import AdvisorError, BadInputError
from advisor.knobs import TrialConfig
from advisor.results import FailurePhase, TaskSummary, TrialResult
from advisor.task import TrainingTask, build_task, user_batch_size
from advisor.trial.convergence import held_out_split, measure_gradient_norms, run_race
from advisor.trial.loop import DivergedError, Trainer, Window, run_window, warm_up
from advisor.trial.memory import PeakMemory
from advisor.trial.protocol import TrialRequest

__all__ = ["EARLY_STEPS", "measure_request"]

# Optimizer steps whose losses the numerics check compares (advisor.search.checks).
EARLY_STEPS = 3


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
    phase = _Phase(request.phase_path if rank == 0 else None)
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


def _measure(request: TrialRequest, rank: int, phase: _Phase, state: _SoFar) -> TrialResult:
    """Build, take the first step, warm up, then time a window."""
    _seed_everything(request.seed)
    # Dead ReLU units decay AdamW moments into denormals; without flushing, CPU steps slow down
    # mid-run and longer trials look worse. The generated script does the same.
    torch.set_flush_denormal(True)
    task, kind = build_task(request.spec, Path(request.cwd))
    if request.mode == "validate":  # the user's own batch size, whatever the request said
        request = request.model_copy(
            update={
                "config": request.config.model_copy(update={"batch_size": user_batch_size(task)})
            }
        )
    state.config = request.config
    config = request.config
    device = torch.device("cuda", rank) if config.device == "cuda" else torch.device("cpu")
    memory = PeakMemory(
        device, has_children=config.num_workers > 0, all_gpus=config.parallel_mode == "dp"
    )
    memory.start()
    held_out = None
    if request.mode == "race":  # before the loader is built: no racer trains on the slice
        task, held_out = held_out_split(task)
    trainer = Trainer(task, config, device, rank=rank, seed=request.seed, lr=request.lr)
    if request.mode in ("race", "noise"):
        return _converged(request, task, kind, trainer, held_out, memory, phase, state)
    phase.enter("first_step")
    try:
        first = run_window(trainer, min_steps=1, cover_worker_cycles=False)
    finally:  # also when the step fails: the batch it saw explains the failure
        state.summary = _summarise(task, kind, trainer)
    startup_s = time.time() - request.launched_at
    state.startup_s = startup_s
    summary = state.summary
    if request.mode == "validate":
        return _validated(request, trainer, memory, summary, startup_s)
    phase.enter("warmup")
    warmup_started = time.perf_counter()
    warmup = warm_up(trainer, max(request.warmup_steps, EARLY_STEPS - 1))
    warmup_s = time.perf_counter() - warmup_started
    early_losses = tuple((first.losses + warmup.losses)[:EARLY_STEPS])
    if request.mode == "reference":
        trainer.close()
        return TrialResult(config=config, status="ok", early_losses=early_losses, task=summary)
    phase.enter("measure")
    window = _timed_window(trainer, request, warmup, rank)
    trainer.close()
    result = _measured(request, window, memory.stop(), summary, startup_s, warmup_s)
    return result.model_copy(update={"early_losses": early_losses, "first_step_s": first.elapsed_s})


def _converged(
    request: TrialRequest,
    task: TrainingTask,
    kind: str,
    trainer: Trainer,
    held_out: Dataset[Any] | None,
    memory: PeakMemory,
    phase: _Phase,
    state: _SoFar,
) -> TrialResult:
    """A race (the loss against training time) or a noise trial (gradient norms)."""
    phase.enter("measure")
    state.startup_s = time.time() - request.launched_at
    try:
        if request.mode == "race":
            curve = run_race(trainer, task, held_out, request.trial_seconds)
            update: dict[str, Any] = {"race": curve}
        else:
            update = {"gradient_norms": measure_gradient_norms(trainer, request.trial_seconds)}
    finally:  # the batch the first step saw explains a failure
        state.summary = _summarise(task, kind, trainer)
    trainer.close()
    return TrialResult(
        config=request.config,
        status="ok",
        startup_s=state.startup_s,
        peak_memory_bytes=memory.stop(),
        task=state.summary,
        **update,
    )


def _timed_window(trainer: Trainer, request: TrialRequest, warmup: Window, rank: int) -> Window:
    """The measured window: at least `trial_seconds`, on every DDP rank, unless the parent
    watching it ends it early."""
    watch = _ParentWatch(request, trainer.config, rank) if request.stop_path else None
    agree = None
    if trainer.config.world_size > 1:
        dist.barrier()  # all windows start together
        agree = _RankAgreement(
            trainer.device,
            request.trial_seconds,
            warmup.median_step_s,
            check_every_s=_ParentWatch.INTERVAL_S if watch else None,
        )
    return run_window(
        trainer,
        min_steps=3,
        min_seconds=request.trial_seconds,
        max_steps=request.max_measure_steps,
        agree=agree,
        monitor=watch,
    )


class _ParentWatch:
    """Tells the parent how fast the window runs, and ends it when the parent asks.

    Every `INTERVAL_S`, rank 0 appends "elapsed_s samples" (all ranks' samples, estimated from
    its own) to the progress file, and every rank looks for the stop file. DDP ranks then stop
    at their next agreement check.
    """

    INTERVAL_S = 0.1

    def __init__(self, request: TrialRequest, config: TrialConfig, rank: int) -> None:
        self._progress = Path(request.progress_path) if request.progress_path and not rank else None
        self._stop = Path(request.stop_path) if request.stop_path else None
        self._samples_per_micro_batch = config.batch_size * config.world_size
        self._next_s = self.INTERVAL_S
        self._stopping = False

    def __call__(self, elapsed_s: float, micro_batches: int) -> bool:
        if self._stopping or elapsed_s < self._next_s:
            return self._stopping
        self._next_s = elapsed_s + self.INTERVAL_S
        if self._progress is not None:
            with self._progress.open("a") as progress:
                progress.write(f"{elapsed_s:.4f} {micro_batches * self._samples_per_micro_batch}\n")
        self._stopping = self._stop is not None and self._stop.exists()
        return self._stopping


class _RankAgreement:
    """DDP ranks end their windows together, once every rank has run its minimum.

    Each check is an all-reduce, so ranks check rarely, all after the same steps: the first
    check comes after a quarter of the window as the warm-up predicts it, each later one where
    the time still missing says (the earliest any rank proposes). A window the parent may end
    early is checked about every `check_every_s` (an all-reduce of two integers: tens of
    microseconds over gloo), so that the ranks stop soon after the parent asks.
    """

    FIRST_CHECK_FRACTION = 4

    def __init__(
        self, device: torch.device, seconds: float, step_s: float, check_every_s: float | None
    ) -> None:
        self._device = device
        self._seconds = seconds
        step_s = max(step_s, 1e-9)
        expected = math.ceil(seconds / step_s)
        self._max_gap = math.ceil(check_every_s / step_s) if check_every_s else expected
        first = min(expected // self.FIRST_CHECK_FRACTION, self._max_gap)
        self._next_check = self._earliest(max(1, first))
        self._started = time.perf_counter()

    def all_done(self, steps: int, done: bool) -> bool:
        if steps < self._next_check:
            return False
        elapsed = time.perf_counter() - self._started
        missing_s = max(0.0, self._seconds - elapsed)
        gap = min(max(1, math.ceil(missing_s * steps / elapsed)), self._max_gap)
        proposal = steps + gap if not done else steps
        flags = torch.tensor([int(done), proposal], device=self._device)
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        self._next_check = max(int(flags[1].item()), steps + 1)
        return bool(flags[0].item())

    def _earliest(self, proposal: int) -> int:
        value = torch.tensor([proposal], device=self._device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return int(value.item())


def _validated(
    request: TrialRequest,
    trainer: Trainer,
    memory: PeakMemory,
    summary: TaskSummary,
    startup: float,
) -> TrialResult:
    window = run_window(trainer, min_steps=1, max_steps=1, cover_worker_cycles=False)
    flops = _flops_per_sample(trainer)  # after the timed step: counting slows a step down
    trainer.close()
    summary = summary.model_copy(update={"flops_per_sample": flops})
    return _measured(request, window, memory.stop(), summary, startup, warmup_s=0.0)


def _flops_per_sample(trainer: Trainer) -> float | None:
    """Forward and backward FLOPs of one training step per sample, as torch counts them
    (matmuls, convolutions, attention; elementwise work is not counted)."""
    with FlopCounterMode(display=False) as counter:
        trainer.step()
    total = counter.get_total_flops()
    samples = trainer.config.batch_size * trainer.config.accumulation_steps
    return total / samples if total else None


def _measured(
    request: TrialRequest,
    window: Window,
    peak_memory: int,
    summary: TaskSummary,
    startup_s: float,
    warmup_s: float,
) -> TrialResult:
    config = request.config
    samples = window.micro_batches * config.batch_size  # this process's; ranks are summed later
    return TrialResult(
        config=config,
        status="ok",
        samples_per_s=samples / window.elapsed_s,
        step_time_median_s=window.median_step_s,
        step_time_p10_s=window.percentile(0.1),
        step_time_p90_s=window.percentile(0.9),
        data_wait_fraction=min(1.0, window.data_wait_s / window.elapsed_s),
        peak_memory_bytes=peak_memory,
        startup_s=startup_s,
        warmup_s=warmup_s,
        window_s=window.elapsed_s,
        steps_measured=window.steps,
        samples_measured=samples,
        losses=tuple(window.losses[:200]),
        stopped_early=window.stopped_early,
        task=summary,
    )


def _summarise(task: TrainingTask, kind: str, trainer: Trainer) -> TaskSummary:
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
        optimizer_class=type(trainer.optimizer).__name__,
    )


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
