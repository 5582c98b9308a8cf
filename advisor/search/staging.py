"""Where a time-to-loss search measures next: the user's global batch first, then only the
larger global batches that can still win the race.

The race decides between global batches by time to the user's loss, so the search serves it in
three stages (docs/method.md, "The search"):

1. **Your batch.** From the fastest configuration at the user's global batch B0 (the baseline at
   first), one move at a time: another value of one knob that keeps the optimisation (loader
   workers, amp, compile, ...), or another layout of B0 (micro-batch x accumulation x
   processes). A faster move becomes the start of the next; knob effects flip with the batch and
   the machine, so every value is measured, none assumed. This is the configuration the race
   calls "the best at your global batch", and the fallback.
2. **Probes.** A larger global batch is measured once: the best at B0 with its micro-batch
   scaled (or its accumulation, past the largest micro-batch), in the autocast whose matmuls
   run fastest here (`SearchSpace.probe_amp`), ranked by its goodput: samples/s over the
   samples its batch needs by the noise scale, at the optimistic end of its interval. B0 x4
   first; up while the goodput rises, else the neighbours of the best. At most a quarter of
   the budget goes to probes: a batch that cannot win gets no more.
3. **The batches that race.** The ones `race_finalists` would race now (the best predicted, or
   the fastest when none is predicted to win) get the same one-move search as B0.

Each stage keeps a share of `--trials` (`stage_budget`); what one leaves goes to the next, and
once no move is left the sampler proposes among B0 and the raced batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import product
from typing import Any, Literal

from advisor.knobs import KNOBS, TrialConfig
from advisor.noise_scale import predict_batches, race_finalists
from advisor.results import Rejected, TrialRecord
from advisor.search.checks import known_out_of_memory
from advisor.search.memory import memory_gate, over_memory, over_memory_baseline
from advisor.search.ranking import Ranking
from advisor.search.siblings import ran_itself
from advisor.search.space import SHAPE, SearchSpace

__all__ = [
    "PROBE_SHARE",
    "Move",
    "StageBudget",
    "allowed_batches",
    "next_move",
    "raced_batches",
    "stage_budget",
]

PROBE_SHARE = 0.25  # of --trials: probes of larger batches, and again the raced batches' moves
LAYOUT = "layout"  # the shape knobs moved together, keeping the global batch
# The knobs whose moves come first at a batch: workers and amp most often pay off, then the
# layouts (DDP that keeps the batch); the others follow in table order.
FIRST = ("num_workers", "amp", LAYOUT)
# At a raced batch amp comes first: its effect grows with a step's arithmetic, and so with the
# batch (examples/mlp.py: bf16 4.4x your samples/s at batch 512, fp32 2.9x, within noise at 32).
RACED_FIRST = ("amp", "num_workers", LAYOUT)

Stage = Literal["your batch", "probe", "raced batch"]


@dataclass(frozen=True)
class StageBudget:
    """How many of `--trials` each stage may take before the next: the probes and the raced
    batches a quarter each, the user's batch the rest."""

    your_batch: int
    probes: int
    raced: int


def stage_budget(trials: int) -> StageBudget:
    """The stages' shares of a search of `trials`."""
    share = max(1, int(trials * PROBE_SHARE))
    return StageBudget(your_batch=max(1, trials - 2 * share), probes=share, raced=share)


@dataclass(frozen=True)
class Move:
    """The next configuration to measure, and the stage that chose it."""

    params: dict[str, Any]
    stage: Stage


