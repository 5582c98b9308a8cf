"""Render the ready-to-run `train.py` and `launch.sh` for a recommendation (pure functions)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from advisor.knobs import TrialConfig
from advisor.report.templating import docstring_safe, template_environment
from advisor.report.verdicts import claim_text
from advisor.results import LrPlan, Recommendation
from advisor.trial.orders import held_out_count

__all__ = ["launch_command", "render_launch_script", "render_training_script"]

_AMP_DTYPES = {"off": "None", "bf16": "torch.bfloat16", "fp16": "torch.float16"}


def render_training_script(recommendation: Recommendation, script_dir: Path) -> str:
    """The training script, to be written into `script_dir`; it finds the factory from anywhere."""
    summary = recommendation.schedule
    shipped = summary.shipped_racer if summary is not None else None
    # A shipped schedule trains from its first stage's configuration, its lr in the stages.
    config = shipped.config if shipped is not None else recommendation.config
    script_path = f"{script_dir.as_posix().rstrip('/')}/train.py"
    # Every user string becomes a valid, inert Python literal (JSON strings are Python strings).
    environment = template_environment(py=json.dumps, doc=docstring_safe)
    return environment.get_template("train.py.j2").render(
        spec=recommendation.spec,
        version=recommendation.advisor_version,
        created_at=recommendation.created_at,
        study_name=recommendation.study_name,
        samples_per_s=recommendation.samples_per_s,
        speedup=recommendation.speedup,
        unconfirmed=recommendation.confirmation is not None
        and not recommendation.confirmation.confirmed,
        baseline_samples_per_s=recommendation.baseline_samples_per_s,
        script_path=script_path,
        launch=launch_command(config, script_path),
        launch_script=f"{script_dir.as_posix().rstrip('/')}/launch.sh",
        distributed=config.distributed,
        shard_block=recommendation.task.repeated_block,
        cores=recommendation.hardware.cores,
        workdir=recommendation.workdir,
        trial=recommendation.chosen_from_trial,
        config=config,
        global_batch_changed=recommendation.global_batch_changed,
        lr=LrPlan() if shipped is not None else recommendation.lr,
        lr_note="1: the schedule's stages scale it" if shipped else _lr_note(recommendation),
        schedule=shipped.schedule if shipped is not None else None,
        schedule_speedup=(summary.speedup or 0.0) if summary is not None else 0.0,
        schedule_seconds=summary.seconds if summary is not None else 0.0,
        time_to_loss=claim_text(recommendation.time_to_loss) if recommendation.time_to_loss else "",
        race_seconds=recommendation.race.seconds if recommendation.race else 0,
        baseline_global_batch=recommendation.baseline_config.global_batch_size,
        amp_dtype=_AMP_DTYPES[config.amp],
        task=recommendation.task,
        held_out_samples=_held_out_samples(recommendation),
    )


def _held_out_samples(recommendation: Recommendation) -> int:
    """The samples of the race's held-out slice; without a race, those a race would hold out
    (none of an IterableDataset)."""
    race = recommendation.race
    for racer in race.racers if race is not None else ():
        if racer.curve is not None and racer.curve.held_out_samples:
            return racer.curve.held_out_samples
    size = recommendation.task.dataset_size
    if recommendation.task.iterable or not size:
        return 0
    return held_out_count(size)


def launch_command(config: TrialConfig, script: str) -> str:
    """How to start the script as it was measured (without its own arguments)."""
    if config.distributed:
        return f"torchrun --standalone --nproc_per_node={config.world_size} {shlex.quote(script)}"
    return f"python {shlex.quote(script)}"


def render_launch_script(recommendation: Recommendation) -> str:
    """`launch.sh`: starts the `train.py` beside it as measured, passing its arguments on."""
    config = recommendation.config
    return (
        template_environment()
        .get_template("launch.sh.j2")
        .render(
            config=config,
            threads=config.main_process_threads(recommendation.hardware.cores),
            preload=recommendation.hardware.allocator_preload,
            python=_in_double_quotes(recommendation.hardware.python_executable or "python"),
        )
    )


def _in_double_quotes(text: str) -> str:
    """`text` for a double-quoted shell word: its `\\`, `"`, `$` and `` ` `` escaped."""
    return "".join(f"\\{c}" if c in '\\"$`' else c for c in text)


def _lr_note(recommendation: Recommendation) -> str:
    """Where LR_SCALE comes from, for its comment in train.py."""
    lr = recommendation.lr
    if lr.rule == "yours":
        if recommendation.race is not None and recommendation.global_batch_changed:
            return "1: your lr won the race at this global batch"
        return "1: your optimizer's own learning rate"
    batch0 = recommendation.baseline_config.global_batch_size
    batch = recommendation.config.global_batch_size
    return f"the {lr.rule} rule for global batch {batch} (yours: {batch0}); it won the race"
