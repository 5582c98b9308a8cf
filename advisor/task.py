"""The factory contract: resolve a spec, call the factory, normalise what it returns.

A factory is a zero-argument callable named `path/to/file.py:attr` or `pkg.module:attr`. It returns
a `TrainingTask` or a plain tuple `(model, dataset[, loss_fn[, optimizer]])`. torch is imported
lazily so that `import advisor` stays light.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from advisor.errors import FactoryError, SpecError

__all__ = [
    "TrainingTask",
    "build_task",
    "callable_to_spec",
    "check_spec",
    "is_file_spec",
    "resolve_spec",
    "user_batch_size",
]

ReturnKind = Literal["task", "tuple"]
DEFAULT_BATCH_SIZE = 32  # the baseline's batch size when the factory names none


@dataclass(frozen=True, kw_only=True)
class TrainingTask:
    """What a factory returns: the user's model, data and (optionally) loss and optimizer.

    `loss_fn=None` means the model's output is the loss (a scalar, `.loss` or `["loss"]`).
    `optimizer` is a callable `params -> torch.optim.Optimizer` (default `AdamW(lr=1e-3)`).
    `batch_size` is the user's current batch size, the baseline (default 32).
    """

    model: Any
    dataset: Any
    loss_fn: Callable[..., Any] | None = None
    optimizer: Callable[..., Any] | None = None
    collate_fn: Callable[..., Any] | None = None
    batch_size: int | None = None


def check_spec(spec: str, cwd: Path | None = None) -> None:
    """Cheap checks that import nothing: the spec's form, and that its file or package exists."""
    base = Path.cwd() if cwd is None else cwd
    module_part, _ = _split(spec)
    if is_file_spec(spec):
        _existing_file(module_part, base)
        return
    top = module_part.split(".", 1)[0]
    if not (base / top).exists() and importlib.util.find_spec(top) is None:
        raise SpecError(
            f"module {module_part!r} not found: run advisor from the folder that contains it, "
            "or install its package"
        )


def is_file_spec(spec: str) -> bool:
    """Whether a spec names a file (`path/file.py:attr`) rather than a module."""
    module_part = spec.rpartition(":")[0]
    return module_part.endswith(".py") or "/" in module_part


def resolve_spec(spec: str, cwd: Path | None = None) -> Callable[[], Any]:
    """Import the callable a spec names, relative to `cwd` (default: the working directory)."""
    base = Path.cwd() if cwd is None else cwd
    module_part, attr = _split(spec)
    if is_file_spec(spec):
        module = _load_file(module_part, base)
    else:
        module = _import_module(module_part, base)
    return _get_callable(module, attr, spec)


def _split(spec: str) -> tuple[str, str]:
    module_part, sep, attr = spec.rpartition(":")
    if not sep or not module_part or not attr:
        raise SpecError(
            f"{spec!r} is not a factory spec: use path/to/file.py:factory or package.module:factory"
        )
    return module_part, attr


def _existing_file(path_text: str, base: Path) -> Path:
    path = (base / path_text).resolve()
    if not path.is_file():
        raise SpecError(f"file {path_text!r} not found (looked for {path}): check the spec's path")
    return path


def _load_file(path_text: str, base: Path) -> ModuleType:
    path = _existing_file(path_text, base)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    # A stable module name lets DataLoader workers and spawned ranks unpickle the user's classes.
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path):
        return loaded
    if loaded is not None:
        name = f"advisor_user_{abs(hash(str(path)))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise SpecError(f"{path_text!r} cannot be loaded as a Python module: is it a .py file?")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise SpecError(f"importing {path_text} raised {_describe(exc)}: fix that file") from exc
    return module


def _import_module(name: str, base: Path) -> ModuleType:
    if str(base) not in sys.path:
        sys.path.insert(0, str(base))
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise SpecError(
                f"module {name!r} not found: run advisor from the folder that contains it, "
                "or install its package"
            ) from exc
        raise SpecError(
            f"importing {name} failed: module {exc.name!r} is not installed; install it"
        ) from exc
    except Exception as exc:
        raise SpecError(f"importing {name} raised {_describe(exc)}: fix that module") from exc


def _get_callable(module: ModuleType, attr: str, spec: str) -> Callable[[], Any]:
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            hint = _factories_hint(module, attr)
            raise SpecError(f"{spec!r}: {module.__name__} has no attribute {attr!r}{hint}")
        target = getattr(target, part)
    if not callable(target):
        raise SpecError(
            f"{spec!r} is a {type(target).__name__}, not a callable: point the spec at a "
            "zero-argument function that returns (model, dataset)"
        )
    return target


