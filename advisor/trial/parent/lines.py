"""Reading a helper process's answers: one JSON object per line on its stdout, with a timeout."""

from __future__ import annotations

import json
import os
import select
import time
from typing import IO, Any

__all__ = ["JsonLines"]


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
