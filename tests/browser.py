"""Headless Chromium (Debian's `chromium` package) for checks of what a person sees."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# No sandbox (CI runs as root); no background traffic (the machine has no network).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium here (Debian: apt-get install chromium)"
)


def _chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.resolve().as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


def screenshot(page: Path, png: Path, width: int = 1200, height: int = 4000) -> None:
    """A PNG of `page` as a browser window of that size shows it."""
    _chromium(
        page,
        png.parent / "chromium-profile",
        f"--window-size={width},{height}",
        f"--screenshot={png}",
    )


def rendered_dom(page: Path, profile: Path) -> str:
    """The page's DOM after the browser parsed it."""
    return _chromium(page, profile, "--dump-dom").stdout
