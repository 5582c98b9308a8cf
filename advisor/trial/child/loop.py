"""The training loop a trial measures: exactly the knobs of one `TrialConfig`.

The generated `train.py` (templates/train.py.j2) does the same steps; keep the two in line.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset
from torch.utils.data._utils import signal_handling

from advisor.errors import ContractError
from advisor.knobs import TrialConfig
from advisor.results import LrPlan
from advisor.task import TrainingTask
from advisor.trial.child.batches import (
    BatchKind,
    batch_kind,
    compute_loss,
    describe_batch,
    to_channels_last,
    to_device,
)
from advisor.trial.child.blocks import checkpoint_blocks, repeated_block, shard_blocks
from advisor.trial.child.hardware import usable_cores

__all__ = ["DivergedError", "Trainer", "apply_lr", "wrap_model"]

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


class DivergedError(ArithmeticError):
    """A loss was NaN or infinite."""


class Trainer:
    """Model, optimizer, loader and AMP for one configuration; `step()` is one optimizer step,
    `micro_step()` one micro-batch of it.

    An optimizer step takes a cycle of `cycle` micro-batches: the configuration's accumulation
    steps, unless a measurement shortens it (`advisor.trial.child.budget`: a cycle too long for the
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
        # FSDP's unit, found before checkpointing wraps it
        block = repeated_block(model) if config.parallel_mode == "fsdp" else None
        if config.activation_checkpointing != "off":
            checkpoint_blocks(model, config.activation_checkpointing)
        if config.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        self.module = model  # unwrapped and uncompiled, sharing the parameters
        self.model = compiled(wrap_model(model, config, device, block), config.compile)
        self.optimizer = (task.optimizer or default_optimizer(config))(model.parameters())
        self.lr = lr or LrPlan()
        self.scheduler = apply_lr(self.optimizer, self.lr)
        self.loss_fn = task.loss_fn
        self._task = task
        self._base_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self._seed = seed
        self.sampler = _sampler(task, config, rank, seed)
        self.loader = _build_loader(task, config, self.sampler, seed)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.amp == "fp16")
        self.data_wait_s = 0.0
        self.first_batch: str | None = None
        self.first_batch_kind: BatchKind | None = None
        self.cycle = config.accumulation_steps
        self.last_loss = torch.zeros((), device=device)  # of the last optimizer step
        self._micro_done = 0  # of the current cycle
        self._cycle_loss = torch.zeros((), device=device)  # of the micro-batches in the gradients
        self._cycle_micro = 0  # those micro-batches
        self._iterator: Iterator[Any] | None = None  # over the loader's current epoch
        # of the loader's shuffle: a new loader (`regroup`) goes on from the next
        self.epochs_begun = 0
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
            self.scaler.scale(loss / self.cycle).backward()
        if on_backward is not None:
            on_backward(micro)
        self._cycle_loss += loss.detach().float()
        self._cycle_micro += 1
        self._micro_done += 1
        if not final:
            return False
        self.last_loss = self._cycle_loss / self._cycle_micro
        self._cycle_loss = torch.zeros((), device=self.device)
        self._micro_done = self._cycle_micro = 0
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return True

    def restart_cycle(self, cycle: int) -> None:
        """From now on, cycles of `cycle` micro-batches, the next micro-step the first of one.

        A window that times a cycle's parts (`advisor.trial.child.budget`) starts so, even where the
        first micro-step or the warm-up began a cycle: the micro-batches it accumulated stay
        in the gradients that the next optimizer step applies (a timing does not depend on
        them), and their losses in its mean loss, whose check for a non-finite loss they join.
        Before, such a window began with the stepped micro-step that ended the cycle begun
        earlier, a micro-step it could not pair and did not count, on examples/data_bound.py
        one of five (0.6 s) in a DDP search trial."""
        self.cycle = cycle
        self._micro_done = 0

    def regroup(self, batch_size: int, accumulation_steps: int) -> None:
        """From the next optimizer step on, micro-batches of `batch_size` and
        `accumulation_steps` of them per step (a stage of a batch-size schedule); call it
        between optimizer steps. A new micro-batch size gets a new loader, from a new epoch."""
        if batch_size != self.config.batch_size:
            self._stop_loader()
            self.config = self.config.model_copy(update={"batch_size": batch_size})
            self.loader = _build_loader(self._task, self.config, self.sampler, self._seed)
            self._batches = self._endless_batches()
        self.config = self.config.model_copy(update={"accumulation_steps": accumulation_steps})
        self.cycle = accumulation_steps
        self._micro_done = 0

    def scale_lr(self, scale: float) -> None:
        """Every parameter group's learning rate: the one the optimizer was built with (times
        the racer's `LrPlan`), times `scale`."""
        for group, base in zip(self.optimizer.param_groups, self._base_lrs, strict=True):
            group["lr"] = base * scale

    def next_batch(self) -> Any:
        """The next micro-batch of the training stream, on the device."""
        return next(self._batches)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The forward pass's autocast, as the configuration trains."""
        return self._autocast()

    def close(self) -> None:
        """Stop the loader's worker processes now rather than at garbage collection.

        They are killed: asked to stop, a worker first finishes the batch it is building (0.6 s
        of every trial at 512 decoded images, examples/data_bound.py).
        """
        self._stop_loader()

    def _stop_loader(self) -> None:
        persistent = getattr(self.loader, "_iterator", None)  # kept alive by persistent_workers
        for iterator in {
            id(it): it for it in (self._iterator, persistent) if it is not None
        }.values():
            _kill_workers(iterator)
        self._batches.close()
        self._iterator = None

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _gradient_sync(self, *, final: bool) -> contextlib.AbstractContextManager[Any]:
        """DDP all-reduces, and FSDP reduce-scatters, gradients on the last micro-step of an
        optimizer step only (FSDP keeps the others' unsharded until then)."""
        wrapped = getattr(self.model, "_orig_mod", self.model)  # under torch.compile too
        if self.config.parallel_mode == "fsdp":
            from torch.distributed.fsdp import FSDPModule  # imported by `wrap_model` already

            assert isinstance(wrapped, FSDPModule)
            wrapped.set_requires_gradient_sync(final)
            return contextlib.nullcontext()
        if final or not isinstance(wrapped, DistributedDataParallel):
            return contextlib.nullcontext()
        return wrapped.no_sync()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.config.amp == "off":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=AMP_DTYPES[self.config.amp])

    def _endless_batches(self) -> Generator[Any, None, None]:
        non_blocking = self.config.pin_memory
        while True:
            if self.sampler is not None:  # a new shuffle per pass, the same on every rank
                self.sampler.set_epoch(self.epochs_begun)
            self.epochs_begun += 1
            yielded = False
            iterator = self._iterator = iter(self.loader)
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


