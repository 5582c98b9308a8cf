"""The package's shape (docs/architecture.md): imports flow one way, the reports render what the
search decided, torch stays in trial processes, every public name is exported where others import
it and says what it is."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "advisor"
# Lower layers never import higher ones; a module may import its own layer.
LAYERS = (
    ("errors", "frozen", "memory"),
    ("knobs",),
    ("settings",),
    ("results",),  # what was measured and concluded
    ("noise_scale", "task", "progress"),
    ("trial",),
    ("search",),  # proposes and measures
    ("decide",),  # decides from what the search measured
    ("report",),
    ("api", "console"),
    ("cli", "__main__"),
)
LAYER = {part: level for level, parts in enumerate(LAYERS) for part in parts}


@dataclass(frozen=True)
class Import:
    importer: str  # e.g. advisor.search.space
    imported: str  # e.g. advisor.knobs
    names: tuple[str, ...]
    line: int
    module_level: bool


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[Import]:
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in _module_level_nodes(tree)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [(node.module, tuple(alias.name for alias in node.names))]
        else:
            continue
        for module, names in modules:
            found.append(
                Import(_module_name(path), module, names, node.lineno, id(node) in top_level)
            )
    return found


def _module_level_nodes(tree: ast.Module) -> list[ast.AST]:
    """Statements that run on import: the module body, into if/try blocks, not into functions."""
    nodes: list[ast.AST] = []
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        nodes.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                pending.extend(getattr(node, field, []))
        if isinstance(node, ast.ExceptHandler):
            pending.extend(node.body)
    return nodes


SOURCES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = [found for path in SOURCES for found in _imports(path)]


def _layer(module: str) -> int:
    return LAYER[module.split(".")[1]]


def test_every_module_has_a_layer():
    assert {_module_name(path).split(".")[1] for path in SOURCES if path.parent != PACKAGE} | {
        _module_name(path).split(".")[1] for path in SOURCES if path.stem != "__init__"
    } <= set(LAYER)


def test_imports_flow_one_way():
    upward = [
        f"{found.importer}:{found.line} imports {found.imported}"
        for found in IMPORTS
        if found.importer != "advisor"  # the package root re-exports the public API
        and found.imported.startswith("advisor.")
        and _layer(found.imported) > _layer(found.importer)
    ]
    assert upward == []


def _imports_from(importer: str, imported: str) -> list[str]:
    return [
        f"{found.importer}:{found.line} imports {found.imported}"
        for found in IMPORTS
        if _within(found.importer, importer) and _within(found.imported, imported)
    ]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_reports_render_and_import_nothing_of_the_search_or_the_decision():
    """The decision decides; `report/` renders what it is handed (docs/architecture.md)."""
    assert _imports_from("advisor.report", "advisor.search") == []
    assert _imports_from("advisor.report", "advisor.decide") == []


def test_the_search_proposes_and_never_reaches_into_the_decision():
    assert _imports_from("advisor.search", "advisor.decide") == []


def test_the_child_side_of_a_trial_imports_neither_the_parent_side_nor_the_search():
    assert _imports_from("advisor.trial.child", "advisor.trial.parent") == []
    assert _imports_from("advisor.trial.child", "advisor.search") == []


def test_optuna_is_imported_only_where_the_study_is_read_and_written():
    outside = [
        f"{found.importer}:{found.line}"
        for found in IMPORTS
        if found.imported.split(".")[0] == "optuna"
        and not _within(found.importer, "advisor.search")
        and not _within(found.importer, "advisor.decide")
    ]
    assert outside == []


def test_nothing_imports_the_package_root():
    """The root re-exports from the modules; a module importing it would import its own layer's
    parents (and, for `advisor.__version__`, the whole public API)."""
    assert [
        f"{found.importer}:{found.line}"
        for found in IMPORTS
        if found.imported == "advisor" and found.importer != "advisor"
    ] == []


def test_torch_is_imported_at_module_level_only_in_trial_processes():
    outside = [
        f"{found.importer}:{found.line}"
        for found in IMPORTS
        if found.module_level
        and found.imported.split(".")[0] == "torch"
        and not found.importer.startswith("advisor.trial")
    ]
    assert outside == []


@pytest.mark.parametrize(
    "module",
    [
        "advisor.cli",
        "advisor.api",
        "advisor.report.render",
        "advisor.search.study",
        "advisor.decide.decision",
    ],
)
def test_the_tuning_parent_does_not_import_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.stdout.strip() == "False", completed.stderr


def test_no_import_cycles_at_module_level():
    graph: dict[str, set[str]] = {}
    for found in IMPORTS:
        if found.module_level and found.imported.startswith("advisor."):
            graph.setdefault(found.importer, set()).add(found.imported)
    visiting: list[str] = []
    done: set[str] = set()

    def visit(module: str) -> None:
        assert module not in visiting, " -> ".join([*visiting[visiting.index(module) :], module])
        if module in done:
            return
        visiting.append(module)
        for imported in graph.get(module, ()):
            visit(imported)
        visiting.pop()
        done.add(module)

    for module in list(graph):
        visit(module)


def test_what_modules_import_from_each_other_is_in_the_exporters_all():
    missing = sorted(
        f"{name} (imported by {found.importer}:{found.line})"
        for found in IMPORTS
        if found.imported.startswith("advisor.") and found.importer != "advisor"
        for name in found.names
        if not name.startswith("_")
        and _is_module(found.imported)
        and name not in getattr(importlib.import_module(found.imported), "__all__", ())
        and not _is_module(f"{found.imported}.{name}")
    )
    assert missing == []


def test_every_name_in_all_exists():
    for path in SOURCES:
        if path.stem == "__main__":  # importing it runs the CLI
            continue
        module = importlib.import_module(_module_name(path))
        for name in getattr(module, "__all__", ()):
            assert hasattr(module, name), f"{module.__name__}.__all__ lists {name}"


def test_every_public_function_and_class_says_what_it_is():
    undocumented = [
        f"{_module_name(path)}.{node.name}"
        for path in SOURCES
        for node in ast.parse(path.read_text()).body
        if isinstance(node, (ast.FunctionDef, ast.ClassDef))
        and not node.name.startswith("_")
        and ast.get_docstring(node) is None
    ]
    assert undocumented == []


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True
