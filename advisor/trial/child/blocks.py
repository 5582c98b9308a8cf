"""A model's repeated blocks, and activation checkpointing and FSDP2 sharding of them.

The block is the module class that repeats in a `ModuleList` or `Sequential` (a transformer's
layer, a ResNet's bottleneck): of those, the one holding the most parameters. Checkpointing one
keeps only its input for the backward pass and recomputes the rest there, trading compute for
the memory of its activations (torch's `apply_activation_checkpointing`, non-reentrant, the
random state kept so that dropout draws the same). Sharding one (`fully_shard`) makes it
FSDP's unit: its parameters are gathered for its forward and backward passes only.
"""

from __future__ import annotations

from collections import Counter
from functools import partial
from typing import TYPE_CHECKING

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

if TYPE_CHECKING:  # FSDP adds 0.3 s to a launcher's imports: a trial imports it to shard
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

__all__ = ["checkpoint_blocks", "repeated_block", "shard_blocks"]


def repeated_block(model: nn.Module) -> str | None:
    """The class name of the model's repeated block; None where none repeats. A block has
    modules of its own: a single layer repeated (Linear, ReLU in a Sequential) is none."""
    sizes: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for container in model.modules():
        if not isinstance(container, (nn.ModuleList, nn.Sequential)):
            continue
        repeats = Counter(type(child).__name__ for child in container.children())
        for child in container.children():
            name = type(child).__name__
            if repeats[name] >= 2 and any(True for _ in child.children()):
                counts[name] += 1
                sizes[name] += sum(p.numel() for p in child.parameters())
    blocks = [name for name in counts if sizes[name] > 0]
    return max(blocks, key=lambda name: (sizes[name], counts[name]), default=None)


def checkpoint_blocks(model: nn.Module, block: str) -> int:
    """Wrap every `block` module of `model` in place in torch's checkpoint wrapper (its state
    dict keeps the model's own names); returns how many."""
    wrapped = [m for m in model.modules() if type(m).__name__ == block]
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(
            checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT
        ),
        check_fn=lambda module: type(module).__name__ == block,
    )
    return len(wrapped)


def shard_blocks(
    model: nn.Module,
    block: str | None,
    mesh: DeviceMesh,
    policy: MixedPrecisionPolicy,
    *,
    reshard_after_forward: bool,
) -> int:
    """Shard every `block` module of `model` (its checkpoint wrapper where it has one), then the
    model itself, with FSDP2's `fully_shard` over `mesh`, in place, as torchtitan does; returns
    how many blocks. Without a block the model is one unit. The root keeps its parameters
    gathered after the forward pass: the backward pass starts with it."""
    from torch.distributed.fsdp import fully_shard

    units = _outermost(model, block) if block else []
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return len(units)


def _outermost(model: nn.Module, block: str) -> list[nn.Module]:
    """The `block` modules of `model`, each as its checkpoint wrapper where it has one."""
    units: list[nn.Module] = []
    wrapped: set[int] = set()
    for module in model.modules():  # a wrapper comes before the block it wraps
        if isinstance(module, CheckpointWrapper):
            inner = module._checkpoint_wrapped_module
            if type(inner).__name__ == block:
                units.append(module)
                wrapped.add(id(inner))
        elif type(module).__name__ == block and id(module) not in wrapped:
            units.append(module)
    return units
