"""What memory says about whether a configuration can run: the headroom a finished trial leaves,
and the larger batches a trial that ran out of memory rules out without running them."""

from __future__ import annotations

from collections.abc import Iterable

from advisor.config import TrialConfig
from advisor.results import HardwareProfile, TrialRecord, TrialResult

__all__ = ["known_out_of_memory", "memory_problem"]

# Knobs that do not change the memory one micro-batch needs: accumulation only repeats it.
_MEMORY_NEUTRAL = {"batch_size", "accumulation_steps"}


def memory_problem(result: TrialResult, hardware: HardwareProfile, headroom: float) -> str | None:
    """Why a finished trial leaves too little memory free, or None when it fits."""
    if not result.feasible or result.peak_memory_bytes is None:
        return None
    if result.config.device == "cuda" and hardware.gpus:
        capacity, where = hardware.gpus[0].memory_bytes, "GPU"
    else:
        capacity, where = hardware.memory_bytes, "host"
    if result.peak_memory_bytes <= (1 - headroom) * capacity:
        return None
    return (
        f"peak {where} memory {result.peak_memory_bytes / 2**30:.1f} GiB leaves less than "
        f"{headroom:.0%} of {capacity / 2**30:.1f} GiB free"
    )


def known_out_of_memory(config: TrialConfig, records: Iterable[TrialRecord]) -> str | None:
    """Why `config` cannot fit, known without running it: a trial with every other knob the
    same (accumulation aside) and a batch no larger ran out of memory or left too little free.

    Peak memory grows with the micro-batch, so the larger batch needs at least as much.
    """
    for record in records:
        tried = record.result.config
        if tried.batch_size > config.batch_size or not _same_but_batch(tried, config):
            continue
        if record.result.status == "oom":
            return (
                f"batch {config.batch_size} needs at least the memory of batch "
                f"{tried.batch_size}, which ran out of memory in trial {record.number} "
                "with the same other knobs"
            )
        if record.infeasible_reason is not None:
            return (
                f"batch {config.batch_size} needs at least the memory of batch "
                f"{tried.batch_size}, whose {record.infeasible_reason} in trial {record.number}"
            )
    return None


def _same_but_batch(first: TrialConfig, second: TrialConfig) -> bool:
    return first.model_dump(exclude=_MEMORY_NEUTRAL) == second.model_dump(exclude=_MEMORY_NEUTRAL)
