"""The knob table read as rows: `KNOBS` in field order, each row completed from its field of
`TrialConfig`, `KNOB` by name, the `--knobs` groups, and the combinations of values no trial
can run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pydantic_core import PydanticUndefined

from advisor.knobs._row import Knob
from advisor.knobs._table import TrialConfig

__all__ = ["KNOB", "KNOBS", "KNOB_GROUPS", "combination_problems"]


def combination_problems(config: TrialConfig) -> list[str]:
    """What is wrong with a combination of knob values, each with how to fix it."""
    problems = []
    if config.parallel_mode in ("none", "dp") and config.world_size != 1:
        problems.append(
            f"world_size={config.world_size} needs parallel_mode='ddp' "
            f"({config.parallel_mode!r} runs one process): set world_size=1"
        )
    if config.num_workers == 0 and config.prefetch_factor != 2:
        problems.append("prefetch_factor needs num_workers > 0: leave it at 2")
    if config.parallel_mode == "ddp" and config.world_size < 2:
        problems.append("parallel_mode='ddp' needs world_size >= 2; use parallel_mode='none'")
    if config.nnodes > 1 and not config.distributed:
        problems.append(
            f"nnodes={config.nnodes} needs parallel_mode='ddp' or 'fsdp' "
            f"({config.parallel_mode!r} runs on one machine): set nnodes=1"
        )
    elif config.world_size % config.nnodes:
        problems.append(
            f"world_size={config.world_size} does not split over nnodes={config.nnodes}: every "
            "machine runs as many processes, so make world_size a multiple of nnodes"
        )
    if config.parallel_mode != "fsdp" and not config.reshard_after_forward:
        problems.append("reshard_after_forward=False needs parallel_mode='fsdp': leave it True")
    if config.device == "cpu":
        for row in KNOBS:
            value = getattr(config, row.fields[0])
            if value in row.invalid_on_cpu:
                problems.append(f"{row.fields[0]}={value!r} {row.invalid_on_cpu[value]}")
    return problems


def _rows() -> tuple[Knob, ...]:
    """The table in field order, each row completed from its field."""
    rows = []
    for name, info in TrialConfig.model_fields.items():
        row = next((item for item in info.metadata if isinstance(item, Knob)), None)
        if row is None:
            continue
        default = None if info.default is PydanticUndefined else info.default
        rows.append(
            dataclasses.replace(
                row, name=row.name or name, fields=row.fields or (name,), default=default
            )
        )
    return tuple(rows)


KNOBS: tuple[Knob, ...] = _rows()
KNOB: Mapping[str, Knob] = {row.name: row for row in KNOBS}
# `--knobs` names these groups (or single knobs); the base group is always searched.
KNOB_GROUPS: Mapping[str, tuple[str, ...]] = {
    group: tuple(row.name for row in KNOBS if row.group == group)
    for group in dict.fromkeys(row.group for row in KNOBS)
}
