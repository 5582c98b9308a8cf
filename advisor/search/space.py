"""The search space for one machine and one task: searched domains, fixed knobs and the baseline.

Every knob is built from its row of the knob table (`advisor.knobs`): fixed, with the reason,
where a rule says it cannot matter here; otherwise searched over the values that can run. The
shape of the global batch (batch sizes, accumulation steps) comes from the settings. Everything
else is left to measurement.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from itertools import product
from math import prod
from typing import TYPE_CHECKING, Any, Literal

from advisor.errors import SettingsError
from advisor.knobs import (
    KNOB,
    KNOB_GROUPS,
    KNOBS,
    MEMORY_GROUP,
    Device,
    Facts,
    Knob,
    TrialConfig,
    parse_parallel,
)
from advisor.results import FixedKnob, HardwareProfile, TaskSummary
from advisor.search.machine import fastest_autocast, machine_facts, resolve_device
from advisor.settings import TuneSettings

if TYPE_CHECKING:
    import optuna

__all__ = ["SHAPE", "SearchSpace", "build_space"]

BATCH_SCALES = (-2, -1, 0, 1, 2, 3, 4, 5)  # powers of two around the user's batch size
# The knobs whose values together make the global batch; only they can make a combination
# impossible (see `SearchSpace.problem`).
SHAPE = ("batch_size", "accumulation_steps", "parallel")


@dataclass(frozen=True)
class SearchSpace:
    """The searched domains (knob -> values, in table order), the knobs fixed with their reasons,
    and the user's baseline; the Optuna search draws its proposals from it."""

    device: Device
    domains: dict[str, tuple[Any, ...]]
    fixed_values: dict[str, Any]
    fixed: tuple[FixedKnob, ...]
    baseline: TrialConfig
    global_batch_size: int | None = None
    accumulation_choices: tuple[int, ...] = (1,)
    dataset_size: int | None = None
    # The memory knobs wait until memory binds (CUDA without --memory-budget): `memory_gate`.
    memory_gated: bool = False
    # The autocast a probe of a larger batch takes (`advisor.search.staging`); None: the probe
    # keeps the precision of the best at the user's batch.
    probe_amp: str | None = None

    @cached_property
    def size(self) -> int:
        """How many distinct configurations the space holds, counted by factors: only the shape
        knobs can make a combination impossible, a knob that `needs` another makes no
        difference while that one is 0, and one that `applies` under some layouts none under the
        others (so no product of every domain is built)."""
        shape = [name for name in SHAPE if name in self.domains]
        applying = {
            row.name: row.applies for row in KNOBS if row.applies and row.name in self.domains
        }
        possible = 0
        for combo in product(*(self.domains[name] for name in shape)):
            params = dict(zip(shape, combo, strict=True))
            if self.problem(params) is None:  # times the knobs that apply under its layout
                fields = self._values(params)
                possible += prod(len(self.domains[n]) for n, ok in applying.items() if ok(fields))
        dependents = {
            row.name: row.needs for row in KNOBS if row.needs and row.name in self.domains
        }
        total = possible
        for name, values in self.domains.items():
            if name in shape or name in dependents or name in applying:
                continue
            inner = prod(len(self.domains[d]) for d, needed in dependents.items() if needed == name)
            total *= sum(inner if value else 1 for value in values)
        for needed in set(dependents.values()) - set(self.domains):  # needed but fixed
            if self.fixed_values.get(needed):
                total *= prod(len(self.domains[d]) for d, n in dependents.items() if n == needed)
        return total

    def suggest(self, trial: optuna.Trial) -> dict[str, Any]:
        """The sampler's proposal: a value for every searched knob."""
        return {
            name: trial.suggest_categorical(name, values) for name, values in self.domains.items()
        }

    def problem(self, params: dict[str, Any]) -> str | None:
        """Why a combination of searched values is no configuration at all, or None.

        Such combinations exist because the domains are a product: under `--global-batch-size`
        a micro-batch may not divide the global batch at some world size, and DDP ranks each
        read only their share of the dataset.
        """
        values = self._values(params)
        batch, world = values["batch_size"], values.get("world_size", 1)
        total = self.global_batch_size
        if total is not None and total % (batch * world):
            return f"global batch {total} is no multiple of batch {batch} x {world} processes"
        if total is not None and total // (batch * world) not in self.accumulation_choices:
            return (
                f"global batch {total} with batch {batch} x {world} processes needs "
                f"{total // (batch * world)} accumulation steps, not one of "
                f"{list(self.accumulation_choices)}"
            )
        if values.get("parallel_mode") == "fsdp" and values.get("compile", "off") != "off":
            return (
                "torch.compile with FSDP2 compiles each sharded block on its own (torchtitan's "
                "way), which advisor does not do: FSDP layouts are measured uncompiled"
            )
        if world > 1 and self.dataset_size is not None and batch * world > self.dataset_size:
            return (
                f"each of {world} ranks reads {self.dataset_size // world} samples, "
                f"fewer than batch {batch}"
            )
        return None

    def config_from_params(self, params: dict[str, Any]) -> TrialConfig:
        """The configuration a proposal (searched knob -> value) stands for."""
        return TrialConfig(device=self.device, **self._values(params))

    def params_of(self, config: TrialConfig) -> dict[str, Any]:
        """The proposal that stands for `config`: its value of every searched knob."""
        return {name: getattr(config, name) for name in self.domains}

    def contains(self, config: TrialConfig) -> bool:
        """Whether every searched knob of `config` has a value of its domain."""
        return all(getattr(config, name) in values for name, values in self.domains.items())

    def all_configs(self) -> list[TrialConfig]:
        """Every distinct configuration of the space, `size` of them (a grid, for tests)."""
        names = list(self.domains)
        every = (dict(zip(names, combo, strict=True)) for combo in product(*self.domains.values()))
        configs = (self.config_from_params(p) for p in every if self.problem(p) is None)
        return list(dict.fromkeys(configs))

    def _values(self, params: dict[str, Any]) -> dict[str, Any]:
        """TrialConfig fields from searched params: `parallel` is mode and world size together."""
        values = {**self.fixed_values, **params}
        for row in KNOBS:  # a knob that needs another at 0 cannot matter: one config
            if row.needs is not None and not values.get(row.needs):
                values.update(dict.fromkeys(row.fields, row.default))
        if "parallel" in values:
            layout = parse_parallel(values.pop("parallel"))
            values["parallel_mode"], values["world_size"] = layout.mode, layout.world
            values["reshard_after_forward"], values["nnodes"] = layout.reshard, layout.nodes
        for row in KNOBS:  # a knob of another layout (DDP's buckets without DDP): one config
            if row.applies is not None and not row.applies(values):
                values.update(dict.fromkeys(row.fields, row.default))
        if self.global_batch_size is not None:
            per_step = values["batch_size"] * values.get("world_size", 1)
            values["accumulation_steps"] = max(1, self.global_batch_size // per_step)
        return values


class _Builder:
    """Collects searched domains and fixed knobs (with reasons) while the space is built."""

    def __init__(self) -> None:
        self.domains: dict[str, tuple[Any, ...]] = {}
        self.fixed_values: dict[str, Any] = {}
        self.fixed: list[FixedKnob] = []

    def search(self, name: str, values: tuple[Any, ...]) -> None:
        self.domains[name] = values

    def fix(self, name: str, value: Any, reason: str) -> None:
        self.fixed_values[name] = value
        self.note(name, str(value), reason, "fixed")

    def note(
        self, name: str, value: str, reason: str, kind: Literal["fixed", "limited", "derived"]
    ) -> None:
        self.fixed.append(FixedKnob(name=name, value=value, reason=reason, kind=kind))


def build_space(
    settings: TuneSettings, hardware: HardwareProfile, task: TaskSummary
) -> SearchSpace:
    """The space for this machine, task and settings: each knob of the table searched over what
    can run here, or fixed with the reason; the baseline is the user's own configuration."""
    device = resolve_device(settings.device, hardware)
    forced = frozenset(name for name in settings.knobs if name in KNOB)
    facts = machine_facts(device, hardware, task, settings.max_world_size, forced)
    facts = dataclasses.replace(
        facts, memory_budget=settings.memory_budget is not None, nodes=settings.nnodes
    )
    space = _Builder()
    total = _kept_global_batch(settings, task)
    from_settings = {
        "batch_size": lambda: _add_batch_sizes(settings, task, total, space),
        "accumulation_steps": lambda: _add_accumulation(settings, task, total, space),
    }
    searched = settings.searched_knobs
    if device == "cuda":  # held back until memory binds (`SearchSpace.memory_gated`)
        searched |= frozenset(KNOB_GROUPS[MEMORY_GROUP])
    for row in KNOBS:
        if row.values is None:  # the global batch's shape comes from the settings
            from_settings[row.name]()
        else:
            _add_knob(row, facts, searched, space)
    baseline = _baseline(settings, task, total, device, space.domains["batch_size"])
    return SearchSpace(
        device=device,
        domains=space.domains,
        fixed_values=space.fixed_values,
        fixed=tuple(space.fixed),
        baseline=baseline,
        global_batch_size=total,
        accumulation_choices=_accumulation_choices(settings),
        dataset_size=task.dataset_size,
        memory_gated=device == "cuda" and settings.memory_budget is None,
        probe_amp=fastest_autocast(space.domains.get("amp", ()), facts.matmul_flops),
    )


def _kept_global_batch(settings: TuneSettings, task: TaskSummary) -> int | None:
    """The global batch every configuration keeps: `--global-batch-size`, or the user's own
    where no race may show that another reaches their loss sooner (`--race-seconds 0` under the
    time-to-loss objective): a configuration at another batch could not be recommended, so the
    search measures none. None: the global batch is searched."""
    if settings.global_batch_size is not None:
        return settings.global_batch_size
    return task.user_batch_size if settings.keeps_global_batch else None


def _add_knob(row: Knob, facts: Facts, wanted: frozenset[str], space: _Builder) -> None:
    """Fix the knob where its row's rules say it cannot matter; else search the values that can
    run here, noting the ones that cannot and why."""
    reason = _why_fixed(row, facts, wanted, space)
    if reason is not None:
        space.fix(row.fields[0], row.default, reason)
        return
    candidates = row.candidates(facts)
    dropped = {
        value: why
        for value in candidates
        if value in row.dropped_when and (why := row.dropped_when[value](facts)) is not None
    }
    kept = tuple(value for value in candidates if value not in dropped)
    reasons = "; ".join(dict.fromkeys(dropped.values()))
    if kept == (row.default,):
        space.fix(row.fields[0], row.default, reasons)
        return
    space.search(row.name, kept)  # one value that is not the default is still a choice made
    if dropped:
        space.note(row.fields[0], "|".join(map(str, kept)), reasons, "limited")


def _why_fixed(row: Knob, facts: Facts, wanted: frozenset[str], space: _Builder) -> str | None:
    if row.name not in wanted:
        return f"not searched: add it with --knobs classic,{row.group}"
    if row.needs is not None and not any(
        space.domains.get(row.needs, (space.fixed_values.get(row.needs),))
    ):
        value = space.fixed_values.get(row.needs)
        return f"it matters only with {row.needs} > 0, and {row.needs} is fixed at {value}"
    fixed_layout = "parallel" not in space.domains
    if row.applies is not None and fixed_layout and not row.applies(space.fixed_values):
        return "it matters only under DDP, and the parallel layout is fixed"
    return next((reason for rule in row.fixed_when if (reason := rule(facts))), None)


def _worlds(space: _Builder) -> tuple[int, ...]:
    """The process counts in the space so far (the parallel knob comes first in the table)."""
    layouts = space.domains.get("parallel", ("none",))
    return tuple(sorted({parse_parallel(layout)[1] for layout in layouts}))


def _add_batch_sizes(
    settings: TuneSettings, task: TaskSummary, total: int | None, space: _Builder
) -> None:
    limit = task.dataset_size or 2**31
    if total is not None:
        choices = _accumulation_choices(settings)
        splits = {a * w for a in choices for w in _worlds(space)}
        micro = sorted({total // n for n in splits if total % n == 0 and total // n <= limit})
        if settings.batch_sizes is not None:  # yours, where they make the kept global batch
            micro = [b for b in micro if b in settings.batch_sizes]
        if not micro:
            raise SettingsError(
                f"no micro-batch{_of_yours(settings)} fits global batch {total}"
                f"{_kept_because(settings)} with accumulation steps "
                f"{list(choices)} and {limit} samples: "
                f"{_another_batch(settings)}"
            )
        space.search("batch_size", tuple(micro))
        return
    wanted = settings.batch_sizes or _batch_sizes_around(settings, task.user_batch_size)
    sizes = tuple(b for b in wanted if b <= limit)
    if not sizes:
        raise SettingsError(
            f"every batch size {list(wanted)} exceeds the dataset's {limit} samples: "
            "pass smaller --batch-sizes"
        )
    space.search("batch_size", sizes)


def _batch_sizes_around(settings: TuneSettings, user: int) -> tuple[int, ...]:
    """Powers of two around the user's batch size; under `--memory-budget` also each split of it
    by an accumulation choice, so that your global batch can be kept without a memory knob
    where your micro-batch does not fit (8 x 4 for your 32, 4 x 8 too)."""
    sizes = {max(1, user * 2**k if k >= 0 else user >> -k) for k in BATCH_SCALES}
    if settings.memory_budget is not None:
        sizes |= {user // a for a in settings.accumulation_steps if user % a == 0}
    return tuple(sorted(sizes))


def _accumulation_choices(settings: TuneSettings) -> tuple[int, ...]:
    """The accumulation steps a configuration may take: the settings', and 1 where the user's
    own global batch is kept, as their own configuration (the baseline) takes it."""
    if settings.global_batch_size is None and settings.keeps_global_batch:
        return tuple(sorted({1, *settings.accumulation_steps}))
    return settings.accumulation_steps


def _of_yours(settings: TuneSettings) -> str:
    return "" if settings.batch_sizes is None else f" of --batch-sizes {list(settings.batch_sizes)}"


def _kept_because(settings: TuneSettings) -> str:
    """Why the global batch is fixed, where the user did not fix it themselves."""
    if settings.global_batch_size is not None:
        return ""
    return " (your own: --race-seconds 0 keeps it)"


def _another_batch(settings: TuneSettings) -> str:
    if settings.global_batch_size is not None:
        return "choose another --global-batch-size"
    return "pass other --batch-sizes or --accumulation-steps, or race (--race-seconds 10)"


def _add_accumulation(
    settings: TuneSettings, task: TaskSummary, total: int | None, space: _Builder
) -> None:
    if total is None:
        space.search("accumulation_steps", settings.accumulation_steps)
        return
    kept = (
        ""
        if settings.global_batch_size is not None
        else (
            f"; your batch size {task.user_batch_size}, kept: with --race-seconds 0 no race can "
            "show that another global batch reaches your loss sooner"
        )
    )
    space.note(
        "accumulation_steps",
        "derived",
        f"global batch {total} = batch x accumulation x processes{kept}",
        "derived",
    )


def _baseline(
    settings: TuneSettings,
    task: TaskSummary,
    total: int | None,
    device: Device,
    sizes: tuple[int, ...],
) -> TrialConfig:
    """The user's configuration: their batch size (or the nearest searched one), every other
    knob at its default (fp32, one process, no loader workers)."""
    if total is not None:  # one process: the accumulation must be one the settings allow
        sizes = tuple(b for b in sizes if total // b in _accumulation_choices(settings))
        if not sizes:
            raise SettingsError(
                f"no micro-batch makes global batch {total} in one process with accumulation "
                f"steps {list(_accumulation_choices(settings))}{_kept_because(settings)}: "
                f"{_another_batch(settings)}"
            )
    batch = min(sizes, key=lambda b: (abs(b - task.user_batch_size), b))
    return TrialConfig(
        device=device,
        batch_size=batch,
        accumulation_steps=1 if total is None else total // batch,
    )
