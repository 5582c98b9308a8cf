"""The recommendation in the forms the training frameworks take (pure functions): keyword
arguments for Hugging Face's `TrainingArguments`, a Lightning `Trainer`, an accelerate config.

Each file names the measured speed-up and the study, carries the learning-rate rule where the
global batch changed, and lists the knobs its framework has no setting for, with how to apply
them by hand, rather than dropping them. What each knob becomes in each framework is the knob
table's `exports` column (`advisor.knobs._row`); this module reads it, and adds what is not a knob:
the device, the learning rate, the launch line.
"""

from __future__ import annotations

import json
import shlex
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from advisor.knobs import FRAMEWORKS, KNOBS, Framework, Target
from advisor.report.fsdp_export import CPU_NOTE, accelerate_fsdp, fsdp_export, hf_fsdp
from advisor.report.templating import docstring_safe, template_environment
from advisor.report.verdicts import claim_text
from advisor.results import LrPlan, Racer, Recommendation, ScheduleSummary

__all__ = ["EXPORT_FILES", "render_export", "write_exports"]

EXPORT_FILES: dict[Framework, str] = {
    "hf": "hf_training_args.json",
    "lightning": "lightning_trainer.py",
    "accelerate": "accelerate_config.yaml",
}
_SCRIPT = "your_script.py"
# What train.py does at its end under torchrun on CPU (its comment there says why; measured: 3
# of 52 runs aborted so before, 0 of 150 after).
DEFAULT_LR = 1e-3  # AdamW's, which trials train with where the factory gives no optimizer
FLUSH_DENORMAL = (
    "torch.set_flush_denormal(True) once, before training: advisor measured with denormals "
    "flushed to zero, as train.py runs (dead ReLU units decay AdamW's moments into denormals, "
    "and CPU steps slow down as they pile up)"
)
GLOO_EXIT = (
    "the end of a DDP run on CPU: once training is over and saved, end each process with "
    "torch.distributed.barrier() then os._exit(0). DDP keeps gloo's threads alive past "
    "destroy_process_group, and one freeing the last all-reduce while Python shuts down aborts "
    'the finished run ("terminate called without an active exception", torchrun: exitcode -6)'
)
LINE_LENGTH = 100


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
    environment = template_environment(
        doc=_paragraph, comment=_comment, py=_literal, yaml=_yaml_scalar
    )
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


def _yaml_scalar(value: object) -> str:
    """A YAML scalar that parses to `value` under YAML 1.1 and 1.2 alike: JSON's spelling
    (a bare `NO` or `off` would read as false in PyYAML)."""
    return json.dumps(value)


def _advice(rec: Recommendation, by_hand: list[str]) -> _Advice:
    config = rec.config
    measured = f"Measured: {rec.samples_per_s:,.0f} samples/s with {config.label()}"
    if rec.speedup and rec.baseline_samples_per_s:
        unconfirmed = rec.confirmation is not None and not rec.confirmation.confirmed
        measured += (
            f", {'unconfirmed (a busy machine): at most ' if unconfirmed else ''}"
            f"{rec.speedup:.2f}x your baseline ({rec.baseline_samples_per_s:,.0f} samples/s, "
            f"{rec.baseline_config.label()})"
        )
    headline = [
        f"advisor {rec.advisor_version}, study {rec.study_name} ({rec.spec}), {rec.created_at}.",
        measured + ".",
    ]
    if rec.time_to_loss is not None and rec.race is not None:
        headline.append(
            f"Over the first {rec.race.seconds:g} s of training it reaches your loss "
            f"{claim_text(rec.time_to_loss)} sooner."
        )
    headline.append("Evidence: report.md in the folder above this one.")
    by_hand = [*by_hand, FLUSH_DENORMAL]
    if config.device == "cpu" and config.distributed:
        by_hand = [*by_hand, GLOO_EXIT]
    if config.device == "cpu" and config.parallel_mode == "fsdp":
        by_hand = [*by_hand, CPU_NOTE]
    return _Advice(headline=headline, lr=_lr_advice(rec), by_hand=by_hand)


def _lr_advice(rec: Recommendation) -> str | None:
    """How to set the learning rate, when the global batch is not the user's."""
    if not rec.global_batch_changed:
        return None
    batch, batch0 = rec.config.global_batch_size, rec.baseline_config.global_batch_size
    where = f"global batch {batch} against your {batch0}"
    # Where the factory gave no optimizer the trials trained AdamW at lr 1e-3: a known number.
    known = None if rec.task.custom_optimizer else DEFAULT_LR
    if rec.lr.rule == "yours":
        checked = "it won the race" if rec.race is not None else "no race checked it"
        number = f", {known:g}, advisor's default AdamW's" if known else ""
        return f"keep your learning rate{number} ({where}): {checked}."
    warmup = (
        f", reached by a linear warm-up over {rec.lr.warmup_steps} optimizer steps"
        if rec.lr.warmup_steps
        else ""
    )
    number = f": {known * rec.lr.scale:g} for advisor's default AdamW at {known:g}" if known else ""
    return (
        f"multiply your learning rate by {rec.lr.scale:.3g} ({rec.lr.rule} rule, {where})"
        f"{number}{warmup}: it won the race."
    )