def _kill_workers(iterator: Any) -> None:
    """SIGKILL a loader iterator's workers, once the loader no longer watches them (its SIGCHLD
    handler would take their deaths for crashes), and release what they leave in place of the
    iterator's own shutdown.

    That shutdown (`_shutdown_workers`, also run when the iterator is collected) sets and reads
    the workers' done event, whose lock a worker takes each time it checks the event. A worker
    killed while checking it holds that lock forever, and the shutdown hangs: one trial of
    examples/data_bound.py hung so until its timeout.
    """
    workers = getattr(iterator, "_workers", ())
    if not workers:
        return
    if getattr(iterator, "_worker_pids_set", False):
        signal_handling._remove_worker_pids(id(iterator))
        iterator._worker_pids_set = False
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join()
    iterator._shutdown = True  # torch's shutdown: nothing left
    queues = list(getattr(iterator, "_index_queues", ()))
    if hasattr(iterator, "_pin_memory_thread"):  # it polls its event, then ends (a daemon)
        iterator._pin_memory_thread_done_event.set()
    else:  # nothing reads the results but the iterator
        queues.append(iterator._worker_result_queue)
    for queue in queues:
        queue.cancel_join_thread()
        queue.close()


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


def wrap_model(
    model: torch.nn.Module, config: TrialConfig, device: torch.device, block: str | None = None
) -> torch.nn.Module:
    """The model as the parallel mode runs it; DDP and FSDP need an initialised process group.
    FSDP shards the model in place, each `block` (the model's repeated block, found before any
    checkpoint wrapper hid it) a unit of its own (`advisor.trial.child.blocks.shard_blocks`)."""
    if config.parallel_mode == "ddp":
        return DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            bucket_cap_mb=config.bucket_cap_mb,
            gradient_as_bucket_view=config.gradient_as_bucket_view,
        )
    if config.parallel_mode == "fsdp":  # imported here: 0.3 s of every launcher's start
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dtype = AMP_DTYPES.get(config.amp)
        shard_blocks(
            model,
            block,
            init_device_mesh(device.type, (config.world_size,)),  # the device named: #132471
            MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None),
            reshard_after_forward=config.reshard_after_forward,
        )
        return model
    if (
        config.parallel_mode == "dp"
    ):  # splits each batch over every visible GPU, gathers on the first
        return torch.nn.DataParallel(model)
    return model


def _sampler(
    task: TrainingTask, config: TrialConfig, rank: int, seed: int
) -> DistributedSampler[Any] | None:
    """Each pass's shuffle, seeded by `seed` and the pass (as train.py's `DataOrder`); under
    DDP and FSDP each rank reads its own shard, `len(dataset) // world_size` samples. None for
    an IterableDataset, which has no index."""
    if isinstance(task.dataset, IterableDataset):
        if config.distributed:
            raise ContractError(
                f"{config.parallel_mode.upper()} needs a map-style dataset to shard; an "
                "IterableDataset has no index"
            )
        return None
    replicas = config.world_size if config.distributed else 1
    return DistributedSampler(
        task.dataset,
        num_replicas=replicas,
        rank=rank if config.distributed else 0,
        shuffle=True,
        seed=seed,
        drop_last=True,
    )


def _build_loader(
    task: TrainingTask, config: TrialConfig, sampler: DistributedSampler[Any] | None, seed: int
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
        sampler=sampler,
        num_workers=workers,
        prefetch_factor=config.prefetch_factor if workers else None,
        # Kept between epochs unless the config says otherwise: a new set of workers per epoch
        # costs a fork and a warm-up each time.
        persistent_workers=config.persistent_workers and workers > 0,
        pin_memory=config.pin_memory,
        drop_last=True,  # a partial last batch would change shapes mid-window
        collate_fn=task.collate_fn,
        # The workers' seeds, drawn apart from the model's random stream (as in train.py)
        generator=torch.Generator().manual_seed(seed),
    )
