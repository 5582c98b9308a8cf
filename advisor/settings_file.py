"""Read a `--config` file (TOML or JSON) into the values `TuneSettings` validates."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from advisor.errors import SettingsError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

__all__ = ["read_settings_file"]


def read_settings_file(path: Path) -> dict[str, Any]:
    """The file's settings, names as in `TuneSettings` (`trial-seconds` and `trial_seconds`
    both work). Values are validated later, with the flags, so every problem is named at once."""
    if path.suffix not in (".toml", ".json"):
        raise SettingsError(f"{path}: use a .toml or .json settings file")
    try:
        text = path.read_text()
    except OSError as exc:
        raise SettingsError(f"cannot read settings file {path}: {exc.strerror}") from None
    try:
        values = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise SettingsError(f"{path} is not valid {path.suffix[1:].upper()}: {exc}") from None
    if not isinstance(values, dict):
        raise SettingsError(f"{path}: expected a table of settings, e.g. trials = 20")
    return {str(name).replace("-", "_"): value for name, value in values.items()}