def _knob_settings(rec: Recommendation, target: Target) -> tuple[dict[str, Any], list[str]]:
    """What the knob table says `target` sets for the recommendation: its settings, and the
    lines applying by hand what it has no setting for."""
    settings: dict[str, Any] = {}
    lines: list[str] = []
    for row in KNOBS:
        counterpart = row.exports.get(target)
        if counterpart is None or (counterpart.when_searched and not _measured(rec, row.name)):
            continue
        value = getattr(rec.config, row.fields[0])
        if counterpart.settings is not None:
            settings.update(counterpart.settings(value, rec.config))
        line = counterpart.by_hand(value, rec.config) if counterpart.by_hand else None
        if line is not None:
            lines.append(line)
    return settings, lines


def _threads(rec: Recommendation) -> str:
    """The launch line's thread setting for CPU processes, as advisor measured them."""
    if rec.config.device != "cpu":
        return ""
    return f"OMP_NUM_THREADS={rec.config.main_process_threads(rec.hardware.cores)} "


def _preload(rec: Recommendation) -> str:
    """The launch line's allocator, where advisor measured under a preloaded one."""
    preload = rec.hardware.allocator_preload
    return f"LD_PRELOAD={shlex.quote(preload)} " if preload else ""


def _launch(rec: Recommendation, env: str = "") -> str:
    """How to start the user's script as measured: torchrun for DDP, else plain python."""
    config = rec.config
    prefix = _threads(rec) + _preload(rec) + env
    if config.distributed and config.nnodes > 1:  # the same line on every machine
        return (
            f"{prefix}torchrun --nnodes={config.nnodes} --nproc_per_node={config.per_node} "
            "--rdzv-backend=c10d --rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT --rdzv-id=$RDZV_ID "
            f"{_SCRIPT}"
        )
    if config.distributed:
        return f"{prefix}torchrun --standalone --nproc_per_node={config.world_size} {_SCRIPT}"
    if config.device == "cuda" and config.parallel_mode == "none" and len(rec.hardware.gpus) > 1:
        prefix += "CUDA_VISIBLE_DEVICES=0 "  # one device, as measured
    return f"{prefix}python {_SCRIPT}"


# --- Hugging Face -------------------------------------------------------------------------------
def _hf(rec: Recommendation) -> str:
    config = rec.config
    args, by_hand = _knob_settings(rec, "hf")
    args["use_cpu"] = config.device == "cpu"
    if config.parallel_mode == "ddp":
        # Trainer turns it on for a model with parameters it cannot see used; advisor's DDP
        # trials ran without it, and it costs an extra pass over the autograd graph each step.
        args["ddp_find_unused_parameters"] = False
    if rec.lr.warmup_steps:
        args["warmup_steps"] = rec.lr.warmup_steps
    fsdp = fsdp_export(rec)
    if fsdp is not None:
        args.update(hf_fsdp(fsdp))
    advice = _advice(rec, by_hand)
    document = {
        "about": advice.headline,
        "usage": "TrainingArguments(output_dir=..., **json.load(open(this_file))['training_args'])",
        "launch": _hf_launch(rec),
        "learning_rate": advice.lr or "keep yours: the global batch is yours",
        "not_in_training_args": advice.by_hand,
        "training_args": args,
    }
    if rec.schedule is not None and rec.schedule.schedule is not None:
        document["batch_size_schedule"] = _hf_schedule(rec.schedule)
    return json.dumps(document, indent=2) + "\n"


