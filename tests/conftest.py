from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from advisor.results import HardwareProfile

ROOT = Path(__file__).resolve().parent.parent
TINY = "tests/workloads/tiny.py"

# A described 2-core CPU machine, for tests of pure functions of the hardware profile.
CPU_PROFILE = HardwareProfile(
    cpu_model="test CPU",
    cores=2,
    memory_bytes=24 * 2**30,
    cpu_capability="AVX512",
    cpu_bf16=True,
    python_version="3.11",
    torch_version="2.13.0+cpu",
)


def run_advisor(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m advisor ARGS` from the repository root, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "advisor", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _run_from_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Specs resolve relative to the working directory, as they do for users."""
    monkeypatch.chdir(ROOT)
