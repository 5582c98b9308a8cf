"""The launcher imports a factory module's installed packages once, not every trial again."""

import textwrap
from pathlib import Path

import pytest

from advisor.knobs import TrialConfig
from advisor.trial.orders import WindowOrder
from advisor.trial.parent import launcher
from advisor.trial.parent.preload import installed_imports
from advisor.trial.parent.runner import ProcessRunner, TrialLaunch

# A package "installed" in a site-packages folder of its own that notes every process that
# imports it, with what it read: `{body}` adds what else its import does.
PACKAGE = """
import os
with open(os.environ["IMPORTED_BY"], "a") as record:
    record.write(f"{{os.getpid()}} {{os.environ.get('SET_BY_THE_MODULE', '-')}}\\n")
{body}
VALUE = OTHER = 1
"""
MODULE = """
{before}
from {package} import VALUE, OTHER
from tests.workloads.tiny import factory as _tiny


def factory():
{factory}
    return _tiny()
"""
# A parallel tensor operation: it starts OpenMP's threads, and a fork of a process that ran
# one hangs at its first own (in the factory: every trial runs it).
PARALLEL = "import torch\n(torch.ones(1000, 1000) @ torch.ones(1000, 1000)).sum()"


def test_the_leading_imports_of_installed_packages_are_imported_ahead(tmp_path):
    (tmp_path / "helper.py").write_text("X = 1\n")
    (tmp_path / "optuna").mkdir()  # a local package that shadows the installed one
    (tmp_path / "optuna" / "__init__.py").write_text("")
    work = tmp_path / "work.py"
    work.write_text(
        textwrap.dedent('''
        """A docstring."""
        import json, os.path
        import numpy as np
        import torch.nn
        from advisor import TrainingTask
        from pydantic import BaseModel
        import optuna
        from click import echo
        ''')
    )
    # Not the standard library, torch or advisor (the launcher has them). The local optuna
    # shadows the installed one: it is the user's code, and a trial imports what follows it.
    found = installed_imports("work.py:factory", tmp_path)
    assert found == ("numpy", "pydantic:BaseModel")
    assert installed_imports("work:factory", tmp_path) == found
    assert installed_imports("missing.py:factory", tmp_path) == ()

    # What the user's own code runs may change what an import after it reads: a trial imports
    # those itself. So do relative imports, and the imports of a spec's own package.
    for before in (
        'import os\nos.environ["HF_HUB_OFFLINE"] = "1"',
        "import helper",
        "from . import x",
    ):
        work.write_text(f"{before}\nimport numpy\n")
        assert installed_imports("work.py:factory", tmp_path) == (), before
    work.write_text("import numpy\nimport click\n")
    assert installed_imports("click.core:factory", tmp_path) == ()  # not under tmp_path
    (tmp_path / "click").mkdir()
    (tmp_path / "click" / "core.py").write_text("import numpy\nimport click.testing\n")
    assert installed_imports("click.core:factory", tmp_path) == ("numpy",)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project folder whose module imports `package`, made with `body` at its import."""

    def make(package: str, body: str = "", before: str = "", factory: str = "") -> TrialLaunch:
        site = tmp_path / "site-packages"
        (site / package).mkdir(parents=True)
        (site / package / "__init__.py").write_text(PACKAGE.format(body=body))
        monkeypatch.syspath_prepend(str(site))  # the parent looks it up, importing nothing
        monkeypatch.setenv("PYTHONPATH", str(site))
        monkeypatch.setenv("IMPORTED_BY", str(tmp_path / "imported_by"))
        folder = tmp_path / "project"
        folder.mkdir()
        code = MODULE.format(
            package=package, before=before, factory=textwrap.indent(factory or "pass", "    ")
        )
        (folder / "work.py").write_text(code)
        return TrialLaunch(
            spec="work.py:factory", cwd=folder, warmup_steps=1, trial_seconds=0.2, timeout_s=60
        )

    return make


def _importers(tmp_path: Path) -> list[list[str]]:
    record = tmp_path / "imported_by"
    return [line.split() for line in record.read_text().splitlines()] if record.exists() else []


def _two_trials(launch: TrialLaunch, tmp_path: Path) -> list[str]:
    """The statuses of two trials, or on failure their reasons too."""
    config = TrialConfig(batch_size=16)
    results = [
        ProcessRunner(launch).run(WindowOrder(config=config), tmp_path / f"{n}.log")
        for n in range(2)
    ]
    if all(r.status == "ok" for r in results):
        return ["ok", "ok"]
    return [f"{r.status}: {r.reason}" for r in results]


def test_trials_share_one_import_of_an_installed_package(project, tmp_path):
    # it prints at import: the launcher's answers on its stdout must not be mixed with that
    launch = project("noted_package", body='print("imported")')

    assert _two_trials(launch, tmp_path) == ["ok", "ok"]
    assert len(_importers(tmp_path)) == 1  # the launcher's import, before it forked both
    launch.import_ahead = False  # each trial imports it again
    ProcessRunner(launch).run(WindowOrder(config=TrialConfig(batch_size=16)), tmp_path / "each.log")
    assert len(_importers(tmp_path)) == 2


@pytest.mark.parametrize(
    "body",
    [
        PARALLEL,
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()",
        "import torch\ntorch.cuda._initialized = True",  # as if it had initialised CUDA
    ],
    ids=["parallel_op", "thread", "cuda"],
)
def test_a_package_that_leaves_a_process_unsafe_to_fork_is_left_to_the_trials(
    project, tmp_path, body, request
):
    # Two names from it: the launcher must not try the same package again for the second.
    name = f"unsafe_{request.node.callspec.id}"  # this process remembers unsafe packages
    launch = project(name, body=body, factory=PARALLEL)

    assert _two_trials(launch, tmp_path) == ["ok", "ok"]  # none hung at its parallel op
    # the first launcher's import, which it then left with; each trial's own after that
    assert len({pid for pid, _ in _importers(tmp_path)}) == 3


@pytest.mark.slow
def test_an_import_that_hangs_in_the_launcher_is_left_to_the_trials(project, tmp_path, monkeypatch):
    # Its first import hangs, the launcher's; a trial's after it does not. (Not keyed on the
    # launcher's NVML setting: lightning_fabric sets that at import, in the tests' process too.)
    body = (
        "first = os.environ['IMPORTED_BY'] + '.first'\n"
        "if not os.path.exists(first):\n"
        "    open(first, 'w').close()\n"
        "    import time; time.sleep(600)"
    )
    launch = project("hanging_package", body=body)
    monkeypatch.setattr(launcher, "PRELOAD_TIMEOUT_S", 2.0)

    assert _two_trials(launch, tmp_path) == ["ok", "ok"]


def test_a_variable_the_module_sets_before_its_imports_reaches_them(project, tmp_path):
    before = 'import os\nos.environ["SET_BY_THE_MODULE"] = "yes"'
    launch = project("reading_package", before=before)

    assert _two_trials(launch, tmp_path) == ["ok", "ok"]
    assert [read for _, read in _importers(tmp_path)] == ["yes", "yes"]  # each trial's import


def test_a_package_that_fails_to_import_fails_the_trial_as_without_the_launcher(project, tmp_path):
    launch = project("broken_package", body='raise RuntimeError("no licence server")')
    config = TrialConfig(batch_size=16)

    ahead = ProcessRunner(launch).run(WindowOrder(config=config), tmp_path / "ahead.log")
    launch.preloaded = False
    fresh = ProcessRunner(launch).run(WindowOrder(config=config), tmp_path / "fresh.log")

    assert ahead.status == fresh.status == "error"
    assert "no licence server" in ahead.reason
    assert ahead.reason == fresh.reason
