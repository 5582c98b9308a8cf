"""Which installed packages a factory's module imports, and importing them in the trial launcher
once, before it forks the trials (`advisor.trial.parent.launcher`), rather than in every trial
again.

Every trial child imports the user's module, and with it what that module imports: importing
`transformers` alone took 1.2-1.9 s of each trial of examples/hf_gpt2.py, whose steps take
milliseconds. Only what the module's leading imports take from installed packages is imported
ahead (libraries, as torch is): never the user's own code, which may change between trials,
and nothing after a statement that may set what an import reads (an environment variable,
`sys.path`, a warnings filter).
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.machinery
import os
import sys
from collections.abc import Callable
from pathlib import Path

from advisor.task import is_file_spec

__all__ = ["import_ahead", "installed_imports", "package_of"]

# Imported by the launcher anyway, or advisor itself.
_ALREADY = frozenset({"torch", "advisor", "__future__"})
_INSTALLED = frozenset({"site-packages", "dist-packages"})


def installed_imports(spec: str, cwd: Path) -> tuple[str, ...]:
    """What the spec's module imports from installed packages (`_installed`) in its leading
    block of imports: `module` for `import module`, `module:name` for `from module import name`
    (a lazy package such as transformers loads `name`'s module only then). No standard library,
    nothing the launcher imports anyway, nothing a local module of the same name would shadow
    in a trial. Empty where the module is not a file this can find and parse; the trial then
    reports what is wrong with it."""
    source = _module_file(spec, cwd)
    if source is None:
        return ()
    return _installed_imports(source, source.stat().st_mtime_ns, cwd.resolve(), _own(spec))


def package_of(entry: str) -> str:
    """The top-level package of an `installed_imports` entry."""
    return entry.partition(":")[0].partition(".")[0]


@functools.lru_cache(maxsize=32)
def _installed_imports(source: Path, _mtime_ns: int, cwd: Path, own: str | None) -> tuple[str, ...]:
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ()
    # as a trial looks names up: the module's folder, then its working directory
    where = [str(source.parent), str(cwd), *sys.path]
    taken: dict[str, None] = {}
    for entry in _leading_imports(tree):
        package = package_of(entry)
        if package in _ALREADY or package in sys.stdlib_module_names:
            continue
        if package == own or not _installed(package, where):
            break  # the user's own code runs here, and may set what the imports after it read
        taken[entry] = None
    return tuple(taken)


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


def _own(spec: str) -> str | None:
    """The top-level package of a module spec (`pkg.train:factory`): the user's own."""
    return None if is_file_spec(spec) else spec.rpartition(":")[0].partition(".")[0]


def _leading_imports(tree: ast.Module) -> list[str]:
    """The module's imports, in order, up to its first statement of another kind (its
    docstring aside): what a statement of the user's may change (an environment variable,
    `sys.path`) must be imported after it, in the trial. A relative import is the user's own."""
    entries = []
    for index, node in enumerate(tree.body):
        if index == 0 and _is_docstring(node):
            continue
        if isinstance(node, ast.Import):
            entries += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            entries += [f"{node.module}:{alias.name}" for alias in node.names if alias.name != "*"]
        else:
            break
    return entries


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _installed(name: str, where: list[str]) -> bool:
    """Whether top-level `name`, looked up along `where` as a trial would, is a package or
    module installed in a site-packages folder (a project's own virtual environment may lie
    under its working directory): not the standard library, not the user's own code, even
    installed in place (`pip install -e .`). Finding it imports nothing."""
    try:
        found = importlib.machinery.PathFinder.find_spec(name, where)
    except (ImportError, ValueError):
        return False
    if found is None or found.origin is None:  # a namespace package: left to the trial
        return False
    return not _INSTALLED.isdisjoint(Path(found.origin).parts)


# --- in the launcher ---------------------------------------------------------------------------
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
_TASKS = "/proc/self/task"  # one entry per thread of this process (Linux)
_MAPS = "/proc/self/maps"  # the libraries it has loaded
_IMPORTED: set[str] = set()
_FAILED: set[str] = set()


def import_ahead(
    entries: tuple[str, ...], announce: Callable[[str], None] | None = None
) -> str | None:
    """In the launcher, before it forks a trial: import these `installed_imports` entries, each
    once for all trials (`announce(entry)` before each, if given). Returns the first whose
    import left the launcher unsafe to fork: it started a thread (an OpenMP pool after a
    parallel tensor operation: a fork then hangs at its first one), initialised CUDA or loaded
    its driver where nothing had (`cuInit` does: a fork cannot use CUDA then), or was not found
    in site-packages after all. One that
    fails is left to the trial, which reports it. Nothing is imported where threads cannot be
    counted."""
    import torch

    if not os.path.isdir(_TASKS):
        return None
    threads, driver = len(os.listdir(_TASKS)), _cuda_driver_loaded()
    for entry in entries:
        if entry in _IMPORTED or entry in _FAILED:
            continue
        if announce is not None:
            announce(entry)
        _import_quietly(entry)
        unsafe = len(os.listdir(_TASKS)) > threads or torch.cuda.is_initialized()
        unsafe = unsafe or (_cuda_driver_loaded() and not driver)
        if unsafe or not _from_site_packages(package_of(entry)):
            return entry
    return None


def _import_quietly(entry: str) -> None:
    """`import module`, or `from module import name` for `module:name`, looked up in installed
    packages only, its prints sent to stderr: the launcher's stdout carries its answers. torch
    checks for CUDA through NVML meanwhile: its usual check initialises the driver, which a
    fork could not use then."""
    module, _, name = entry.partition(":")
    nvml = os.environ.get(_NVML_CHECK)
    os.environ[_NVML_CHECK] = "1"
    path = sys.path[:]
    sys.path[:] = [p for p in path if p and Path(p).resolve() != Path.cwd().resolve()]
    sys.stdout.flush()
    stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        imported = importlib.import_module(module)
        if name and not hasattr(imported, name):  # `from package import submodule`
            importlib.import_module(f"{module}.{name}")
        _IMPORTED.add(entry)
    except BaseException:  # whatever it raises, the trial raises again and reports
        _FAILED.add(entry)
    finally:
        sys.stdout.flush()
        os.dup2(stdout, 1)
        os.close(stdout)
        sys.path[:] = path
        if nvml is None:
            del os.environ[_NVML_CHECK]
        else:
            os.environ[_NVML_CHECK] = nvml


def _cuda_driver_loaded() -> bool:
    """Whether the CUDA driver library is loaded in this process."""
    try:
        with open(_MAPS) as maps:
            return any("libcuda.so" in line for line in maps)
    except OSError:
        return False


def _from_site_packages(package: str) -> bool:
    module = sys.modules.get(package)
    origin = getattr(module, "__file__", None)
    return module is None or (origin is not None and not _INSTALLED.isdisjoint(Path(origin).parts))
