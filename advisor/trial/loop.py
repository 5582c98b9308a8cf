"""The training loop a trial measures: exactly the knobs of one `TrialConfig`.

The generated `train.py` (templates/train.py.j2) does the same steps; keep the two in line.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from advisor.convergence import LrPlan
from advisor.errors import ContractError
from advisor.knobs import ParallelMode, TrialConfig
from advisor.task import TrainingTask
from advisor.trial.batches import (
    BatchKind,
    batch_kind,
    compute_loss,
    describe_batch,
    to_channels_last,
    to_device,
)
from advisor.trial.probe import usable_cores

__all__ = [
    "Agreement",
    "Bounds",
    "DivergedError",
    "Trainer",
    "Window",
    "WindowMonitor",
    "apply_lr",
    "run_window",
    "warm_up",
    "wrap_model",
]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
BENCHMARK_EXTRA_STEPS = 5  # cudnn.benchmark autotunes every new shape on its first calls
SCALER_STABLE_STEPS = 3  # fp16: the loss scale must have stopped backing off
SCALER_MAX_STEPS = 50


class Agreement(Protocol):
    """How DDP ranks decide together when a window ends."""

    def all_done(self, steps: int, done: bool) -> bool:
        """Whether every rank is done; each rank calls it after the same steps."""
        ...


class WindowMonitor(Protocol):
    """Watches a trial as it runs; called after every micro-step, True once it should stop."""

    def __call__(self) -> bool: ...


class DivergedError(ArithmeticError):
    """A loss was NaN or infinite."""


class Trainer:
    """Model, optimizer, loader and AMP for one configuration; `step()` is one optimizer step,
    `micro_step()` one micro-batch of it.

    An optimizer step takes a cycle of `cycle` micro-batches: the configuration's accumulation
    steps, unless a measurement shortens it (`advisor.trial.measure`: a cycle too long for the
    window is timed in parts). Under DDP this is one rank: the process group must be initialised
    before, and `rank` picks this process's shard of the dataset.
    """

    def __init__(
        self,
        task: TrainingTask,
        config: TrialConfig,
        device: torch.device,
        *,
        rank: int = 0,
        seed: int = 0,
        lr: LrPlan | None = None,
    ) -> None:
        self.config = config
        self.device = device
        torch.set_num_threads(config.main_process_threads(usable_cores()))
        torch.backends.cudnn.benchmark = config.cudnn_benchmark
        torch.backends.cudnn.deterministic = config.cudnn_deterministic
        torch.set_float32_matmul_precision(config.matmul_precision)
        model = task.model.to(device)
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        self.module = model  # unwrapped and uncompiled, sharing the parameters
        self.model = compiled(wrap_model(model, config.parallel_mode, device), config.compile)
        self.optimizer = (task.optimizer or default_optimizer(config))(model.parameters())
        self.lr = lr or LrPlan()
        self.scheduler = apply_lr(self.optimizer, self.lr)
        self.loss_fn = task.loss_fn
        self.sampler = _sampler(task, config, rank, seed)
        self.loader = _build_loader(task, config, self.sampler)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")
        self.data_wait_s = 0.0
        self.first_batch: str | None = None
        self.first_batch_kind: BatchKind | None = None
        self.cycle = config.accumulation_steps
        self.last_loss = torch.zeros((), device=device)  # of the last optimizer step
        self._micro_done = 0  # of the current cycle
        self._cycle_loss = torch.zeros((), device=device)
        self._batches = self._endless_batches()

    def step(self, on_backward: Callable[[int], None] | None = None) -> torch.Tensor:
        """The rest of the current optimizer step (a whole one between steps); returns its
        mean loss.

        `on_backward(micro)` sees the gradients after each micro-step's backward pass (after
        the last one they are complete, and all-reduced under DDP).
        """
        while not self.micro_step(on_backward):
            pass
        return self.last_loss

    def micro_step(self, on_backward: Callable[[int], None] | None = None) -> bool:
        """One micro-batch's forward and backward pass, and after the cycle's last the
        optimizer step (then `last_loss` holds its mean loss); returns whether it stepped."""
        micro = self._micro_done
        final = micro + 1 >= self.cycle
        batch = next(self._batches)
        with self._gradient_sync(final=final):
            with self._autocast():
                loss = compute_loss(self.model, batch, self.loss_fn)
            self.scaler.scale(loss / self.config.accumulation_steps).backward()
        if on_backward is not None:
            on_backward(micro)
        self._cycle_loss += loss.detach().float()
        self._micro_done += 1
        if not final:
            return False
        self.last_loss = self._cycle_loss / self._micro_done
        self._cycle_loss = torch.zeros((), device=self.device)
        self._micro_done = 0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return True

    def close(self) -> None:
        """Stop the loader's worker processes now rather than at garbage collection."""
        self._batches.close()
        iterator = getattr(self.loader, "_iterator", None)  # kept alive by persistent_workers
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _gradient_sync(self, *, final: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP all-reduces gradients on the last micro-step of an optimizer step only."""
        ddp = getattr(self.model, "_orig_mod", self.model)  # under torch.compile too
        if final or not isinstance(ddp, DistributedDataParallel):
            return contextlib.nullcontext()
        return ddp.no_sync()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.config.amp])

    def _endless_batches(self) -> Generator[Any, None, None]:
        non_blocking = self.config.pin_memory
        epoch = 0
        while True:
            if self.sampler is not None:
                self.sampler.set_epoch(epoch)  # a new shuffle per epoch, the same on every rank
            epoch += 1
            yielded = False
            iterator = iter(self.loader)
            while True:
                started = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                self.data_wait_s += time.perf_counter() - started
                if self.first_batch is None:
                    self.first_batch = describe_batch(batch)
                    self.first_batch_kind = batch_kind(batch)
                yielded = True
                batch = to_device(batch, self.device, non_blocking)
                yield to_channels_last(batch) if self.config.channels_last else batch
            if not yielded:
                raise ContractError(
                    f"the loader yields no full batch of {self.config.batch_size}: "
                    "the dataset is smaller than the batch size"
                )


def apply_lr(optimizer: torch.optim.Optimizer, plan: LrPlan) -> LambdaLR | None:
    """Scale every parameter group's learning rate by `plan.scale`; with a warm-up, return the
    scheduler that ramps it linearly over the first `plan.warmup_steps` steps (step it after
    each optimizer step). The generated train.py does the same."""
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * plan.scale
    if not plan.warmup_steps:
        return None
    steps = plan.warmup_steps
    return LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / steps))


def default_optimizer(config: TrialConfig) -> Callable[[Any], torch.optim.Optimizer]:
    """AdamW(lr=1e-3) in the implementation the configuration names: torch's choice (a
    for-loop on CPU, foreach on CUDA), foreach, or fused."""
    foreach = True if config.optimizer_impl == "foreach" else None
    fused = True if config.optimizer_impl == "fused" else None
    return lambda params: torch.optim.AdamW(params, lr=1e-3, foreach=foreach, fused=fused)


def compiled(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """`torch.compile` in `mode` ("default" is torch's default mode); the model as is if off.

    A DDP model is compiled as a whole, so that Dynamo splits its graph at the gradient
    buckets and the all-reduces still overlap the backward pass.
    """
    if mode == "off":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)  # type: ignore[return-value]


def wrap_model(model: torch.nn.Module, mode: ParallelMode, device: torch.device) -> torch.nn.Module:
    """The model as the parallel mode runs it; DDP needs an initialised process group."""
    if mode == "ddp":
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if mode == "dp":  # splits each batch over every visible GPU, gathers on the first
        return torch.nn.DataParallel(model)
    return model


def _sampler(
    task: TrainingTask, config: TrialConfig, rank: int, seed: int
) -> DistributedSampler[Any] | None:
    """Under DDP each rank reads its own shard: `len(dataset) // world_size` samples."""
    if config.parallel_mode != "ddp":
        return None
    if isinstance(task.dataset, IterableDataset):
        raise ContractError(
            "DDP needs a map-style dataset to shard; an IterableDataset has no index"
        )
    return DistributedSampler(
        task.dataset,
        num_replicas=config.world_size,
        rank=rank,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )


def _build_loader(
    task: TrainingTask, config: TrialConfig, sampler: DistributedSampler[Any] | None
) -> DataLoader[Any]:
    dataset = task.dataset
    iterable = isinstance(dataset, IterableDataset)
    if not iterable:
        per_process = len(dataset) // config.world_size
        if per_process < config.batch_size:
            shard = f"the {per_process} samples each of {config.world_size} ranks reads"
            whole = f"the dataset's {len(dataset)} samples"
            raise ContractError(
                f"batch size {config.batch_size} exceeds "
                f"{shard if config.world_size > 1 else whole}"
            )
    workers = config.num_workers
    return DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=not iterable and sampler is None,
        sampler=sampler,
        num_workers=workers,
        prefetch_factor=config.prefetch_factor if workers else None,
        # Kept between epochs unless the config says otherwise: a new set of workers per epoch
        # costs a fork and a warm-up each time.
        persistent_workers=config.persistent_workers and workers > 0,
        pin_memory=config.pin_memory,
        drop_last=True,  # a partial last batch would change shapes mid-window
        collate_fn=task.collate_fn,
    )


@dataclass
class Window:
    """Micro-steps run back to back, timed between device synchronisations."""

    steps: int = 0  # optimizer steps completed
    micro_batches: int = 0
    elapsed_s: float = 0.0
    data_wait_s: float = 0.0
    stopped_early: bool = False  # the monitor ended it
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    # With `time_micro`: each micro-step's seconds, and whether it ended with the optimizer step.
    micro_times_s: list[tuple[float, bool]] = field(default_factory=list)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.step_times_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_times_s)

    def median_micro_s(self, *, stepped: bool) -> float | None:
        """The median seconds of the timed micro-steps that did (or did not) end a step."""
        times = [seconds for seconds, final in self.micro_times_s if final == stepped]
        return statistics.median(times) if times else None


@dataclass(frozen=True)
class Bounds:
    """When a window may end: the minimums, and the limits that end it regardless."""

    min_steps: int = 1
    min_seconds: float = 0.0
    max_steps: int | None = None
    max_seconds: float | None = None  # a budget: ends it even before the minimums
    cover_worker_cycles: bool = True
    stop_at_once: bool = False  # the monitor's stop ends it even before the minimums
    # DDP ranks decide after every micro-step, not only after optimizer steps: a budget then
    # ends a long cycle in its middle on every rank alike.
    agree_every_micro_step: bool = False


def run_window(
    trainer: Trainer,
    bounds: Bounds,
    *,
    agree: Agreement | None = None,
    monitor: WindowMonitor | None = None,
    time_micro: bool = False,
) -> Window:
    """Run micro-steps until the bounds say, then check the losses.

    The window also spans at least two full worker cycles (`num_workers × prefetch_factor`
    micro-batches): loaders with workers deliver batches in bursts. A `monitor` may end the
    window before `min_seconds`, never before the other minimums unless `stop_at_once`. DDP
    ranks pass `agree` and decide only after optimizer steps: they stop together, once every
    rank is done (one waiting for the others would hang). `time_micro` times every micro-step,
    synchronising the device after each.
    """
    config = trainer.config
    min_micro = 2 * config.num_workers * config.prefetch_factor if bounds.cover_worker_cycles else 0
    window = Window()
    loss_tensors = []
    trainer.synchronize()
    wait_before = trainer.data_wait_s
    started = last_step = last_micro = time.perf_counter()
    while True:
        stepped = trainer.micro_step()
        if time_micro:
            trainer.synchronize()
        now = time.perf_counter()
        window.micro_batches += 1
        if time_micro:
            window.micro_times_s.append((now - last_micro, stepped))
        last_micro = now
        if stepped:
            loss_tensors.append(trainer.last_loss)
            window.step_times_s.append(now - last_step)
            last_step = now
            window.steps += 1
        stop = monitor is not None and monitor()
        if agree is not None and not stepped and not bounds.agree_every_micro_step:
            continue
        done = _window_done(window, bounds, min_micro, stop, now - started)
        if agree is not None:
            done = agree.all_done(window.steps, done)
        if done or (stepped and window.steps == bounds.max_steps):
            window.stopped_early = stop and (
                bounds.stop_at_once or now - started < bounds.min_seconds
            )
            break
    trainer.synchronize()
    window.elapsed_s = time.perf_counter() - started
    window.data_wait_s = trainer.data_wait_s - wait_before
    window.losses = torch.stack(loss_tensors).cpu().tolist() if loss_tensors else []
    if not all(torch.isfinite(torch.tensor(window.losses))):
        raise DivergedError(f"the loss became non-finite ({_first_bad(window.losses)})")
    return window


def _window_done(
    window: Window, bounds: Bounds, min_micro: int, stop: bool, elapsed: float
) -> bool:
    if (stop and bounds.stop_at_once) or (
        bounds.max_seconds is not None and elapsed >= bounds.max_seconds
    ):
        return True
    minimums = window.steps >= bounds.min_steps and window.micro_batches >= min_micro
    return minimums and (stop or elapsed >= bounds.min_seconds)


def warm_up(
    trainer: Trainer,
    steps: int,
    budget_s: float | None = None,
    *,
    agree: Agreement | None = None,
    monitor: WindowMonitor | None = None,
    whole_steps: bool = False,
) -> Window:
    """Run past everything that makes early steps unrepresentative; return the warm-up window,
    every micro-step timed.

    At least `steps` optimizer steps and two loader worker cycles; more with cudnn.benchmark
    (autotuning); with fp16, until the GradScaler's scale has settled, since it starts at 2^16
    and skips optimizer steps while it backs off. All of it within `budget_s` seconds: a
    configuration whose steps are that slow ends its warm-up early, even within a step (its
    window then times the parts of a step: `advisor.trial.measure`). With `whole_steps` the
    budget ends it only after an optimizer step, and after one at the least. The monitor's stop
    ends it at once. DDP ranks pass `agree`, and end it together after an optimizer step.
    """
    extra = BENCHMARK_EXTRA_STEPS if trainer.config.cudnn_benchmark else 0
    bounds = (
        Bounds(
            min_steps=1 + extra,
            min_seconds=budget_s,
            max_steps=steps + extra,
            stop_at_once=True,
        )
        if whole_steps and budget_s is not None
        else Bounds(
            min_steps=steps + extra,
            max_seconds=budget_s,
            stop_at_once=True,
            agree_every_micro_step=budget_s is not None,
        )
    )
    started = time.perf_counter()
    window = run_window(trainer, bounds, agree=agree, monitor=monitor, time_micro=True)
    if not trainer.scaler.is_enabled() or window.stopped_early:
        return window
    scale, stable = trainer.scaler.get_scale(), 0
    for _ in range(SCALER_MAX_STEPS):
        left = None if budget_s is None else budget_s - (time.perf_counter() - started)
        done = stable >= SCALER_STABLE_STEPS or (left is not None and left <= 0)
        if agree is not None:  # each rank's clock started apart: they end it together
            done = agree.all_done(window.steps, done)
        if done:
            break
        one = Bounds(
            max_seconds=None if whole_steps else left, cover_worker_cycles=False, stop_at_once=True
        )
        settling = run_window(trainer, one, agree=agree, monitor=monitor)
        window.losses += settling.losses  # every step's loss, in order: the early losses
        if settling.stopped_early:
            window.stopped_early = True
            break
        previous, scale = scale, trainer.scaler.get_scale()
        stable = stable + 1 if scale == previous else 0
    return window


def _first_bad(losses: list[float]) -> str:
    for index, value in enumerate(losses):
        if value != value or value in (float("inf"), float("-inf")):
            return f"{value} at step {index + 1} of the window"
    return "unknown"
