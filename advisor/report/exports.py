"""The recommendation in the forms the training frameworks take (pure functions): keyword
arguments for Hugging Face's `TrainingArguments`, a Lightning `Trainer`, an accelerate config.

Each file names the measured speed-up and the study, carries the learning-rate rule where the
global batch changed, and lists the knobs its framework has no setting for, with how to apply
them by hand, rather than dropping them.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from advisor.knobs import TrialConfig
from advisor.report.templating import docstring_safe, template_environment
from advisor.results import Recommendation

__all__ = ["EXPORT_FILES", "FRAMEWORKS", "Framework", "render_export", "write_exports"]

Framework = Literal["hf", "lightning", "accelerate"]
FRAMEWORKS: tuple[Framework, ...] = ("hf", "lightning", "accelerate")
EXPORT_FILES: dict[Framework, str] = {
    "hf": "hf_training_args.json",
    "lightning": "lightning.py",
    "accelerate": "accelerate_config.yaml",
}
# Where advisor's default optimizer (AdamW) has a TrainingArguments name per implementation.
_HF_OPTIM = {"default": "adamw_torch", "fused": "adamw_torch_fused"}
_LIGHTNING_PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_ACCELERATE_PRECISION = {"off": "no", "bf16": "bf16", "fp16": "fp16"}
_SCRIPT = "your_script.py"
LINE_LENGTH = 100
_CUDNN_BENCHMARK = "cudnn.benchmark: torch.backends.cudnn.benchmark = True before training"


@dataclass
class _Advice:
    """What every export says besides its framework's settings."""

    headline: list[str]
    lr: str | None
    by_hand: list[str] = field(default_factory=list)  # knobs without a setting, and how


def write_exports(
    rec: Recommendation, out_dir: Path, frameworks: tuple[Framework, ...] = FRAMEWORKS
) -> tuple[Path, ...]:
    """Write `out_dir/exports/<file>` for each framework; return the paths written."""
    folder = out_dir / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for framework in frameworks:
        path = folder / EXPORT_FILES[framework]
        path.write_text(render_export(rec, framework))
        written.append(path)
    return tuple(written)


def render_export(rec: Recommendation, framework: Framework) -> str:
    """One framework's export of a confirmed recommendation."""
    if framework == "hf":
        return _hf(rec)
    environment = template_environment(doc=_paragraph, comment=_comment, py=_literal)
    template = "lightning.py.j2" if framework == "lightning" else "accelerate_config.yaml.j2"
    settings = _lightning(rec) if framework == "lightning" else _accelerate(rec)
    return environment.get_template(template).render(rec=rec, config=rec.config, **settings)


def _paragraph(text: str) -> str:
    """User text for a docstring: inert, wrapped at the line length ruff checks."""
    return textwrap.fill(docstring_safe(text), LINE_LENGTH - 4, break_long_words=False)


def _comment(text: str, first: str = "# ", rest: str = "#   ") -> str:
    """User text as comment lines: the first starts with `first`, the next with `rest`."""
    lines = textwrap.wrap(
        docstring_safe(text), LINE_LENGTH - len(rest), break_long_words=False
    ) or [""]
    return "\n".join([first + lines[0], *(rest + line for line in lines[1:])])


def _literal(value: object) -> str:
    """A Python (and YAML) literal: strings double-quoted, as ruff formats them."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _advice(rec: Recommendation, by_hand: list[str]) -> _Advice:
    config = rec.config
    measured = f"Measured: {rec.samples_per_s:,.0f} samples/s with {config.label()}"
    if rec.speedup and rec.baseline_samples_per_s:
        measured += (
            f", {rec.speedup:.2f}x your baseline ({rec.baseline_samples_per_s:,.0f} samples/s, "
            f"{rec.baseline_config.label()})"
        )
    headline = [
        f"advisor {rec.advisor_version}, study {rec.study_name} ({rec.spec}), {rec.created_at}.",
        measured + ".",
    ]
    if rec.time_to_loss_speedup and rec.race is not None:
        headline.append(
            f"In a {rec.race.seconds:g}-s race from the same initial weights it reached your "
            f"loss {rec.time_to_loss_speedup:.2f}x sooner."
        )
    headline.append("Evidence: report.md in the folder above this one.")
    return _Advice(headline=headline, lr=_lr_advice(rec), by_hand=by_hand)


def _lr_advice(rec: Recommendation) -> str | None:
    """How to set the learning rate, when the global batch is not the user's."""
    if not rec.global_batch_changed:
        return None
    batch, batch0 = rec.config.global_batch_size, rec.baseline_config.global_batch_size
    where = f"global batch {batch} against your {batch0}"
    if rec.lr.rule == "yours":
        checked = "it won the race" if rec.race is not None else "no race checked it"
        return f"keep your learning rate ({where}): {checked}."
    warmup = (
        f", reached by a linear warm-up over {rec.lr.warmup_steps} optimizer steps"
        if rec.lr.warmup_steps
        else ""
    )
    return (
        f"multiply your learning rate by {rec.lr.scale:.3g} ({rec.lr.rule} rule, {where})"
        f"{warmup}: it won the race."
    )


