"""How each framework sets a knob where one setting or line takes more than one expression:
the helpers the knob table's `exports` column calls, each a function of the knob's value and
the whole configuration (`advisor.knobs._row.Counterpart`)."""

from __future__ import annotations

from typing import Any

from advisor.knobs._row import Counterpart, Line, setting

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

__all__ = [
    "CHANNELS_LAST",
    "CUDNN_BENCHMARK",
    "CUDNN_DETERMINISTIC",
    "accelerate_accumulation",
    "accelerate_checkpointing",
    "accelerate_dp",
    "accelerate_layout",
    "checkpointing_by_hand",
    "compile_by_hand",
    "hf_checkpointing",
    "hf_checkpointing_note",
    "hf_compile",
    "hf_foreach",
    "hf_optimizer",
    "lightning_checkpointing",
    "lightning_dp",
    "lightning_layout",
    "loader_with_workers",
    "matmul_by_hand",
    "optimizer_by_hand",
    "with_workers",
]


def lightning_layout(mode: str, config: Any) -> dict[str, Any]:
    """Lightning's `devices` (per machine), `num_nodes` over several machines, and `strategy`
    under DDP (the export builds FSDP's strategy)."""
    nodes = {"num_nodes": config.nnodes} if config.nnodes > 1 else {}
    return {"devices": config.per_node, **nodes} | ({"strategy": "ddp"} if mode == "ddp" else {})


def lightning_dp(mode: str, _: Any) -> str | None:
    """Lightning has no DataParallel: what is nearest."""
    return _DP_LIGHTNING if mode == "dp" else None


def accelerate_layout(mode: str, config: Any) -> dict[str, Any]:
    """accelerate's `distributed_type`, `num_processes` (on all machines) and
    `num_machines`."""
    distributed = _ACCELERATE_DISTRIBUTED.get((mode, config.device), "NO")
    return {
        "distributed_type": distributed,
        "num_processes": config.world_size,
        "num_machines": config.nnodes,
    }


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
