"""How busy the machine was during a trial, from outside the trial's process group.

A trial's samples/s is only as good as the machine was quiet: another program on the same
cores, or a hypervisor that steals them, slows one run and not the next. The meter reads the
machine's CPU time (`/proc/stat` through psutil) at a trial's start and end, and takes off
what the trial's own processes used, and advisor's: what is left ran in other programs.

The trial's processes are counted exactly, after the fact: its child is reaped by one process
(advisor's launcher, or advisor itself), and a reaped child's CPU time, with that of each
descendant it reaped in turn (DDP ranks, DataLoader workers), is added to its reaper's
`children_user` and `children_system`. On CUDA, NVML (the optional `nvidia-ml-py`) also
counts the other programs computing on the trial's GPUs.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from advisor.results import MachineLoad

__all__ = ["LoadMeter", "foreign_gpu_processes"]


@dataclass(frozen=True)
class _Reading:
    wall_s: float
    busy_s: float  # every core's non-idle, non-stolen time, summed
    steal_s: float
    total_s: float
    advisor_s: float  # advisor's own processes' CPU: this one and the launcher
    reaped_s: float  # CPU time of the children the reaper has reaped


class LoadMeter:
    """Reads the machine's load around one trial: `start()` before it is launched, `stop()`
    once its child is reaped by `reaper` (a pid; this process where None)."""

    def __init__(
        self,
        reaper: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        gpus: tuple[int, ...] = (),
    ) -> None:
        self._reaper = reaper
        self._clock = clock
        self._gpus = gpus
        self._start: _Reading | None = None
        self._gpu_foreign = 0

    def start(self) -> None:
        self._start = self._read()

    def sample(self, trial_pid: int) -> None:
        """Count other programs on the trial's GPUs now (a no-op without CUDA or NVML)."""
        if self._gpus:
            found = foreign_gpu_processes(self._gpus, trial_pid)
            self._gpu_foreign = max(self._gpu_foreign, found or 0)

    def stop(self) -> MachineLoad | None:
        """The load since `start()`; None if it was never started or lasted no time."""
        if self._start is None:
            return None
        end = self._read()
        wall = end.wall_s - self._start.wall_s
        if wall <= 0:
            return None
        busy = end.busy_s - self._start.busy_s
        ours = (end.advisor_s - self._start.advisor_s) + (end.reaped_s - self._start.reaped_s)
        total = end.total_s - self._start.total_s
        steal = end.steal_s - self._start.steal_s
        return MachineLoad(
            cores=psutil.cpu_count() or 1,
            seconds=wall,
            outside_cores=max(0.0, busy - ours) / wall,
            steal_share=steal / total if total > 0 else 0.0,
            gpu_processes=self._gpu_foreign if self._gpus else None,
        )

    def _read(self) -> _Reading:
        times = psutil.cpu_times()
        steal = getattr(times, "steal", 0.0)
        idle = times.idle + getattr(times, "iowait", 0.0)
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        own = psutil.Process()
        reaper = own if self._reaper is None else _process(self._reaper)
        advisor_s = _cpu_s(own)
        reaped_s = 0.0
        if reaper is not None:
            with contextlib.suppress(psutil.Error):
                reaped = reaper.cpu_times()
                reaped_s = reaped.children_user + reaped.children_system
                if reaper.pid != own.pid:
                    advisor_s += reaped.user + reaped.system
        return _Reading(
            wall_s=self._clock(),
            busy_s=total - idle - steal,
            steal_s=steal,
            total_s=total,
            advisor_s=advisor_s,
            reaped_s=reaped_s,
        )


def _process(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def foreign_gpu_processes(gpus: tuple[int, ...], trial_pid: int) -> int | None:
    """Processes computing on `gpus` that are neither the trial's nor advisor's; None without
    NVML, or where its PIDs are not this PID namespace's."""
    try:
        import pynvml  # type: ignore[import-not-found]  # the optional nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    ours = {os.getpid(), trial_pid, *_descendants(trial_pid)}
    found: set[int] = set()
    try:
        for index in gpus:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            found |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
    if not all(psutil.pid_exists(pid) for pid in found):
        return None  # NVML names the host's PIDs (a container): ours cannot be told apart
    return len(found - ours)


def _descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []
