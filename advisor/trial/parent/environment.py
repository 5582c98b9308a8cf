"""The environment advisor's child processes run in, and whether the launcher can carry it."""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["child_env", "json_safe"]


def child_env() -> dict[str, str]:
    """The environment for advisor's child processes: unbuffered, importing this advisor."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    package_root = str(Path(__file__).resolve().parents[3])  # the folder holding advisor/
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return env


def json_safe(env: dict[str, str]) -> bool:
    """Whether the environment survives the launcher's JSON orders (a value that is no valid
    UTF-8 does not; such an environment gets a fresh interpreter per trial instead)."""
    try:
        json.dumps(env, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    return True
