"""A model's repeated blocks, and activation checkpointing of them.

The block is the module class that repeats in a `ModuleList` or `Sequential` (a transformer's
layer, a ResNet's bottleneck): of those, the one holding the most parameters. Checkpointing one
keeps only its input for the backward pass and recomputes the rest there, trading compute for
the memory of its activations (torch's `apply_activation_checkpointing`, non-reentrant, the
random state kept so that dropout draws the same).
"""

from __future__ import annotations

from collections import Counter
from functools import partial

from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

__all__ = ["checkpoint_blocks", "repeated_block"]


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