def next_move(
    space: SearchSpace,
    ranking: Ranking,
    records: Sequence[TrialRecord],
    rejected: Iterable[Rejected],
    trials: int,
    busy: Iterable[TrialConfig] = (),
) -> Move | None:
    """The next configuration the stages ask for; None once none asks for one. `busy`
    configurations (another worker's) count as measured."""
    records = [r for r in records if r.role in ("baseline", "search")]
    known = {r.result.config for r in records} | set(busy)
    ruled_out = {(r.knob, r.value) for r in rejected}
    budget = stage_budget(trials)
    ran = [r for r in records if ran_itself(r)]
    batch0 = ranking.batch0
    over_memory = over_memory_baseline(records) if _incumbent(records, batch0) is None else None
    start = _incumbent(records, batch0) or over_memory
    at_batch0 = _moves(space, start, records, known, ruled_out, over_memory=over_memory is not None)
    if at_batch0 and len(ran) < budget.your_batch:
        return Move(at_batch0[0], "your batch")
    elsewhere = [r for r in ran if r.result.config.global_batch_size != batch0]
    probed = {r.result.config.global_batch_size for r in elsewhere}
    if len(probed) < budget.probes and (
        probe := _next_probe(space, ranking, records, known, ruled_out)
    ):
        return Move(probe, "probe")
    raced = _raced_move(space, ranking, records, known, ruled_out, ran)
    if raced is not None and len(elsewhere) < budget.probes + budget.raced:
        return raced
    if at_batch0:
        return Move(at_batch0[0], "your batch")
    return raced


def _raced_move(
    space: SearchSpace,
    ranking: Ranking,
    records: list[TrialRecord],
    known: set[TrialConfig],
    ruled_out: set[tuple[str, Any]],
    ran: list[TrialRecord],
) -> Move | None:
    """One move at the raced batch with the fewest trials that has one left."""
    for batch in _by_fewest_trials(raced_batches(space, ranking, records), ran):
        start = _incumbent(records, batch)
        moves = _moves(space, start, records, known, ruled_out, first=RACED_FIRST)
        if moves:
            return Move(moves[0], "raced batch")
    return None


def raced_batches(
    space: SearchSpace, ranking: Ranking, records: Sequence[TrialRecord]
) -> list[int]:
    """The larger or smaller global batches the race would run now, judged from `records`."""
    predictions, _ = race_finalists(
        predict_batches(ranking.noise, records, space.baseline),
        ranking.noise,
        records,
        space.baseline,
    )
    return [p.global_batch for p in predictions if p.raced]


def allowed_batches(
    space: SearchSpace, ranking: Ranking, records: Sequence[TrialRecord]
) -> set[int]:
    """The global batches a proposal may still take: the user's and those that would race."""
    return {ranking.batch0, *raced_batches(space, ranking, records)}


def _by_fewest_trials(batches: list[int], ran: list[TrialRecord]) -> list[int]:
    count = {b: sum(r.result.config.global_batch_size == b for r in ran) for b in batches}
    return sorted(batches, key=lambda b: count[b])


def _incumbent(records: Sequence[TrialRecord], batch: int) -> TrialConfig | None:
    """The fastest eligible configuration measured at global batch `batch`."""
    at_batch = [r for r in records if r.eligible and r.result.config.global_batch_size == batch]
    best = max(at_batch, key=lambda r: r.result.samples_per_s or 0.0, default=None)
    return best.result.config if best is not None else None


def _moves(
    space: SearchSpace,
    start: TrialConfig | None,
    records: Sequence[TrialRecord],
    known: set[TrialConfig],
    ruled_out: set[tuple[str, Any]],
    *,
    over_memory: bool = False,
    first: Sequence[str] = FIRST,
) -> list[dict[str, Any]]:
    """The configurations one move from `start` at its global batch that nobody measured: the
    knobs in `first`'s order, each walked outwards from its value (`_walk`), then every other
    layout of the batch. From a start `over_memory`, the moves that can take less come first:
    the layouts (one process first), activation checkpointing, amp."""
    if start is None:
        return []
    params = space.params_of(start)
    rates = {
        r.result.config: (r.result.samples_per_s or 0.0) if r.eligible else 0.0 for r in records
    }
    floor = rates.get(start, 0.0)

    def proposable(candidate: dict[str, Any]) -> bool:
        if space.problem(candidate) is not None:
            return False
        if any((knob, value) in ruled_out for knob, value in candidate.items()):
            return False  # a layout or memory move may bring a rejected micro-batch back
        config = space.config_from_params(candidate)
        return (
            config not in known
            and known_out_of_memory(config, records) is None
            and memory_gate(space.memory_gated, config, records) is None
        )

    retries, splits = _memory_moves(space, records, start)
    moves = [c for c in retries if proposable(c)] + [c for c in splits if proposable(c)][:1]
    order = _move_order(space, first)
    if over_memory:
        saving = [LAYOUT, "activation_checkpointing", "amp"]
        order = [n for n in saving if n in order] + [n for n in order if n not in saving]
    for name in order:
        if name == LAYOUT:
            candidates = _layouts(space, params, start.global_batch_size, one_process=over_memory)
        else:

            def allowed(value: Any, knob: str = name) -> bool:
                return (knob, value) not in ruled_out and proposable({**params, knob: value})

            candidates = [
                {**params, name: v} for v in _walk(space, name, params, rates, floor, allowed)
            ]
        moves += [c for c in candidates if proposable(c) and c not in moves]
    return moves


