"""A CPU trial's peak (`PeakMemory`): what the process allocated counts, the pages that map
files (its libraries, whose residency follows the page cache) do not."""

from __future__ import annotations

import subprocess
import sys

MIB = 2**20
# Holds 256 MiB for the measured span, read from a mapped file or allocated; prints the peak.
SCRIPT = """
import mmap, sys, torch
from advisor.trial.child.memory import PeakMemory
size, how, path = 256 * 2**20, sys.argv[1], sys.argv[2]
peak = PeakMemory(torch.device("cpu"), has_children=False)
peak.start()
if how == "file":
    with open(path, "wb") as out:  # written, not sparse: every page is the file's own
        for _ in range(size // 2**20):
            out.write(b"y" * 2**20)
    with open(path, "rb") as source:
        held = mmap.mmap(source.fileno(), size, access=mmap.ACCESS_READ)
        total = sum(held[i] for i in range(0, size, 4096))  # every page resident
else:
    held = bytearray(size)
    for i in range(0, size, 4096):  # every page resident, and nothing more
        held[i] = 1
print(peak.stop())
"""


def _peak(how: str, tmp_path) -> int:
    run = subprocess.run(
        [sys.executable, "-c", SCRIPT, how, str(tmp_path / "mapped")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return int(run.stdout.strip())


def test_a_cpu_peak_counts_allocated_memory_and_not_pages_that_map_files(tmp_path):
    mapped, allocated = _peak("file", tmp_path), _peak("allocated", tmp_path)
    assert allocated - mapped > 200 * MIB, (mapped // MIB, allocated // MIB)
