"""The host's memory allocator: which one a process runs, and where mimalloc lies if installed.

On CPU a trial's peak is its resident memory, and that is what the allocator holds, not only
what tensors need. glibc's malloc keeps freed buffers of up to 32 MiB in its heaps once it has
raised its mmap threshold, so activation checkpointing, which frees each block's temporaries,
saved little resident memory under it (docs/method.md, "Memory"). An allocator that reuses its
pages, such as mimalloc, shows the saving. Which allocator runs is the user's choice, made
before Python starts (`LD_PRELOAD`); advisor records it with the machine
(`HardwareProfile.allocator`) and the launch script keeps it.

    pip install cmeel-mimalloc
    LD_PRELOAD=$(python -m advisor.memory) advisor tune ...
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

__all__ = [
    "MIMALLOC_PACKAGE",
    "main",
    "mimalloc_library",
    "preloaded_allocator",
    "running_allocator",
]

MIMALLOC_PACKAGE = "cmeel-mimalloc"
# Allocator libraries by the name advisor reports, as they appear in a process's mapped files.
LIBRARIES = {"mimalloc": "libmimalloc", "jemalloc": "libjemalloc", "tcmalloc": "libtcmalloc"}


def running_allocator(maps: str | None = None) -> str:
    """The allocator this process runs: mimalloc, jemalloc or tcmalloc where one is loaded
    (`maps`: the text of /proc/self/maps), else the C library's ("glibc" on Linux)."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
    for name, library in LIBRARIES.items():
        if f"/{library}" in maps:
            return name
    return "glibc" if sys.platform.startswith("linux") else "system"


def preloaded_allocator(preload: str | None = None) -> str | None:
    """The allocator library in `LD_PRELOAD` (default: this process's), to start a run under
    the same one; None where none is preloaded."""
    value = os.environ.get("LD_PRELOAD", "") if preload is None else preload
    for path in value.replace(":", " ").split():
        if any(Path(path).name.startswith(library) for library in LIBRARIES.values()):
            return path
    return None


def mimalloc_library() -> Path | None:
    """The mimalloc shared library that `pip install cmeel-mimalloc` put in this environment."""
    for root in {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}:
        library = Path(root) / "cmeel.prefix" / "lib" / "libmimalloc.so"
        if library.is_file():
            return library
    return None


def main() -> int:
    """Print the path of mimalloc for `LD_PRELOAD`, or say how to install it (exit code 1)."""
    library = mimalloc_library()
    if library is None:
        print(f"mimalloc is not installed here: pip install {MIMALLOC_PACKAGE}", file=sys.stderr)
        return 1
    print(library)
    return 0