def _common_by_hand(config: TrialConfig) -> list[str]:
    """Knobs that none of the frameworks sets, as a line each, when they need doing."""
    lines = []
    if config.channels_last:
        lines.append(
            "channels_last: model.to(memory_format=torch.channels_last), and each 4-D input "
            "batch .contiguous(memory_format=torch.channels_last)"
        )
    if config.cudnn_deterministic:
        lines.append("cudnn.deterministic: torch.backends.cudnn.deterministic = True")
    return lines


def _optimizer_by_hand(rec: Recommendation, where: str = "") -> list[str]:
    """The measured foreach or fused implementation of advisor's AdamW, as a line to apply."""
    impl = rec.config.optimizer_impl
    if not _measured(rec, "optimizer_impl") or impl == "default":
        return []
    return [f"optimizer_impl={impl}: torch.optim.AdamW(..., {impl}=True){where}"]


def _threads(rec: Recommendation) -> str:
    """The launch line's thread setting for CPU processes, as advisor measured them."""
    if rec.config.device != "cpu":
        return ""
    return f"OMP_NUM_THREADS={rec.config.main_process_threads(rec.hardware.cores)} "


def _launch(rec: Recommendation, env: str = "") -> str:
    """How to start the user's script as measured: torchrun for DDP, else plain python."""
    config = rec.config
    prefix = _threads(rec) + env
    if config.parallel_mode == "ddp":
        return f"{prefix}torchrun --standalone --nproc_per_node={config.world_size} {_SCRIPT}"
    if config.device == "cuda" and config.parallel_mode == "none" and len(rec.hardware.gpus) > 1:
        prefix += "CUDA_VISIBLE_DEVICES=0 "  # one device, as measured
    return f"{prefix}python {_SCRIPT}"


# --- Hugging Face -------------------------------------------------------------------------------
def _hf(rec: Recommendation) -> str:
    config = rec.config
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.batch_size,
        "gradient_accumulation_steps": config.accumulation_steps,
        "bf16": config.amp == "bf16",
        "fp16": config.amp == "fp16",
        "dataloader_num_workers": config.num_workers,
        "dataloader_pin_memory": config.pin_memory,
        "dataloader_persistent_workers": config.persistent_workers and config.num_workers > 0,
        "dataloader_prefetch_factor": config.prefetch_factor if config.num_workers else None,
        "torch_compile": config.compile != "off",
        "tf32": config.matmul_precision == "high",
        "use_cpu": config.device == "cpu",
    }
    if config.compile != "off":
        args["torch_compile_mode"] = config.compile
    by_hand = _common_by_hand(config)
    if _measured(rec, "optimizer_impl"):
        if config.optimizer_impl in _HF_OPTIM:
            args["optim"] = _HF_OPTIM[config.optimizer_impl]
        else:
            by_hand.append(
                "optimizer_impl=foreach: TrainingArguments.optim has no foreach choice; pass "
                "your own torch.optim.AdamW(..., foreach=True) as Trainer(optimizers=...)"
            )
    if rec.lr.warmup_steps:
        args["warmup_steps"] = rec.lr.warmup_steps
    if config.cudnn_benchmark:
        by_hand.append(_CUDNN_BENCHMARK)
    advice = _advice(rec, by_hand)
    document = {
        "about": advice.headline,
        "usage": "TrainingArguments(output_dir=..., **json.load(open(this_file))['training_args'])",
        "launch": _hf_launch(rec),
        "learning_rate": advice.lr or "keep yours: the global batch is yours",
        "not_in_training_args": advice.by_hand,
        "training_args": args,
    }
    return json.dumps(document, indent=2) + "\n"


def _hf_launch(rec: Recommendation) -> str:
    if rec.config.parallel_mode == "dp":  # Trainer wraps several visible GPUs in DataParallel
        return f"python {_SCRIPT} (all GPUs visible: Trainer uses DataParallel on its own)"
    return _launch(rec)


