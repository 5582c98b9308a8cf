"""The memory a configuration may use, and how the configurations that ran stood against it.

The limit is `--memory-budget` (`advisor.memory`), or without one the device less
`--memory-headroom`. What it covers is the trial's measured peak
(`TrialResult.peak_memory_bytes`): each GPU's `max_memory_reserved` on CUDA, and on CPU the
resident memory of the trial's whole process tree, every rank and loader worker together, since
they share the host, less the pages that map files (`advisor.trial.child.memory`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from advisor.knobs import TrialConfig
from advisor.memory import BudgetSummary, MemoryBudget, MemoryLimit, gib
from advisor.results import HardwareProfile, TrialRecord

__all__ = [
    "GLIBC_NOTE",
    "budget_summary",
    "memory_gate",
    "memory_limit",
    "over_memory",
    "over_memory_baseline",
    "uses_memory_knob",
]

MEMORY_GATE = (
    "memory has not bound yet: activation checkpointing and FSDP trade speed for memory, so "
    "without --memory-budget they are measured once a trial runs out of memory or comes within "
    "--memory-headroom"
)

# Measured: docs/method.md, "Memory".
GLIBC_NOTE = (
    "under glibc's malloc, which keeps freed buffers in its heaps, checkpointing lowers a CPU "
    "trial's resident peak far less than what its tensors need; preload mimalloc to measure "
    "under an allocator that reuses them: LD_PRELOAD=$(python -m advisor.memory)"
)


def memory_limit(
    budget: MemoryBudget | None, headroom: float, config: TrialConfig, hardware: HardwareProfile
) -> MemoryLimit:
    """The limit for `config`'s trials: the budget, or the device less the headroom."""
    if config.device == "cuda" and hardware.gpus:
        capacity, where = hardware.gpus[0].memory_bytes, "GPU"
    else:
        capacity, where = hardware.memory_bytes, "host"
    if budget is None:
        return MemoryLimit(
            bytes=int((1 - headroom) * capacity), budget=False, where=where, capacity=capacity
        )
    limit = budget.bytes if budget.bytes is not None else int((budget.fraction or 1) * capacity)
    return MemoryLimit(bytes=limit, budget=True, where=where, capacity=capacity)


def over_memory(record: TrialRecord) -> bool:
    """Whether a trial ran out of memory, or peaked over the budget or into the headroom."""
    return record.result.status == "oom" or (
        record.result.feasible
        and record.infeasible_reason is not None
        and "memory" in record.infeasible_reason
    )


def uses_memory_knob(config: TrialConfig) -> bool:
    """Whether `config` trades speed for memory: checkpointed blocks, or FSDP."""
    return config.activation_checkpointing != "off" or config.parallel_mode == "fsdp"


def memory_gate(gated: bool, config: TrialConfig, records: Iterable[TrialRecord]) -> str | None:
    """Why `config` is held back: the space is `gated` (CUDA without a budget), it uses a
    memory knob, and no trial has yet run out of memory or into the headroom. None otherwise."""
    if not gated or not uses_memory_knob(config) or any(map(over_memory, records)):
        return None
    return MEMORY_GATE


def budget_summary(
    budget: MemoryBudget | None,
    headroom: float,
    trials: list[TrialRecord],
    hardware: HardwareProfile,
    global_batch: int,
) -> BudgetSummary | None:
    """The budget's summary over `trials`, and what checkpointing bought at `global_batch`
    (the recommendation's), or where nothing was checkpointed there at your global batch; None
    without `--memory-budget`."""
    measured = [
        t
        for t in trials
        if t.role in ("baseline", "search") and t.derived_from is None
        if t.result.peak_memory_bytes
    ]
    if budget is None or not measured:
        return None
    limit = memory_limit(budget, headroom, measured[0].result.config, hardware)
    baseline = next((t for t in measured if t.role == "baseline"), None)
    trade = _checkpointing_trade(measured, global_batch, limit)
    if trade is None and baseline is not None:  # nothing checkpointed there: at your batch
        trade = _checkpointing_trade(measured, baseline.result.config.global_batch_size, limit)
    return BudgetSummary(
        checkpointing=trade,
        allocator_note=GLIBC_NOTE if trade and _under_glibc(limit, hardware) else None,
        limit=limit,
        ran=len(measured),
        over=tuple(
            (t.number, t.result.peak_memory_bytes or 0)
            for t in measured
            if (t.result.peak_memory_bytes or 0) > limit.bytes
        ),
        baseline_peak=baseline.result.peak_memory_bytes if baseline else None,
    )


def _under_glibc(limit: MemoryLimit, hardware: HardwareProfile) -> bool:
    """Whether the peaks are resident memory under glibc's malloc (see `GLIBC_NOTE`)."""
    return limit.where == "host" and hardware.allocator == "glibc"


def _checkpointing_trade(
    measured: list[TrialRecord], global_batch: int, limit: MemoryLimit
) -> str | None:
    """The fastest configuration within the budget at `global_batch` with activation
    checkpointing against the fastest without: their micro-batches and speeds."""
    at_batch = [
        t for t in measured if t.eligible and t.result.config.global_batch_size == global_batch
    ]

    def fastest(checkpointed: bool) -> TrialRecord | None:
        return max(
            (
                t
                for t in at_batch
                if (t.result.config.activation_checkpointing != "off") == checkpointed
            ),
            key=lambda t: t.result.samples_per_s or 0.0,
            default=None,
        )

    on, off = fastest(True), fastest(False)
    if on is None:
        return None
    within = f"within {gib(limit.bytes)}"
    if off is None:
        return (
            f"checkpointing: global batch {global_batch} fits {within} only with it "
            f"(micro-batch {on.result.config.batch_size})"
        )
    ratio = (on.result.samples_per_s or 0.0) / (off.result.samples_per_s or 1.0)
    trade = (
        f"micro-batch {off.result.config.batch_size} → {on.result.config.batch_size} {within}, "
        f"{ratio:.2f}x samples/s at global batch {global_batch}"
    )
    return f"checkpointing: {trade}" if ratio > 1 else f"checkpointing did not pay: {trade}"


def over_memory_baseline(records: Sequence[TrialRecord]) -> TrialConfig | None:
    """The user's configuration where it ran out of memory or did not fit the budget (or the
    headroom) and nothing at its global batch has fit yet: the walk starts from it, its micro-batch
    split by accumulation and the knobs that change the memory tried (the larger micro-batches
    known not to fit)."""
    for record in records:
        over = record.result.status == "oom" or (
            record.result.feasible and record.infeasible_reason is not None
        )
        if record.role == "baseline" and over:
            return record.result.config
    return None
