"""How far the recommendation is from the hardware limit: its FLOP rate against the machine's
measured matmul peak for the dtype it computes in."""

from __future__ import annotations

from advisor.config import TrialConfig
from advisor.results import Efficiency, HardwareProfile, TaskSummary

__all__ = ["efficiency"]


def efficiency(
    config: TrialConfig, samples_per_s: float, task: TaskSummary, hardware: HardwareProfile
) -> Efficiency | None:
    """None when the model's FLOPs were not counted or no peak was measured for its dtype."""
    if task.flops_per_sample is None:
        return None
    dtype = "fp32" if config.amp == "off" else config.amp
    if config.device == "cuda" and hardware.gpus:
        devices = len(hardware.gpus) if config.parallel_mode == "dp" else config.world_size
        per_device = hardware.gpus[0].peak_flops.get(dtype)
        peak = per_device * devices if per_device else None
        where = f"{devices} x {hardware.gpus[0].name}"
    else:  # every rank shares the same cores, so the machine's peak is the limit
        peak = hardware.cpu_peak_flops.get(dtype)
        where = f"{hardware.cores} CPU cores"
    if not peak:
        return None
    achieved = task.flops_per_sample * samples_per_s
    return Efficiency(
        flops_per_sample=task.flops_per_sample,
        achieved_flops=achieved,
        peak_flops=peak,
        dtype=dtype,
        devices=where,
        fraction_of_peak=achieved / peak,
    )
