"""Peak memory of a trial: CUDA allocator peaks, or the host memory of the process tree."""

from __future__ import annotations

import resource
import threading

import psutil
import torch

__all__ = ["PeakMemory"]


class PeakMemory:
    """Track peak memory from `start()` to `stop()`.

    On CUDA this is `max_memory_reserved` (what the allocator took from the device; the largest
    over all GPUs when DataParallel spreads the model over every one of them). On CPU it is
    the larger of this process's lifetime peak RSS and the sampled RSS of this process plus the
    private resident memory (RSS less file-backed pages) of its children, the DataLoader workers
    and DDP ranks; this process's file-backed pages (`RssFile`: torch's and the other shared
    libraries' code) are left out too. How many of those are resident follows the page cache,
    not the configuration: the same trial peaked 40-85 MiB higher in a freshly installed venv,
    whose libraries were all cached (measured), and the kernel can drop them under pressure.
    The sum errs high by the copy-on-write pages a forked worker shares with its parent; exact
    USS needs /proc/PID/smaps, which cost 18 ms per sample of two data_bound workers (measured)
    and slowed the very trials being measured.
    """

    def __init__(
        self,
        device: torch.device,
        *,
        has_children: bool,
        all_gpus: bool = False,
        interval_s: float = 0.5,
    ) -> None:
        self._device = device
        self._gpus = (
            [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
            if all_gpus and device.type == "cuda"
            else [device]
        )
        # Without loader workers the lifetime peak RSS is exact, and a sampling thread would
        # only compete with the measured loop for the GIL.
        self._has_children = has_children
        self._interval_s = interval_s
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._device.type == "cuda":
            # The allocator's statistics exist only once CUDA is initialised; before the model's
            # first allocation, resetting them fails with "Invalid device argument".
            torch.cuda.init()
            for gpu in self._gpus:
                torch.cuda.reset_peak_memory_stats(gpu)
            return
        if not self._has_children:
            return
        self._thread = threading.Thread(target=self._sample_loop, name="peak-memory", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        if self._device.type == "cuda":
            return max(int(torch.cuda.max_memory_reserved(gpu)) for gpu in self._gpus)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._sample()
        own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _file_backed()
        return max(self._peak, own_peak)

    def _sample_loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def _sample(self) -> None:
        process = psutil.Process()
        total = process.memory_info().rss - _file_backed()
        for child in process.children(recursive=True):
            try:
                info = child.memory_info()
                total += info.rss - getattr(info, "shared", 0)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        self._peak = max(self._peak, total)


def _file_backed() -> int:
    """This process's resident pages that map files (`RssFile` in /proc/self/status), in bytes;
    0 where the kernel does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
