"""Memory as advisor judges it: `--memory-budget` as given (`_budget`), what a trial's peak is
judged by and how the configurations stood against the budget (`_limit`), and which malloc a
process runs, which on CPU decides what a budget measures (`_allocator`;
`python -m advisor.memory` prints mimalloc's path for `LD_PRELOAD`)."""

from advisor.memory._allocator import (
    MIMALLOC_PACKAGE,
    mimalloc_library,
    preloaded_allocator,
    running_allocator,
)
from advisor.memory._budget import (
    MemoryBudget,
    gib,
)
from advisor.memory._limit import (
    BudgetSummary,
    MemoryLimit,
)

__all__ = [
    "MIMALLOC_PACKAGE",
    "BudgetSummary",
    "MemoryBudget",
    "MemoryLimit",
    "gib",
    "mimalloc_library",
    "preloaded_allocator",
    "running_allocator",
]