def _hf_schedule(summary: ScheduleSummary) -> dict[str, Any]:
    """What Trainer cannot express of a shipped schedule, and how to follow it anyway."""
    racer = summary.shipped_racer
    assert racer is not None and racer.schedule is not None
    batches = racer.schedule.global_batches(racer.config.world_size)
    return {
        "note": (
            "TrainingArguments fixes the batch for a whole run, so training_args above are the "
            "nearest fixed configuration (the fixed recommendation). The batch-size schedule "
            f"advisor raced reached your loss {summary.speedup or 0:.2f}x sooner than it. To "
            "follow it, train one run per stage with that stage's per_device_train_batch_size "
            "and gradient_accumulation_steps, each resumed (resume_from_checkpoint, "
            "ignore_data_skip=True) from the checkpoint the run before saved at the stage's "
            "from_step (StopAtStep below); where a stage's learning_rate_scale is not 1, add "
            "StageLearningRate(scale) to its run."
        ),
        "stages": [
            {
                "from_step": stage.from_step,
                "global_batch": batch,
                "per_device_train_batch_size": stage.batch_size,
                "gradient_accumulation_steps": stage.accumulation_steps,
                "learning_rate_scale": stage.lr_scale,
            }
            for stage, batch in zip(racer.schedule.stages, batches, strict=True)
        ],
        "callback": [
            "from transformers import TrainerCallback",
            "",
            "",
            "class StopAtStep(TrainerCallback):",
            '    """Save and stop where the next stage begins."""',
            "",
            "    def __init__(self, step):",
            "        self.step = step",
            "",
            "    def on_step_end(self, args, state, control, **kwargs):",
            "        if state.global_step >= self.step:",
            "            control.should_save = True",
            "            control.should_training_stop = True",
            "",
            "",
            "class StageLearningRate(TrainerCallback):",
            '    """Your learning rate times the stage\'s scale (after the resumed scheduler)."""',
            "",
            "    def __init__(self, scale):",
            "        self.scale = scale",
            "",
            "    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):",
            "        lr_scheduler.base_lrs = [args.learning_rate * self.scale] * len(",
            "            lr_scheduler.base_lrs",
            "        )",
        ],
    }


def _hf_launch(rec: Recommendation) -> str:
    if rec.config.parallel_mode == "dp":  # Trainer wraps several visible GPUs in DataParallel
        return f"python {_SCRIPT} (all GPUs visible: Trainer uses DataParallel on its own)"
    return _launch(rec)


def _measured(rec: Recommendation, name: str) -> bool:
    """Whether the search measured this knob (it was not fixed)."""
    return all(knob.name != name or knob.kind != "fixed" for knob in rec.fixed_knobs)


# --- Lightning ----------------------------------------------------------------------------------
def _lightning(rec: Recommendation) -> dict[str, Any]:
    shipped = rec.schedule.shipped_racer if rec.schedule is not None else None
    stages = _accumulation_stages(shipped) if shipped is not None else None
    if shipped is not None:  # trains the schedule from its first stage's configuration
        rec = rec.model_copy(update={"config": shipped.config, "lr": LrPlan()})
    config = rec.config
    settings, by_hand = _knob_settings(rec, "lightning")
    trainer = {"accelerator": "gpu" if config.device == "cuda" else "cpu", **settings}
    return {
        "fsdp": fsdp_export(rec) if config.device == "cuda" else None,  # Lightning's needs a GPU
        "advice": _advice(rec, by_hand),
        "trainer": trainer,
        "loader": _knob_settings(rec, "loader")[0],
        "launch": _launch(rec),
        "stages": stages,
        "schedule_speedup": rec.schedule.speedup if rec.schedule is not None else None,
    }


def _accumulation_stages(racer: Racer) -> list[tuple[int, int, float]]:
    """The schedule as (from step, accumulation, lr scale) at its first stage's micro-batch: a
    Lightning loader keeps its batch size, so each stage's global batch comes from
    accumulation."""
    assert racer.schedule is not None
    first = racer.schedule.stages[0].batch_size
    return [
        (
            stage.from_step,
            max(1, round(stage.batch_size * stage.accumulation_steps / first)),
            stage.lr_scale,
        )
        for stage in racer.schedule.stages
    ]


# --- accelerate ---------------------------------------------------------------------------------
def _accelerate(rec: Recommendation) -> dict[str, Any]:
    config = rec.config
    settings, by_hand = _knob_settings(rec, "accelerate")
    steps = config.accumulation_steps
    env = f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={steps} " if steps > 1 else ""
    cpu_ddp = config.device == "cpu" and config.parallel_mode == "ddp"
    if cpu_ddp:  # accelerate launch starts several CPU processes only through mpirun
        env += f"ACCELERATE_MIXED_PRECISION={settings['mixed_precision']} "
    machines = (
        "--machine_rank $NODE_RANK --main_process_ip $MASTER_ADDR --main_process_port $MASTER_PORT "
        if config.nnodes > 1
        else ""
    )
    command = (
        _launch(rec, env)
        if cpu_ddp
        else f"{_threads(rec)}{env}accelerate launch --config_file exports/accelerate_config.yaml "
        f"{machines}{_SCRIPT}"
    )
    loader = _knob_settings(rec, "loader")[0]
    fsdp = fsdp_export(rec)
    return {
        **settings,
        "fsdp_config": accelerate_fsdp(fsdp) if fsdp is not None else None,
        "advice": _advice(rec, by_hand),
        "loader_call": ", ".join(
            ["DataLoader(dataset", "shuffle=True"]
            + [f"{key}={_literal(value)}" for key, value in loader.items()]
        )
        + ")",
        "launch": command,
    }
