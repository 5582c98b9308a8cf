"""Configurations a search trial measures besides its own: the same one at the other
accumulation steps of the space.

Where one optimizer cycle is too long for the window, a trial times its parts, micro-steps
and optimizer steps apart (`advisor.trial.budget`), and the same parts give the cycle at any
accumulation (`advisor.trial.window.cycle_s`). A trial whose own cycle fits, but one of whose
siblings' would not, is timed in parts too. The search records each sibling it has not
measured as a trial of its own, derived from the one that ran: it costs nothing, the sampler
learns from it, and `--trials` counts a trial's siblings as one configuration (with the
default accumulation steps 1, 2, 4 and 8, each counted alone, the three siblings of each trial
timed in parts had taken half of a 12-trial search on examples/data_bound.py, whose other knobs
it then explored less). Without it, each accumulation of a configuration
whose micro-steps take a second cost a trial of its own, its first step (a loader's first
batch, DDP's set-up) paid again each time. A derived configuration that becomes a finalist is
re-measured in whole cycles like any other.
"""

from __future__ import annotations

from advisor.knobs import TrialConfig
from advisor.results import TrialRecord, TrialResult
from advisor.search.space import SearchSpace

__all__ = ["derived_siblings", "sibling_accumulation"]


def sibling_accumulation(space: SearchSpace, config: TrialConfig) -> tuple[int, ...]:
    """The accumulation steps the space holds at `config` besides its own (none where the
    accumulation is not searched, or where `--global-batch-size` ties it to the batch)."""
    values = space.domains.get("accumulation_steps", ())
    params = space.params_of(config)
    return tuple(
        value
        for value in values
        if value != config.accumulation_steps
        and space.problem({**params, "accumulation_steps": value}) is None
    )


def derived_siblings(
    space: SearchSpace, record: TrialRecord, measured: set[TrialConfig]
) -> list[tuple[TrialConfig, TrialResult]]:
    """The configurations an eligible trial's timed parts measured and the search has not:
    each with its result, derived from the trial's."""
    if not record.eligible:
        return []
    params = space.params_of(record.result.config)
    siblings = []
    for accumulation, rate in sorted(record.result.sibling_rates.items()):
        config = space.config_from_params({**params, "accumulation_steps": accumulation})
        if config not in measured:
            siblings.append((config, _derived(record, config, rate)))
    return siblings


def _derived(record: TrialRecord, config: TrialConfig, samples_per_s: float) -> TrialResult:
    """`record`'s result as `config`'s: its rate at that accumulation, its memory and loader
    figures (the same micro-batches), none of its losses or costs (another global batch
    trains otherwise; the trial ran once)."""
    cycle_s = config.global_batch_size / samples_per_s
    return TrialResult(
        config=config,
        status="ok",
        reason=(
            f"derived from trial {record.number}'s timed micro-steps and optimizer steps "
            f"(the same configuration at accumulation {record.result.config.accumulation_steps})"
        ),
        samples_per_s=samples_per_s,
        estimated=True,
        step_time_median_s=cycle_s,
        step_time_p10_s=cycle_s,
        step_time_p90_s=cycle_s,
        data_wait_fraction=record.result.data_wait_fraction,
        peak_memory_bytes=record.result.peak_memory_bytes,
        task=record.result.task,
    )