def _factories_hint(module: ModuleType, wanted: str) -> str:
    """The closest zero-argument function of the module, and up to 8 of them (a factory takes
    no argument)."""
    factories = sorted(
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and value.__module__ == module.__name__
        and not name.startswith("_")
        and not any(p.default is p.empty for p in inspect.signature(value).parameters.values())
    )
    if not factories:
        return ""
    close = difflib.get_close_matches(wanted, factories, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    return f"{guess} zero-argument functions there: {', '.join(factories[:8])}"


def callable_to_spec(factory: Callable[[], Any]) -> str:
    """The spec that names `factory`, so that a fresh trial process can import it."""
    qualname = getattr(factory, "__qualname__", "")
    module_name = getattr(factory, "__module__", None)
    if not module_name or "<" in qualname:
        raise SpecError(
            f"{qualname or factory!r} is a lambda or closure; trials run in fresh processes "
            "that import the factory by name: define it at module level and pass 'file.py:name'"
        )
    if module_name == "__main__":
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        if not main_file:
            raise SpecError(
                f"{qualname} is defined in an interactive session; trials cannot import it: "
                "move it to a file and pass 'file.py:name'"
            )
        return f"{Path(main_file).resolve()}:{qualname}"
    return f"{module_name}:{qualname}"


def build_task(spec: str, cwd: Path | None = None) -> tuple[TrainingTask, ReturnKind]:
    """Call the factory the spec names and check what it returns."""
    factory = resolve_spec(spec, cwd)
    try:
        returned = factory()
    except Exception as exc:
        raise FactoryError(f"the factory {spec} raised {_describe(exc)}") from exc
    task, kind = _normalise(returned, spec)
    _check_task(task)
    return task, kind


def _normalise(returned: Any, spec: str) -> tuple[TrainingTask, ReturnKind]:
    if isinstance(returned, TrainingTask):
        return returned, "task"
    if isinstance(returned, (tuple, list)) and 2 <= len(returned) <= 4:
        names = ("model", "dataset", "loss_fn", "optimizer")
        return TrainingTask(**dict(zip(names, returned, strict=False))), "tuple"
    shown = f"a {len(returned)}-tuple" if isinstance(returned, (tuple, list)) else type(returned)
    raise FactoryError(
        f"the factory {spec} returned {getattr(shown, '__name__', shown)}; return "
        "advisor.TrainingTask(...) or a tuple (model, dataset[, loss_fn[, optimizer]])"
    )


def _check_task(task: TrainingTask) -> None:
    import torch

    if not isinstance(task.model, torch.nn.Module):
        raise FactoryError(
            f"the model is a {type(task.model).__name__}, not a torch.nn.Module: "
            "return the module itself as the first element"
        )
    if not any(parameter.requires_grad for parameter in task.model.parameters()):
        raise FactoryError(
            f"the model ({type(task.model).__name__}) has no parameters that require grad: "
            "there is nothing to train"
        )
    _check_dataset(task.dataset)
    if isinstance(task.optimizer, torch.optim.Optimizer):
        raise FactoryError(
            "optimizer is an Optimizer instance; pass a callable params -> Optimizer "
            "(e.g. functools.partial(torch.optim.SGD, lr=0.1)) so each trial builds a fresh one"
        )
    for name in ("loss_fn", "optimizer", "collate_fn"):
        value = getattr(task, name)
        if value is not None and not callable(value):
            raise FactoryError(f"{name} is a {type(value).__name__}, not a callable (or None)")
    size = task.batch_size
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 1):
        raise FactoryError(f"batch_size must be a positive int or None, got {size!r}")


def _check_dataset(dataset: Any) -> None:
    from torch.utils.data import IterableDataset

    if isinstance(dataset, IterableDataset):
        return
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise FactoryError(
            f"the dataset is a {type(dataset).__name__}, not a map-style Dataset "
            "(__getitem__ and __len__) or an IterableDataset"
        )
    if len(dataset) == 0:
        raise FactoryError("the dataset is empty (len 0): the factory must return samples")


def user_batch_size(task: TrainingTask) -> int:
    """The user's batch size: the task's own, else the default of 32."""
    return task.batch_size or DEFAULT_BATCH_SIZE


def _describe(exc: BaseException) -> str:
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
