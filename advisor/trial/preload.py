"""Which installed packages a factory's module imports, and importing them in the trial launcher
once, before it forks the trials (`advisor.trial.launcher`), rather than in every trial again.

Every trial child imports the user's module, and with it what that module imports: importing
`transformers` alone took 2.1 s of each trial of examples/hf_gpt2.py, whose steps take
milliseconds. Only installed third-party packages are imported ahead (libraries, as torch is):
never the user's module itself nor any of the user's own code, which may change between trials
and runs whatever it runs at import.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from advisor.task import is_file_spec

__all__ = ["import_ahead", "installed_imports"]

# Imported by the launcher anyway, or advisor itself.
_ALREADY = frozenset({"torch", "advisor", "__future__"})


@functools.lru_cache(maxsize=32)
def installed_imports(spec: str, cwd: Path) -> tuple[str, ...]:
    """What the spec's module imports (anywhere in it, as its factory runs in every trial) from
    installed packages (`_installed`): `module` for `import module`, `module:name` for `from
    module import name` (a lazy package such as transformers loads `name`'s module only then).
    No standard library, nothing the launcher imports anyway. Empty where the module is not a
    file this can find and parse; the trial then reports what is wrong with it."""
    source = _module_file(spec, cwd)
    if source is None:
        return ()
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ()
    wanted = dict.fromkeys(_imports(tree))
    return tuple(entry for entry in wanted if _installed(entry.split(".", 1)[0].split(":")[0]))


def _module_file(spec: str, cwd: Path) -> Path | None:
    """The file of the spec's module: a file spec's, or a module's under `cwd`."""
    module_part = spec.rpartition(":")[0]
    if not module_part:
        return None
    if is_file_spec(spec):
        path = (cwd / module_part).resolve()
        return path if path.is_file() else None
    relative = Path(*module_part.split("."))
    for candidate in (cwd / relative.with_suffix(".py"), cwd / relative / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None  # an installed module: its imports are its package's business


def _imports(tree: ast.Module) -> list[str]:
    entries = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            entries += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            entries += [f"{node.module}:{alias.name}" for alias in node.names if alias.name != "*"]
    return [entry for entry in entries if entry.split(".", 1)[0].split(":")[0] not in _ALREADY]


def _installed(name: str) -> bool:
    """Whether top-level `name` is a package or module installed in a site-packages folder (a
    project's own virtual environment may lie under its working directory), not the standard
    library nor the user's own code, even installed in place (`pip install -e .`). Finding it
    imports nothing (a top-level name has no parent)."""
    if name in sys.stdlib_module_names or name in sys.builtin_module_names:
        return False
    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return False
    if found is None or found.origin in (None, "built-in", "frozen"):
        return False
    return not _INSTALLED.isdisjoint(Path(found.origin).parts)


_INSTALLED = frozenset({"site-packages", "dist-packages"})


# --- in the launcher ---------------------------------------------------------------------------
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
_TASKS = "/proc/self/task"  # one entry per thread of this process (Linux)
_IMPORTED: set[str] = set()
_FAILED: set[str] = set()


def import_ahead(entries: tuple[str, ...]) -> str | None:
    """In the launcher, before it forks a trial: import these `installed_imports` entries, each
    once for all trials. Returns the first whose import left the launcher unsafe to fork: it
    started a thread (an OpenMP pool after a parallel tensor operation: a fork then hangs at
    its first one) or initialised CUDA (a fork cannot use it). One that fails is left to the
    trial, which reports it. Nothing is imported where threads cannot be counted."""
    import torch

    if not os.path.isdir(_TASKS):
        return None
    threads = len(os.listdir(_TASKS))
    for entry in entries:
        if entry in _IMPORTED or entry in _FAILED:
            continue
        _import_quietly(entry)
        if len(os.listdir(_TASKS)) > threads or torch.cuda.is_initialized():
            return entry
    return None


def _import_quietly(entry: str) -> None:
    """`import module`, or `from module import name` for `module:name` (a lazy package loads
    `name`'s module only then), its prints sent to stderr: the launcher's stdout carries its
    answers. torch checks for CUDA through NVML meanwhile: its usual check initialises the
    driver, which a fork could not use then."""
    module, _, name = entry.partition(":")
    nvml = os.environ.get(_NVML_CHECK)
    os.environ[_NVML_CHECK] = "1"
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        imported = importlib.import_module(module)
        if name:
            getattr(imported, name)
        _IMPORTED.add(entry)
    except (Exception, SystemExit):
        _FAILED.add(entry)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        os.close(stdout)
        if nvml is None:
            del os.environ[_NVML_CHECK]
        else:
            os.environ[_NVML_CHECK] = nvml