def _walk(
    space: SearchSpace,
    name: str,
    params: dict[str, Any],
    rates: dict[TrialConfig, float],
    floor: float,
    allowed: Callable[[Any], bool],
) -> list[Any]:
    """The values of knob `name` to try next from `params`: in each direction along its domain,
    the nearest value not measured, unless two measured values on the way both ran slower than
    `floor` (the start's samples/s): a knob's effect rises then falls along its values, and one
    dip may be noise. A value not `allowed` (rejected, known not to fit) is passed over. Nearest
    first."""
    values = space.domains[name]
    here = values.index(params[name]) if params[name] in values else 0
    found = []
    for step in (1, -1):
        slower = 0
        index = here + step
        while 0 <= index < len(values) and slower < 2:
            config = space.config_from_params({**params, name: values[index]})
            if config not in rates:
                if allowed(values[index]):
                    found.append(values[index])
                    break
                index += step
                continue
            slower = slower + 1 if rates[config] < floor else 0
            index += step
    return sorted(found, key=lambda value: abs(values.index(value) - here))


def _memory_moves(
    space: SearchSpace, records: Sequence[TrialRecord], start: TrialConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Where configurations at `start`'s global batch did not fit the memory without activation
    checkpointing, both sides of its trade: each retried with it (the largest micro-batch
    first) and each DDP one sharded by FSDP with as many ranks, then the one-process layouts
    without it, the largest micro-batch first (the walk takes the first that may fit). A move
    of a memory knob alone, at a micro-batch that already fits, would only cost compute."""
    batch = start.global_batch_size
    over = {
        r.result.config
        for r in records
        if r.result.config.global_batch_size == batch
        and r.result.config.activation_checkpointing == "off"
        and over_memory(r)
    }
    if not over:
        return [], []
    ordered = sorted(over, key=lambda config: (-config.batch_size, config.world_size))
    block = next((v for v in space.domains.get("activation_checkpointing", ()) if v != "off"), None)
    retries = (
        [{**space.params_of(config), "activation_checkpointing": block} for config in ordered]
        if block is not None
        else []
    )
    layouts = space.domains.get("parallel", ())
    retries += [
        {**space.params_of(config), "parallel": f"fsdp-{config.world_size}"}
        for config in ordered
        if config.parallel_mode == "ddp" and f"fsdp-{config.world_size}" in layouts
    ]
    plain = {**space.params_of(start)}
    if "activation_checkpointing" in plain:
        plain["activation_checkpointing"] = "off"
    return retries, _layouts(space, plain, batch, one_process=True)


def _move_order(space: SearchSpace, first: Sequence[str]) -> list[str]:
    table = [row.name for row in KNOBS if row.name in space.domains and row.name not in SHAPE]
    names = [*table, LAYOUT] if any(name in space.domains for name in SHAPE) else table
    return sorted(
        names, key=lambda n: (first.index(n) if n in first else len(first), names.index(n))
    )


def _layouts(
    space: SearchSpace, params: dict[str, Any], batch: int, *, one_process: bool = False
) -> list[dict[str, Any]]:
    """Every other combination of the shape knobs that makes global batch `batch`: the fewest
    accumulation steps first, then the most processes (`one_process`: the fewest processes
    first, each on the host takes memory of its own)."""
    names = [name for name in SHAPE if name in space.domains]
    layouts = []
    for combo in product(*(space.domains[name] for name in names)):
        candidate = {**params, **dict(zip(names, combo, strict=True))}
        if candidate == params or space.problem(candidate) is not None:
            continue
        config = space.config_from_params(candidate)
        if config.global_batch_size == batch:
            first = config.world_size if one_process else 0
            layouts.append((first, config.accumulation_steps, -config.world_size, candidate))
    return [candidate for *_, candidate in sorted(layouts, key=lambda item: item[:3])]


def _next_probe(
    space: SearchSpace,
    ranking: Ranking,
    records: Sequence[TrialRecord],
    known: set[TrialConfig],
    ruled_out: set[tuple[str, Any]],
) -> dict[str, Any] | None:
    """The next larger global batch to probe, with the best configuration at the user's batch
    scaled to it, in `probe_amp` unless rejected; None once the ladder is done (module doc)."""
    start = _incumbent(records, ranking.batch0)
    if start is None:
        return None
    if space.probe_amp is not None and ("amp", space.probe_amp) not in ruled_out:
        start = start.model_copy(update={"amp": space.probe_amp})
    ladder = [ranking.batch0, *sorted(b for b in _global_batches(space) if b > ranking.batch0)]
    # A sibling derived from a trial's parts (accumulation alone) leaves its rung unprobed.
    gains = _goodput_gains([r for r in records if ran_itself(r)], ranking, ladder)
    for index in _ladder_candidates(gains, len(ladder)):
        probe = _scaled(space, start, ladder[index], records, known)
        if probe is not None:
            return probe
    return None


def _goodput_gains(
    records: Sequence[TrialRecord], ranking: Ranking, ladder: list[int]
) -> dict[int, float]:
    """For each rung measured (a failure counts 0): its best goodput over the best at B0's."""
    best: dict[int, float] = {}
    for record in records:
        batch = record.result.config.global_batch_size
        if batch not in ladder:
            continue
        rate = (record.result.samples_per_s or 0.0) if record.eligible else 0.0
        goodput = rate / ranking.samples_ratio(batch)
        best[ladder.index(batch)] = max(best.get(ladder.index(batch), 0.0), goodput)
    base = best.get(0) or 1.0
    return {index: value / base for index, value in best.items()}


def _ladder_candidates(gains: dict[int, float], rungs: int) -> list[int]:
    """The rungs to probe next, in order: two up from the best rung while nothing above it is
    measured, else its unmeasured neighbours (goodput against the batch is taken to rise, then
    fall: beyond a measured fall nothing is probed)."""
    best = max(gains, key=lambda i: (gains[i], -i))
    above = [i for i in gains if i > best]
    order = [best + 2, best + 1] if not above else [best + 1, best - 1]
    return [i for i in order if 0 < i < rungs and i not in gains]


def _global_batches(space: SearchSpace) -> set[int]:
    names = [name for name in SHAPE if name in space.domains]
    batches = set()
    for combo in product(*(space.domains[name] for name in names)):
        params = dict(zip(names, combo, strict=True))
        if space.problem(params) is None:
            batches.add(space.config_from_params(params).global_batch_size)
    return batches


def _scaled(
    space: SearchSpace,
    start: TrialConfig,
    batch: int,
    records: Sequence[TrialRecord],
    known: set[TrialConfig],
) -> dict[str, Any] | None:
    """`start` at global batch `batch`: its knobs, the layout with the largest micro-batch that
    may fit (its processes kept where they can be), the fewest accumulation steps."""
    params = space.params_of(start)
    options = []
    for candidate in _layouts(space, params, batch):
        config = space.config_from_params(candidate)
        if config in known or known_out_of_memory(config, records) is not None:
            continue
        key = (config.world_size != start.world_size, -config.batch_size, config.accumulation_steps)
        options.append((key, candidate))
    return min(options, key=lambda option: option[0])[1] if options else None