def _measured(rec: Recommendation, name: str) -> bool:
    """Whether the search measured this knob (it was not fixed)."""
    return all(knob.name != name for knob in rec.fixed_knobs)


# --- Lightning ----------------------------------------------------------------------------------
def _lightning(rec: Recommendation) -> dict[str, Any]:
    config = rec.config
    trainer: dict[str, Any] = {
        "accelerator": "gpu" if config.device == "cuda" else "cpu",
        "devices": config.world_size,
        "precision": _LIGHTNING_PRECISION[config.amp],
        "accumulate_grad_batches": config.accumulation_steps,
        "benchmark": config.cudnn_benchmark,
        "deterministic": config.cudnn_deterministic,
    }
    if config.parallel_mode == "ddp":
        trainer["strategy"] = "ddp"
    by_hand = [line for line in _common_by_hand(config) if not line.startswith("cudnn.det")]
    if config.parallel_mode == "dp":
        by_hand.append(
            f"DataParallel over {len(rec.hardware.gpus)} GPUs: Lightning 2 has no DataParallel "
            "strategy; strategy='ddp' with devices=N is its nearest, which advisor did not measure"
        )
    if config.compile != "off":
        by_hand.append(f"compile={config.compile}: model = torch.compile(model, mode=...)")
    by_hand += _optimizer_by_hand(rec, " in configure_optimizers")
    return {
        "advice": _advice(rec, by_hand),
        "trainer": trainer,
        "loader": _loader_kwargs(config),
        "launch": _launch(rec) if config.parallel_mode == "ddp" else f"python {_SCRIPT}",
    }


def _loader_kwargs(config: TrialConfig) -> dict[str, Any]:
    """The DataLoader's arguments (the batch is per process)."""
    kwargs: dict[str, Any] = {
        "batch_size": config.batch_size,
        "num_workers": config.num_workers,
        "pin_memory": config.pin_memory,
    }
    if config.num_workers:
        kwargs["persistent_workers"] = config.persistent_workers
        kwargs["prefetch_factor"] = config.prefetch_factor
    return kwargs


# --- accelerate ---------------------------------------------------------------------------------
def _accelerate(rec: Recommendation) -> dict[str, Any]:
    config = rec.config
    distributed = {"ddp": "MULTI_CPU" if config.device == "cpu" else "MULTI_GPU"}
    steps = config.accumulation_steps
    accumulating = steps > 1
    env = f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={steps} " if accumulating else ""
    cpu_ddp = config.device == "cpu" and config.parallel_mode == "ddp"
    if cpu_ddp:  # accelerate launch starts several CPU processes only through mpirun
        env += f"ACCELERATE_MIXED_PRECISION={_ACCELERATE_PRECISION[config.amp]} "
    by_hand = _common_by_hand(config)
    if accumulating:
        by_hand.insert(
            0,
            f"gradient accumulation ({config.accumulation_steps} micro-batches per optimizer "
            "step): the launch line's ACCELERATE_GRADIENT_ACCUMULATION_STEPS sets Accelerator's "
            "(its config file has no key for it); it applies inside "
            "`with accelerator.accumulate(model):`",
        )
    if config.cudnn_benchmark:
        by_hand.append(_CUDNN_BENCHMARK)
    if config.matmul_precision != "highest":
        by_hand.append(f'torch.set_float32_matmul_precision("{config.matmul_precision}")')
    by_hand += _optimizer_by_hand(rec)
    if config.parallel_mode == "dp":
        by_hand.append(
            "DataParallel: accelerate has none; wrap the model in torch.nn.DataParallel yourself"
        )
    command = (
        _launch(rec, env)
        if cpu_ddp
        else f"{_threads(rec)}{env}accelerate launch --config_file exports/accelerate_config.yaml "
        f"{_SCRIPT}"
    )
    return {
        "advice": _advice(rec, by_hand),
        "distributed_type": distributed.get(config.parallel_mode, "NO"),
        "num_processes": config.world_size,
        "mixed_precision": _ACCELERATE_PRECISION[config.amp],
        "loader_call": ", ".join(
            ["DataLoader(dataset", "shuffle=True"]
            + [f"{key}={_literal(value)}" for key, value in _loader_kwargs(config).items()]
        )
        + ")",
        "dynamo_mode": None if config.compile == "off" else config.compile,
        "launch": command,
    }
