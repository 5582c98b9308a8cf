"""A helper process that answers one JSON object per line on its stdout (the trial launcher,
node 0's store): reading its answers with a timeout, and ending it."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from typing import IO, Any

__all__ = ["JsonLines", "end_helper"]


class JsonLines:
    """The JSON lines a process writes to `stream`, one at a time; `EOFError` once it closed."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._buffer = b""

    def read(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message, or None if none came within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._stream], [], [], left)
            if not ready:
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(self._stream.fileno(), 65536)
            if not chunk:
                raise EOFError("the process closed its output")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)


def end_helper(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Close the helper's stdin (its sign to end), wait `timeout_s` for it, else kill it; then
    close its stdout."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stdout is not None:
        process.stdout.close()
