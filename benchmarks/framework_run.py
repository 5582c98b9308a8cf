"""One timed training run of a factory in a framework, set up from advisor's export for it.

    python benchmarks/framework_run.py {hf,lightning,accelerate} SPEC WORKDIR EXPORTS STEPS WARMUP

Started by `benchmarks/frameworks.py` under the export's own launch line (python, torchrun, or
accelerate launch). Trains STEPS optimizer steps of the factory's model on its dataset with its
loss and optimizer (AdamW(lr=1e-3) where it names none), as a user would in that framework,
and prints, on rank 0, one JSON line: the samples/s of the steps after WARMUP.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from advisor.task import TrainingTask, build_task
from advisor.trial.child.batches import compute_loss


class StepClock:
    """Wall time from the end of optimizer step `warmup` to the end of the last one."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.started: float | None = None
        self.steps = 0

    def step_done(self, step: int) -> None:
        if step == self.warmup:
            self.started = time.perf_counter()
        self.steps = step

    def samples_per_s(self, global_batch: int) -> float:
        assert self.started is not None, "no step after the warm-up"
        elapsed = time.perf_counter() - self.started
        return (self.steps - self.warmup) * global_batch / elapsed


class LossModel(torch.nn.Module):
    """The user's model and loss as one module whose output is the loss, as frameworks expect."""

    def __init__(self, task: TrainingTask) -> None:
        super().__init__()
        self.model = task.model
        self.loss_fn = task.loss_fn

    def forward(self, batch: Any) -> dict[str, torch.Tensor]:
        return {"loss": compute_loss(self.model, batch, self.loss_fn)}


def optimizer_for(task: TrainingTask, params: Any) -> torch.optim.Optimizer:
    make = task.optimizer or (lambda p: torch.optim.AdamW(p, lr=1e-3))
    return make(params)


def world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def report(rate: float) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"samples_per_s": rate}), flush=True)


def run_hf(task: TrainingTask, exports: Path, steps: int, warmup: int) -> None:
    import transformers

    args = json.loads((exports / "hf_training_args.json").read_text())["training_args"]
    clock = StepClock(warmup)

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.step_done(state.global_step)

    collate = task.collate_fn or default_collate
    training_args = transformers.TrainingArguments(
        output_dir=str(exports / "hf-output"), max_steps=steps, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, remove_unused_columns=False, **args,
    )  # fmt: skip
    model = LossModel(task)
    trainer = transformers.Trainer(
        model=model,
        args=training_args,
        train_dataset=task.dataset,
        data_collator=lambda samples: {"batch": collate(samples)},
        optimizers=(optimizer_for(task, model.parameters()), None),
        callbacks=[Clock()],
    )
    trainer.train()
    per_device = training_args.per_device_train_batch_size
    report(clock.samples_per_s(per_device * training_args.gradient_accumulation_steps * world()))


def _load(path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("advisor_export", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_lightning(task: TrainingTask, exports: Path, steps: int, warmup: int) -> None:
    import lightning.pytorch as pl

    snippet = _load(exports / "lightning_trainer.py")
    clock = StepClock(warmup)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = LossModel(task)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.net(batch)["loss"]

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer_for(task, self.parameters())

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
            clock.step_done(trainer.global_step)

    loader = DataLoader(
        task.dataset, shuffle=True, collate_fn=task.collate_fn, **snippet.DATALOADER_KWARGS
    )
    trainer = snippet.make_trainer(
        max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[Clock()],
    )  # fmt: skip
    trainer.fit(Module(), loader)
    accumulation = trainer.accumulate_grad_batches
    report(clock.samples_per_s(loader.batch_size * accumulation * trainer.world_size))


def run_accelerate(task: TrainingTask, exports: Path, steps: int, warmup: int) -> None:
    from accelerate import Accelerator

    # The accelerate config's comment names the same loader settings as Lightning's snippet.
    loader_kwargs = _load(exports / "lightning_trainer.py").DATALOADER_KWARGS
    accelerator = Accelerator()
    model = LossModel(task)
    optimizer = optimizer_for(task, model.parameters())
    loader = DataLoader(task.dataset, shuffle=True, collate_fn=task.collate_fn, **loader_kwargs)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    clock, done = StepClock(warmup), 0
    while done < steps:
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch)["loss"])
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                done += 1
                clock.step_done(done)
                if done == steps:
                    break
    accumulation = accelerator.gradient_accumulation_steps
    report(clock.samples_per_s(loader_kwargs["batch_size"] * accumulation * world()))
    accelerator.end_training()


RUNS = {"hf": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}


def main() -> None:
    framework, spec, workdir, exports, steps, warmup = sys.argv[1:7]
    torch.manual_seed(0)
    task, _ = build_task(spec, Path(workdir))
    RUNS[framework](task, Path(exports), int(steps), int(warmup))
    if world() > 1:  # as the exports advise for DDP on CPU (GLOO_EXIT)
        if torch.distributed.is_initialized():
            torch.distributed.barrier()
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
