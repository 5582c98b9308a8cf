"""The launcher imports a factory module's installed packages once, not every trial again."""

import textwrap
from pathlib import Path

import pytest

from advisor.knobs import TrialConfig
from advisor.trial.preload import installed_imports
from advisor.trial.runner import TrialLaunch, run_trial

# A package "installed" in a site-packages folder of its own that notes every process that
# imports it; `{body}` adds what else its import does.
PACKAGE = """
import os
with open(os.environ["IMPORTED_BY"], "a") as record:
    record.write(f"{{os.getpid()}}\\n")
{body}
VALUE = 1
"""
MODULE = """
from {package} import VALUE
from tests.workloads.tiny import factory as _tiny


def factory():
    return _tiny()
"""


def test_only_installed_packages_are_imported_ahead(tmp_path):
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "work.py").write_text(
        textwrap.dedent("""
        import json, os.path
        import numpy as np
        import torch.nn
        import helper
        from advisor import TrainingTask
        from optuna.samplers import TPESampler
        from . import sibling

        def factory():
            import pydantic
        """)
    )

    found = installed_imports("work.py:factory", tmp_path)

    # not the standard library, torch or advisor (the launcher has them), nor the user's own
    assert found == ("numpy", "optuna.samplers:TPESampler", "pydantic")
    assert installed_imports("work:factory", tmp_path) == found  # a module spec alike
    assert installed_imports("missing.py:factory", tmp_path) == ()


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder whose module imports `package`, made with `body` at its import."""

    def make(package: str, body: str = "") -> tuple[TrialLaunch, Path]:
        site = tmp_path / "site-packages"
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(PACKAGE.format(body=body))
        monkeypatch.syspath_prepend(str(site))  # the parent looks it up, importing nothing
        monkeypatch.setenv("PYTHONPATH", str(site))
        record = tmp_path / "imported_by"
        monkeypatch.setenv("IMPORTED_BY", str(record))
        folder = tmp_path / "project"
        folder.mkdir()
        (folder / "work.py").write_text(MODULE.format(package=package))
        launch = TrialLaunch(
            spec="work.py:factory", cwd=folder, warmup_steps=1, trial_seconds=0.2, timeout_s=120
        )
        return launch, record

    return make


def _importers(record: Path) -> list[str]:
    return record.read_text().split() if record.exists() else []


def test_trials_share_one_import_of_an_installed_package(project, tmp_path):
    # it prints at import: the launcher's answers on its stdout must not be mixed with that
    launch, record = project("noted_package", body='print("imported")')
    config = TrialConfig(batch_size=16)

    results = [run_trial(launch, config, tmp_path / f"{n}.log") for n in range(2)]

    assert [r.status for r in results] == ["ok", "ok"], [r.reason for r in results]
    assert len(_importers(record)) == 1  # the launcher's import, before it forked both
    launch.preloaded = False  # fresh interpreters: each trial imports it again
    run_trial(launch, config, tmp_path / "fresh.log")
    assert len(_importers(record)) == 2


def test_a_package_that_starts_a_thread_at_import_is_left_to_the_trials(project, tmp_path):
    # as an OpenMP pool after a parallel tensor operation: a fork of its process would hang
    body = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()"
    launch, record = project("threaded_package", body=body)
    config = TrialConfig(batch_size=16)

    results = [run_trial(launch, config, tmp_path / f"{n}.log") for n in range(2)]

    assert [r.status for r in results] == ["ok", "ok"], [r.reason for r in results]
    # the first launcher's import, which it then left with; each trial's own after that
    assert len(set(_importers(record))) == 3


def test_a_package_that_fails_to_import_fails_the_trial_as_without_the_launcher(project, tmp_path):
    launch, _ = project("broken_package", body='raise RuntimeError("no licence server")')
    config = TrialConfig(batch_size=16)

    forked = run_trial(launch, config, tmp_path / "forked.log")
    launch.preloaded = False
    fresh = run_trial(launch, config, tmp_path / "fresh.log")

    assert forked.status == fresh.status == "error"
    assert "no licence server" in forked.reason
    assert forked.reason == fresh.reason
