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

from advisor.knob_rules import Facts, Rule

__all__ = [
    "CHANNELS_LAST",
    "CUDNN_BENCHMARK",
    "CUDNN_DETERMINISTIC",
    "FRAMEWORKS",
    "IN_LOADER",
    "Counterpart",
    "Framework",
    "Knob",
    "Target",
    "accelerate_accumulation",
    "accelerate_checkpointing",
    "accelerate_dp",
    "accelerate_layout",
    "by_hand",
    "checkpointing_by_hand",
    "compile_by_hand",
    "elsewhere",
    "hf_checkpointing",
    "hf_checkpointing_note",
    "hf_compile",
    "hf_foreach",
    "hf_optimizer",
    "in_loader",
    "key",
    "lightning_checkpointing",
    "lightning_dp",
    "lightning_layout",
    "loader_with_workers",
    "matmul_by_hand",
    "optimizer_by_hand",
    "setting",
    "when_set",
    "with_workers",
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


# What the knob table's `exports` column says, where a setting or line takes more than one
# expression: each a function of the knob's value and the whole configuration.
CUDNN_BENCHMARK = "cudnn.benchmark: torch.backends.cudnn.benchmark = True before training"
CUDNN_DETERMINISTIC = "cudnn.deterministic: torch.backends.cudnn.deterministic = True"
CHANNELS_LAST = (
    "channels_last: model.to(memory_format=torch.channels_last), and each 4-D input batch "
    ".contiguous(memory_format=torch.channels_last)"
)
_ACCUMULATE = (
    "gradient accumulation ({} micro-batches per optimizer step): the launch line's "
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS sets Accelerator's (its config file has no key for "
    "it); it applies inside `with accelerator.accumulate(model):`"
)
_DP_LIGHTNING = (
    "DataParallel over every visible GPU: Lightning 2 has no DataParallel strategy; "
    "strategy='ddp' with devices=N is its nearest, which advisor did not measure"
)
_DP_ACCELERATE = (
    "DataParallel: accelerate has none; wrap the model in torch.nn.DataParallel yourself"
)
_ACCELERATE_DISTRIBUTED = {
    ("ddp", "cpu"): "MULTI_CPU",
    ("ddp", "cuda"): "MULTI_GPU",
    ("fsdp", "cpu"): "FSDP",
    ("fsdp", "cuda"): "FSDP",
}
# TrainingArguments.optim names advisor's default AdamW per implementation.
_HF_OPTIM = {"default": "adamw_torch", "fused": "adamw_torch_fused"}
_HF_FOREACH = (
    "optimizer_impl=foreach: TrainingArguments.optim has no foreach choice; pass your own "
    "torch.optim.AdamW(..., foreach=True) as Trainer(optimizers=...)"
)


def lightning_layout(mode: str, config: Any) -> dict[str, Any]:
    """Lightning's `devices`, and `strategy` under DDP (the export builds FSDP's strategy)."""
    return {"devices": config.world_size} | ({"strategy": "ddp"} if mode == "ddp" else {})


def lightning_dp(mode: str, _: Any) -> str | None:
    """Lightning has no DataParallel: what is nearest."""
    return _DP_LIGHTNING if mode == "dp" else None


def accelerate_layout(mode: str, config: Any) -> dict[str, Any]:
    """accelerate's `distributed_type` and `num_processes`."""
    distributed = _ACCELERATE_DISTRIBUTED.get((mode, config.device), "NO")
    return {"distributed_type": distributed, "num_processes": config.world_size}


def accelerate_dp(mode: str, _: Any) -> str | None:
    """accelerate has no DataParallel: wrap the model by hand."""
    return _DP_ACCELERATE if mode == "dp" else None


def accelerate_accumulation(steps: int, _: Any) -> str | None:
    """accelerate's config file has no accumulation key: the launch line sets it."""
    return _ACCUMULATE.format(steps) if steps > 1 else None


def hf_compile(mode: str, _: Any) -> dict[str, Any]:
    """`torch_compile`, and its mode where it compiles."""
    return {"torch_compile": mode != "off"} | (
        {"torch_compile_mode": mode} if mode != "off" else {}
    )


def compile_by_hand(mode: str, _: Any) -> str | None:
    """torch.compile applied to the model by hand."""
    return f"compile={mode}: model = torch.compile(model, mode=...)" if mode != "off" else None


def matmul_by_hand(precision: str, _: Any) -> str | None:
    """The float32 matmul precision set by hand, where it is not the default."""
    if precision == "highest":
        return None
    return f'torch.set_float32_matmul_precision("{precision}")'


def hf_checkpointing(block: str, config: Any) -> dict[str, Any]:
    """`gradient_checkpointing` where blocks are checkpointed; under FSDP its `fsdp_config`
    says it instead (`advisor.report.fsdp_export`: Trainer refuses both at once)."""
    if block == "off" or config.parallel_mode == "fsdp":
        return {}
    return {"gradient_checkpointing": True}


def hf_checkpointing_note(block: str, config: Any) -> str | None:
    """What Trainer's `gradient_checkpointing` needs of the model, and the way without it."""
    if block == "off" or config.parallel_mode == "fsdp":
        return None
    return (
        "gradient_checkpointing: Trainer turns it on through your model's "
        "gradient_checkpointing_enable(), which transformers models have; for another model, "
        f"leave it false and apply {checkpointing_by_hand(block, None)}"
    )


def lightning_checkpointing(block: str, config: Any) -> str | None:
    """Checkpointing by hand, unless Lightning's FSDPStrategy (CUDA only) does it."""
    fsdp = config.parallel_mode == "fsdp" and config.device == "cuda"
    return None if fsdp else checkpointing_by_hand(block, config)


def accelerate_checkpointing(block: str, config: Any) -> str | None:
    """Checkpointing by hand, unless accelerate's `fsdp_config` does it."""
    return None if config.parallel_mode == "fsdp" else checkpointing_by_hand(block, config)


def checkpointing_by_hand(block: str, _: Any) -> str | None:
    """torch's call that checkpoints every `block` module, as advisor's trials did."""
    if block == "off":
        return None
    return (
        f"activation checkpointing of every {block}, before training: "
        "apply_activation_checkpointing(model, checkpoint_wrapper_fn=partial(checkpoint_wrapper, "
        f"checkpoint_impl=CheckpointImpl.NO_REENTRANT), check_fn=lambda m: type(m).__name__ == "
        f"{block!r}), the three from torch.distributed.algorithms._checkpoint.checkpoint_wrapper"
    )


def with_workers(name: str, without: Any = None) -> Counterpart:
    """A loader setting that applies only with loader workers: `without` stands in without
    them (HF's TrainingArguments take a value either way)."""
    return setting(lambda value, config: {name: value if config.num_workers else without})


def loader_with_workers(name: str) -> Counterpart:
    """A DataLoader argument it accepts only with workers (it raises a ValueError without)."""
    return setting(lambda value, config: {name: value} if config.num_workers else {})


def hf_optimizer(impl: str, _: Any) -> dict[str, Any]:
    """`TrainingArguments.optim` for advisor's AdamW, where it has a name for the implementation."""
    return {"optim": _HF_OPTIM[impl]} if impl in _HF_OPTIM else {}


def hf_foreach(impl: str, _: Any) -> str | None:
    """HF has no foreach choice: pass the optimizer by hand."""
    return _HF_FOREACH if impl == "foreach" else None


def optimizer_by_hand(where: str = "") -> Line:
    """The measured foreach or fused implementation of advisor's AdamW, as a line to apply
    (`where`: in which of the user's functions)."""

    def line(impl: str, _: Any) -> str | None:
        if impl == "default":
            return None
        return f"optimizer_impl={impl}: torch.optim.AdamW(..., {impl}=True){where}"

    return line


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
    invalid_on_cpu: Mapping[Any, str] = field(default_factory=dict)  # value -> what to do instead
    tag: str = "{}"  # how a value reads in a configuration's label
    always_shown: bool = False  # in the label even at its default
    order: Callable[[Any], tuple[int, ...]] | None = None  # of values that are not in `values`
    # How each framework sets it (`advisor.knob_row`): every row names all of FRAMEWORKS.
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
        value = getattr(config, self.name)
        if not self.always_shown and value == self.default:
            return None
        return self.tag.format(value)
