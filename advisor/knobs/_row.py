"""What one row of the knob table (`advisor.knobs`) says: `Knob`, and how each framework sets
the knob (its `exports` column).

A knob's row maps each framework advisor exports to (`FRAMEWORKS`: Hugging Face
`TrainingArguments`, a Lightning `Trainer`, an accelerate config) to a `Counterpart`: the
framework's own settings for the knob's value, a line saying how to apply it by hand where the
framework has none, or where else the export sets it (the DataLoader's arguments, the launch line,
the export's code). `LOADER` maps the knobs a DataLoader takes to its arguments, for the
Lightning and accelerate exports. `advisor.report.exports` reads these and nothing else about
knobs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from advisor.knobs._rules import Facts, Rule

__all__ = [
    "FRAMEWORKS",
    "IN_LOADER",
    "Counterpart",
    "Framework",
    "Knob",
    "Line",
    "Target",
    "by_hand",
    "elsewhere",
    "in_loader",
    "key",
    "setting",
    "when_set",
]

Framework = Literal["hf", "lightning", "accelerate"]
FRAMEWORKS: tuple[Framework, ...] = ("hf", "lightning", "accelerate")
# The frameworks, and the DataLoader arguments the Lightning and accelerate exports print.
Target = Literal["hf", "lightning", "accelerate", "loader"]

# Functions of the knob's value and the whole configuration (a `TrialConfig`, typed loosely: the
# table is built after these).
Settings = Callable[[Any, Any], Mapping[str, Any]]
Line = Callable[[Any, Any], str | None]


@dataclass(frozen=True)
class Counterpart:
    """How one framework sets one knob.

    `settings`: the framework's keyword arguments for the configuration's value; `by_hand`: the
    line telling the user how to apply it where the framework has no setting (None where this
    value needs nothing done); `where`: where else the export sets it, for a reader of the table
    ("the DataLoader's arguments", "the launch line"). `when_searched`: only where the tune
    searched the knob (a fixed optimizer implementation is the user's own optimizer).
    """

    settings: Settings | None = None
    by_hand: Line | None = None
    where: str | None = None
    when_searched: bool = False


def setting(
    settings: Settings, *, by_hand: Line | None = None, when_searched: bool = False
) -> Counterpart:
    """A knob the framework has a setting for (and, for some values, a line by hand)."""
    return Counterpart(settings=settings, by_hand=by_hand, when_searched=when_searched)


def by_hand(line: Line, *, when_searched: bool = False) -> Counterpart:
    """A knob the framework has no setting for: the line that applies it (None: nothing to do)."""
    return Counterpart(by_hand=line, when_searched=when_searched)


def elsewhere(where: str) -> Counterpart:
    """A knob the export sets outside the framework's settings: `where` says where."""
    return Counterpart(where=where)


def key(name: str, convert: Callable[[Any], Any] | None = None) -> Counterpart:
    """A setting that takes the knob's value (converted, where given) under `name`."""
    return setting(lambda value, _: {name: convert(value) if convert else value})


def when_set(line: str) -> Counterpart:
    """A switch the framework has no setting for: `line` says how, when it is on."""
    return by_hand(lambda value, _: line if value else None)


IN_LOADER = elsewhere("the DataLoader's arguments")


def in_loader(*, hf: Counterpart, loader: Counterpart) -> dict[Target, Counterpart]:
    """A DataLoader argument: the HF setting for it, and the DataLoader's argument that the
    Lightning and accelerate exports print."""
    return {"hf": hf, "lightning": IN_LOADER, "accelerate": IN_LOADER, "loader": loader}


@dataclass(frozen=True, kw_only=True)
class Knob:
    """One row of the knob table; `name`, `fields` and `default` come from the annotated field."""

    group: str  # what `--knobs` calls it
    title: str  # what it is, for people
    unit: str = ""  # of its values, where they are numbers
    # The values to search, from the default outwards, or a function of the circumstances; None:
    # set by the settings (batch sizes, accumulation steps: the shape of the global batch).
    values: tuple[Any, ...] | Callable[[Facts], tuple[Any, ...]] | None = None
    changes_maths: bool = False  # computes the step in another order or precision
    fixed_when: tuple[Rule, ...] = ()  # any reason fixes the knob at its default
    dropped_when: Mapping[Any, Rule] = field(default_factory=dict)  # a value that cannot run
    needs: str | None = None  # matters only when this other knob is non-zero
    # Matters only where this holds of the configuration's fields (e.g. under DDP).
    applies: Callable[[Mapping[str, Any]], bool] | None = None
    invalid_on_cpu: Mapping[Any, str] = field(default_factory=dict)  # value -> what to do instead
    tag: str = "{}"  # how a value reads in a configuration's label
    always_shown: bool = False  # in the label even at its default
    order: Callable[[Any], tuple[int, ...]] | None = None  # of values that are not in `values`
    # How each framework sets it (`advisor.knobs._row`): every row names all of FRAMEWORKS.
    exports: Mapping[Target, Counterpart] = field(default_factory=dict)
    name: str = ""  # the searched parameter; the field's name unless set
    fields: tuple[str, ...] = ()  # the `TrialConfig` fields it sets; the field alone unless set
    default: Any = None

    def candidates(self, facts: Facts) -> tuple[Any, ...]:
        """The values worth measuring in these circumstances, before `dropped_when`."""
        return self.values(facts) if callable(self.values) else self.values or ()

    def order_key(self, value: Any) -> tuple[int, ...]:
        """Where a value stands from the default outwards (for reports and effects)."""
        if self.order is not None:
            return self.order(value)
        listed = self.values if isinstance(self.values, tuple) else ()
        if value in listed:
            return (listed.index(value),)
        if isinstance(value, (int, float)):  # bools too; numbers past the row's values follow them
            return (len(listed), int(value))
        return (len(listed),)

    def label_part(self, config: Any) -> str | None:
        """How this knob reads in a `TrialConfig`'s label; None where it says nothing."""
        if self.needs is not None and not getattr(config, self.needs):
            return None
        if self.applies is not None and not self.applies(dict(config)):
            return None
        value = getattr(config, self.name)
        if not self.always_shown and value == self.default:
            return None
        return self.tag.format(value)
