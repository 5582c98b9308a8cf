"""What an FSDP recommendation becomes in each framework's export (pure functions): the unit
advisor sharded (the model's repeated block), whether it resharded after the forward pass, and
whether the blocks were also checkpointed.

Each framework applies FSDP's checkpointing of the blocks itself, so under FSDP the knob table's
generic checkpointing setting and line say nothing there (`advisor.knobs._row`): HF refuses both
at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from advisor.results import Recommendation

__all__ = ["CPU_NOTE", "FsdpExport", "accelerate_fsdp", "fsdp_export", "hf_fsdp"]

CPU_NOTE = (
    "FSDP on CPU: advisor measured torch's fully_shard over gloo, as train.py applies it under "
    "torchrun. The frameworks' FSDP paths are built for GPUs (Lightning's FSDPStrategy refuses "
    "accelerator='cpu'; accelerate's and Trainer's are not tested on CPU), so on this machine "
    "train with train.py (launch.sh)"
)


@dataclass(frozen=True)
class FsdpExport:
    """How advisor sharded the model: what each framework's FSDP settings must say."""

    block: str | None  # the class sharded on its own; None: the model is one unit
    reshard_after_forward: bool
    checkpointing: bool  # the blocks were checkpointed too

    @property
    def sharding_strategy(self) -> str:
        """FSDP1's name for it (Lightning's FSDPStrategy)."""
        return "FULL_SHARD" if self.reshard_after_forward else "SHARD_GRAD_OP"


def fsdp_export(rec: Recommendation) -> FsdpExport | None:
    """The recommendation's FSDP layout; None where it is not FSDP."""
    config = rec.config
    if config.parallel_mode != "fsdp":
        return None
    return FsdpExport(
        block=rec.task.repeated_block,
        reshard_after_forward=config.reshard_after_forward,
        checkpointing=config.activation_checkpointing != "off",
    )


def hf_fsdp(export: FsdpExport) -> dict[str, Any]:
    """`TrainingArguments` for FSDP2: `fsdp=True` and its `fsdp_config`."""
    config: dict[str, Any] = {
        "version": 2,
        "reshard_after_forward": export.reshard_after_forward,
        "activation_checkpointing": export.checkpointing,
    }
    if export.block:
        config["transformer_layer_cls_to_wrap"] = [export.block]
    return {"fsdp": True, "fsdp_config": config}


def accelerate_fsdp(export: FsdpExport) -> dict[str, Any]:
    """accelerate's `fsdp_config` for FSDP2."""
    config: dict[str, Any] = {
        "fsdp_version": 2,
        "fsdp_reshard_after_forward": export.reshard_after_forward,
        "fsdp_activation_checkpointing": export.checkpointing,
        "fsdp_state_dict_type": "FULL_STATE_DICT",
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP" if export.block else "NO_WRAP",
    }
    if export.block:
        config["fsdp_transformer_layer_cls_to_wrap"] = export.block
    return config
