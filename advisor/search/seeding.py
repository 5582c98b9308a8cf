"""The search's first trials: from the user's configuration outwards, one measured step at a time.

Before the sampler has a model of the space, it proposes at random, and a random point may be
the most expensive corner (the largest batch and accumulation, with every process, under a
precision this machine emulates). Instead, each first trial takes the fastest configuration
measured so far (the user's baseline at first) and moves one knob one step further from the
default: the batch size two notches up (x4), the other knobs to their next value. Knobs take
turns, so that each is measured once near the user's configuration before the sampler takes
over.

Loader workers take the first turn: they keep the user's global batch, and a configuration
that keeps it needs no race and no new learning rate to be recommended (the time-to-loss
objective recommends one wherever larger batches do not reach the loss sooner); at the user's
batch, the trial is also among the cheapest. The batch size follows, whose step is often the
largest: a search of few trials must still take it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from advisor.knobs import KNOBS
from advisor.results import Rejected, TrialRecord
from advisor.search.checks import known_out_of_memory
from advisor.search.space import SearchSpace
from advisor.settings import TuneSettings

__all__ = ["next_seed", "seed_count"]

# The knobs whose first steps matter most, in turn: loader workers first, which keep the global
# batch; the others follow in table order.
FIRST = ("num_workers", "batch_size", "parallel", "accumulation_steps", "amp")
BATCH_NOTCHES = 2


def seed_count(settings: TuneSettings) -> int:
    """How many first trials are seeded: TPE's start-up trials, a third of the budget (3 to 10)."""
    return max(3, min(10, settings.trials // 3))


def next_seed(
    space: SearchSpace,
    records: Iterable[TrialRecord],
    rejected: Iterable[Rejected],
    turn: int,
    busy: Iterable[dict[str, Any]] = (),
) -> dict[str, Any] | None:
    """The next seed's parameters: the fastest measured configuration with one knob moved one
    step outwards, the knobs taking turns from `turn`; None when no such move is left. `busy`
    proposals (being measured by another worker) count as measured."""
    records = [r for r in records if r.role != "duplicate"]
    measured = {r.result.config for r in records}
    whole = [p for p in busy if set(space.domains) <= set(p)]  # a proposal may be half-drawn
    measured |= {space.config_from_params(p) for p in whole if space.problem(p) is None}
    eligible = [r for r in records if r.eligible]
    incumbent = max(eligible, key=lambda r: r.result.samples_per_s or 0.0, default=None)
    start = incumbent.result.config if incumbent is not None else space.baseline
    params = space.params_of(start)
    ruled_out = {(r.knob, r.value) for r in rejected}
    names = _knob_order(space)
    for offset in range(len(names)):
        name = names[(turn + offset) % len(names)]
        for value in _steps_out(name, space.domains[name], params[name]):
            candidate = {**params, name: value}
            if (name, value) in ruled_out or space.problem(candidate) is not None:
                continue
            config = space.config_from_params(candidate)
            if config not in measured and known_out_of_memory(config, records) is None:
                return candidate
    return None


def _knob_order(space: SearchSpace) -> list[str]:
    table = [row.name for row in KNOBS]
    ordered = sorted(space.domains, key=lambda name: (
        FIRST.index(name) if name in FIRST else len(FIRST), table.index(name)
    ))  # fmt: skip
    return ordered


def _steps_out(name: str, values: tuple[Any, ...], current: Any) -> list[Any]:
    """The values one step further from the default than `current` (domains run from the
    default outwards; batch sizes run up, `BATCH_NOTCHES` at once, else one)."""
    if current not in values:
        return []
    later = list(values[values.index(current) + 1 :])
    if name == "batch_size":
        return later[BATCH_NOTCHES - 1 : BATCH_NOTCHES] + later[:1]
    return later[:1]
